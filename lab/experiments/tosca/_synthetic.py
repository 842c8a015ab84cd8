"""Synthetic class-incremental features for tests and smoke runs: Gaussian class clusters."""
from __future__ import annotations

import torch

from ._base import ScenarioData


def synthetic_data(num_tasks: int = 3, classes_per_task: int = 2, dim: int = 32, n_train: int = 40,
                   n_test: int = 20, noise: float = 1.0, seed: int = 0) -> ScenarioData:
    """``n_train`` / ``n_test`` samples per class around random class means; labels grouped by task."""
    g = torch.Generator().manual_seed(seed)
    C = num_tasks * classes_per_task
    means = 3 * torch.randn(C, dim, generator=g)

    def split(n):
        y = torch.arange(C).repeat_interleave(n)
        x = means[y] + noise * torch.randn(len(y), dim, generator=g)
        return x, y, y // classes_per_task

    tr, te = split(n_train), split(n_test)
    tasks = [list(range(t * classes_per_task, (t + 1) * classes_per_task)) for t in range(num_tasks)]
    return ScenarioData(*tr, *te, tasks)
