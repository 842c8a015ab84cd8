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

from lab.experiments.aware.plan import (ContinualJob, Job, StudyConfig, continual_key, data_fingerprint, job_key,
                                        plan_continual, plan_tests, plan_tuning, train_config, variant_id, variants)


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
    from lab.experiments.aware.ablate import profile_calibrations

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
        from lab.experiments.aware.ablate import Variant
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

    from lab.experiments.aware.ablate import tasks_for
    from lab.experiments.aware.context import setup
    from lab.experiments.aware.finetune import evaluate
    from lab.experiments.aware.provenance import source_hashes
    from lab.experiments.aware.tune import validation_context

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
        base = {k: [int(x) for x in evaluate(ctx.base, qa, ctx.enc, batch_size=b)["correct"]] for k, qa in sets.items()}
        if base_file is not None:
            from lab._io import write_json

            write_json(base_file, base)
    sal = _saliency(ctx, cfg, fp, store, progress)
    return Env(ctx, val, cfg, base, sal, fp, source_hashes()["sha256"])


def _stamp(env: Env, t0: float) -> dict:
    from lab.experiments.aware.provenance import machine

    m = machine()
    return {"code": env.code, "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{m['cpu']} ({m['cpu_count']} cores, {m['torch_threads']} torch threads, {m['device']})",
            "seconds": time.perf_counter() - t0}


def run_job(job: Job, env: Env) -> dict:
    """Train one job's variant from a fresh copy of the base (:func:`~lab.experiments.aware.finetune.fit`)
    and answer its question sets."""
    from lab.aware.methods import lr_field
    from lab.experiments.aware.finetune import evaluate, fit

    ctx, v, cfg = env.ctx, job.variant, env.cfg
    method = v.spec.method
    t0 = time.perf_counter()
    rec = {"variant": variant_id(v), "method": method, "lr": job.lr, "seed": job.seed}
    if not lr_field(method):   # nothing trains: the base model's answers
        answers = {k: list(a) for k, a in env.base_answers.items() if not k.startswith("val:") or "val" in job.sets}
        return {**rec, "answers": answers, "trainable": 0, "total": 0, "lora_rank": 0, "steps": 0, "losses": [],
                "final_loss": float("nan"), "diverged": False, "train_s": 0.0, **_stamp(env, t0)}
    tc = train_config(cfg, method, job.lr, job.seed)
    model, info, log, _ = fit(ctx.base, v.spec, tc, ctx.down[cfg.task].train, ctx.enc,
                              saliency=env.saliency.get(v.calib_key(ctx.size)))
    train_s = time.perf_counter() - t0
    losses = [float(x) for x in log["losses"]]
    diverged = not all(math.isfinite(x) for x in losses)
    b = ctx.size.eval_batch
    sets = {k: qa for k, qa in _sets(ctx, env.val, cfg.task).items() if ("val" if k.startswith("val:") else "test") in job.sets}
    answers = {k: [int(x) for x in evaluate(model, qa, ctx.enc, batch_size=b)["correct"]] for k, qa in sets.items()}
    return {**rec, "answers": answers, "trainable": int(info["trainable"]), "total": int(info["total"]),
            "lora_rank": int(info.get("lora_rank", 0)), "steps": len(losses), "losses": losses,
            "final_loss": float(np.mean(losses[-4:])) if losses else float("nan"), "diverged": diverged,
            "train_s": train_s, **_stamp(env, t0)}


def run_continual_job(job: ContinualJob, env: Env) -> dict:
    from dataclasses import replace

    from lab.experiments.aware.continual import ORDER, run_sequence
    from lab.experiments.aware.plan import MAIN

    t0 = time.perf_counter()
    tc = train_config(env.cfg, job.method, job.lr, job.seed)
    ctx = replace(env.ctx, size=replace(env.ctx.size, train=tc))
    rows = run_sequence(ctx, job.method, job.seed, order=ORDER, aware=MAIN, replay=job.replay, progress=False)
    return {"label": job.label, "method": job.method, "replay": job.replay, "lr": job.lr, "seed": job.seed,
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


def choose_rates(env: Env, records: list[dict]) -> tuple[dict, list[dict]]:
    """``({variant id: lr}, candidate rows)``: full fine-tuning by validation downstream accuracy,
    every other variant by validation H (E against full's choice); ties to the smaller rate; a
    diverged run never chosen."""
    from lab.aware import metrics as M
    from lab.aware.methods import get_method

    before = _acc(env.base_answers["val:easy_vqa"])
    rows = [{"variant": r["variant"], "method": r["method"], "lr": r["lr"], "seed": r["seed"],
             "diverged": bool(r.get("diverged")), "val_downstream": _acc(r["answers"]["val:down"]),
             "val_R": M.retention(before, _acc(r["answers"]["val:easy_vqa"]))} for r in records]
    score = lambda r, k: -1.0 if r["diverged"] else float(np.nan_to_num(r[k], nan=-1.0))  # noqa: E731
    pick = lambda rs, k: max(rs, key=lambda r: (score(r, k), -r["lr"]))  # noqa: E731
    full_rows = [r for r in rows if get_method(r["method"]).role == "reference"]
    if not full_rows:
        raise ValueError("tuning needs full fine-tuning: E of every other variant is relative to it")
    full_best = pick(full_rows, "val_downstream")
    for r in rows:
        r["val_E"] = M.efficiency(r["val_downstream"], full_best["val_downstream"])
        r["val_H"] = M.h_score(r["val_R"], r["val_E"])
    chosen = {}
    for vid in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == vid]
        ref = get_method(mine[0]["method"]).role == "reference"
        chosen[vid] = pick(mine, "val_downstream" if ref else "val_H")["lr"]
    for r in rows:
        lrs = sorted(x["lr"] for x in rows if x["variant"] == r["variant"])
        r["chosen"] = chosen[r["variant"]] == r["lr"]
        r["edge"] = r["chosen"] and len(lrs) > 1 and r["lr"] in (lrs[0], lrs[-1])
    return chosen, rows


def _beyond(lrs: list[float], chosen: float) -> float | None:
    """The next rate past the edge ``chosen`` sits at (the grid's own ratio), or None if interior."""
    lrs = sorted(lrs)
    if len(lrs) < 2 or chosen not in (lrs[0], lrs[-1]):
        return None
    if chosen == lrs[-1]:
        return float(f"{lrs[-1] * lrs[-1] / lrs[-2]:.3g}")
    return float(f"{lrs[0] * lrs[0] / lrs[1]:.3g}")


def _extensions(chosen: dict, rows: list[dict], extra: dict, most: int) -> dict:
    """``{variant id: rates past the edge}`` for every choice at the edge of what it tried, up to
    ``most`` added rates per variant (empty: every choice is interior or at its limit)."""
    grow = {}
    for vid, lr in chosen.items():
        nxt = _beyond([r["lr"] for r in rows if r["variant"] == vid], lr)
        if nxt is not None and len(extra.get(vid, ())) < most:
            grow[vid] = (*extra.get(vid, ()), nxt)
    return grow


def tune(env: Env, out: Path, *, log=print, groups=None, **kw) -> tuple[dict, list[dict], list[dict]]:
    """Tuning runs (of ``groups``; None: all), extended past every edge choice up to
    ``cfg.max_extensions`` times per variant: ``(chosen, candidate rows, tuning records)``."""
    cfg, extra = env.cfg, {}
    while True:
        recs = execute(env, plan_tuning(cfg, extra, groups), out, log=log, **kw)
        chosen, rows = choose_rates(env, recs)
        grow = _extensions(chosen, rows, extra, cfg.max_extensions)
        if not grow:
            return chosen, rows, recs
        if log:
            log("grid extended past an edge choice: " + ", ".join(f"{k} +{v[-1]:.1e}" for k, v in grow.items()))
        extra.update(grow)


def run_all(env: Env, out: Path, *, log=print, **kw) -> dict:
    """Tune, test every seed, run the continual sequences: every record, by phase."""
    from lab.experiments.aware.plan import PHASES

    t_tune = t_test = 0.0
    for groups in PHASES:     # the headline first, then each finding's variants (plan.PHASES)
        t0 = time.perf_counter()
        chosen, tuning_rows, tune_recs = tune(env, out, log=log, groups=groups, **kw)
        t_tune += time.perf_counter() - t0
        t0 = time.perf_counter()
        test_recs = execute(env, plan_tests(env.cfg, chosen, groups), out, log=log, **kw)
        t_test += time.perf_counter() - t0
    t0 = time.perf_counter()
    cont = execute(env, plan_continual(env.cfg, chosen), out, log=log, **kw)
    return {"chosen": chosen, "tuning_rows": tuning_rows, "tune": tune_recs, "test": test_recs, "continual": cont,
            "complete": True,
            "timings": {"tuning_s": t_tune, "tests_s": t_test, "continual_s": time.perf_counter() - t0}}


def collect(env: Env, out: Path) -> dict:
    """The records of the finished runs in ``out/runs``, by phase, without running anything. A
    variant's rate is chosen only once its whole grid (with the extensions the runs call for) is
    there, and only its test runs at that rate are read; ``complete`` says whether the whole plan
    was found."""
    from lab._io import read_json
    from lab.experiments.aware import plan as P

    runs_dir = Path(out) / "runs"

    def found(jobs, key):
        recs = []
        for j in jobs:
            f = runs_dir / f"{key(env.fingerprint, j, env.cfg)}.json"
            if f.is_file():
                recs.append({**read_json(f), "key": f.stem, **({"variant": variant_id(j.variant), "seed": j.seed}
                                                                if isinstance(j, Job) else {})})
        return recs

    cfg, extra = env.cfg, {}
    empty = {"tune": [], "test": [], "continual": [], "chosen": {}, "tuning_rows": [], "complete": False}
    for _ in range(cfg.max_extensions + 2):
        jobs = P.plan_tuning(cfg, extra)
        recs = found(jobs, P.job_key)
        planned = {}
        for j in jobs:
            planned.setdefault(variant_id(j.variant), set()).add(j.lr)
        have = {}
        for r in recs:
            have.setdefault(r["variant"], set()).add(r["lr"])
        done = {v for v, lrs in planned.items() if have.get(v, set()) >= lrs}
        if "methods/full" not in done:   # nothing can be chosen yet: the candidates so far, for display
            shown = choose_rates(env, recs)[1] if any(r["variant"] == "methods/full" for r in recs) else []
            for r in shown:
                r["chosen"] = r["edge"] = False
            return {**empty, "tune": recs, "tuning_rows": shown}
        mine = [r for r in recs if r["variant"] in done]
        chosen, rows = choose_rates(env, mine)
        grow = _extensions(chosen, rows, extra, cfg.max_extensions)
        if not grow:
            break
        for k, v in grow.items():
            extra[k] = v
    tests = [j for j in P.plan_tests(cfg, chosen) if variant_id(j.variant) in chosen or j.lr is None]
    test_recs = found(tests, P.job_key)
    conts = P.plan_continual(cfg, chosen) if {"methods/full", "methods/aware"} <= set(chosen) else []
    cont_recs = found(conts, P.continual_key)
    complete = (len(done) == len(planned) and len(test_recs) == len(P.plan_tests(cfg, chosen))
                and len(cont_recs) == len(P.plan_continual(cfg, chosen)) and len(chosen) == len(planned))
    return {"tune": recs, "test": test_recs, "continual": cont_recs, "chosen": chosen, "tuning_rows": rows,
            "complete": complete}


def check(env: Env, out: Path, key: str | None = None, *, log=print) -> dict:
    """Re-run one finished run of the study (``key``: its file name in ``out/runs`` without ``.json``;
    default: the first finished tuning run of full fine-tuning) and compare its answers with the
    stored ones, question by question. On the machine and code that produced it the answers are the
    same; ``same`` counts the questions that agree."""
    from lab._io import read_json
    from lab.experiments.aware import plan as P

    runs_dir = Path(out) / "runs"
    res = collect(env, out)
    jobs = P.plan_tuning(env.cfg) + P.plan_tests(env.cfg, res["chosen"])
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
        log(f"re-running {key} ({variant_id(job.variant)}, lr {job.lr}, seed {job.seed}) ...")
    import re

    import torch

    threads = re.search(r"(\d+) torch threads", str(stored.get("machine", "")))
    was = torch.get_num_threads()
    if threads:       # the stored run's intra-op threads: a matmul's sums are split (and rounded) by them
        torch.set_num_threads(int(threads.group(1)))
    try:
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
