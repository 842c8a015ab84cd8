"""TOSCA router ``margin``: the module most sure of its own top class.

For every test image each task module gives logits over all classes seen so far; the margin of a
module is its top-1 logit minus its top-2 logit. The image goes to the module with the largest
margin (a confidence score like ``max-softmax`` or ``energy``, but insensitive to the logits'
overall offset, and to how the remaining classes share the rest).

Use: ``lab tosca --routings per-sample margin oracle --routing margin``, or in Python
``lab.tosca.routing.route(logits, "margin", ctx)``.
"""
from __future__ import annotations

import torch

from lab.tosca.routing import register


@register("margin", rule="largest top-1 minus top-2 logit margin")
def margin(logits: torch.Tensor, ctx) -> torch.Tensor:
    """``logits [T, N, C]`` (T task modules, N images, C classes) -> module index per image ``[N]``."""
    if logits.shape[-1] < 2:  # one class: every module is equally sure
        return torch.zeros(logits.shape[1], dtype=torch.long, device=logits.device)
    top2 = logits.float().topk(2, dim=-1).values  # [T, N, 2]
    return (top2[..., 0] - top2[..., 1]).argmax(0)
