"""Class-incremental metrics (PILOT conventions), as pure functions on arrays. Accuracies in percent.

* accuracy matrix ``R [T, B]``: ``R[i, b]`` = accuracy on task i's test classes after stage b
  (NaN where task i is not learned yet, i > b).
* ``A_b``: accuracy after stage b on the test samples of every class seen so far (sample-weighted,
  as PILOT's ``accy['total']``); ``Ā = mean_b A_b``; ``A_B`` = the last one.
* forgetting (Chaudhry et al. 2018): for each task but the last, the best earlier accuracy minus the
  final one, ``max_{i<=b<B-1} R[i,b] - R[i,B-1]``, averaged.
* backward transfer (Lopez-Paz & Ranzato 2017): ``mean_{i<B-1} R[i,B-1] - R[i,i]`` (negative = forgetting).
"""
from __future__ import annotations

import numpy as np


def _np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def accuracy(preds, labels) -> float:
    """Percent of ``preds == labels``; NaN for no samples."""
    preds, labels = _np(preds), _np(labels)
    return float(100.0 * (preds == labels).mean()) if len(labels) else float("nan")


def task_accuracies(preds, labels, task_ids, num_tasks: int) -> np.ndarray:
    """One column of the accuracy matrix: accuracy per task ``[num_tasks]`` (NaN for absent tasks)."""
    preds, labels, task_ids = _np(preds), _np(labels), _np(task_ids)
    out = np.full(num_tasks, np.nan)
    for i in range(num_tasks):
        m = task_ids == i
        if m.any():
            out[i] = 100.0 * (preds[m] == labels[m]).mean()
    return out


def accuracy_matrix(columns) -> np.ndarray:
    """Stack per-stage columns (from :func:`task_accuracies`) into ``R [T, B]``."""
    return np.stack([_np(c) for c in columns], axis=1).astype(float)


def stage_accuracies(matrix, task_sizes) -> np.ndarray:
    """``A_b`` from the matrix and the number of test samples per task ``[T]`` (sample-weighted)."""
    R, n = np.asarray(matrix, float), np.asarray(task_sizes, float)
    out = []
    for b in range(R.shape[1]):
        seen = ~np.isnan(R[:, b])
        out.append(float((R[seen, b] * n[seen]).sum() / n[seen].sum()))
    return np.asarray(out)


def average_incremental_accuracy(a_b) -> float:
    """Ā = mean over stages of A_b."""
    return float(np.mean(_np(a_b)))


def last_accuracy(a_b) -> float:
    """A_B: accuracy on all classes after the last stage."""
    return float(_np(a_b)[-1])


def forgetting(matrix) -> float:
    """Average forgetting over every task but the last (NaN with a single stage)."""
    R = np.asarray(matrix, float)
    B = R.shape[1]
    if B < 2:
        return float("nan")
    drops = [np.nanmax(R[i, i:B - 1]) - R[i, B - 1] for i in range(min(R.shape[0], B - 1))]
    return float(np.mean(drops))


def backward_transfer(matrix) -> float:
    """BWT = mean over tasks i < B-1 of R[i, B-1] - R[i, i] (NaN with a single stage)."""
    R = np.asarray(matrix, float)
    B = R.shape[1]
    if B < 2:
        return float("nan")
    return float(np.mean([R[i, B - 1] - R[i, i] for i in range(min(R.shape[0], B - 1))]))


def summarize(matrix, a_b) -> dict[str, float]:
    """The headline numbers of one run under one routing."""
    return {"avg_inc_acc": average_incremental_accuracy(a_b), "last_acc": last_accuracy(a_b),
            "forgetting": forgetting(matrix), "bwt": backward_transfer(matrix)}
