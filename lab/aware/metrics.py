"""AWARe's evaluation numbers as pure functions (docs/aware.md, "Metrics").

- R, retention: upstream performance after fine-tuning relative to before (percent).
- E, efficiency: downstream performance relative to full fine-tuning (percent).
- H = 2RE / (R + E).
- Continual sequence: ``acc[i][j]`` = accuracy on task ``j`` after training stage ``i``
  (``j <= i`` are the tasks seen so far), fractions in [0, 1]; per-stage averages, last-stage
  average and BWT are the shared definitions of :mod:`lab.metrics` (BWT is NaN for one stage).
- Mask overlap between two selections (e.g. from different calibration sets).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import math

from lab import metrics as shared


def retention(before: float, after: float) -> float:
    """R = 100 * after / before. ``nan`` when the skill was absent before (before <= 0)."""
    return 100.0 * after / before if before > 0 else math.nan


def efficiency(method: float, full_finetune: float) -> float:
    """E = 100 * downstream(method) / downstream(full fine-tuning)."""
    return 100.0 * method / full_finetune if full_finetune > 0 else math.nan


def h_score(r: float, e: float) -> float:
    """Harmonic mean H = 2RE / (R + E); 0 when both are 0."""
    if math.isnan(r) or math.isnan(e):
        return math.nan
    return 2.0 * r * e / (r + e) if (r + e) > 0 else 0.0


def mean_retention(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """R over several upstream skills: the mean of the per-skill retentions."""
    vals = [retention(before[k], after[k]) for k in before]
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def stage_averages(acc: Sequence[Sequence[float]]) -> list[float]:
    """Average accuracy over the tasks seen so far, after every stage."""
    return [float(a) for a in shared.stage_averages(shared.from_stage_rows(acc))]


def average_over_stages(acc: Sequence[Sequence[float]]) -> float:
    """'Avg' of MLLM-DCL: mean of the per-stage averages."""
    return shared.average_incremental_accuracy(stage_averages(acc))


def last(acc: Sequence[Sequence[float]]) -> float:
    """'Last': average over all tasks after the final stage."""
    return stage_averages(acc)[-1]


def bwt(acc: Sequence[Sequence[float]]) -> float:
    """Backward transfer (:func:`lab.metrics.backward_transfer`); NaN for a single stage."""
    return shared.backward_transfer(shared.from_stage_rows(acc))


def mask_overlap(a: Mapping[str, "object"], b: Mapping[str, "object"]) -> dict[str, float]:
    """Agreement of two frozen-row selections ``{layer: BoolTensor}`` over their common layers.

    Returns ``jaccard`` = |A∩B| / |A∪B| and ``overlap`` = |A∩B| / min(|A|, |B|).
    """
    common = [k for k in a if k in b]
    if not common:
        raise ValueError("the two selections share no layer")
    inter = union = na = nb = 0
    for k in common:
        x, y = a[k].bool(), b[k].bool()
        inter += int((x & y).sum())
        union += int((x | y).sum())
        na, nb = na + int(x.sum()), nb + int(y.sum())
    return {"jaccard": inter / union if union else 1.0,
            "overlap": inter / min(na, nb) if min(na, nb) else 1.0}
