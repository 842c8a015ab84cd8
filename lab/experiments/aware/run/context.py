"""The shared, read-only inputs of every AWARe experiment: how big (:class:`Size`), and what is
built once (:class:`Context`: the aligned mini-LLaVA, its chat encoder, the upstream and downstream
tasks, the calibration sets). :func:`setup` is the one way to build it (docs/aware.md, "The offline miniature").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import torch

from lab.aware.config import AwareConfig
from lab.aware.methods import main_method, reference_method
from lab.aware.methods import method_names
from lab.experiments.aware.run.finetune import TrainConfig
from lab.experiments.aware.run.tasks import QASet, Task
from lab.experiments.aware.run.upstream import AlignConfig


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
    methods: tuple[str, ...] = field(default_factory=method_names)   # registered ones; full and aware always run
    rules: tuple[str, ...] = ("activation-balanced", "weight-norm", "random")   # vs activation-global
    n_calib: int = 200
    calib_sizes: tuple[int, ...] = (16, 64)
    rhos: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
    seeds: tuple[int, ...] = (0,)
    continual_steps: int = 16      # training steps per continual stage
    n_continual_eval: int = 60
    continual_calib: int = 64      # upstream calibration samples AWARe re-profiles on before each stage
    continual_methods: tuple[str, ...] = (reference_method(), main_method())   # full fine-tuning, AWARe
    exact: bool = False            # greedy exact match on the probe after every run (slower)
    grid: int = 2                  # visual tokens per side
    eval_batch: int = 50


SIZES = {
    "smoke": Size(n_align=64, align=AlignConfig(steps=2, batch_size=4), n_easy_eval=16, n_probe=16, n_train=32, n_eval=16,
                  train=TrainConfig(steps=2, batch_size=4), n_calib=8, calib_sizes=(4,), rhos=(0.0, 0.3),
                  continual_steps=1, n_continual_eval=8, eval_batch=16),
    "default": Size(),
    "large": Size(n_align=12000, align=AlignConfig(steps=1200, batch_size=32), n_easy_eval=1000, n_train=3000,
                  n_eval=1000, train=TrainConfig(steps=200, batch_size=16), seeds=(0, 1, 2),
                  continual_steps=150, n_continual_eval=500, continual_methods=(reference_method(), "lora", main_method()),
                  exact=True),
}
MAIN = AwareConfig(rho=0.3, rule="activation-global", targets="qkv+projector")


@dataclass(frozen=True)
class Context:
    """Everything built once per sweep, read-only afterwards (runs copy ``base`` before training)."""

    base: torch.nn.Module
    enc: object
    easy: Task
    probe: Task | None                                      # None: easy-VQA is the only upstream skill
    down: Mapping[str, Task]
    size: Size
    calib: Mapping[tuple[str, int], QASet] = field(default_factory=dict)   # (kind, n) -> QASet
    info: Mapping = field(default_factory=dict)


def upstream(model, ctx: Context, *, exact: bool | None = None) -> dict:
    """Upstream skills of ``model`` on the sweep's fixed evaluation questions (probe None: easy-VQA only)."""
    from lab.experiments.aware.run.upstream import upstream_skills

    return upstream_skills(model, ctx.enc, ctx.easy, ctx.probe, batch_size=ctx.size.eval_batch,
                           exact=ctx.size.exact if exact is None else exact)


def setup(size: Size | str, *, tiny: bool = False, downstream: bool = True, tasks_needed=None,
          cache_dir=None, device: str | None = None, progress: bool = True, model: str | None = None,
          dtype: str | None = None) -> Context:
    """Build (or load from cache) the aligned mini-LLaVA, the tasks and the calibration sets.

    ``size``: a :class:`Size` or preset name. ``tiny=True`` swaps SmolLM2 for a randomly initialised
    2-layer Llama with a word-level tokenizer over every word the tasks use (seconds; numbers are
    meaningless, code paths are the real ones) and sets torch to one thread. ``downstream=False``
    builds no downstream task (saliency only; the alignment pool's visual tokens are then computed
    only for the rows read, :class:`~lab.experiments.aware.run.minillava.LazyTokens`); ``tasks_needed``
    limits the ones built (default: all; each costs a visual-token pass when not cached, see :func:`lab.experiments.aware.run.ablate.tasks_for`). ``device``: where the
    model runs (default: CUDA when available, else CPU). ``model``: a transformers LLaVA (hub id or
    local folder, :mod:`lab.experiments.aware.run.hub_llava`) instead of the mini-LLaVA, in ``dtype``
    (bf16, fp16, fp32; default bf16 on CUDA); its tasks keep raw images for its processor
    (``info['vision']``, for task sets built later). For the mini-LLaVA ``dtype`` (default float32)
    casts the aligned model after its cached float32 alignment."""
    from lab.experiments.aware.run import tasks
    from lab.experiments.aware.run.upstream import build_base

    size = SIZES[size] if isinstance(size, str) else size
    if tiny:
        # a 32-wide model gains nothing from intra-op threads, and on a busy machine they cost
        # (smoke runs measured 2-3x slower with 2 threads under load)
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    kw = dict(grid=size.grid, cache_dir=cache_dir, progress=progress)
    hub = None
    if model is not None and not tiny:   # first: a checkpoint that cannot load fails before any data
        from lab.experiments.aware.run import hub_llava

        hub = hub_llava.load(model, device=device, dtype=dtype, progress=progress)
        kw["vision"] = hub_llava.raw_images
    probe = tasks.probe()    # first: a damaged packaged file fails in a second, naming itself
    # saliency only: the alignment pool's tokens are read for its calibration rows alone (and for
    # the alignment, where the projector is not cached yet), so they are computed as they are read
    easy = tasks.easy_vqa(n_train=size.n_align, n_test=size.n_easy_eval, lazy_train=not downstream, **kw)
    wanted = tasks.DOWNSTREAM if tasks_needed is None else tuple(dict.fromkeys(tasks_needed))
    unknown = set(wanted) - set(tasks.DOWNSTREAM)
    if unknown:
        raise ValueError(f"unknown downstream tasks {sorted(unknown)}; choose from {list(tasks.DOWNSTREAM)}")
    if hub is not None:
        (base, enc), align = hub, {"model": model, "dtype": str(next(hub[0].parameters()).dtype)}
    elif not tiny:   # the real model first: its alignment is the slow, cached step
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        base, enc, align = build_base(easy, size.align, grid=size.grid, cache_dir=cache_dir, progress=progress,
                                      device=device)
    down = {t: tasks.downstream(t, n_train=size.n_train, n_test=size.n_eval, **kw) for t in wanted} if downstream else {}
    probe.test = probe.test.subset(range(min(size.n_probe, len(probe.test))))
    # nested upstream calibration sets: the first n of the same n_calib samples
    full = tasks.calibration("upstream", size.n_calib, upstream=easy)
    calib = {("upstream", n): full.subset(range(min(n, len(full)))) for n in {size.n_calib, *size.calib_sizes}}
    calib[("proxy", size.n_calib)] = tasks.calibration("proxy", size.n_calib, **kw)
    if tiny:
        from lab.experiments.aware.run.tiny import tiny_llama, tiny_tokenizer

        sets = [easy.train, easy.test, probe.test, calib[("proxy", size.n_calib)]]
        sets += [s for d in down.values() for s in (d.train, d.test)]
        tok = tiny_tokenizer(w for qa in sets for w in [*qa.questions, *qa.answers, *(o for opts in qa.options for o in opts)])
        base, enc, align = build_base(easy, size.align, grid=size.grid, cache_dir=cache_dir, progress=progress,
                                      language_model=(tok, tiny_llama(len(tok))))
    if dtype is not None and hub is None:     # aligned (and cached) in float32; trained and scored in ``dtype``
        from lab.experiments.aware.run.hub_llava import dtype_of

        base = base.to(dtype_of(dtype, device or "cpu"))
        align = {**align, "dtype": str(next(base.parameters()).dtype)}
    info = {"align": align, **({"tiny": True} if tiny else {}), **({"vision": kw["vision"]} if hub is not None else {}),
            "setup_s": time.perf_counter() - t0}
    return Context(base, enc, easy, probe, down, size, calib, info)
