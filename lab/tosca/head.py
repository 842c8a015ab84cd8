"""Cosine classifier with a learnable scale, grown by one task's classes at a time.

As PILOT's ``CosineLinear`` (used by SimpleCIL, APER and TOSCA): ``logits = σ · cos(x, w_c)``,
rows initialised uniform(±1/√d), the scale σ initialised to 1 and learned. When the head grows,
old rows and σ are kept and only the new rows are initialised. With σ = 1 the logits lie in
[-1, 1], so softmax is nearly uniform and entropy routing is noise — the learned σ is logged.

How σ is learned (``param``):

* ``"positive"`` (ours, the default): σ = softplus(s) with a free parameter s, initialised so
  that σ starts at ``scale`` exactly. σ stays > 0, so a logit's sign always means "closer to this
  class"; for σ well above 1 the gradient is the free σ's (softplus' slope tends to 1).
* ``"free"`` (the reference): σ itself is the parameter, unconstrained. Nothing stops it from
  crossing zero; with σ < 0 every logit's sign flips, the arg-max picks the *least* similar class
  and accuracy collapses (seen on the CPU default with a strong L1 penalty). Runs report σ so a
  negative one is visible (``lab tosca`` and the TOSCA panel warn).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SCALE_PARAMS = ("positive", "free")


def check_scale_param(name: str) -> str:
    if name not in SCALE_PARAMS:
        raise ValueError(f"unknown head scale parametrisation {name!r}; valid: {', '.join(SCALE_PARAMS)}")
    return name


def _softplus_inverse(value: float) -> float:
    """s with softplus(s) == value (exact in float32 for the values used here, e.g. 1.0)."""
    return value + math.log(-math.expm1(-value))


class CosineHead(nn.Module):
    def __init__(self, dim: int, num_classes: int = 0, *, scale: float = 1.0, param: str = "positive"):
        super().__init__()
        self.dim, self.param = dim, check_scale_param(param)
        self.weight = nn.Parameter(torch.empty(0, dim))
        if param == "positive":
            if not scale > 0:
                raise ValueError(f"a positive head scale must start > 0 (got {scale})")
            self.sigma_raw = nn.Parameter(torch.tensor([_softplus_inverse(float(scale))]))
        else:
            self.sigma = nn.Parameter(torch.tensor([float(scale)]))
        if num_classes:
            self.grow(num_classes)

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    @torch.no_grad()
    def grow(self, n_new: int, generator: torch.Generator | None = None, *, init: str = "uniform") -> None:
        """Append ``n_new`` rows; old rows and σ are kept (a new Parameter: rebuild the optimiser).

        ``init='uniform'``: rows uniform(±1/√d), as ``CosineLinear.reset_parameters``; ``'zeros'``:
        zero rows, as the reference's ``SimpleVitNet.update_fc`` appends for every task after the
        first (``F.normalize`` maps a zero row to zero, so its logits start at 0 and its first
        gradient is the upstream one divided by normalize's eps)."""
        if init not in ("uniform", "zeros"):
            raise ValueError(f"unknown head row init {init!r}; valid: uniform, zeros")
        bound = 1.0 / math.sqrt(self.dim)
        new = torch.zeros(n_new, self.dim)
        if init == "uniform":
            new.uniform_(-bound, bound, generator=generator)  # CPU draw
        self.weight = nn.Parameter(torch.cat([self.weight.detach(), new.to(self.weight)]))

    @torch.no_grad()
    def set_rows(self, classes: torch.Tensor | list[int], rows: torch.Tensor) -> None:
        """Overwrite rows (e.g. with class-mean prototypes); the cosine makes their norm irrelevant."""
        self.weight[torch.as_tensor(classes, device=self.weight.device)] = rows.to(self.weight)

    def sigma_value(self) -> torch.Tensor:
        """σ as a ``[1]`` tensor (differentiable), whatever the parametrisation."""
        return F.softplus(self.sigma_raw) if self.param == "positive" else self.sigma

    @torch.no_grad()
    def set_scale(self, value) -> None:
        """Set σ (a number or a ``[1]`` tensor, e.g. a saved ``head.sigma``); in place, so an
        optimiser's reference to the parameter stays valid."""
        v = float(torch.as_tensor(value).reshape(-1)[0])
        if self.param == "positive":
            if not v > 0:
                raise ValueError(f"this head keeps σ > 0 (param='positive'); cannot set σ = {v}")
            self.sigma_raw.fill_(_softplus_inverse(v))
        else:
            self.sigma.fill_(v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, d] -> [N, C]
        return self.sigma_value() * F.linear(F.normalize(x, dim=1), F.normalize(self.weight, dim=1))

    @property
    def scale(self) -> float:
        return float(self.sigma_value().detach())


def scale_warning(scale: float | None) -> str:
    """One line for a run that ended with σ <= 0 (empty otherwise)."""
    if scale is None or scale > 0:
        return ""
    return (f"warning: the cosine head's scale σ ended at {scale:.3g} <= 0, so every logit's sign is flipped and "
            f"predictions pick the least similar class; use the default head_scale_param='positive'")


def class_means(x: torch.Tensor, y: torch.Tensor, classes) -> torch.Tensor:
    """Class-mean prototypes ``[len(classes), d]`` of features ``x [N, d]`` with labels ``y [N]``."""
    classes = torch.as_tensor(list(classes), device=y.device)
    onehot = (y[None, :] == classes[:, None]).to(x.dtype)  # [K, N]
    counts = onehot.sum(1, keepdim=True)
    if bool((counts == 0).any()):
        missing = classes[(counts[:, 0] == 0)].tolist()
        raise ValueError(f"no training samples for classes {missing}")
    return (onehot @ x) / counts
