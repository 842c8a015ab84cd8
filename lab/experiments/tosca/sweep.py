"""``lab tosca --seeds ... --l1 ...``: one scenario, several seeds and L1 coefficients, as a sweep.

Every (seed, L1) pair is one variant, a frozen :class:`~lab.experiments.tosca.run.RunConfig`,
run by :mod:`lab.executors` — one after another here (``local``) or one Ray task each (``ray``).
Each variant trains once and is evaluated under every router in ``routings`` (a router costs no
training, so a router sweep is free). Written into the sweep's folder:

* ``variants/<key>.json``  one per finished variant (its rows); a sweep started again on the same
                           folder (``lab tosca --resume DIR``) skips them — each file checked first
                           (:func:`check_rows`): an empty, damaged or foreign one is refused by name,
                           never taken as done (the sweep would return fewer seeds than asked)
* ``runs.parquet``         tidy: one row per (seed, l1, routing): Ā, A_B, routing accuracy (%)
* ``summary.parquet``      per (method, l1, routing): seeds, mean and the 95 % t-interval over seeds
* ``sweep.json``           the base config, the seeds and L1 values, the executor

    lab tosca --seeds 1993 1994 1995 --l1 0 5e-4 2e-3 --routings per-sample oracle
    lab tosca --seeds 1993 1994 1995 --l1 0 5e-4 --executor ray            # a local Ray, 1 CPU per variant
    lab tosca --resume runs/tosca-sweep/<folder>                           # after a kill: the rest only
"""
from __future__ import annotations

import shutil
from dataclasses import asdict, replace
from pathlib import Path

from .run import RunConfig

KEYS = ["method", "l1", "routing"]
METRICS = ("avg_inc_acc", "last_acc", "routing_accuracy_last")
MANIFEST = "sweep.json"


def configs(base: RunConfig, seeds, l1s) -> list[RunConfig]:
    """The variants: every seed with every L1 coefficient (seed-major, as they are listed)."""
    return [replace(base, seed=int(s), l1=float(l)) for s in seeds for l in l1s]


def run_variant(cfg: RunConfig, runs_root: str) -> list[dict]:
    """One variant (what an executor runs): the study's tidy rows with its L1 coefficient."""
    from .study import run_one

    return [{**row, "l1": cfg.l1} for row in run_one(cfg, runs_root)]


def check_rows(rows, cfg: RunConfig) -> str | None:
    """What is wrong with a variant's result (its rows) for ``cfg``, or ``None``: a non-empty list of
    rows, one per evaluated routing, each naming the variant's scenario, seed, method and L1 coefficient
    and holding every metric as a number."""
    from .methods import METHODS

    if not isinstance(rows, list):
        what = {dict: "object", str: "string", type(None): "null", bool: "boolean"}.get(type(rows), "number")
        return f"is not a variant's rows (a JSON {what}, not an array)"
    if not rows:
        return "holds no rows (an empty list): it is not a finished variant"
    routings = set(cfg.evaluated_routings) if METHODS.info(cfg.method)["routed"] else {"single"}
    ident = {"scenario": "+".join(cfg.datasets), "seed": cfg.seed, "method": cfg.method, "l1": cfg.l1}
    if not (all(isinstance(r, dict) for r in rows) and sorted(str(r.get("routing")) for r in rows) == sorted(routings)
            and all(r.get(k) == v for r in rows for k, v in ident.items())):
        return (f"its rows are not one per routing ({', '.join(sorted(routings))}) of {cfg.method} on "
                f"{ident['scenario']}, seed {cfg.seed}, L1 {cfg.l1:g}")
    missing = sorted({m for r in rows for m in METRICS
                      if isinstance(r.get(m), bool) or not isinstance(r.get(m), (int, float))})
    if missing:
        return f"a row lacks a number for {', '.join(missing)}"
    return None


def summarise(runs):
    """Mean and 95 % t-interval over seeds of each metric, per (method, l1, routing)."""
    import pandas as pd

    from .study import t_interval

    out = []
    for key, g in runs.groupby(KEYS, sort=False, dropna=False):
        row = dict(zip(KEYS, key), seeds=g["seed"].nunique())
        for m in METRICS:
            row[m], half = t_interval(g[m])
            row[f"{m}_lo"], row[f"{m}_hi"] = row[m] - half, row[m] + half
        out.append(row)
    return pd.DataFrame(out)


def write_manifest(folder: Path, base: RunConfig, seeds, l1s, executor: str) -> None:
    from lab._io import write_json

    write_json(folder / MANIFEST, {"base_config": asdict(base), "seeds": [int(s) for s in seeds],
                                   "l1": [float(x) for x in l1s], "executor": executor})


def read_manifest(folder: Path) -> tuple[RunConfig, list[int], list[float]]:
    """(base config, seeds, L1 values) of the sweep in ``folder`` (to resume it)."""
    from lab._io import read_json

    from .run import config_from_stored

    path = Path(folder) / MANIFEST
    m = read_json(path)
    if not isinstance(m, dict):
        raise ValueError(f"{path}: not a sweep manifest (a JSON {type(m).__name__ if m is not None else 'null'}, "
                         f"not an object)")
    unknown = sorted(set(m) - {"base_config", "seeds", "l1", "executor"})
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {', '.join(unknown)} (written by a newer version of the lab?); "
                         f"resume it with that version, or start a new sweep")
    seeds, l1s = m.get("seeds"), m.get("l1")
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise ValueError(f"{path}: its seeds must be a non-empty list of integers (got {seeds!r})")
    if not (isinstance(l1s, list) and l1s and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in l1s)):
        raise ValueError(f"{path}: its l1 must be a non-empty list of numbers (got {l1s!r})")
    return config_from_stored(m.get("base_config"), f"{path} (base_config)"), seeds, [float(x) for x in l1s]


def run_sweep(base: RunConfig, seeds, l1s, folder: Path, *, executor: str = "local", address: str | None = None,
              log=print):
    """Run (or finish) the sweep in ``folder``; return ``(runs, summary)`` and write them there
    (parquet; CSV without pyarrow)."""
    import pandas as pd

    from lab import executors
    from lab._io import write_table

    from . import study

    folder = Path(folder)
    todo = configs(base, seeds, l1s)
    jobs = [executors.Job(executors.key(f"{c.method}-s{c.seed}-l1={c.l1:g}", c), run_variant, c,
                          **executors.resources(c.device, max(1, c.threads))) for c in todo]
    if executor == "ray":    # the features once, here, so that Ray workers only read the cache
        study._data(todo[0], {})
    scratch = folder / "scratch"    # each variant's run folder, removed once its rows are read (study.run_one)
    try:
        results = executors.run(jobs, executor=executor, address=address, shared=(str(scratch),),
                                results_dir=folder / "variants", log=log, check=check_rows)
    finally:
        study._DATA.clear()
        # what a variant stopped mid-run (Ctrl-C, SIGTERM, a Ray worker shut down) left of its run folder:
        # never resumed from (a variant is redone whole), so it goes with the sweep's scratch
        shutil.rmtree(scratch, ignore_errors=True)
    runs = pd.DataFrame([row for rows in results for row in rows])
    summary = summarise(runs)
    write_table(folder / "runs", runs)
    write_table(folder / "summary", summary)
    return runs, summary


def format_summary(summary, folder: Path) -> str:
    """The summary table (each number with its 95 % interval over seeds) and where it was written."""
    from lab.report import with_interval

    names = {"avg_inc_acc": "Ā", "last_acc": "A_B", "routing_accuracy_last": "route_acc"}
    table = summary[KEYS + ["seeds"]].copy()
    for m, label in names.items():
        table[label] = [with_interval(r[m], r[f"{m}_lo"], r[f"{m}_hi"]) for _, r in summary.iterrows()]
    return "\n".join([table.to_string(index=False), "(mean over seeds [95 % t-interval]; percent)",
                      f"sweep dir: {folder} (runs and summary tables; after a kill: lab tosca --resume {folder})"])
