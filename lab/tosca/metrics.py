"""Class-incremental metrics of TOSCA runs (PILOT conventions). Accuracies in percent.

The accuracy matrix, Ā, forgetting and BWT are the shared ones of :mod:`lab.metrics` (re-exported
here). TOSCA's own: ``A_b``, the accuracy after stage b on the test samples of every class seen so
far (sample-weighted, as PILOT's ``accy['total']``), ``Ā = mean_b A_b`` and ``A_B`` = the last one.
"""
from __future__ import annotations

import numpy as np

from lab.metrics import (as_numpy, accuracy_matrix, average_incremental_accuracy, backward_transfer,  # noqa: F401
                         forgetting, last_accuracy, stage_accuracies)


def accuracy(preds, labels) -> float:
    """Percent of ``preds == labels``; NaN for no samples."""
    preds, labels = as_numpy(preds), as_numpy(labels)
    return float(100.0 * (preds == labels).mean()) if len(labels) else float("nan")


def task_accuracies(preds, labels, task_ids, num_tasks: int) -> np.ndarray:
    """One column of the accuracy matrix: accuracy per task ``[num_tasks]`` (NaN for absent tasks)."""
    preds, labels, task_ids = as_numpy(preds), as_numpy(labels), as_numpy(task_ids)
    out = np.full(num_tasks, np.nan)
    for i in range(num_tasks):
        m = task_ids == i
        if m.any():
            out[i] = 100.0 * (preds[m] == labels[m]).mean()
    return out


def summarize(matrix, a_b) -> dict[str, float]:
    """The headline numbers of one run under one routing."""
    return {"avg_inc_acc": average_incremental_accuracy(a_b), "last_acc": last_accuracy(a_b),
            "forgetting": forgetting(matrix), "bwt": backward_transfer(matrix)}
