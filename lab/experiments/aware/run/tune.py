"""Learning rates chosen on validation questions, never on the test questions a sweep reports.

Each method trains a different set of weights, so one learning rate does not fit all: at the
reference's 2e-5 the ~9 % of q/k/v rows AWARe trains barely move in a few dozen steps, while full
fine-tuning at 1e-4 collapses. :func:`tune` picks each method's rate the way a careful paper would:

1. **Held-out questions.** Downstream: ``n_val`` questions from the task's *train* split, disjoint
   from the training pool (:func:`lab.experiments.aware.run.tasks.downstream_validation`). Upstream: ``n_val``
   easy-VQA train questions about images the projector was never aligned on
   (:func:`lab.experiments.aware.run.tasks.easy_vqa_validation`). The text probe stays wholly held out for testing,
   so validation R is easy-VQA retention alone.
2. **Full fine-tuning first**: its language-model lr with the best validation downstream accuracy —
   it is the reference E is measured against, so it should learn as well as it can.
3. **Every other method**: the lr with the best validation H (E against step 2's choice), i.e. the
   rate that best balances keeping and learning. Ties go to the smaller lr.

Every candidate is one run of the sweep's own harness (:func:`lab.experiments.aware.run.ablate.run_variant`) at the
sweep's steps and batch; with several ``seeds`` the validation accuracies are averaged over them
before choosing. ``lab aware tune`` runs it and prints the flags to use.
"""
from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from lab.aware import metrics as M

def default_grids() -> dict[str, tuple[float, ...]]:
    """``{method: grid}`` of every tunable method, from the methods registry (reference first)."""
    from lab.aware.methods import get_method, tunable_methods

    return {m: tuple(get_method(m).grid) for m in tunable_methods()}


def check_grids(grids: dict) -> dict:
    """``{method: (lr, ...)}`` with the reference (full fine-tuning) included and every lr > 0
    (checked before work)."""
    from lab.aware.methods import reference_method, tunable_methods

    unknown = set(grids) - set(tunable_methods())
    if unknown:
        raise ValueError(f"cannot tune {sorted(unknown)}; tunable methods: {list(tunable_methods())}")
    ref = reference_method()
    if ref not in grids:
        raise ValueError(f"the grids must include {ref!r}: E of every other method is relative to it")
    from lab._validate import learning_rate

    for m, lrs in grids.items():
        if not lrs:
            raise ValueError(f"--grid {m}: needs a non-empty list of learning rates, e.g. {m}=1e-4,3e-4")
        for x in lrs:
            learning_rate(f"--grid {m}", x)   # the same check as TrainConfig's
    return {m: tuple(float(x) for x in lrs) for m, lrs in grids.items()}


def validation_context(ctx, task: str, n_val: int, *, cache_dir=None, progress: bool = True):
    """A copy of the sweep's :class:`~lab.experiments.aware.run.context.Context` whose evaluation sets are the
    validation questions (train pool and calibration sets shared with ``ctx``)."""
    from lab.experiments.aware.run import tasks
    from lab.experiments.aware.run.tasks import Task

    size = ctx.size
    kw = dict(grid=size.grid, cache_dir=cache_dir, progress=progress, vision=ctx.info.get("vision"))
    easy_val = tasks.easy_vqa_validation(n=n_val, n_align=size.n_align, **kw)
    down_val = tasks.downstream_validation(task, n=n_val, n_train=size.n_train, **kw)
    return replace(ctx, easy=Task("easy_vqa", ctx.easy.train, easy_val), probe=None,
                   down={task: Task(task, ctx.down[task].train, down_val)})


def choose(rows: list[dict]) -> dict[str, float]:
    """The protocol's choice from candidate rows ``{method, lr, downstream, H}`` (see module doc)."""
    from lab.aware.methods import reference_method

    ref = reference_method()
    by = lambda m: [r for r in rows if r["method"] == m]  # noqa: E731
    best = lambda rs, key: max(rs, key=lambda r: (np.nan_to_num(r[key], nan=-1.0), -r["lr"]))["lr"]  # noqa: E731
    out = {ref: best(by(ref), "downstream")}
    for m in dict.fromkeys(r["method"] for r in rows):
        if m != ref:
            out[m] = best(by(m), "H")
    return out


def tune(ctx, *, task: str = "fashion", grids: dict | None = None, seeds=(0,), n_val: int = 100,
         run_dir: str | Path | None = None, cache_dir=None, progress: bool = True, executor: str = "local",
         address: str | None = None) -> dict:
    """Run every candidate lr (x seed) on the validation questions; returns ``{'table'`` (mean over
    seeds), ``'runs'`` (one row per seed), ``'chosen', 'before', 'run_dir'}``. ``ctx``: a prepared
    sweep context with ``task`` built (:func:`lab.experiments.aware.run.context.setup`)."""
    import pandas as pd

    from lab import runs
    from lab._io import write_json, write_table
    from lab.aware.methods import MethodSpec, lr_field, reference_method, uses_saliency
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.ablate import Variant, VariantRun, run_variants
    from lab.experiments.aware.run.context import MAIN, upstream
    from lab.experiments.aware.run.profiling import calibration_batches

    grids = check_grids(dict(default_grids() if grids is None else grids))
    if task not in ctx.down:
        raise ValueError(f"this context has no downstream task {task!r} (it has {sorted(ctx.down)})")
    if n_val < 1:
        raise ValueError(f"the validation set is empty (n_val={n_val})")
    seeds = tuple(int(x) for x in ([seeds] if isinstance(seeds, int) else seeds))
    if not seeds:
        raise ValueError("give at least one seed")
    t_start = time.perf_counter()
    run_dir = Path(run_dir) if run_dir else runs.new_run_dir("aware", f"tune-{task}")
    val = validation_context(ctx, task, n_val, cache_dir=cache_dir, progress=progress)
    before = upstream(val.base, val)
    key = ("upstream", val.size.n_calib)
    sal = None
    if any(uses_saliency(MethodSpec(m, MAIN)) for m in grids):
        sal = profile(val.base, calibration_batches(val.calib[key], val.enc), targets=MAIN.targets, progress=progress)
    runs_ = []
    todo = [(method, lr, seed, VariantRun(Variant("tune", f"{method}@{lr:g}", MethodSpec(method, MAIN),
                                                  train=replace(ctx.size.train, **{lr_field(method): lr})),
                                          task, seed, progress=progress))   # the candidate lr travels in the variant
            for method, lrs in grids.items() for lr in lrs for seed in seeds]
    done = run_variants(val, [t[-1] for t in todo], before=before, saliency={key: sal} if sal is not None else {},
                        executor=executor, address=address, results_dir=run_dir / "variants",
                        log=print if progress else None)
    for (method, lr, seed, _), (row, _) in zip(todo, done):
        runs_.append({"method": method, "lr": lr, "seed": seed, **{k: row[k] for k in (
            "downstream", "up_easy_vqa", "R", "trainable_frac", "train_s")}})
        if progress:
            print(f"  {method:<6} lr {lr:<8g} seed {seed}: val downstream {row['downstream']:.3f}  "
                  f"val R {row['R']:.1f}", flush=True)
    per_seed = pd.DataFrame(runs_)
    mean = per_seed.groupby(["method", "lr"], sort=False)[["downstream", "up_easy_vqa", "R", "trainable_frac", "train_s"]].mean()
    mean["seeds"] = len(seeds)
    rows = mean.reset_index().to_dict("records")
    ref = reference_method()
    full = {r["lr"]: r["downstream"] for r in rows if r["method"] == ref}
    chosen_full = choose([r for r in rows if r["method"] == ref])[ref]   # the reference: on accuracy alone
    for r in rows:
        r["E"] = M.efficiency(r["downstream"], full[chosen_full])
        r["H"] = M.h_score(r["R"], r["E"])
    chosen = choose(rows)
    table = pd.DataFrame(rows)
    table["chosen"] = [chosen.get(m) == lr for m, lr in zip(table.method, table.lr)]
    write_table(run_dir / "tune", table)
    write_table(run_dir / "tune_runs", per_seed)
    write_json(run_dir / "config.json", {"task": task, "seeds": list(seeds), "n_val": n_val, "grids": grids,
                                         "chosen": chosen, "before_val": before,
                                         "train": asdict(ctx.size.train), "seconds": time.perf_counter() - t_start,
                                         "versions": runs.versions()})
    return {"table": table, "runs": per_seed, "chosen": chosen, "before": before, "run_dir": run_dir}


def flags(chosen: dict[str, float]) -> str:
    """Command-line flags that apply ``chosen``: each method's registry ``lr_field`` as ``--lr-field``
    (DoRA shares LoRA's ``--lr-adapter``)."""
    from lab.aware.methods import lr_field

    out = {"--" + lr_field(m).replace("_", "-"): lr for m, lr in chosen.items()}
    return " ".join(f"{k} {v:g}" for k, v in out.items())
