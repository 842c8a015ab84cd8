"""The masking rule: which output neurons (rows of W) AWARe keeps frozen (docs/aware.md, "Phase 2").

``select(scores, rho, rule)`` returns ``{layer name: BoolTensor[d_out]}`` with ``True`` for a
*retained* (frozen) row. Rules:

- ``activation-global`` (default, reference ``global_highest``): top-``rho`` fraction of all
  target rows together, ranked by activation saliency.
- ``activation-balanced`` (reference ``balanced``): top-``rho`` fraction within every layer.
- ``weight-norm``: like ``activation-global`` but ranked by the L2 norm of each weight row
  (normalised to unit length per layer, as the activation saliency is).
- ``random``: a uniformly random ``rho`` fraction of all rows, seeded.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor, nn

from lab.aware.config import check_rho, check_rule
from lab.aware.targets import is_projector


def row_norms(layers: Mapping[str, nn.Module]) -> dict[str, Tensor]:
    """``{name: Tensor[d_out]}``: L2 norm of every weight row, scaled to unit length per layer."""
    out = {}
    for name, layer in layers.items():
        w = layer.weight.detach().float()
        r = w.norm(dim=1)
        out[name] = (r / r.norm().clamp_min(1e-12)).cpu()
    return out


def _top_global(scores: Mapping[str, Tensor], k: int) -> dict[str, Tensor]:
    names = list(scores)
    flat = torch.cat([scores[n].float().flatten() for n in names])
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    if k:
        keep[torch.topk(flat, k, sorted=False).indices] = True
    out, start = {}, 0
    for n in names:
        size = scores[n].numel()
        out[n] = keep[start:start + size].clone()
        start += size
    return out


def select(scores: Mapping[str, Tensor], rho: float, rule: str = "activation-global", *,
           weights: Mapping[str, nn.Module] | None = None, seed: int = 0) -> dict[str, Tensor]:
    """Choose the frozen rows. ``scores`` are saliency vectors from ``profile`` (their keys and
    sizes define the layers; ignored by ``weight-norm`` and ``random``); ``weights`` maps the same
    names to the Linear layers and is required by ``weight-norm``."""
    rho, rule = check_rho(rho), check_rule(rule)
    if not scores:
        raise ValueError("no layers to select from: the saliency dict is empty")
    sizes = {n: int(v.numel()) for n, v in scores.items()}
    total = sum(sizes.values())
    if rule == "activation-balanced":
        return {n: _top_global({n: v}, round(rho * sizes[n]))[n] for n, v in scores.items()}
    if rule == "weight-norm":
        if weights is None:
            raise ValueError("rule 'weight-norm' needs weights={name: Linear}")
        missing = set(scores) - set(weights)
        if missing:
            raise ValueError(f"weights missing for layers: {sorted(missing)[:5]}")
        return _top_global(row_norms({n: weights[n] for n in scores}), round(rho * total))
    if rule == "random":
        g = torch.Generator().manual_seed(seed)
        return _top_global({n: torch.rand(s, generator=g) for n, s in sizes.items()}, round(rho * total))
    return _top_global(scores, round(rho * total))


def frozen_fraction(masks: Mapping[str, Tensor]) -> float:
    """Fraction of target rows that are frozen."""
    total = sum(m.numel() for m in masks.values())
    return sum(int(m.sum()) for m in masks.values()) / max(total, 1)


def composition(masks: Mapping[str, Tensor]) -> dict[str, tuple[int, int]]:
    """``{layer kind: (frozen rows, rows)}`` where kind is the module's last name component
    (``q_proj``, ``k_proj``, ...) or ``projector`` for anything inside a multimodal projector."""
    out: dict[str, list[int]] = {}
    for name, m in masks.items():
        kind = "projector" if is_projector(name) else name.rsplit(".", 1)[-1]
        acc = out.setdefault(kind, [0, 0])
        acc[0] += int(m.sum())
        acc[1] += m.numel()
    return {k: (a, b) for k, (a, b) in out.items()}
