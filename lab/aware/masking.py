"""The masking rule: which output neurons (rows of W) AWARe keeps frozen (docs/aware.md, "Phase 2").

``select(scores, rho, rule)`` returns ``{layer name: BoolTensor[d_out]}`` with ``True`` for a
*retained* (frozen) row. Rules are entries of :data:`RULES`, one contract each::

    @register_rule("my-rule", saliency=False)
    def my_rule(scores, rho, *, weights, seed) -> {name: BoolTensor[d_out]}   # True = frozen row

``scores`` (``{name: Tensor[d_out]}``, the profiler's) fix the layers and their sizes; ``rho`` is
the fraction of rows to freeze (checked in [0, 1]); ``weights`` maps the same names to the Linear
layers (rules that rank by weights need it); ``saliency=True`` says the rule ranks by activation saliency (so a
profile must be computed first). The built-in rules:

- ``activation-global`` (default, reference ``global_highest``): top-``rho`` fraction of all
  target rows together, ranked by activation saliency.
- ``activation-balanced`` (reference ``balanced``): top-``rho`` fraction within every layer.
- ``weight-norm``: like ``activation-global`` but ranked by the L2 norm of each weight row
  (normalised to unit length per layer, as the activation saliency is).
- ``random``: a uniformly random ``rho`` fraction of all rows, seeded.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import torch
from torch import Tensor, nn

from lab import plugins
from lab._registry import Registry
from lab.aware.targets import is_projector

RULES = Registry("selection rule", group="continual_lab.aware_rules", contract=plugins.check_aware_rule)
Rule = Callable[..., "dict[str, Tensor]"]


def register_rule(name: str, *, saliency: bool) -> Callable[[Rule], Rule]:
    """Record a selection rule; ``saliency``: whether it ranks by an activation profile."""
    return RULES.register(name, saliency=saliency)


def rule_names() -> tuple[str, ...]:
    return tuple(RULES.names())


def needs_saliency(rule: str) -> bool:
    """Whether ``rule`` ranks by activation saliency (a profile must be computed before it runs)."""
    return bool(RULES.info(check_rule(rule))["saliency"])


def check_rho(rho: float) -> float:
    """The retention ratio must be a real number in [0, 1]."""
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or math.isnan(rho) or not 0 <= rho <= 1:
        raise ValueError(f"retention ratio rho must be a number in [0, 1], got {rho!r}")
    return float(rho)


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"unknown selection rule {rule!r}; choose one of {list(RULES.names())}")
    return rule


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


def _count(scores: Mapping[str, Tensor], rho: float) -> int:
    """``round(rho * all rows)``: how many rows a global rule freezes."""
    return round(rho * sum(int(v.numel()) for v in scores.values()))


@register_rule("activation-global", saliency=True)
def _activation_global(scores, rho, *, weights=None, seed=0):
    return _top_global(scores, _count(scores, rho))


@register_rule("activation-balanced", saliency=True)
def _activation_balanced(scores, rho, *, weights=None, seed=0):
    return {n: _top_global({n: v}, round(rho * v.numel()))[n] for n, v in scores.items()}


@register_rule("weight-norm", saliency=False)
def _weight_norm(scores, rho, *, weights=None, seed=0):
    if weights is None:
        raise ValueError("rule 'weight-norm' needs weights={name: Linear}")
    missing = set(scores) - set(weights)
    if missing:
        raise ValueError(f"weights missing for layers: {sorted(missing)[:5]}")
    return _top_global(row_norms({n: weights[n] for n in scores}), _count(scores, rho))


@register_rule("random", saliency=False)
def _random(scores, rho, *, weights=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return _top_global({n: torch.rand(v.numel(), generator=g) for n, v in scores.items()}, _count(scores, rho))


def select(scores: Mapping[str, Tensor], rho: float, rule: str = "activation-global", *,
           weights: Mapping[str, nn.Module] | None = None, seed: int = 0) -> dict[str, Tensor]:
    """Choose the frozen rows. ``scores`` are saliency vectors from ``profile`` (their keys and
    sizes define the layers; ignored by ``weight-norm`` and ``random``); ``weights`` maps the same
    names to the Linear layers and is required by ``weight-norm``."""
    rho, rule = check_rho(rho), check_rule(rule)
    if not scores:
        raise ValueError("no layers to select from: the saliency dict is empty")
    return RULES.get(rule)(scores, rho, weights=weights, seed=seed)


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
