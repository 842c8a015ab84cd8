"""Which Linear layers AWARe profiles and constrains (docs/aware.md, "Phase 2").

Targets are chosen by *module-name component* patterns (``q_proj`` matches
``...self_attn.q_proj``; ``mm_projector`` matches every Linear inside the projector) and are
restricted to the language model and the projector: anything under a vision tower is excluded,
because the reference wildcard ``q_proj|k_proj|v_proj`` would otherwise also catch the vision
tower's attention.
"""
from __future__ import annotations

import re
from typing import Iterable

from torch import nn

# Named target sets used by the ablation ("targets" axis, docs/aware.md "Ablations").
_QKV = ("q_proj", "k_proj", "v_proj")
_PROJECTOR = ("mm_projector", "multi_modal_projector")  # mini-LLaVA / transformers' Llava
_MLP = ("gate_proj", "up_proj", "down_proj")
TARGET_PRESETS: dict[str, tuple[str, ...]] = {
    "qkv": _QKV,
    "qkv+projector": _QKV + _PROJECTOR,
    "qkv+projector+mlp": _QKV + _PROJECTOR + _MLP,
}
DEFAULT_TARGETS = "qkv+projector"
# Module-path components that belong to an image encoder, never a target.
VISION_EXCLUDE = r"vision_tower|vision_model|visual|image_encoder|vision_encoder"


def is_projector(name: str) -> bool:
    """Whether a module or parameter name lies inside a multimodal projector (a name component
    ``mm_projector`` as mini-LLaVA, or ``multi_modal_projector`` as transformers' Llava)."""
    return _matches(name, _PROJECTOR)


def expand_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """A preset name (``'qkv+projector'``) or an iterable of component patterns -> patterns."""
    if isinstance(targets, str):
        if targets in TARGET_PRESETS:
            return TARGET_PRESETS[targets]
        return tuple(p for p in targets.split(",") if p)
    return tuple(targets)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    parts = name.split(".")
    return any(re.fullmatch(p, part) for p in patterns for part in parts)


def find_targets(model: nn.Module, targets: str | Iterable[str] = DEFAULT_TARGETS, *,
                 exclude: str | None = VISION_EXCLUDE) -> dict[str, nn.Linear]:
    """Return ``{module name: nn.Linear}`` for every Linear matching ``targets``.

    Raises ``ValueError`` listing the available Linear names when nothing matches, so a typo in a
    pattern fails before any profiling or training starts.
    """
    patterns = expand_targets(targets)
    if not patterns:
        raise ValueError("no target patterns given")
    for p in patterns:
        re.compile(p)  # a malformed pattern fails here, with re's own message
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    excluded = (lambda n: _matches(n, (exclude,))) if exclude else (lambda n: False)
    found = {n: m for n, m in linears.items() if _matches(n, patterns) and not excluded(n)}
    if not found:
        names = sorted(linears)
        shown = ", ".join(names[:40]) + (f", ... ({len(names) - 40} more)" if len(names) > 40 else "")
        raise ValueError(f"target patterns {list(patterns)} match no nn.Linear in "
                         f"{type(model).__name__} (vision modules excluded). "
                         f"Available Linear modules: {shown or '(none)'}")
    return found
