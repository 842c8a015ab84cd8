"""Continual-learning metrics on an accuracy matrix, shared by TOSCA and AWARe (pure functions).

One convention for both methods:

* accuracy matrix ``R [T, B]``: ``R[i, b]`` = accuracy on task ``i`` after training stage ``b``
  (rows = tasks, columns = stages; NaN where task ``i`` is not learned yet, ``i > b``). AWARe's
  stage-major lists ``acc[b][i]`` become this matrix through :func:`from_stage_rows`.
* unit: the functions are linear in the accuracies and return them in the matrix's own unit.
  :mod:`lab.tosca` stores percent (as PILOT); :mod:`lab.aware` stores fractions of questions
  answered correctly (its R/E/H are percent, computed from those fractions).
* undefined values are NaN, never 0: forgetting and backward transfer need at least two stages.

Definitions (``B`` stages, the last one ``B-1``):

* stage average ``a_b``: unweighted mean of ``R[i, b]`` over the tasks seen so far (MLLM-DCL's
  per-stage average); :func:`stage_accuracies` is the sample-weighted version (PILOT's
  ``accy['total']``).
* average incremental accuracy ``Ā = mean_b a_b`` (MLLM-DCL's "Avg"); last accuracy ``a_{B-1}``.
* forgetting (Chaudhry et al. 2018, "Riemannian Walk"): for each task but the last,
  ``max_{i<=b<B-1} R[i,b] - R[i,B-1]``, averaged.
* backward transfer (Lopez-Paz & Ranzato 2017, "Gradient Episodic Memory"):
  ``mean_{i<B-1} R[i,B-1] - R[i,i]`` (negative = forgetting).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def as_numpy(a) -> np.ndarray:
    """A tensor or array-like as a numpy array (tensors detached, on the CPU)."""
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def accuracy_matrix(columns) -> np.ndarray:
    """Stack per-stage columns (accuracy per task ``[T]``, NaN for unseen tasks) into ``R [T, B]``."""
    return np.stack([as_numpy(c) for c in columns], axis=1).astype(float)


def from_stage_rows(acc: Sequence[Sequence[float]]) -> np.ndarray:
    """``R [T, B]`` from stage-major rows ``acc[b]`` = accuracies on tasks ``0..b`` after stage ``b``."""
    B = len(acc)
    if B == 0:
        raise ValueError("empty accuracy matrix")
    R = np.full((B, B), np.nan)
    for b, row in enumerate(acc):
        if len(row) < b + 1:
            raise ValueError(f"stage {b} row must hold accuracies for tasks 0..{b}, got {len(row)}")
        R[: b + 1, b] = [float(v) for v in row[: b + 1]]
    return R


def stage_averages(matrix) -> np.ndarray:
    """Unweighted mean accuracy over the tasks seen so far, after every stage ``[B]``."""
    R = np.asarray(matrix, float)
    return np.asarray([float(np.mean(R[: b + 1, b])) for b in range(R.shape[1])])


def stage_accuracies(matrix, task_sizes) -> np.ndarray:
    """``A_b`` from the matrix and the number of test samples per task ``[T]`` (sample-weighted)."""
    R, n = np.asarray(matrix, float), np.asarray(task_sizes, float)
    out = []
    for b in range(R.shape[1]):
        seen = ~np.isnan(R[:, b])
        out.append(float((R[seen, b] * n[seen]).sum() / n[seen].sum()))
    return np.asarray(out)


def average_incremental_accuracy(a_b) -> float:
    """Ā = mean over stages of the per-stage accuracies ``a_b``."""
    return float(np.mean(as_numpy(a_b)))


def last_accuracy(a_b) -> float:
    """The per-stage accuracy after the last stage."""
    return float(as_numpy(a_b)[-1])


def forgetting(matrix) -> float:
    """Average forgetting over every task but the last (NaN with a single stage)."""
    R = np.asarray(matrix, float)
    B = R.shape[1]
    if B < 2:
        return float("nan")
    drops = [np.nanmax(R[i, i:B - 1]) - R[i, B - 1] for i in range(min(R.shape[0], B - 1))]
    return float(np.mean(drops))


def backward_transfer(matrix) -> float:
    """BWT = mean over tasks i < B-1 of ``R[i, B-1] - R[i, i]`` (NaN with a single stage)."""
    R = np.asarray(matrix, float)
    B = R.shape[1]
    if B < 2:
        return float("nan")
    return float(np.mean([R[i, B - 1] - R[i, i] for i in range(min(R.shape[0], B - 1))]))


def wilson_interval(accuracy: float, n: int, *, percent: bool = False, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of an accuracy measured once on ``n`` independent test items
    (one run, one seed: the interval covers the sampling of test items, not of seeds). In the
    accuracy's unit: a fraction, or percent with ``percent=True``."""
    scale = 100.0 if percent else 1.0
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive number of test items, got {n!r}")
    p = float(accuracy) / scale
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"accuracy must lie in [0, {scale:g}], got {accuracy!r}")
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return scale * max(0.0, centre - half), scale * min(1.0, centre + half)
