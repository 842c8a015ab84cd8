"""Cosine classifier with a learnable scale, grown by one task's classes at a time.

As PILOT's ``CosineLinear`` (used by SimpleCIL, APER and TOSCA): ``logits = σ · cos(x, w_c)``,
rows initialised uniform(±1/√d), the scale σ initialised to 1 and learned. When the head grows,
old rows and σ are kept and only the new rows are initialised. With σ = 1 the logits lie in
[-1, 1], so softmax is nearly uniform and entropy routing is noise — the learned σ is logged.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CosineHead(nn.Module):
    def __init__(self, dim: int, num_classes: int = 0, *, scale: float = 1.0):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(0, dim))
        self.sigma = nn.Parameter(torch.tensor([float(scale)]))
        if num_classes:
            self.grow(num_classes)

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    @torch.no_grad()
    def grow(self, n_new: int, generator: torch.Generator | None = None) -> None:
        """Append ``n_new`` rows; old rows and σ are kept (a new Parameter: rebuild the optimiser)."""
        bound = 1.0 / math.sqrt(self.dim)
        new = torch.empty(n_new, self.dim).uniform_(-bound, bound, generator=generator)  # CPU draw
        self.weight = nn.Parameter(torch.cat([self.weight.detach(), new.to(self.weight)]))

    @torch.no_grad()
    def set_rows(self, classes: torch.Tensor | list[int], rows: torch.Tensor) -> None:
        """Overwrite rows (e.g. with class-mean prototypes); the cosine makes their norm irrelevant."""
        self.weight[torch.as_tensor(classes, device=self.weight.device)] = rows.to(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, d] -> [N, C]
        return self.sigma * F.linear(F.normalize(x, dim=1), F.normalize(self.weight, dim=1))

    @property
    def scale(self) -> float:
        return float(self.sigma.detach())


def class_means(x: torch.Tensor, y: torch.Tensor, classes) -> torch.Tensor:
    """Class-mean prototypes ``[len(classes), d]`` of features ``x [N, d]`` with labels ``y [N]``."""
    classes = torch.as_tensor(list(classes), device=y.device)
    onehot = (y[None, :] == classes[:, None]).to(x.dtype)  # [K, N]
    counts = onehot.sum(1, keepdim=True)
    if bool((counts == 0).any()):
        missing = classes[(counts[:, 0] == 0)].tolist()
        raise ValueError(f"no training samples for classes {missing}")
    return (onehot @ x) / counts
