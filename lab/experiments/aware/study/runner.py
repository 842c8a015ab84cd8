"""The one runner of every AWARe study run: a plan's jobs through :mod:`lab.executors` (local, or
one Ray task per run on this machine's cores), each finished run written at once as
``<study>/runs/<key>.json`` (atomic) and skipped when the study is started again.

:func:`run_job` is a pure function of the shared, read-only :class:`Env` and one job: a fresh copy
of the base model, prepared by the method's registry entry, trained, scored on every question set
the job names (0/1 per question, for paired intervals). :func:`choose_rates` picks each variant's
rate on validation questions and :func:`tune` extends a grid whose choice sits at its edge.
"""
from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from lab.experiments.aware.study.plan import (ContinualJob, Job, StudyConfig, continual_key, data_fingerprint, job_key,
                                              plan_continual, plan_fronts, plan_precision, plan_tests, plan_tuning, train_config,
                                              variant_id, variants)


@dataclass(frozen=True)
class Env:
    """Everything built once, read-only afterwards: the test context, its validation twin, the base
    model's answers, and the saliency of every calibration set."""

    ctx: object
    val: object
    cfg: StudyConfig
    base_answers: Mapping[str, list]
    saliency: Mapping
    fingerprint: str
    code: str


def _sets(ctx, val, task: str) -> dict:
    """Every question set a run can answer, by name."""
    out = {"easy_vqa": ctx.easy.test, "probe": ctx.probe.test, "down": ctx.down[task].test}
    if val is not None:
        out.update({"val:easy_vqa": val.easy.test, "val:down": val.down[task].test})
    return out


def _saliency(ctx, cfg: StudyConfig, fp: str, store: Path | None, progress: bool) -> dict:
    """Saliency of every calibration set the variants need, kept in ``store`` (the study folder's
    ``saliency/``, which also keeps the base model's answers) so that a resumed study selects exactly the same rows (profiles computed with
    another thread count differ in the last bits, which could flip a near-tie)."""
    import json

    from lab._io import load_tensors, save_tensors
    from lab.aware.saliency import Saliency
    from lab.experiments.aware.run.ablate import profile_calibrations

    from lab.aware.methods import uses_saliency

    needed = sorted({v.calib_key(ctx.size) for v in variants(cfg) if uses_saliency(v.spec)})
    out, todo = {}, []
    for key in needed:
        f = store / f"{fp}-{key[0]}-{key[1]}.safetensors" if store else None
        if f is not None and f.exists():
            t, meta = load_tensors(f)
            out[key] = Saliency({n: t[n] for n in json.loads(meta["layers"])}, int(meta["n_samples"]),
                                float(meta["seconds"]))
        else:
            todo.append(key)
    if todo:
        from lab.experiments.aware.run.ablate import Variant
        from lab.aware.methods import MethodSpec

        fresh = profile_calibrations(ctx, [Variant("x", "x", MethodSpec("aware"), calib=k, calib_n=n) for k, n in todo],
                                     progress=progress)
        for key, sal in fresh.items():
            out[key] = sal
            if store is not None:
                save_tensors(store / f"{fp}-{key[0]}-{key[1]}.safetensors", {n: v.float().contiguous() for n, v in sal.scores.items()},
                             {"layers": json.dumps(list(sal.scores)), "n_samples": str(sal.n_samples),
                              "seconds": f"{sal.seconds:.3f}"})
    return out


def build_env(cfg: StudyConfig, *, cache_dir=None, device: str | None = None, progress: bool = True,
              store: Path | None = None) -> Env:
    import torch

    from lab.experiments.aware.run.ablate import tasks_for
    from lab.experiments.aware.run.context import setup
    from lab.experiments.aware.run.finetune import evaluate
    from lab.experiments.aware.study.provenance import source_hashes
    from lab.experiments.aware.run.tune import validation_context

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    size = cfg.to_size()
    ctx = setup(size, tiny=cfg.tiny, tasks_needed=tasks_for(None if cfg.continual else (), cfg.task),
                cache_dir=cache_dir, device=device, progress=progress)
    val = validation_context(ctx, cfg.task, cfg.n_val, cache_dir=cache_dir, progress=progress)
    b = ctx.size.eval_batch
    fp = data_fingerprint(cfg, device)
    base_file = store / f"{fp}-base-answers.json" if store is not None else None
    sets = _sets(ctx, val, cfg.task)
    base = None
    if base_file is not None and base_file.is_file():   # the base model's answers, computed once per study
        from lab._io import read_json

        base = read_json(base_file)
        if set(base) != set(sets) or any(len(base[k]) != len(qa) for k, qa in sets.items()):
            base = None
    if base is None:
        from lab.experiments.aware.run.finetune import for_scoring

        scored = for_scoring(ctx.base, cfg.precision)
        base = {k: [int(x) for x in evaluate(scored, qa, ctx.enc, batch_size=b)["correct"]] for k, qa in sets.items()}
        del scored
        if base_file is not None:
            from lab._io import write_json

            write_json(base_file, base)
    sal = _saliency(ctx, cfg, fp, store, progress)
    return Env(ctx, val, cfg, base, sal, fp, source_hashes()["sha256"])


def _stamp(env: Env, t0: float) -> dict:
    from lab.experiments.aware.study.provenance import machine

    m = machine()
    return {"code": env.code, "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{m['cpu']} ({m['cpu_count']} cores, {m['torch_threads']} torch threads, {m['device']})",
            "seconds": time.perf_counter() - t0}


def run_job(job: Job, env: Env) -> dict:
    """Train one job's variant from a fresh copy of the base (:func:`~lab.experiments.aware.run.finetune.fit`)
    and answer its question sets."""
    from lab.aware.methods import lr_field
    from lab.experiments.aware.run.finetune import evaluate, fit, for_scoring

    ctx, v, cfg = env.ctx, job.variant, env.cfg
    method = v.spec.method
    t0 = time.perf_counter()
    rec = {"variant": variant_id(v), "method": method, "scale": job.scale, "seed": job.seed,
           "precision": job.precision or cfg.precision}
    if not lr_field(method):   # nothing trains: the base model's answers
        answers = {k: list(a) for k, a in env.base_answers.items()}
        return {**rec, "lr": None, "lr_projector": None, "answers": answers, "trainable": 0, "total": 0,
                "lora_rank": 0, "steps": 0, "losses": [], "final_loss": float("nan"), "diverged": False,
                "train_s": 0.0, **_stamp(env, t0)}
    tc = train_config(cfg, method, job.scale, job.seed, precision=job.precision)
    model, info, log, _ = fit(ctx.base, v.spec, tc, ctx.down[cfg.task].train, ctx.enc,
                              saliency=env.saliency.get(v.calib_key(ctx.size)))
    train_s = time.perf_counter() - t0
    losses = [float(x) for x in log["losses"]]
    diverged = not all(math.isfinite(x) for x in losses)
    b = ctx.size.eval_batch
    sets = {k: qa for k, qa in _sets(ctx, env.val, cfg.task).items() if ("val" if k.startswith("val:") else "test") in job.sets}
    scored = for_scoring(model, tc.precision)
    del model
    answers = {k: [int(x) for x in evaluate(scored, qa, ctx.enc, batch_size=b)["correct"]] for k, qa in sets.items()}
    return {**rec, "lr": getattr(tc, lr_field(method)), "lr_projector": tc.lr_projector, "answers": answers,
            "trainable": int(info["trainable"]), "total": int(info["total"]),
            "lora_rank": int(info.get("lora_rank", 0)), "steps": len(losses), "losses": losses,
            "final_loss": float(np.mean(losses[-4:])) if losses else float("nan"), "diverged": diverged,
            "train_s": train_s, "score_s": time.perf_counter() - t0 - train_s, **_stamp(env, t0)}


def run_continual_job(job: ContinualJob, env: Env) -> dict:
    from dataclasses import replace

    from lab.aware.methods import lr_field
    from lab.experiments.aware.run.continual import ORDER, run_sequence
    from lab.experiments.aware.study.plan import MAIN

    t0 = time.perf_counter()
    tc = train_config(env.cfg, job.method, job.scale, job.seed)
    ctx = replace(env.ctx, size=replace(env.ctx.size, train=tc))
    rows = run_sequence(ctx, job.method, job.seed, order=ORDER, aware=MAIN, replay=job.replay, progress=False)
    return {"label": job.label, "method": job.method, "replay": job.replay, "scale": job.scale,
            "lr": getattr(tc, lr_field(job.method)), "lr_projector": tc.lr_projector, "seed": job.seed,
            "rows": rows, **_stamp(env, t0)}


# ---------------------------------------------------------------- executing a plan
def execute(env: Env, jobs: list, out: Path, *, executor: str = "local", workers: int | None = None,
            address: str | None = None, log=print) -> list[dict]:
    """Every job's record, in ``jobs`` order, through :func:`lab.executors.run` (finished runs in
    ``out/runs`` are read back, not re-run; identical jobs run once)."""
    from lab import executors

    keyed = []
    for j in jobs:
        if isinstance(j, ContinualJob):
            keyed.append((continual_key(env.fingerprint, j, env.cfg), run_continual_job, j))
        else:
            keyed.append((job_key(env.fingerprint, j, env.cfg), run_job, j))
    unique = {}
    for k, fn, j in keyed:
        unique.setdefault(k, executors.Job(k, fn, j, num_cpus=1.0))
    results = executors.run(list(unique.values()), executor=executor, address=address, shared=(env,),
                            results_dir=out / "runs", workers=workers, log=log)
    by_key = dict(zip(unique, results))
    return [{**by_key[k], "key": k, **({"variant": variant_id(j.variant), "seed": j.seed} if isinstance(j, Job) else {})}
            for k, _, j in keyed]


def _acc(a) -> float:
    return float(np.mean(a)) if len(a) else float("nan")


def choose(env: Env, records: list[dict], keep: int) -> tuple[dict, dict, list[dict]]:
    """From tuning records (validation answers on the tuning seeds): ``(points, kept, rows)``.
    ``points[variant id]``: the best scale (full fine-tuning by mean validation downstream accuracy,
    every other variant by mean validation H, E against full's best; ties to the smaller scale; a
    diverged run scores -1); ``kept[variant id]``: its ``keep`` best scales in that order; ``rows``:
    one row per variant and scale, averaged over the tuning seeds."""
    import pandas as pd

    from lab.aware import metrics as M
    from lab.aware.methods import get_method

    before = _acc(env.base_answers["val:easy_vqa"])
    per = pd.DataFrame([{"variant": r["variant"], "method": r["method"], "scale": r["scale"], "lr": r["lr"],
                         "seed": r["seed"], "diverged": bool(r.get("diverged")),
                         "val_downstream": -1.0 if r.get("diverged") else _acc(r["answers"]["val:down"]),
                         "val_R": -1.0 if r.get("diverged") else M.retention(before, _acc(r["answers"]["val:easy_vqa"]))}
                        for r in records])
    if per.empty:
        return {}, {}, []
    rows = (per.groupby(["variant", "method", "scale", "lr"], as_index=False)
               .agg(seeds=("seed", "nunique"), diverged=("diverged", "any"), val_downstream=("val_downstream", "mean"),
                    val_R=("val_R", "mean")))
    ref = rows[rows.method.map(lambda m: get_method(m).role == "reference")]
    if ref.empty:
        raise ValueError("tuning needs full fine-tuning: E of every other variant is relative to it")
    best_down = float(ref.val_downstream.max())
    rows["val_E"] = [M.efficiency(d, best_down) for d in rows.val_downstream]
    rows["val_H"] = [M.h_score(r, e) if r > 0 and e > 0 else 0.0 for r, e in zip(rows.val_R, rows.val_E)]
    points, kept = {}, {}
    rows["rank"] = 0
    for vid, g in rows.groupby("variant", sort=False):
        key = "val_downstream" if get_method(g.method.iloc[0]).role == "reference" else "val_H"
        order = sorted(g.index, key=lambda i: (-float(np.nan_to_num(rows.at[i, key], nan=-1.0)), rows.at[i, "scale"]))
        for rank, i in enumerate(order, 1):
            rows.at[i, "rank"] = rank
        points[vid] = float(rows.at[order[0], "scale"])
        kept[vid] = tuple(sorted(float(rows.at[i, "scale"]) for i in order[:keep]))
    rows["kept"] = rows["rank"] <= keep
    rows["chosen"] = rows["rank"] == 1
    return points, kept, rows.to_dict("records")


def run_all(env: Env, out: Path, *, log=print, **kw) -> dict:
    """The whole study, in the order its results matter: the methods group's fronts on the test
    seeds; the tuning runs of the methods and the first ablation phase; each ablation phase's tests
    (tuned before it); the continual sequences at the methods' operating points."""
    from lab.experiments.aware.study.plan import PHASES

    cfg, t = env.cfg, {}
    t0 = time.perf_counter()
    fronts = execute(env, plan_fronts(cfg), out, log=log, **kw)
    t["fronts_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    precision = execute(env, plan_precision(cfg), out, log=log, **kw)
    t["precision_s"] = time.perf_counter() - t0
    tune_recs, test_recs, t["tuning_s"], t["tests_s"] = [], [], 0.0, 0.0
    for i, groups in enumerate(PHASES):
        t0 = time.perf_counter()
        tune_recs += execute(env, plan_tuning(cfg, groups, methods=i == 0), out, log=log, **kw)
        points, kept, rows = choose(env, _unique(tune_recs), cfg.keep)
        t["tuning_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        test_recs += execute(env, plan_tests(cfg, kept, groups), out, log=log, **kw)
        t["tests_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    cont = execute(env, plan_continual(cfg, points), out, log=log, **kw)
    t["continual_s"] = time.perf_counter() - t0
    return {"fronts": fronts, "precision": precision, "tune": _unique(tune_recs), "test": _unique(fronts + test_recs),
            "continual": cont,
            "points": points, "kept": kept, "tuning_rows": rows, "complete": True, "timings": t}


def _unique(recs: list[dict]) -> list[dict]:
    """Records once per (key, variant): a run shared by two variants (``rho/rho=0`` is ``methods/rho=0``)
    stays under each name."""
    seen, out = set(), []
    for r in recs:
        k = (r["key"], r.get("variant"))
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def collect(env: Env, out: Path) -> dict:
    """The records of the finished runs in ``out/runs``, without running anything: the fronts found,
    the tuning runs found, each ablation variant's tests once its tuning is whole, the continual
    sequences once the operating points are known; ``complete`` says whether the whole plan was
    found, ``missing`` counts what is not."""
    from lab._io import read_json
    from lab.experiments.aware.study import plan as P

    runs_dir = Path(out) / "runs"
    cfg = env.cfg

    def found(jobs, key):
        recs, miss = [], 0
        for j in jobs:
            f = runs_dir / f"{key(env.fingerprint, j, cfg)}.json"
            if f.is_file():
                rec = read_json(f)
                check_record(f, rec, j)
                recs.append({**rec, "key": f.stem, **({"variant": variant_id(j.variant), "seed": j.seed}
                                                       if isinstance(j, Job) else {})})
            else:
                miss += 1
        return recs, miss

    fronts, m_fronts = found(P.plan_fronts(cfg), P.job_key)
    precision, m_prec = found(P.plan_precision(cfg), P.job_key)
    tune_jobs = P.plan_tuning(cfg)
    tune, m_tune = found(tune_jobs, P.job_key)
    have = {}
    for r in tune:
        have.setdefault(r["variant"], set()).add((r["scale"], r["seed"]))
    want = {}
    for j in tune_jobs:
        want.setdefault(variant_id(j.variant), set()).add((j.scale, j.seed))
    whole = [r for r in tune if have.get(r["variant"], set()) >= want[r["variant"]]]
    from lab.aware.methods import get_method

    points, kept, rows = choose(env, whole, cfg.keep) if any(
        get_method(r["method"]).role == "reference" for r in whole) else ({}, {}, [])
    tests, m_tests = found(P.plan_tests(cfg, kept), P.job_key)
    untested = sum(len(cfg.seeds_for(v.group)) * cfg.keep for v in P.variants(cfg)
                   if v.group != "methods" and P.trains(v) and variant_id(v) not in kept)
    pair = {P.method_variant(P.reference_method()), P.method_variant(P.main_method())}   # full fine-tuning, AWARe
    conts, m_cont = found(P.plan_continual(cfg, points), P.continual_key) if pair <= set(points) \
        else ([], len(cfg.seeds[: cfg.ablation_seeds]) * len(P.CONTINUAL) * cfg.continual)
    missing = {"fronts": m_fronts, "precision": m_prec, "tuning": m_tune, "tests": m_tests + untested, "continual": m_cont}
    return {"fronts": fronts, "precision": precision, "tune": tune, "test": _unique(fronts + tests), "continual": conts,
            "points": points,
            "kept": kept, "tuning_rows": rows, "missing": missing, "complete": not any(missing.values())}


class BadRun(ValueError):
    """A run file that is not the run its name says: one line naming the file."""


def check_record(path: Path, rec, job) -> None:
    """A run file read back must be the run its key names: a JSON object with the job's seed and
    scale, every question set it should answer as a list of 0/1 (a foreign, edited or truncated file
    is refused by name, never tabulated)."""
    def bad(why):
        return BadRun(f"{path}: {why}; delete it and run `lab aware study` again to redo that run")

    if not isinstance(rec, dict):
        raise bad("not a run record (not a JSON object)")
    if isinstance(job, ContinualJob):
        if rec.get("seed") != job.seed or rec.get("method") != job.method or not isinstance(rec.get("rows"), list):
            raise bad("not this continual sequence's record")
        return
    trains = bool(job.scale is not None)
    if rec.get("seed") != job.seed and trains or rec.get("scale") != job.scale:
        raise bad(f"holds seed {rec.get('seed')!r} and scale {rec.get('scale')!r}, not the job's {job.seed} and {job.scale}")
    answers = rec.get("answers")
    if not isinstance(answers, dict) or not answers:
        raise bad("holds no answers")
    for st, a in answers.items():
        if not isinstance(a, list) or any(x not in (0, 1) for x in a):
            raise bad(f"its answers to {st!r} are not a list of 0/1")
    if trains and not isinstance(rec.get("losses"), list):
        raise bad("holds no per-step losses")


def check(env: Env, out: Path, key: str | None = None, *, steps: int | None = None, log=print) -> dict:
    """Re-run one finished run of the study (``key``: its file name in ``out/runs`` without ``.json``;
    default: the first finished front run of full fine-tuning) and compare it with the stored one.
    Whole (``steps`` None): its answers, question by question; on the machine and code that produced
    it they are the same. ``steps``: only the first ``steps`` training steps, compared with the
    stored per-step losses (a prefix check in seconds, not minutes)."""
    from lab._io import read_json
    from lab.experiments.aware.study import plan as P

    runs_dir = Path(out) / "runs"
    res = collect(env, out)
    jobs = P.plan_fronts(env.cfg) + P.plan_precision(env.cfg) + P.plan_tuning(env.cfg) + P.plan_tests(env.cfg, res["kept"])
    by_key = {P.job_key(env.fingerprint, j, env.cfg): j for j in jobs}
    done = [k for k in by_key if (runs_dir / f"{k}.json").is_file()]
    if key is None:
        from lab.aware.methods import get_method

        key = next((k for k in done if get_method(by_key[k].variant.spec.method).role == "reference"),
                   done[0] if done else None)
        if key is None:
            raise ValueError(f"{out}: no finished run to check")
    if key not in by_key or not (runs_dir / f"{key}.json").is_file():
        raise ValueError(f"{out}: no finished run {key!r}; finished runs: {', '.join(sorted(done)[:8])}"
                         + (" ..." if len(done) > 8 else ""))
    stored = read_json(runs_dir / f"{key}.json")
    job = by_key[key]
    if log:
        log(f"re-running {key} ({variant_id(job.variant)}, scale {job.scale}, seed {job.seed}"
            + (f", first {steps} steps" if steps else "") + ") ...")
    import re

    import torch

    threads = re.search(r"(\d+) torch threads", str(stored.get("machine", "")))
    was = torch.get_num_threads()
    if threads:       # the stored run's intra-op threads: a matmul's sums are split (and rounded) by them
        torch.set_num_threads(int(threads.group(1)))
    try:
        if steps:
            return _check_prefix(env, job, stored, steps, key)
        live = run_job(job, env)
    finally:
        torch.set_num_threads(was)
    rows = []
    for st, a in stored["answers"].items():
        b = live["answers"].get(st, [])
        rows.append({"set": st, "questions": len(a), "same": int(sum(int(x == y) for x, y in zip(a, b))),
                     "stored acc": _acc(a), "live acc": _acc(b)})
    same = all(r["same"] == r["questions"] for r in rows)
    return {"key": key, "rows": rows, "same": same, "stored_code": stored.get("code"), "code": env.code,
            "stored_machine": stored.get("machine"), "seconds": live["seconds"]}


def _check_prefix(env: Env, job: Job, stored: dict, steps: int, key: str) -> dict:
    """The first ``steps`` training steps of ``job`` against the stored run's per-step losses (the
    schedule is the whole run's: only the loop stops early)."""
    from lab.experiments.aware.run.finetune import fit, train

    t0 = time.perf_counter()
    tc = train_config(env.cfg, job.variant.spec.method, job.scale, job.seed, precision=job.precision)
    ctx = env.ctx

    def prefix(model, groups, qa, enc, cfg, **kw):
        return train(model, groups, qa, enc, cfg, stop_after=steps, **kw)

    _, _, log, _ = fit(ctx.base, job.variant.spec, tc, ctx.down[env.cfg.task].train, ctx.enc,
                       saliency=env.saliency.get(job.variant.calib_key(ctx.size)), trainer=prefix)
    live = [float(x) for x in log["losses"]]
    ref = [float(x) for x in stored["losses"][:steps]]
    rows = [{"step": i + 1, "stored loss": a, "live loss": b} for i, (a, b) in enumerate(zip(ref, live))]
    return {"key": key, "rows": rows, "same": len(live) == len(ref) and live == ref, "stored_code": stored.get("code"),
            "code": env.code, "stored_machine": stored.get("machine"), "seconds": time.perf_counter() - t0}
