"""The TOSCA study: TOSCA under every router and the cheap baselines over seeds and scenarios.

Seeds x scenarios x (TOSCA under every router, with each initialisation) and the cheap baselines,
on cached features -> tidy tables with 95 % intervals over seeds.

    lab tosca study --executor ray --out results/tosca   # the committed tables (both cores)
    lab tosca study --seeds 1993 --epochs 2 --out /tmp/x   # a quick look (one seed, nothing more)

A sweep is a list of frozen :class:`~lab.experiments.tosca.run.RunConfig` variants built by one
pure function (:func:`variants`) and mapped by :func:`run_all`: per scenario and seed, TOSCA with
the reference initialisation, with this library's former one (uniform head rows, Xavier LuCA) and
with each of those two changes alone,
the LuCA flow ablation (adapter / calibrator / tosca_r, reference initialisation) on the scenarios
in ``--flow-scenarios``, and every cheap baseline. TOSCA is evaluated under every router. The
headline — TOSCA with the reference initialisation under every router, and every baseline — also
runs at the ``--headline-seeds`` (default: 50 seeds, the ten of ``--seeds`` among them): per-batch
routing sends a whole class-ordered batch to one module, so its A_B rests on ~21 decisions per run
and spreads ±7.5 points over seeds (measured over 70); ten seeds leave its 95 % interval at ±6.6,
forty or more bring it under ±2.5. Written into ``--out``:

* ``runs.csv``    one row per (scenario, seed, method, flow, head_init, luca_init, routing): Ā,
                  A_B, routing accuracy (last stage and mean over stages), all in percent; trainable
                  parameters, training seconds (train_s) and the run's seconds
* ``summary.csv`` per (scenario, method, flow, head_init, luca_init, routing): seeds, mean and the
                  95 % t-interval half-width over seeds of each of those numbers
* ``manifest.json`` the exact command, sha256 of the lab/tosca and lab/experiments/tosca sources
                  (:func:`sources_sha256`), date, machine, torch threads, wall time, and the sha256
                  of runs.csv and summary.csv (``sha256``: the reader refuses a table that differs)

Paired comparisons (a difference per seed, then its t-interval) are computed from ``runs.csv`` by
:mod:`lab.experiments.tosca.results`.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from lab._names import REFERENCE_FLOW, TOSCA_METHODS

if TYPE_CHECKING:      # imported where used: .run imports torch, and `lab tosca study --help` needs none
    from .run import RunConfig

SCENARIOS = ("fashion_mnist_mini", "mnist_5k+fashion_mnist_mini")
# the method under study (TOSCA) and the baselines compared with it: those that train nothing (registry info)
METHOD = TOSCA_METHODS.builtin(role="method")[0]
BASELINES = TOSCA_METHODS.builtin(role="baseline", trains=False)
# ten seeds: with three, A_B's 95 % interval was up to ±6 points for per-sample routing (t = 4.30)
SEEDS = tuple(range(1993, 2003))
# the headline's seeds (module docstring): per-batch A_B's spread over seeds, 7.5 points, needs ~40
# for a ±2.5 interval; 50 leave a margin (t · 7.5 / √50 = 2.1)
HEADLINE_SEEDS = tuple(range(1993, 2043))
# (head_init, luca_init): the reference's, this library's former default, then each change alone
INITS = (("reference", "reference"), ("uniform", "xavier"), ("uniform", "reference"), ("reference", "xavier"))
ABLATION_FLOWS = ("adapter", "calibrator", "tosca_r")  # beside 'tosca' (lab.tosca.luca.FLOWS)
METRICS = ("avg_inc_acc", "last_acc", "routing_accuracy_last", "routing_accuracy_mean")
KEYS = ["scenario", "method", "flow", "head_init", "luca_init", "routing"]
# not hashed for this study: the reader of the shipped tables, the efficiency measurement (efficiency.py's
# own manifest hashes it), the `lab tosca` command line and its seed / L1 sweep (the study calls
# run.py directly): none of them produces a number of the study
UNHASHED = ("results.py", "efficiency.py", "cli.py", "sweep.py",
            # the mechanism study and notebook 01's table: their own commands and manifests
            "mechanism.py", "mechanism_results.py", "mechanism_views.py", "ventral.py")
# the training engine of the shipped study (lab/tosca/engines/_fused.py, C kernels): passed to every
# variant and recorded in the manifest, so a rerun of the shipped command trains as the shipped one did
# (the library's default is the plain autograd step; docs/measurements.md compares them)
STUDY_ENGINE = "fused"


def variants(base: RunConfig, *, scenarios, seeds, baselines=BASELINES, inits=INITS, routings=None,
             flows=ABLATION_FLOWS, flow_scenarios=None, headline_seeds=()) -> list[RunConfig]:
    """Every run of the study as a frozen config: per scenario and seed, TOSCA once per
    (head_init, luca_init) and — on ``flow_scenarios`` (default: the first scenario) — once per
    ablation flow with the reference initialisation, each evaluated under every routing; and each
    baseline once. At a seed of ``headline_seeds`` not in ``seeds``: only the headline, TOSCA with
    the first of ``inits`` (under every routing) and each baseline."""
    from lab.tosca.routing import list_routings

    routings = tuple(routings or list_routings())
    flow_scenarios = scenarios[:1] if flow_scenarios is None else flow_scenarios
    every = [*seeds, *(s for s in headline_seeds if s not in seeds)]
    out = []
    for scenario, seed in itertools.product(scenarios, every):
        common = dict(datasets=tuple(scenario.split("+")), seed=int(seed))
        full = seed in seeds
        out += [replace(base, method=METHOD, head_init=h, luca_init=lu, routings=routings, **common)
                for h, lu in (inits if full else inits[:1])]
        if full and scenario in flow_scenarios:
            out += [replace(base, method=METHOD, flow=f, head_init="reference", luca_init="reference",
                            routings=routings, **common) for f in flows]
        out += [replace(base, method=m, **common) for m in baselines]
    return out


def _data(cfg: RunConfig, cache: dict):
    """ScenarioData per (datasets, seed, resolution): the class order depends on the seed; the
    feature cache makes a second scenario over the same datasets cheap."""
    from lab import backbones, data, features

    from .methods import ScenarioData

    key = (cfg.datasets, cfg.seed, cfg.init, cfg.inc, cfg.resolution)
    if key not in cache:
        scn = data.scenario(list(cfg.datasets), init=cfg.init, inc=cfg.inc, seed=cfg.seed)
        bb = backbones.load(cfg.backbone, resolution=cfg.resolution)
        while len(cache) >= _KEEP:      # variants come grouped by (scenario, seed): the last few suffice
            cache.pop(next(iter(cache)))
        cache[key] = ScenarioData.from_scenario(scn, features.scenario_features(scn, bb, progress=False))
    return cache[key]


_KEEP = 4         # ScenarioData kept per process: 100 (scenario, seed) pairs would hold ~10 GB
_DATA: dict = {}   # ScenarioData per process: variants run in one process (or one Ray worker) share it


def run_one(cfg: RunConfig, runs_root, data=None) -> list[dict]:
    """One variant of the study (the unit an executor runs): its tidy rows, one per routing.
    ``data``: a ScenarioData to use instead of the configured datasets' cached features."""
    import tempfile

    from .run import run

    t0 = time.perf_counter()
    # the run's folder (its tables and saved modules: ~200 MB for RanPAC's projection) goes as soon as its
    # rows are read: 590 variants kept until the end filled a 70 GB disk. ``runs_root`` is made here: on a
    # Ray cluster the driver's folder need not exist on this node
    Path(runs_root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=runs_root) as root:
        res = run(cfg, data=_data(cfg, _DATA) if data is None else data, runs_root=root, progress=False)
    secs = time.perf_counter() - t0
    tosca = TOSCA_METHODS.info(cfg.method)["luca"]     # flow and initialisations: the LuCA's
    return [{"scenario": "+".join(cfg.datasets), "seed": cfg.seed, "method": cfg.method,
             "flow": cfg.flow if tosca else "", "head_init": cfg.head_init if tosca else "",
             "luca_init": cfg.luca_init if tosca else "", "routing": r["routing"],
             **{m: r[m] for m in METRICS[:2]}, **{m: 100 * r[m] for m in METRICS[2:]},  # routing accuracy in %
             "trainable_params": res.info["trainable_params_total"],
             "train_s": res.info["seconds"]["training"], "seconds": secs}
            for r in res.summary.to_dict("records")]


def run_variant(cfg: RunConfig, runs_root, data=None) -> dict:
    """:func:`run_one` as a study keeps it in ``variants/``: ``{"config", "rows", "sha256"}``, the
    sha256 over the config and the rows, so that a file read back is this variant's, whole and as
    written (:func:`check_variant`)."""
    from lab import executors

    body = json.loads(executors._roundtrip({"config": cfg.to_dict(), "rows": run_one(cfg, runs_root, data)}))
    return {**body, "sha256": _variant_digest(body)}


def _variant_digest(record: dict) -> str:
    text = json.dumps({"config": record.get("config"), "rows": record.get("rows")}, sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_variant(record, cfg: RunConfig, where) -> list[dict]:
    """The rows of a variant's stored result, verified: a record of this study's form, its sha256
    matching its config and rows, the config the variant's, one row per evaluated routing, each
    naming the variant's scenario, seed and method. Anything else: ValueError naming ``where``."""
    from lab import executors

    fix = "remove it and the variant runs again"
    if not (isinstance(record, dict) and set(record) == {"config", "rows", "sha256"}):
        what = "a JSON " + {dict: "object", list: "array", str: "string", type(None): "null", bool: "boolean"}.get(
            type(record), "number")
        raise ValueError(f"{where}: not a variant result of this study ({what} without config, rows and sha256); "
                         f"{fix}")
    if record["sha256"] != _variant_digest(record):
        raise ValueError(f"{where}: its config and rows differ from the sha256 recorded with them (edited or "
                         f"damaged); {fix}")
    want = json.loads(executors._roundtrip(cfg.to_dict()))
    if record["config"] != want:
        diff = ", ".join(f"{k} {record['config'].get(k)!r} (this variant: {want.get(k)!r})"
                         for k in sorted(set(want) | set(record["config"])) if record["config"].get(k) != want.get(k))
        raise ValueError(f"{where}: holds another variant's result: {diff}; {fix}")
    rows = record["rows"]
    from .methods import METHODS

    routings = set(cfg.evaluated_routings) if METHODS.info(cfg.method)["routed"] else {"single"}
    ident = {"scenario": "+".join(cfg.datasets), "seed": cfg.seed, "method": cfg.method}
    if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
            and sorted(r.get("routing") for r in rows) == sorted(routings)
            and all(r.get(k) == v for r in rows for k, v in ident.items())):
        raise ValueError(f"{where}: its rows are not one per routing ({', '.join(sorted(routings))}) of "
                         f"{ident['method']} on {ident['scenario']}, seed {ident['seed']}; {fix}")
    return rows


def _check_stored(jobs, results_dir) -> None:
    """Every variant file already in ``results_dir`` verified before any is used (one line naming
    the first bad one)."""
    from lab import _io

    for j in jobs:
        f = Path(results_dir) / f"{j.key}.json"
        if f.is_file():
            try:
                record = _io.read_json(f)
            except (_io.CorruptFile, UnicodeDecodeError) as exc:
                raise ValueError(f"{f}: not readable JSON ({' '.join(str(exc).split())[:200]}); remove it and the "
                                 "variant runs again") from None
            check_variant(record, j.config, f)


def run_all(configs, runs_root, *, log=print, executor: str = "local", address: str | None = None,
            results_dir=None, data=None) -> list[dict]:
    """Run every config (:func:`run_variant`, through :func:`lab.executors.run`: ``local`` or one Ray
    task each; with ``results_dir``, finished variants are kept there, verified when read back and
    skipped on a rerun)."""
    from lab import executors

    jobs = [executors.Job(executors.key(f"{cfg.method}-{'+'.join(cfg.datasets)}-s{cfg.seed}-"
                                        f"{cfg.head_init}-{cfg.luca_init}" + ("" if cfg.flow == REFERENCE_FLOW else f"-{cfg.flow}"), cfg), run_variant, cfg,
                          **executors.resources(cfg.device, max(1, cfg.threads))) for cfg in configs]
    if results_dir is not None:
        _check_stored(jobs, results_dir)
    try:
        results = executors.run(jobs, executor=executor, address=address, shared=(str(runs_root), data),
                                results_dir=results_dir, log=log)
    finally:
        _DATA.clear()
    return [row for j, record in zip(jobs, results) for row in check_variant(record, j.config, f"variant {j.key}")]


def t_interval(values) -> tuple[float, float]:
    """Mean and the half-width of the lab's 95 % t-interval over per-seed values (:func:`lab.stats.t_interval`,
    the one rule; NaNs dropped, NaN half-width for one value)."""
    from lab import stats

    mean, lo, hi = stats.t_interval(float(x) for x in values)
    return mean, hi - mean


def summarise(rows):
    """Mean and 95 % t-interval over seeds per (scenario, method, flow, head_init, luca_init, routing)."""
    import pandas as pd

    df = pd.DataFrame(rows).fillna({k: "" for k in KEYS})
    out = []
    for key, g in df.groupby(KEYS, sort=False):
        row = dict(zip(KEYS, key), seeds=len(g))
        for m in METRICS:
            row[m], row[f"{m}_ci95"] = t_interval(g[m])
        out.append(row)
    return pd.DataFrame(out)


def sources_sha256(unhashed=UNHASHED) -> dict:
    """sha256 of every source of lab/tosca (the fused engine's C kernels and lab/_cc.py, which builds
    them, included) and lab/experiments/tosca (but the file names in ``unhashed``), keyed by its path
    from the repository root."""
    root = Path(__file__).resolve().parents[2]
    files = sorted([*(root / "tosca").rglob("*.py"), *(root / "tosca").rglob("*.c"), root / "_cc.py",
                    *(root / "experiments" / "tosca").glob("*.py")])
    return {f.relative_to(root.parent).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in files if f.name not in unhashed}


def machine() -> dict:
    import os

    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}


def _digest(sources: dict) -> str:
    return hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:12]


def main(argv=None, prog: str = "lab tosca study") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser(prog)
    args = p.parse_args(argv)
    try:
        return _main(args, argv, prog)
    except KeyboardInterrupt:       # Ctrl-C, or SIGTERM (lab tosca study turns it into this)
        print(f"{prog}: interrupted; {_resume(args, argv, prog)}", file=sys.stderr)
        return 130
    except (ValueError, KeyError, OSError) as exc:
        from lab._io import DiskFull

        if isinstance(exc, DiskFull):
            print(f"{prog}: error: {exc}; free some space, then {_resume(args, argv, prog)}", file=sys.stderr)
            return 2
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"{prog}: error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2


def _resume(args, argv, prog) -> str:
    """Where the finished variants are and the command that continues the study."""
    import shlex

    if not args.out or not (Path(args.out) / "variants").is_dir():
        return "nothing was finished yet; run the command again"
    keep, skip = [], False
    for a in argv:
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        keep.append(a)
    return (f"finished variants are kept in {args.out}/variants/ and skipped: resume with: "
            f"{prog} {shlex.join([*keep, '--out', str(args.out)])}")


class _OneLine(argparse.ArgumentParser):
    """One-line usage errors, as every ``lab`` command: ``lab tosca study: error: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser(prog: str = "lab tosca study") -> argparse.ArgumentParser:
    """The study's command line (``lab tosca study --help``)."""
    p = _OneLine(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), help="datasets, '+' chains them")
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help=f"seeds of every variant, each its own class order (default: {SEEDS[0]}-{SEEDS[-1]})")
    p.add_argument("--headline-seeds", nargs="*", type=int, default=None,
                   help="more seeds for the headline only: TOSCA with the reference initialisation under every "
                        f"router, and every baseline (default: {HEADLINE_SEEDS[0]}-{HEADLINE_SEEDS[-1]} when --seeds "
                        "is not given, none when it is)")
    p.add_argument("--baselines", nargs="*", default=list(BASELINES))
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--inc", type=int, default=2)
    p.add_argument("--resolution", type=int, default=None)
    p.add_argument("--flow-scenarios", nargs="*", default=None,
                   help="scenarios of the LuCA flow ablation (default: the first of --scenarios)")
    p.add_argument("--out", default=None,
                   help="study folder (default: a new runs/tosca/study-... folder; the shipped study is "
                        "--out results/tosca)")
    p.add_argument("--replace", action="store_true",
                   help="allow writing over a study in --out that was made with other settings (the new study is "
                        "written beside it and swapped in as a whole; other files in the folder are kept)")
    p.add_argument("--engine", default=STUDY_ENGINE,
                   choices=("autograd", "eager", "fused", "compile", "static", "cuda_graph"),
                   help=f"TOSCA training engine of every variant (default {STUDY_ENGINE}, the shipped study's; "
                        "lab tosca --help lists them)")
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local: one variant after another; ray: one Ray task per variant (finished variants "
                        "are kept in OUT/variants/ and skipped when the same command runs again)")
    p.add_argument("--address", default=None, help="join the Ray cluster at this address (with --executor ray)")
    return p


def check_arguments(args) -> None:
    """Every argument of the study, before any work (one line naming the first bad one)."""
    from lab import _validate as V
    from lab import executors
    from lab.data import datasets

    V.count("--epochs", args.epochs, maximum=100_000)
    V.count("--inc", args.inc, maximum=100_000)
    if args.resolution is not None:
        V.count("--resolution", args.resolution, minimum=32, maximum=4096)
    if args.seeds is not None and not args.seeds:
        raise V.bad("--seeds", "", "give at least one seed")
    for flag, seeds in (("--seeds", args.seeds), ("--headline-seeds", args.headline_seeds)):
        for s in seeds or ():
            V.seed(flag, s)
        if seeds and len(set(seeds)) != len(seeds):
            raise V.bad(flag, " ".join(map(str, seeds)), "lists a seed twice; give each seed once")
    valid = set(datasets.list_datasets()) if hasattr(datasets, "list_datasets") else None
    for scn in [*args.scenarios, *(args.flow_scenarios or [])]:
        for part in scn.split("+"):
            if valid is not None and part not in valid:
                raise V.bad("--scenarios", scn, f"unknown dataset {part!r}; valid: {', '.join(sorted(valid))}")
    methods = set(TOSCA_METHODS.names())      # static: a bad name answers without torch
    for b in args.baselines:
        if b not in methods or TOSCA_METHODS.info(b)["role"] != "baseline":
            valid = sorted(m for m in methods if TOSCA_METHODS.info(m)["role"] == "baseline")
            raise V.bad("--baselines", b, f"not a baseline; valid: {', '.join(valid)}")
    if args.address is not None and args.executor != "ray":
        raise V.bad("--address", args.address, "joins a Ray cluster: needs --executor ray")
    executors.check(args.executor, args.address)
    if args.out is not None:
        V.out_dir("--out", args.out)


def resolve_seeds(args) -> None:
    """The defaults of ``--seeds`` and ``--headline-seeds`` (the headline's extra seeds only when the
    command line names no seeds)."""
    if args.headline_seeds is None:
        args.headline_seeds = [] if args.seeds is not None else list(HEADLINE_SEEDS)
    if args.seeds is None:
        args.seeds = list(SEEDS)


def _main(args, argv, prog) -> int:
    check_arguments(args)
    resolve_seeds(args)
    if args.out is None:
        from lab import runs

        args.out = str(runs.new_run_dir("tosca", "study"))
    from .run import RunConfig

    base = RunConfig(epochs=args.epochs, inc=args.inc, resolution=args.resolution, engine=args.engine)
    old = Path(args.out) / "manifest.json"
    if old.exists() and not args.replace:
        from lab._io import read_json

        try:
            then = read_json(old)
        except Exception:
            then = {}
        same = then.get("base_config") == base.to_dict() and all(
            then.get(k, v) == v for k, v in _settings(args).items())     # older manifests lack some keys
        if not same:
            raise ValueError(f"--out {args.out} holds a study made with other settings ({then.get('command', '?')}); "
                             "give another --out, or --replace to write over it")
    import tempfile

    import torch

    from lab import _io

    configs = variants(base, scenarios=args.scenarios, seeds=args.seeds, baselines=args.baselines,
                       flow_scenarios=args.flow_scenarios, headline_seeds=args.headline_seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = sources_sha256()  # before the runs: the code that produced the numbers
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as runs_root:
        rows = run_all(configs, runs_root, executor=args.executor, address=args.address,
                       results_dir=out / "variants" / _digest(sources))   # changed code: a fresh set
    wall = time.perf_counter() - t0
    import pandas as pd

    manifest = {"command": f"{prog} " + " ".join(argv), "engine": args.engine, **_settings(args),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": machine(), "executor": args.executor,
                "wall_seconds": round(wall, 1), "runs": len(configs), "base_config": base.to_dict(),
                "sources_sha256": sources}

    def write(new: Path) -> None:
        _link_tree(out, new, skip=STUDY_FILES)      # variants/ and other commands' files come along
        _write_csv(new / "runs.csv", pd.DataFrame(rows))
        _write_csv(new / "summary.csv", summarise(rows))
        _io.write_json(new / "manifest.json", {**manifest, "sha256": table_hashes(new)})

    _io.replace_dir(out, write)   # one swap: a reader sees the old study or the new one, never half of each
    print(f"wrote {out}/runs.csv, summary.csv, manifest.json ({wall:.0f} s)")
    return 0


def _settings(args) -> dict:
    """What, beside the base config, makes two studies the same study (recorded in the manifest)."""
    return {"scenarios": list(args.scenarios), "seeds": list(args.seeds), "headline_seeds": list(args.headline_seeds),
            "baselines": list(args.baselines),
            "flow_scenarios": None if args.flow_scenarios is None else list(args.flow_scenarios)}


STUDY_FILES = ("runs.csv", "summary.csv", "manifest.json")


def _link_tree(src: Path, dst: Path, *, skip=()) -> None:
    """Every entry of ``src`` but ``skip`` into ``dst``, as hard links (a copy where links fail)."""
    import os
    import shutil

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    for entry in src.iterdir():
        if entry.name in skip:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, dst / entry.name, copy_function=link)
        else:
            link(entry, dst / entry.name)


def table_hashes(out, files=("runs.csv", "summary.csv")) -> dict:
    """sha256 of each table the study ships (recorded in its manifest; the reader checks them)."""
    from lab import _manifest

    return _manifest.digests(out, files)


def _write_csv(path: Path, df) -> None:
    """Atomically: a temporary file beside it, then a rename."""
    tmp = path.with_suffix(".csv.tmp")
    df.to_csv(tmp, index=False, float_format="%.4f")
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m lab.experiments.tosca.study"))
