"""A continual sequence of downstream tasks (docs/aware.md, "Metrics").

The model learns the tasks one after another (default fashion -> digits -> even). After each
stage every task seen so far is evaluated, giving ``acc[i][j]`` for the per-stage averages, the
last-stage average and BWT (:mod:`lab.aware.metrics`); the upstream skills are measured once more
at the end. AWARe re-profiles the current model before every stage, on the first
``Size.continual_calib`` upstream calibration samples plus a few training questions of each task
already learned, so each stage protects what the previous ones taught (profiling needs only
forward passes; nothing is replayed in training). 64 samples pick the same rows as 200 (masks
98.9 % Jaccard, measured) at a third of the profiling time.
"""
from __future__ import annotations

import copy
from dataclasses import replace

from lab.aware import metrics as M
from lab.aware.config import AwareConfig
from lab.aware.methods import MethodSpec, finish, prepare, uses_saliency
from lab.aware.saliency import profile
from lab.experiments.aware.finetune import evaluate, train
from lab.experiments.aware.profiling import calibration_batches

ORDER = ("fashion", "digits", "even")
_PER_TASK_CALIB = 32   # train questions of each finished task added to the calibration set


def run_sequence(ctx, method: str, seed: int, *, order: tuple[str, ...] = ORDER,
                 aware: AwareConfig = AwareConfig(), progress: bool = True) -> list[dict]:
    """Rows ``{method, seed, stage, stage_task, task, acc}`` (``task='upstream:<skill>'`` at the end)."""
    from lab.experiments.aware.context import upstream

    size = ctx.size
    cfg = replace(size.train, steps=size.continual_steps, seed=seed)
    model = copy.deepcopy(ctx.base)
    tests = {t: ctx.down[t].test.subset(range(min(size.n_continual_eval, len(ctx.down[t].test)))) for t in order}
    rows = []
    for i, task in enumerate(order):
        sal, spec = None, MethodSpec(method, aware)
        if uses_saliency(spec):
            up = ctx.calib[("upstream", size.n_calib)]      # nested: its first n are the n-sample set
            qas = [up.subset(range(min(size.continual_calib, len(up))))]
            qas += [ctx.down[t].train.subset(range(min(_PER_TASK_CALIB, len(ctx.down[t].train)))) for t in order[:i]]
            sal = profile(model, [b for qa in qas for b in calibration_batches(qa, ctx.enc)],
                          targets=aware.targets, progress=progress)
        model, groups, _ = prepare(model, spec, cfg, saliency=sal)
        train(model, groups, ctx.down[task].train, ctx.enc, cfg, progress=progress,
              desc=f"continual {method}: {task}")
        model = finish(model, method)
        for t in order[: i + 1]:
            acc = evaluate(model, tests[t], ctx.enc, batch_size=size.eval_batch)["acc"]
            rows.append({"method": method, "seed": seed, "stage": i, "stage_task": task, "task": t, "acc": acc})
    for skill, acc in upstream(model, ctx, exact=False).items():   # the sweep's upstream evaluation
        rows.append({"method": method, "seed": seed, "stage": len(order) - 1, "stage_task": order[-1],
                     "task": f"upstream:{skill}", "acc": acc})
    return rows


def summarise(rows: list[dict], order: tuple[str, ...], before: dict) -> list[dict]:
    """One row per (method, seed): Avg over stages, Last, BWT, per-stage averages, R after the sequence."""
    out = []
    for method, seed in sorted({(r["method"], r["seed"]) for r in rows}):
        mine = [r for r in rows if r["method"] == method and r["seed"] == seed]
        acc = [[next(r["acc"] for r in mine if r["stage"] == i and r["task"] == t) for t in order[: i + 1]]
               for i in range(len(order))]
        up = {r["task"].split(":", 1)[1]: r["acc"] for r in mine if r["task"].startswith("upstream:")}
        out.append({"method": method, "seed": seed, "avg": M.average_over_stages(acc), "last": M.last(acc),
                    "bwt": M.bwt(acc), **{f"stage{i}_avg": a for i, a in enumerate(M.stage_averages(acc))},
                    "R_after_sequence": M.mean_retention({k: before[k] for k in up}, up)})
    return out
