"""The shipped AWARe study: every group, several seeds, a learning rate per variant, 95 % intervals.

``lab aware study --out results/aware`` runs it and writes tidy tables plus ``manifest.json``
(the exact command, the sha256 of the ``lab/aware`` and ``lab/experiments/aware`` sources, date,
machine, wall time). Notebook 04 and the README show what it wrote.

The shape (what a distributed executor needs): :func:`plan_tuning` and :func:`plan_tests` return
lists of frozen :class:`Job` s; :func:`run_job` maps one job to one record, a pure function of the
shared, read-only :class:`Env` and the job; the records are cached on disk by the job's
configuration (:func:`job_key`), so a configuration runs once and an interrupted study resumes.

1. **A learning rate per variant.** Every compared variant (method, selection rule, each rho, each
   target set, each calibration set and size) is trained at every rate of its method's grid on the
   tuning seed and scored on *validation* questions (train-split questions no test set contains,
   :func:`lab.experiments.aware.tune.validation_context`). Full fine-tuning keeps the rate with the
   best validation downstream accuracy; every other variant the rate with the best validation H
   (E against full fine-tuning's chosen rate), ties to the smaller rate — the procedure of
   :mod:`lab.experiments.aware.tune`, applied to each variant with the same grid size and budget.
   The choice is cached as JSON keyed by the variant's configuration.
2. **Test runs.** Every variant at its chosen rate, every seed, scored on the fixed test
   questions. A tuning run also answers the test questions (never read by the choice), so the
   tuning seed's test run at the chosen rate is that same run.
3. **The continual sequence, both ways**: the paper's protocol (before each stage, saliency of the
   current model on upstream calibration data only) and this project's extension (upstream plus
   stored training questions of the finished tasks), beside full fine-tuning.
4. **Intervals** (:mod:`lab.experiments.aware.intervals`): a paired bootstrap over test questions
   and seeds for every number and every headline difference.
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from lab.aware.methods import MethodSpec
from lab.experiments.aware.ablate import Variant

from lab.experiments.aware.plan import NOTES, PRESETS  # noqa: E402,F401  (the study's presets live in plan.py)

from lab.experiments.aware.plan import (CONTINUAL, ContinualJob, Job, StudyConfig, job_key, plan_tests,  # noqa: E402,F401
                                        plan_tuning, variant_id, variants)
from lab.experiments.aware.runner import Env, build_env, choose_rates, run_job  # noqa: E402,F401


def _acc(a) -> float:
    return float(np.mean(a)) if len(a) else float("nan")


# ---------------------------------------------------------------- tables with intervals
def _set_sizes(answers: pd.DataFrame) -> dict:  # noqa: F821
    return answers.groupby("set").question.max().add(1).astype(int).to_dict()


def answers_table(records: list[dict], base_answers: Mapping[str, list]):
    """Tidy ``variant, seed, set, question, correct`` (``variant='base'``: the model before fine-tuning)."""
    import pandas as pd

    parts = []
    for r in [{"variant": "base", "seed": -1, "answers": base_answers}, *records]:
        for s, a in r["answers"].items():
            if s.startswith("val:"):
                continue
            parts.append(pd.DataFrame({"variant": r["variant"], "seed": int(r["seed"]), "set": s,
                                       "question": np.arange(len(a)), "correct": np.asarray(a, np.int8)}))
    return pd.concat(parts, ignore_index=True)


def variant_metrics(answers, seeds, *, replicates: int = 2000, rng_seed: int = 0) -> tuple[dict, object]:
    """``{variant: {metric: [B+1] array}}`` for downstream, easy-VQA, probe, R, E, H (paired draws)."""
    from lab.experiments.aware import intervals as I

    sizes = {s: n for s, n in _set_sizes(answers).items() if not s.startswith("cont:")}
    d = I.draw(seeds, sizes, replicates=replicates, rng_seed=rng_seed)
    vec = {(v, int(s), st): g.sort_values("question").correct.to_numpy()
           for (v, s, st), g in answers[~answers.set.str.startswith("cont:")].groupby(["variant", "seed", "set"])}
    base = {st: I.accuracy(d, st, vec[("base", -1, st)]) for st in ("easy_vqa", "probe", "down")}
    per = {}
    for v in sorted({k[0] for k in vec if k[0] != "base"}):
        per[v] = {}
        for seed in seeds:
            acc = {st: I.accuracy(d, st, vec[(v, seed, st)]) for st in ("easy_vqa", "probe", "down")}
            r = (I.retention(base["easy_vqa"], acc["easy_vqa"]) + I.retention(base["probe"], acc["probe"])) / 2
            per[v][seed] = {"downstream": acc["down"], "up_easy_vqa": acc["easy_vqa"], "up_probe": acc["probe"], "R": r}
    for v in per:
        for seed in seeds:
            full = per["methods/full"][seed]["downstream"]
            with np.errstate(divide="ignore", invalid="ignore"):
                e = np.where(full > 0, 100 * per[v][seed]["downstream"] / full, np.nan)
            per[v][seed]["E"] = e
            per[v][seed]["H"] = I.h_score(per[v][seed]["R"], e)
    out = {v: {m: I.over_seeds(d, {s: per[v][s][m] for s in seeds}) for m in per[v][seeds[0]]} for v in per}
    return out, d


HEADLINE = (  # (name, a, b, metrics)
    ("AWARe vs full fine-tuning", "methods/aware", "methods/full", ("R", "H", "downstream")),
    ("AWARe vs LoRA", "methods/aware", "methods/lora", ("R", "E", "H")),
    ("AWARe vs DoRA", "methods/aware", "methods/dora", ("R", "E", "H")),
    ("activation vs weight-norm", "methods/aware", "rule/weight-norm", ("R", "E", "H")),
    ("activation vs random", "methods/aware", "rule/random", ("R", "E", "H")),
    ("weight-norm vs random", "rule/weight-norm", "rule/random", ("R", "E", "H")),
    ("global vs balanced", "methods/aware", "rule/activation-balanced", ("R", "E", "H")),
    ("rho 0.3 vs 0.1", "methods/aware", "rho/rho=0.1", ("R", "E", "H")),
    ("rho 0.3 vs 0.5", "methods/aware", "rho/rho=0.5", ("R", "E", "H")),
    ("q/k/v+projector vs +MLP", "methods/aware", "targets/qkv+projector+mlp", ("R", "E", "H")),
    ("q/k/v+projector vs q/k/v", "methods/aware", "targets/qkv", ("R", "E", "H")),
    ("upstream vs proxy calibration", "methods/aware", "calibration/proxy", ("R", "E", "H")),
)


def summary_table(metrics: Mapping, runs, cfg: StudyConfig):
    """One row per (variant, metric): estimate and 95 % interval, with the variant's chosen rate."""
    import pandas as pd

    from lab.experiments.aware import intervals as I

    info = runs.groupby("variant", sort=False).agg(group=("group", "first"), label=("label", "first"),
                                                    method=("method", "first"), lr=("lr", "first"),
                                                    trainable_frac=("trainable_frac", "mean"), seeds=("seed", "nunique"))
    rows = []
    for v, ms in metrics.items():
        for m, arr in ms.items():
            rows.append({"variant": v, **info.loc[v].to_dict(), "metric": m, **I.summarise(arr)})
    order = {v: i for i, v in enumerate(info.index)}
    return pd.DataFrame(rows).sort_values(["variant"], key=lambda s: s.map(order), kind="stable").reset_index(drop=True)


def comparisons_table(metrics: Mapping):
    import pandas as pd

    from lab.experiments.aware import intervals as I

    rows = []
    for name, a, b, ms in HEADLINE:
        if a not in metrics or b not in metrics:
            continue
        for m in ms:
            s = I.summarise(metrics[a][m] - metrics[b][m])
            rows.append({"comparison": name, "a": a, "b": b, "metric": m, **s,
                         "detected": not I.spans_zero(s["lo"], s["hi"]),
                         "verdict": I.verdict(a.split("/")[-1], b.split("/")[-1], s, m)})
    return pd.DataFrame(rows)


def continual_tables(cont_rows: list[dict], base_answers: Mapping, seeds, *, replicates: int = 2000, rng_seed: int = 1):
    """Per protocol: Avg, Last, BWT and R after the sequence with intervals, plus paired differences
    (each AWARe protocol minus full fine-tuning, replay minus paper) — :mod:`lab.metrics` on every replicate."""
    import pandas as pd

    from lab import metrics as LM
    from lab.experiments.aware import intervals as I

    df = pd.DataFrame(cont_rows)
    tasks = [t for t in dict.fromkeys(df.task) if not t.startswith("upstream:")]
    n_stages = int(df.stage.max()) + 1
    sizes = {f"cont:{t}": len(df[df.task == t].correct.iloc[0]) for t in tasks}
    sizes.update({k: len(base_answers[k]) for k in ("easy_vqa", "probe")})
    d = I.draw(seeds, sizes, replicates=replicates, rng_seed=rng_seed)
    base = {k: I.accuracy(d, k, base_answers[k]) for k in ("easy_vqa", "probe")}
    out = {}
    for label in dict.fromkeys(df.label):
        per = {}
        for seed in seeds:
            mine = df[(df.label == label) & (df.seed == seed)]
            acc = {(int(r.stage), r.task): I.accuracy(d, f"cont:{r.task}" if not r.task.startswith("upstream:")
                                                     else r.task.split(":", 1)[1], r.correct)
                   for r in mine.itertuples()}
            avg, last, bwt = (np.empty(d.replicates + 1) for _ in range(3))
            for b in range(d.replicates + 1):
                m = LM.from_stage_rows([[acc[(i, tasks[j])][b] for j in range(i + 1)] for i in range(n_stages)])
                a_b = LM.stage_averages(m)
                avg[b], last[b], bwt[b] = LM.average_incremental_accuracy(a_b), LM.last_accuracy(a_b), LM.backward_transfer(m)
            r_after = (I.retention(base["easy_vqa"], acc[(n_stages - 1, "upstream:easy_vqa")])
                       + I.retention(base["probe"], acc[(n_stages - 1, "upstream:probe")])) / 2
            per[seed] = {"Avg": avg, "Last": last, "BWT": bwt, "R_after": r_after}
        out[label] = {m: I.over_seeds(d, {s: per[s][m] for s in seeds}) for m in ("Avg", "Last", "BWT", "R_after")}
    rows = [{"protocol": lab_, "metric": m, **I.summarise(arr)} for lab_, ms in out.items() for m, arr in ms.items()]
    labels = list(out)
    pairs = [(labels[1], labels[0]), (labels[2], labels[0]), (labels[2], labels[1])] if len(labels) == 3 else []
    diffs = []
    for a, b in pairs:
        for m in ("Avg", "Last", "BWT", "R_after"):
            s = I.summarise(out[a][m] - out[b][m])
            scale = 100 if m in ("Avg", "Last", "BWT") else 1
            diffs.append({"a": a, "b": b, "metric": m, **s, "detected": not I.spans_zero(s["lo"], s["hi"]),
                          "verdict": I.verdict(a, b, {k: v * scale for k, v in s.items()}, m,
                                               " pts" if scale == 100 else "")})
    return pd.DataFrame(rows), pd.DataFrame(diffs)


# ---------------------------------------------------------------- provenance
# modules that only show or launch results (and the hub-LLaVA path, which the study never imports):
# editing them cannot change a number of the study, so they do not enter its source hash
NOT_COMPUTING = ("ablation_views.py", "figures.py", "prose.py", "study_views.py", "cli.py", "hub_llava.py")


def source_hashes(root: Path | None = None) -> dict:
    """sha256 of every ``lab/aware`` and ``lab/experiments/aware`` source file (``files``) and of the
    ones that compute the study together (``sha256``: all but :data:`NOT_COMPUTING`)."""
    root = Path(root) if root else Path(__file__).resolve().parents[3]
    files = sorted([*(root / "lab" / "aware").glob("*.py"), *(root / "lab" / "experiments" / "aware").glob("*.py")])
    per = {f.relative_to(root).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    computing = {k: v for k, v in per.items() if Path(k).name not in NOT_COMPUTING}
    total = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in computing.items()).encode()).hexdigest()
    return {"sha256": total, "files": per, "not_hashed": list(NOT_COMPUTING)}


def changed_sources(manifest: Mapping, root: Path | None = None) -> list[str]:
    """The computing source files that differ from (or are missing in / new since) the manifest's."""
    now = source_hashes(root)
    then = manifest.get("sources", {}).get("files", {})
    keys = {k for k in {*now["files"], *then} if Path(k).name not in NOT_COMPUTING}
    return sorted(k for k in keys if now["files"].get(k) != then.get(k))


def machine() -> dict:
    import os
    import platform

    import torch

    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"host": platform.node(), "platform": platform.platform(), "cpu": cpu or platform.processor(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(),
            "device": "cuda:" + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}


# ---------------------------------------------------------------- the whole study
def status(env, out: Path) -> str:
    """Which runs of the plan are finished in ``out/runs`` (the tuning phase, then what it decides)."""
    from lab.experiments.aware import plan as P
    from lab.experiments.aware.runner import choose_rates

    runs_dir = Path(out) / "runs"
    tune = P.plan_tuning(env.cfg)
    done = [j for j in tune if (runs_dir / f"{P.job_key(env.fingerprint, j, env.cfg)}.json").exists()]
    lines = [f"study {out}: data fingerprint {env.fingerprint}; {len(list(runs_dir.glob('*.json')))} run files",
             f"tuning (base grids): {len(done)}/{len(tune)} finished"]
    for j in tune:
        k = P.job_key(env.fingerprint, j, env.cfg)
        lines.append(f"  {'done' if (runs_dir / f'{k}.json').exists() else '....'} {P.variant_id(j.variant):<28} "
                     f"lr {j.lr:.1e}")
    if len(done) == len(tune):
        from lab._io import read_json

        recs = [{**read_json(runs_dir / f"{P.job_key(env.fingerprint, j, env.cfg)}.json"), "variant": P.variant_id(j.variant)}
                for j in tune]
        chosen, _ = choose_rates(env, recs)
        tests = P.plan_tests(env.cfg, chosen)
        n = sum((runs_dir / f"{P.job_key(env.fingerprint, j, env.cfg)}.json").exists() for j in tests)
        lines.append(f"tests at the chosen rates (before any grid extension): {n}/{len(tests)} finished")
    return "\n".join(lines)


def run_study(cfg, out: str | Path, *, command: str = "", cache_dir=None, device: str | None = None,
              progress: bool = True, log=print, executor: str = "local", address: str | None = None,
              workers: int | None = None, status_only: bool = False, tables_only: bool = False) -> dict:
    """Tune, test, run the continual sequence (:mod:`lab.experiments.aware.runner`: every finished run
    is kept in ``out/runs`` at once), then compute the tables with intervals and write them and
    ``manifest.json`` into ``out`` (each file atomically)."""
    import datetime

    from lab._io import write_json
    from lab.experiments.aware import runner

    t_start = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = Path(out)
    from lab.experiments.aware.study_views import seed_caches

    seed_caches(out, cache_dir)    # the study's own aligned projector, where this cache lacks it
    env = runner.build_env(cfg, cache_dir=cache_dir, device=device, progress=progress, store=out / "saliency")
    if status_only:
        return {"status": status(env, out)}
    kw = dict(executor=executor, address=address, workers=workers, log=log if progress else None)
    res = runner.run_all(env, out, **kw) if not tables_only else runner.collect(env, out)
    from lab.experiments.aware import study_tables

    tables = study_tables.build(env, res)
    from lab._io import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():      # each file atomically; finished runs stay in out/runs
        if name == "answers":
            atomic_write(out / "answers.parquet", lambda p, df=df: df.to_parquet(p, index=False))
        else:
            atomic_write(out / f"{name}.csv", lambda p, df=df: df.to_csv(p, index=False))
    from lab.experiments.aware.study import Study

    if env.saliency:   # saliency + row norms at the top: notebook 04's mask panel re-selects rows from them
        Study.from_context(env.ctx, env.saliency).save(out)
    listed = sorted(f"{k}.csv" if k != "answers" else "answers.parquet" for k in tables)
    listed += sorted(p.name for p in out.glob("*.safetensors"))
    old = out / "manifest.json"
    if old.exists():      # files an earlier version of this study listed and this one does not write: stale
        from lab._io import read_json

        try:
            for name in set(read_json(old).get("tables", [])) - set(listed):
                for f in (out / Path(name).name, out / (Path(name).name + ".sha256")):
                    if f.is_file():
                        f.unlink()
        except Exception:   # an unreadable old manifest: leave the folder as it is
            pass
    manifest = {
        "command": command, "config": asdict(cfg), "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - t_start, "timings": res.get("timings", {}),
        "compute_s": float(sum(r.get("seconds", 0.0) for ph in ("tune", "test", "continual") for r in res.get(ph, []))),
        "machine": machine(), "sources": source_hashes(), "fingerprint": env.fingerprint,
        "intervals": __import__("lab.experiments.aware.intervals", fromlist=["KIND"]).KIND,
        "note": next((v for k, v in NOTES.items() if PRESETS.get(k) == cfg), "a custom configuration"),
        "chosen_lr": res.get("chosen", {}), "tables": listed,
        "complete": bool(res.get("complete", True)),
    }
    write_json(out / "manifest.json", manifest)
    from lab.experiments.aware import study_views

    text = study_views.results_readme(study_views.load_study(out))
    atomic_write(out / "README.md", lambda p: p.write_text(text, encoding="utf-8"))
    return {**tables, "manifest": manifest, "out": out}
