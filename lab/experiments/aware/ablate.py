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

import copy
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from lab.aware import metrics as M
from lab.aware.config import AwareConfig, check_rho
from lab.aware.finetune import MethodSpec, TrainConfig, evaluate, finish, prepare, train
from lab.aware.saliency import Saliency, profile
from lab.aware.tasks import Task
from lab.aware.upstream import AlignConfig


@dataclass(frozen=True)
class Size:
    """How big every part of the sweep is. ``default``, one seed, measured on 2 idle CPU cores:
    ~22 min (18 runs of 24 steps ~16 min, of which evaluation ~19 s per run; continual sequence
    ~4 min; profiling ~1 min); each extra seed adds ~16 min (3 seeds: 55 min, measured). The
    learning rates (``TrainConfig``) were chosen on validation questions at the default's 24 steps
    x 8; at another size, choose them again first: ``lab aware tune --size large``."""

    n_align: int = 4000            # easy-VQA train questions for projector alignment
    align: AlignConfig = AlignConfig()
    n_easy_eval: int = 100         # easy-VQA test questions (fixed subset)
    n_probe: int = 100             # general-knowledge probe questions (all 100 by default)
    n_train: int = 1000            # downstream train pool per task
    n_eval: int = 100              # downstream test questions per task (fixed subset)
    train: TrainConfig = TrainConfig(steps=24, batch_size=8)
    methods: tuple[str, ...] = ("zero-shot", "full", "lora", "dora", "aware")  # full and aware always run
    rules: tuple[str, ...] = ("activation-balanced", "weight-norm", "random")   # vs activation-global
    n_calib: int = 200
    calib_sizes: tuple[int, ...] = (16, 64)
    rhos: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
    seeds: tuple[int, ...] = (0,)
    continual_steps: int = 16      # training steps per continual stage
    n_continual_eval: int = 60
    continual_calib: int = 64      # upstream calibration samples AWARe re-profiles on before each stage
    continual_methods: tuple[str, ...] = ("full", "aware")
    exact: bool = False            # greedy exact match on the probe after every run (slower)
    grid: int = 2                  # visual tokens per side
    eval_batch: int = 50


SIZES = {
    "smoke": Size(n_align=64, align=AlignConfig(steps=2, batch_size=4), n_easy_eval=16, n_probe=16, n_train=32, n_eval=16,
                  train=TrainConfig(steps=2, batch_size=4), n_calib=8, calib_sizes=(4,), rhos=(0.0, 0.3),
                  continual_steps=1, n_continual_eval=8, eval_batch=16),
    "default": Size(),
    "large": Size(n_align=20000, align=AlignConfig(steps=1200, batch_size=32), n_easy_eval=1000, n_train=4000,
                  n_eval=1000, train=TrainConfig(steps=200, batch_size=16), seeds=(0, 1, 2),
                  continual_steps=150, n_continual_eval=500, continual_methods=("full", "lora", "aware"),
                  exact=True),
}
MAIN = AwareConfig(rho=0.3, rule="activation-global", targets="qkv+projector")
METHODS = ("zero-shot", "full", "lora", "dora", "aware")


def tasks_for(groups, task: str, order: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The downstream tasks a sweep of ``groups`` (None: all) on ``task`` needs: the continual
    sequence needs every task of its ``order``."""
    from lab.aware.continual import ORDER

    seq = tuple(order or ORDER) if groups is None or "continual" in groups else ()
    return tuple(dict.fromkeys([task, *seq]))


@dataclass(frozen=True)
class Variant:
    group: str
    label: str
    spec: MethodSpec
    calib: str = "upstream"
    calib_n: int | None = None      # None: Size.n_calib


def variants(size: Size) -> list[Variant]:
    """The sweep, main AWARe first after the baselines (it is shared by every ablation group)."""
    unknown = set(size.methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {list(METHODS)}")
    out = [Variant("methods", m, MethodSpec(m, MAIN)) for m in METHODS[:-1]
           if m in size.methods or m == "full"]          # E is relative to full fine-tuning
    out.append(Variant("methods", "aware", MethodSpec("aware", MAIN)))
    for rule in size.rules:
        out.append(Variant("rule", rule, MethodSpec("aware", replace(MAIN, rule=rule))))
    for rho in size.rhos:
        if rho != MAIN.rho:
            out.append(Variant("rho", f"rho={check_rho(rho):g}", MethodSpec("aware", replace(MAIN, rho=rho))))
    for tg in ("qkv", "qkv+projector+mlp"):
        out.append(Variant("targets", tg, MethodSpec("aware", replace(MAIN, targets=tg))))
    out.append(Variant("calibration", "proxy", MethodSpec("aware", MAIN), calib="proxy"))
    for n in size.calib_sizes:
        out.append(Variant("calib_size", f"n={n}", MethodSpec("aware", MAIN), calib_n=n))
    return out


# the main AWARe row also belongs to every ablation group (it is their reference point)
_MAIN_LABEL = {"rule": "activation-global", "rho": "rho=0.3", "targets": "qkv+projector",
               "calibration": "upstream", "calib_size": "n={n_calib}"}


@dataclass
class Context:
    """Everything built once per sweep."""

    base: torch.nn.Module
    enc: object
    easy: Task
    probe: Task
    down: dict[str, Task]
    size: Size
    before: dict = field(default_factory=dict)       # upstream skills of the base model
    calib: dict = field(default_factory=dict)        # (kind, n) -> QASet
    saliency: dict = field(default_factory=dict)     # (kind, n) -> Saliency
    info: dict = field(default_factory=dict)

    def upstream(self, model, *, exact: bool | None = None) -> dict:
        """Upstream skills of ``model`` on the sweep's fixed evaluation questions."""
        from lab.aware.upstream import upstream_skills

        return upstream_skills(model, self.enc, self.easy, self.probe, batch_size=self.size.eval_batch,
                               exact=self.size.exact if exact is None else exact)   # probe None: easy-VQA only


def upstream(model, ctx: Context, *, exact: bool | None = None) -> dict:
    """Upstream skills of ``model`` on the sweep's fixed evaluation questions (:meth:`Context.upstream`)."""
    return ctx.upstream(model, exact=exact)


def run_variant(ctx: Context, v: Variant, task: str, seed: int, progress: bool, *,
                keep_model: bool = False) -> tuple[dict, dict]:
    """Fine-tune a fresh copy of the base on ``task``; return (row, info with masks [and model])."""
    cfg = replace(ctx.size.train, seed=seed)
    spec = v.spec if v.spec.aware.rule != "random" else replace(v.spec, aware=replace(v.spec.aware, seed=seed))
    model = copy.deepcopy(ctx.base)
    sal = ctx.saliency.get((v.calib, v.calib_n or ctx.size.n_calib))
    t0 = time.perf_counter()
    model, groups, info = prepare(model, spec, cfg, saliency=sal)
    log = train(model, groups, ctx.down[task].train, ctx.enc, cfg, progress=progress, desc=f"{v.group}/{v.label}")
    train_s = time.perf_counter() - t0
    model = finish(model)
    up = dict(ctx.before) if spec.method == "zero-shot" and ctx.before else upstream(model, ctx)
    down = evaluate(model, ctx.down[task].test, ctx.enc, batch_size=ctx.size.eval_batch)["acc"]
    skills = [k for k in ("easy_vqa", "probe") if k in up]
    row = {"group": v.group, "variant": v.label, "method": spec.method, "seed": seed, "task": task,
           "rho": spec.aware.rho if spec.method == "aware" else np.nan, "rule": spec.aware.rule if spec.method == "aware" else "",
           "targets": spec.aware.targets if spec.method != "full" else "all", "calib": v.calib if spec.method == "aware" else "",
           "calib_n": (v.calib_n or ctx.size.n_calib) if spec.method == "aware" else 0,
           "downstream": down, **{f"up_{k}": up[k] for k in up},
           "R_easy_vqa": M.retention(ctx.before["easy_vqa"], up["easy_vqa"]),
           "R_probe": M.retention(ctx.before["probe"], up["probe"]) if "probe" in up else np.nan,
           "R": M.mean_retention({k: ctx.before[k] for k in skills}, {k: up[k] for k in skills}),
           "trainable": info["trainable"], "trainable_frac": info["trainable"] / info["total"],
           "lora_rank": info.get("lora_rank", 0), "steps": len(log["losses"]),
           "final_loss": float(np.mean(log["losses"][-4:])) if log["losses"] else np.nan,
           "step_s": float(np.median(log["step_seconds"])) if log["step_seconds"] else np.nan,
           "train_s": train_s}
    if keep_model:
        info["model"] = model
    return row, info


def add_efficiency(rows: list[dict]) -> None:
    """E and H need the full fine-tuning result of the same seed and task."""
    full = {(r["seed"], r["task"]): r["downstream"] for r in rows if r["method"] == "full"}
    for r in rows:
        r["E"] = M.efficiency(r["downstream"], full.get((r["seed"], r["task"]), np.nan))
        r["H"] = M.h_score(r["R"], r["E"])


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


def setup(size: Size, *, progress: bool = True, cache_dir=None, device: str | None = None,
          tasks_needed: tuple[str, ...] | None = None) -> Context:
    """Build (or load from cache) the aligned mini-LLaVA, the tasks and the calibration sets.
    ``device``: where the model runs (default: CUDA when available, else CPU). ``tasks_needed``:
    the downstream tasks to build (default: all; each costs a visual-token pass when not cached)."""
    from lab.aware import tasks
    from lab.aware.upstream import build_base

    t0 = time.perf_counter()
    kw = dict(grid=size.grid, cache_dir=cache_dir, progress=progress)
    easy = tasks.easy_vqa(n_train=size.n_align, n_test=size.n_easy_eval, **kw)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    base, enc, info = build_base(easy, size.align, grid=size.grid, cache_dir=cache_dir, progress=progress,
                                 device=device)
    wanted = tasks.DOWNSTREAM if tasks_needed is None else tuple(dict.fromkeys(tasks_needed))
    unknown = set(wanted) - set(tasks.DOWNSTREAM)
    if unknown:
        raise ValueError(f"unknown downstream tasks {sorted(unknown)}; choose from {list(tasks.DOWNSTREAM)}")
    down = {t: tasks.downstream(t, n_train=size.n_train, n_test=size.n_eval, **kw) for t in wanted}
    probe = tasks.probe()
    probe.test = probe.test.subset(range(min(size.n_probe, len(probe.test))))
    ctx = Context(base, enc, easy, probe, down, size, info={"align": info})
    # nested upstream calibration sets: the first n of the same n_calib samples
    full = tasks.calibration("upstream", size.n_calib, upstream=easy)
    for n in {size.n_calib, *size.calib_sizes}:
        ctx.calib[("upstream", n)] = full.subset(range(min(n, len(full))))
    ctx.calib[("proxy", size.n_calib)] = tasks.calibration("proxy", size.n_calib, **kw)
    ctx.info["setup_s"] = time.perf_counter() - t0
    return ctx


def _tidy(rows: list[dict], n_calib: int) -> list[dict]:
    """Repeat the main AWARe row inside every ablation group it is the reference of."""
    out = list(rows)
    for r in rows:
        if r["group"] == "methods" and r["variant"] == "aware":
            out += [{**r, "group": g, "variant": label.format(n_calib=n_calib), "shared": True}
                    for g, label in _MAIN_LABEL.items()]
    return out


def sweep(ctx: Context, *, seeds: tuple[int, ...] | None = None, groups: tuple[str, ...] | None = None,
          task: str = "fashion", run_dir: str | Path | None = None, continual_order: tuple[str, ...] | None = None,
          progress: bool = True) -> dict:
    """Run the sweep on a prepared :class:`Context`; returns ``{table name: DataFrame, 'run_dir': Path}``."""
    import pandas as pd

    from lab import runs
    from lab._io import write_json, write_table
    from lab.aware.continual import ORDER, run_sequence, summarise
    from lab.aware.masking import select
    from lab.aware.targets import find_targets

    size = ctx.size
    seeds = tuple(size.seeds if seeds is None else seeds)
    order = tuple(continual_order or ORDER)
    chosen = [v for v in variants(size) if groups is None or v.group in groups or v.label in ("full", "aware")]
    needed = set(tasks_for(groups if size.continual_methods else (), task, order))
    if needed - set(ctx.down):
        raise ValueError(f"this context has no downstream task {sorted(needed - set(ctx.down))}; "
                         f"build it with setup(..., tasks_needed=...) (it has {sorted(ctx.down)})")
    run_dir = Path(run_dir) if run_dir else runs.new_run_dir("aware", f"ablate-{task}")
    timings, t_start = {"setup_s": ctx.info.get("setup_s", 0.0)}, time.perf_counter()

    # 1. upstream skills before any fine-tuning, and whether they were learned at all
    t0 = time.perf_counter()
    ctx.before = upstream(ctx.base, ctx, exact=True)
    before = [{"skill": "easy_vqa", "acc": ctx.before["easy_vqa"], "reference": "majority answer",
               "reference_acc": ctx.easy.test.majority_rate(), "n": len(ctx.easy.test)},
              {"skill": "probe", "acc": ctx.before["probe"], "reference": "chance (4 options)",
               "reference_acc": ctx.probe.test.chance_rate(), "n": len(ctx.probe.test)},
              {"skill": "probe_em", "acc": ctx.before["probe_em"], "reference": "exact match of greedy answer",
               "reference_acc": np.nan, "n": len(ctx.probe.test)}]
    timings["before_s"] = time.perf_counter() - t0

    # 2. saliency for every calibration set an activation rule needs (all targets hooked at once)
    t0 = time.perf_counter()
    needed = {(v.calib, v.calib_n or size.n_calib) for v in chosen
              if v.spec.method == "aware" and v.spec.aware.rule.startswith("activation")}
    for key in sorted(needed):
        from lab.aware.continual import calibration_batches

        ctx.saliency[key] = profile(ctx.base, calibration_batches(ctx.calib[key], ctx.enc),
                                    targets="qkv+projector+mlp", progress=progress)
        _save_saliency(run_dir, key, ctx.saliency[key])
    timings["profiling_s"] = time.perf_counter() - t0
    timings["profiling_s_per_sample"] = timings["profiling_s"] / max(1, sum(s.n_samples for s in ctx.saliency.values()))

    # 3. mask overlap between calibration sets / rules (main rho and targets)
    layers = find_targets(ctx.base, MAIN.targets)
    ref_key = ("upstream", size.n_calib)
    overlap = []
    if ref_key in ctx.saliency:
        ref = select({n: ctx.saliency[ref_key].scores[n] for n in layers}, MAIN.rho)
        for key, sal in ctx.saliency.items():
            if key != ref_key:
                m = select({n: sal.scores[n] for n in layers}, MAIN.rho)
                overlap.append({"a": f"{ref_key[0]}-{ref_key[1]}", "b": f"{key[0]}-{key[1]}", **M.mask_overlap(ref, m)})
        zeros = {n: torch.zeros(l.out_features) for n, l in layers.items()}
        for rule in ("activation-balanced", "weight-norm", "random"):
            src = {n: ctx.saliency[ref_key].scores[n] for n in layers} if rule.startswith("activation") else zeros
            overlap.append({"a": f"activation-global/{ref_key[0]}-{ref_key[1]}", "b": rule,
                            **M.mask_overlap(ref, select(src, MAIN.rho, rule, weights=layers))})

    # 4. every variant x seed
    from lab.aware.masking import composition

    rows, comp = [], []
    t0 = time.perf_counter()
    for seed in seeds:
        for v in chosen:
            row, info = run_variant(ctx, v, task, seed, progress)
            rows.append(row)
            if seed == seeds[0] and "masks" in info:
                _save_masks(run_dir, f"{v.group}_{v.label}", info["masks"])
                comp += [{"group": v.group, "variant": v.label, "kind": k, "frozen": a, "rows": b,
                          "frozen_frac": a / b} for k, (a, b) in composition(info["masks"]).items()]
            if progress:
                print(f"  {v.group:<12} {v.label:<20} seed {seed}: down {row['downstream']:.3f} "
                      f"R {row['R']:.1f} ({row['train_s']:.0f}s)", flush=True)
    add_efficiency(rows)
    timings["variants_s"] = time.perf_counter() - t0

    # 5. continual sequence
    t0 = time.perf_counter()
    cont = []
    if size.continual_methods and (groups is None or "continual" in groups):
        for method in size.continual_methods:
            cont += run_sequence(ctx, method, seeds[0], order=order, aware=MAIN, progress=progress)
    timings["continual_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start + timings["setup_s"]

    tables = {"results": pd.DataFrame(_tidy(rows, size.n_calib)), "upstream_before": pd.DataFrame(before),
              "overlap": pd.DataFrame(overlap), "mask_composition": pd.DataFrame(comp), "continual": pd.DataFrame(cont),
              "continual_summary": pd.DataFrame(summarise(cont, order, ctx.before) if cont else [])}
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
    size = SIZES[size] if isinstance(size, str) else size
    ctx = setup(size, progress=progress, cache_dir=cache_dir, device=device)
    return sweep(ctx, seeds=seeds, groups=groups, task=task, run_dir=run_dir, progress=progress)
