"""Profiling the mini-LLaVA's calibration sets with :func:`lab.aware.saliency.profile`: the batches
(prompts with answers, as the reference), several sets at once, and nested sets (the first n of
one set, for every n) at the cost of profiling the largest once (docs/aware.md, "Phase 1").
"""
from __future__ import annotations

import torch
from torch import Tensor

from lab.aware.saliency import Saliency, profile
from lab.experiments.aware.run.finetune import iterate
from lab.experiments.aware.run.scoring import model_inputs
from lab.experiments.aware.run.tasks import QASet


def calibration_batches(qa: QASet, enc, batch_size: int = 8) -> list[dict]:
    """Calibration batches: prompts *with* answers (as the reference), logits for one position only."""
    return [{**model_inputs(b), "logits_to_keep": 1} for b in iterate(qa, enc, batch_size, answers=True)]


def profile_sets(ctx, keys=None, *, targets: str = "qkv+projector+mlp", progress: bool = True) -> dict:
    """``{(kind, n): Saliency}`` for every calibration set in ``ctx.calib`` (or ``keys``), as the
    ablation runner profiles them (prompts with answers, all targets hooked at once)."""
    # the main set (largest upstream) first: it is the reference everything else is compared with
    keys = sorted(ctx.calib, key=lambda k: (k[0] != "upstream", -k[1])) if keys is None else list(keys)
    out = {}
    for k in keys:
        batches = calibration_batches(ctx.calib[k], ctx.enc)
        out[k] = profile(ctx.base, batches, targets=targets, total=len(batches), progress=progress)
    return out


def profile_nested(ctx, sizes, kind: str = "upstream", *, targets: str = "qkv+projector+mlp",
                   progress: bool = True) -> dict:
    """``{(kind, n): Saliency}`` for the first ``n`` samples of the largest ``kind`` set, for every
    ``n`` in ``sizes``, at the cost of profiling the largest set once.

    Saliency is a mean over samples, so the profile of the first ``n`` samples is the count-weighted
    mean of the profiles of consecutive chunks. Matches :func:`profile_sets` on the nested sets that
    :func:`setup` builds (``ctx.calib[(kind, n)]`` = the first ``n`` of the largest)."""
    full = max((k for k in ctx.calib if k[0] == kind), key=lambda k: k[1])
    qa = ctx.calib[full]
    bounds = sorted({min(int(n), len(qa)) for n in sizes if int(n) >= 1} | {len(qa)})
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    seconds, start, out = 0.0, 0, {}
    for end in bounds:
        if end > start:
            batches = calibration_batches(qa.subset(range(start, end)), ctx.enc)
            s = profile(ctx.base, batches, targets=targets, total=len(batches), progress=progress)
            for n, v in s.scores.items():
                c = s.meta["counts"][n]
                sums[n] = sums.get(n, torch.zeros_like(v, dtype=torch.float64)) + c * v.double()
                counts[n] = counts.get(n, 0) + c
            seconds += s.seconds
            start = end
        key = full if end == len(qa) else (kind, end)     # every bound is a requested size or the whole set
        out[key] = Saliency({n: (sums[n] / max(counts[n], 1)).float() for n in sums}, end, seconds,
                            meta={"counts": dict(counts), "nested_in": label(full)})
    return dict(sorted(out.items(), key=lambda kv: -kv[0][1]))


def label(key) -> str:
    """``('upstream', 200)`` -> ``'upstream-200'``."""
    return f"{key[0]}-{key[1]}" if isinstance(key, tuple) else str(key)
