"""The AWARe ablation runner: every method and every ablation axis of docs/aware.md ("Ablations"), one table.

Axes (each compared with the main AWARe setting: rho=0.3, activation-global, q/k/v+projector,
200 upstream calibration samples): methods (zero-shot, full, LoRA, DoRA, AWARe), selection rule,
rho sweep, targets, calibration set (upstream vs generic proxy), calibration size; plus a
continual sequence of the downstream tasks (fashion -> digits -> even).

Everything lands in a unique run directory (``lab.runs.new_run_dir('aware', ...)``): tidy tables
(``results``, ``continual``, ``continual_summary``, ``overlap``, ``mask_composition``,
``upstream_before``), the
config with seeds and versions, saliency tensors (layer x neuron) and the selection masks as
safetensors for the heatmap notebook.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from lab.aware import metrics as M
from lab.aware.masking import check_rho, needs_saliency, select
from lab.aware.methods import (MethodSpec, get_method, lr_field, main_method, method_names, reference_method,
                               table_columns, uses_saliency)
from lab.aware.saliency import Saliency
from lab.experiments.aware.run.context import MAIN, Context, Size, setup, upstream
from lab.experiments.aware.run.finetune import TrainConfig, evaluate, fit


def tasks_for(groups, task: str, order: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The downstream tasks a sweep of ``groups`` (None: all) on ``task`` needs: the continual
    sequence needs every task of its ``order``."""
    from lab.experiments.aware.run.continual import ORDER

    seq = tuple(order or ORDER) if groups is None or "continual" in groups else ()
    return tuple(dict.fromkeys([task, *seq]))


@dataclass(frozen=True)
class Variant:
    """One run of the sweep: a method spec, the calibration set its saliency comes from, and
    (``train``) the recipe when it differs from the size's (``lab aware tune`` passes each
    candidate learning rate this way)."""

    group: str
    label: str
    spec: MethodSpec
    calib: str = "upstream"
    calib_n: int | None = None      # None: Size.n_calib
    train: TrainConfig | None = None   # None: Size.train

    def calib_key(self, size: Size) -> tuple[str, int]:
        return self.calib, self.calib_n or size.n_calib


def variants(size: Size) -> list[Variant]:
    """The sweep, main AWARe first after the baselines (it is shared by every ablation group)."""
    names = method_names()
    unknown = set(size.methods) - set(names)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {list(names)}")
    role = lambda m: get_method(m).role   # noqa: E731
    out = [Variant("methods", m, MethodSpec(m, MAIN)) for m in names     # E is relative to the reference
           if role(m) != "method" and (m in size.methods or role(m) == "reference")]
    out += [Variant("methods", m, MethodSpec(m, MAIN)) for m in names if role(m) == "method"]
    main = main_method()   # AWARe: what every ablation group varies
    for rule in size.rules:
        out.append(Variant("rule", rule, MethodSpec(main, replace(MAIN, rule=rule))))
    for rho in size.rhos:
        if rho != MAIN.rho:
            out.append(Variant("rho", f"rho={check_rho(rho):g}", MethodSpec(main, replace(MAIN, rho=rho))))
    for tg in ("qkv", "qkv+projector+mlp"):
        out.append(Variant("targets", tg, MethodSpec(main, replace(MAIN, targets=tg))))
    out.append(Variant("calibration", "proxy", MethodSpec(main, MAIN), calib="proxy"))
    for n in size.calib_sizes:
        out.append(Variant("calib_size", f"n={n}", MethodSpec(main, MAIN), calib_n=n))
    return out


# the main AWARe row also belongs to every ablation group (it is their reference point)
_MAIN_LABEL = {"rule": "activation-global", "rho": "rho=0.3", "targets": "qkv+projector",
               "calibration": "upstream", "calib_size": "n={n_calib}"}


def run_variant(ctx: Context, v: Variant, task: str, seed: int, *, before: Mapping[str, float],
                saliency: Saliency | None = None, progress: bool = True,
                keep_model: bool = False, trainer=None) -> tuple[dict, dict]:
    """Fine-tune a fresh copy of the base on ``task``; return (row, info with masks [and model]).

    Reads ``ctx`` and writes nothing shared: ``before`` (upstream skills of the base) and
    ``saliency`` (the profile of the variant's calibration set, :func:`profile_calibrations`) are
    computed once beforehand and passed in. ``trainer``: a function with :func:`train`'s signature
    (default :func:`train`; several processes: :meth:`lab.experiments.aware.run.distributed.Session.train`)."""
    cfg = replace(v.train or ctx.size.train, seed=seed)
    model, info, log, train_s = fit(ctx.base, v.spec, cfg, ctx.down[task].train, ctx.enc, saliency=saliency,
                                    progress=progress, desc=f"{v.group}/{v.label}", trainer=trainer)
    spec = v.spec
    up = dict(before) if not lr_field(spec.method) and before else upstream(model, ctx)
    down = evaluate(model, ctx.down[task].test, ctx.enc, batch_size=ctx.size.eval_batch)["acc"]
    skills = [k for k in ("easy_vqa", "probe") if k in up]
    row = {"group": v.group, "variant": v.label, "method": spec.method, "seed": seed, "task": task,
           **table_columns(spec, *v.calib_key(ctx.size)),
           "downstream": down, **{f"up_{k}": up[k] for k in up},
           "R_easy_vqa": M.retention(before["easy_vqa"], up["easy_vqa"]),
           "R_probe": M.retention(before["probe"], up["probe"]) if "probe" in up else np.nan,
           "R": M.mean_retention({k: before[k] for k in skills}, {k: up[k] for k in skills}),
           "trainable": info["trainable"], "trainable_frac": info["trainable"] / info["total"],
           "lora_rank": info.get("lora_rank", 0), "steps": len(log["losses"]),
           "final_loss": float(np.mean(log["losses"][-4:])) if log["losses"] else np.nan,
           "step_s": float(np.median(log["step_seconds"])) if log["step_seconds"] else np.nan,
           "train_s": train_s}
    if keep_model:
        info["model"] = model
    return row, info


def add_efficiency(rows: list[dict]) -> list[dict]:
    """E and H need the full fine-tuning result of the same seed and task (new rows returned)."""
    ref = reference_method()
    full = {(r["seed"], r["task"]): r["downstream"] for r in rows if r["method"] == ref}
    out = []
    for r in rows:
        e = M.efficiency(r["downstream"], full.get((r["seed"], r["task"]), np.nan))
        out.append({**r, "E": e, "H": M.h_score(r["R"], e)})
    return out


def _save_saliency(run_dir: Path, key: tuple, sal: Saliency) -> None:
    from lab._io import save_tensors

    names = list(sal.scores)
    save_tensors(run_dir / f"saliency_{key[0]}_{key[1]}.safetensors",
                 {"matrix": sal.matrix(), **{f"layer/{n}": v for n, v in sal.scores.items()}},
                 {"layers": json.dumps(names), "n_samples": str(sal.n_samples), "seconds": f"{sal.seconds:.3f}"})


def _save_masks(run_dir: Path, label: str, masks: dict) -> None:
    from lab._io import save_tensors

    save_tensors(run_dir / f"masks_{label.replace('=', '').replace('+', '_')}.safetensors",
                 {n: m.to(torch.uint8) for n, m in masks.items()}, {"layers": json.dumps(list(masks))})


def _tidy(rows: list[dict], n_calib: int) -> list[dict]:
    """Repeat the main AWARe row inside every ablation group it is the reference of."""
    out = list(rows)
    for r in rows:
        if r["group"] == "methods" and r["variant"] == main_method():
            out += [{**r, "group": g, "variant": label.format(n_calib=n_calib), "shared": True}
                    for g, label in _MAIN_LABEL.items()]
    return out


def before_table(ctx: Context, before: Mapping[str, float]) -> list[dict]:
    """Upstream skills of the base model beside what a model that learned nothing would score."""
    return [{"skill": "easy_vqa", "acc": before["easy_vqa"], "reference": "majority answer",
             "reference_acc": ctx.easy.test.majority_rate(), "n": len(ctx.easy.test)},
            {"skill": "probe", "acc": before["probe"], "reference": "chance (4 options)",
             "reference_acc": ctx.probe.test.chance_rate(), "n": len(ctx.probe.test)},
            {"skill": "probe_em", "acc": before["probe_em"], "reference": "exact match of greedy answer",
             "reference_acc": np.nan, "n": len(ctx.probe.test)}]


def profile_calibrations(ctx: Context, chosen: list[Variant], *, targets: str = "qkv+projector+mlp",
                         progress: bool = True) -> dict[tuple[str, int], Saliency]:
    """``{(kind, n): Saliency}`` of the base model for every calibration set a variant's method
    needs (all targets hooked at once, so every target preset can select from the same profile)."""
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.profiling import calibration_batches

    needed = sorted({v.calib_key(ctx.size) for v in chosen if uses_saliency(v.spec)})
    return {key: profile(ctx.base, calibration_batches(ctx.calib[key], ctx.enc), targets=targets, progress=progress)
            for key in needed}


def overlap_rows(ctx: Context, saliency: Mapping[tuple[str, int], Saliency]) -> list[dict]:
    """Mask agreement at the main rho and targets: every calibration set, and every other rule,
    against the main upstream profile."""
    from lab.aware.targets import find_targets

    layers = find_targets(ctx.base, MAIN.targets)
    ref_key = ("upstream", ctx.size.n_calib)
    if ref_key not in saliency:
        return []
    ref = select({n: saliency[ref_key].scores[n] for n in layers}, MAIN.rho)
    out = []
    for key, sal in saliency.items():
        if key != ref_key:
            m = select({n: sal.scores[n] for n in layers}, MAIN.rho)
            out.append({"a": f"{ref_key[0]}-{ref_key[1]}", "b": f"{key[0]}-{key[1]}", **M.mask_overlap(ref, m)})
    zeros = {n: torch.zeros(l.out_features) for n, l in layers.items()}
    for rule in ("activation-balanced", "weight-norm", "random"):
        src = {n: saliency[ref_key].scores[n] for n in layers} if needs_saliency(rule) else zeros
        out.append({"a": f"activation-global/{ref_key[0]}-{ref_key[1]}", "b": rule,
                    **M.mask_overlap(ref, select(src, MAIN.rho, rule, weights=layers))})
    return out


def sweep(ctx: Context, *, seeds: tuple[int, ...] | None = None, groups: tuple[str, ...] | None = None,
          task: str = "fashion", run_dir: str | Path | None = None, continual_order: tuple[str, ...] | None = None,
          progress: bool = True, executor: str = "local", address: str | None = None) -> dict:
    """Run the sweep on a prepared :class:`Context`; returns ``{table name: DataFrame, 'run_dir': Path}``.
    ``executor``/``address``: where the variants run (:mod:`lab.executors`; ``ray``: one Ray task each).

    Steps, each feeding the next by value: upstream skills before fine-tuning; saliency of every
    calibration set the variants need; mask overlap; every variant x seed (:func:`run_variant`, one
    pure call each); the continual sequence."""
    import pandas as pd

    from lab import runs
    from lab._io import write_json, write_table
    from lab.aware.masking import composition
    from lab.experiments.aware.run.continual import ORDER, summarise

    size = ctx.size
    seeds = tuple(size.seeds if seeds is None else seeds)
    order = tuple(continual_order or ORDER)
    main = lambda v: v.group == "methods" and get_method(v.spec.method).role in ("reference", "method")  # noqa: E731
    chosen = [v for v in variants(size) if groups is None or v.group in groups or main(v)]
    needed = set(tasks_for(groups if size.continual_methods else (), task, order))
    if needed - set(ctx.down):
        raise ValueError(f"this context has no downstream task {sorted(needed - set(ctx.down))}; "
                         f"build it with setup(..., tasks_needed=...) (it has {sorted(ctx.down)})")
    run_dir = Path(run_dir) if run_dir else runs.new_run_dir("aware", f"ablate-{task}")
    timings, t_start = {"setup_s": ctx.info.get("setup_s", 0.0)}, time.perf_counter()

    t0 = time.perf_counter()
    before = upstream(ctx.base, ctx, exact=True)
    timings["before_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    saliency = profile_calibrations(ctx, chosen, progress=progress)
    for key, sal in saliency.items():
        _save_saliency(run_dir, key, sal)
    timings["profiling_s"] = time.perf_counter() - t0
    timings["profiling_s_per_sample"] = timings["profiling_s"] / max(1, sum(s.n_samples for s in saliency.values()))
    overlap = overlap_rows(ctx, saliency)

    rows, comp = [], []
    t0 = time.perf_counter()
    todo = [VariantRun(v, task, seed, keep_masks=seed == seeds[0], progress=progress) for seed in seeds for v in chosen]
    done = run_variants(ctx, todo, before=before, saliency=saliency, executor=executor, address=address,
                        results_dir=run_dir / "variants",
                        log=print if progress else None)     # one job per variant x seed; a rerun skips finished ones
    for r, (row, masks) in zip(todo, done):
        v, seed = r.variant, r.seed
        rows.append(row)
        if masks is not None:
            _save_masks(run_dir, f"{v.group}_{v.label}", masks)
            comp += [{"group": v.group, "variant": v.label, "kind": k, "frozen": a, "rows": b,
                      "frozen_frac": a / b} for k, (a, b) in composition(masks).items()]
        if progress:
            print(f"  {v.group:<12} {v.label:<20} seed {seed}: down {row['downstream']:.3f} "
                  f"R {row['R']:.1f} ({row['train_s']:.0f}s)", flush=True)
    rows = add_efficiency(rows)
    timings["variants_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    cont = []
    if size.continual_methods and (groups is None or "continual" in groups):   # one executor job per sequence
        seqs = [SequenceRun(m, seeds[0], order) for m in size.continual_methods]
        cont = [row for rows in run_sequences(ctx, seqs, executor=executor, address=address,
                                              results_dir=run_dir / "variants", log=print if progress else None)
                for row in rows]
    timings["continual_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start + timings["setup_s"]

    tables = {"results": pd.DataFrame(_tidy(rows, size.n_calib)), "upstream_before": pd.DataFrame(before_table(ctx, before)),
              "overlap": pd.DataFrame(overlap), "mask_composition": pd.DataFrame(comp), "continual": pd.DataFrame(cont),
              "continual_summary": pd.DataFrame(summarise(cont, order, before) if cont else [])}
    for name, df in tables.items():
        write_table(run_dir / name, df)
    write_json(run_dir / "config.json", {"size": asdict(size), "seeds": list(seeds), "task": task,
                                         "groups": list(groups) if groups else None, "continual_order": list(order),
                                         "main": MAIN.to_dict(), "timings": timings, "align": ctx.info.get("align"),
                                         "versions": runs.versions()})
    return {**tables, "run_dir": run_dir, "timings": timings}


def summary(results, by: tuple[str, ...] = ("group", "variant")):
    """Mean over seeds of the headline columns, in sweep order."""
    cols = ["downstream", "up_easy_vqa", "up_probe", "R", "E", "H", "trainable_frac"]
    g = results.groupby(list(by), sort=False)[cols].mean()
    g["seeds"] = results.groupby(list(by), sort=False)["seed"].nunique()
    return g.reset_index()


def run(size: str | Size = "default", *, seeds=None, groups=None, task: str = "fashion", run_dir=None,
        cache_dir=None, device: str | None = None, progress: bool = True) -> dict:
    """Set up and sweep: the whole ablation of the offline default in one call."""
    ctx = setup(size, progress=progress, cache_dir=cache_dir, device=device)
    return sweep(ctx, seeds=seeds, groups=groups, task=task, run_dir=run_dir, progress=progress)


@dataclass(frozen=True)
class VariantRun:
    """One job of a sweep: fine-tune ``variant`` on ``task`` with ``seed``."""

    variant: Variant
    task: str
    seed: int
    keep_masks: bool = False     # return the selection masks (the sweep saves the first seed's)
    progress: bool = False       # progress bars inside the run (local executor only)


def run_one(r: VariantRun, ctx, before: Mapping[str, float], saliency: Mapping) -> dict:
    """The job: :func:`lab.experiments.aware.run.ablate.run_variant` on a fresh copy of the base. Torch's
    global generator is seeded first (LoRA/DoRA draw their initial matrices from it), so a variant's
    numbers do not depend on what ran before it in the process: the same under either executor, and
    after a resume."""
    torch.manual_seed(r.seed)
    row, info = run_variant(ctx, r.variant, r.task, r.seed, before=before,
                            saliency=saliency.get(r.variant.calib_key(ctx.size)), progress=r.progress)
    out = {"row": row}
    if r.keep_masks and "masks" in info:
        out["masks"] = {n: "".join("1" if x else "0" for x in m.tolist()) for n, m in info["masks"].items()}
    return out


def run_variants(ctx, runs: list[VariantRun], *, before: Mapping[str, float], saliency: Mapping,
                 executor: str = "local", address: str | None = None, results_dir=None,
                 log=None) -> list[tuple[dict, dict | None]]:
    """``(row, masks or None)`` per run, in ``runs`` order."""
    from lab import executors

    device = str(next(ctx.base.parameters()).device)
    size = asdict(ctx.size)
    jobs = []
    for r in runs:
        r = replace(r, progress=r.progress and executor == "local")
        ident = {"run": {**asdict(r), "progress": None}, "size": size}
        jobs.append(executors.Job(executors.key(f"{r.variant.group}-{r.variant.label}-{r.task}-s{r.seed}", ident),
                                  run_one, r, **executors.resources(device)))
    results = executors.run(jobs, executor=executor, address=address, shared=(ctx, dict(before), dict(saliency)),
                            results_dir=results_dir, log=log)
    return [(res["row"], {n: torch.tensor([c == "1" for c in m]) for n, m in res["masks"].items()}
             if "masks" in res else None) for res in results]


@dataclass(frozen=True)
class SequenceRun:
    """One job of a sweep's continual sequence: ``method`` through ``order`` with ``seed``."""

    method: str
    seed: int
    order: tuple[str, ...]


def run_sequence_one(r: SequenceRun, ctx) -> list[dict]:
    """The job: :func:`lab.experiments.aware.run.continual.run_sequence` on a fresh copy of the base."""
    from lab.experiments.aware.run.continual import run_sequence

    torch.manual_seed(r.seed)
    return run_sequence(ctx, r.method, r.seed, order=r.order, aware=MAIN, progress=False)


def run_sequences(ctx, seqs: list[SequenceRun], *, executor: str = "local", address: str | None = None,
                  results_dir=None, log=None) -> list[list[dict]]:
    """Each sequence's rows, in ``seqs`` order, through :func:`lab.executors.run` (finished ones skipped)."""
    from lab import executors

    device = str(next(ctx.base.parameters()).device)
    size = asdict(ctx.size)
    jobs = [executors.Job(executors.key(f"continual-{r.method}-s{r.seed}", {"run": asdict(r), "size": size}),
                          run_sequence_one, r, **executors.resources(device)) for r in seqs]
    return executors.run(jobs, executor=executor, address=address, shared=(ctx,), results_dir=results_dir, log=log)
