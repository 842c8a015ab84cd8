"""Phase 2 of AWARe — constrained fine-tuning of the non-retained rows (docs/aware.md, "Phase 2").

``apply(model, masks)`` freezes every parameter of the model, then wraps each target
``nn.Linear`` in a :class:`RowSplitLinear`: the original layer stays inside as ``base_layer``,
frozen and bit-identical, and only a parameter holding the trainable rows sits beside it. As in
the reference code, the retained rows are not parameters the optimizer sees: an optimizer built
from ``p for p in model.parameters() if p.requires_grad`` holds no state for them, so neither
AdamW's decoupled weight decay nor its momentum can move one. ``merge(model)`` writes the trained
rows back and puts the plain ``nn.Linear`` in place again, so the fine-tuned model is a standard
model (``save_pretrained`` / ``from_pretrained``, any inference engine).
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RowSplitLinear(nn.Module):
    """A Linear whose non-retained output rows train, wrapped and kept (as peft's ``base_layer``).

    ``base_layer`` is the original ``nn.Linear``, frozen and never written during training: its
    retained rows are used as they are, its trainable rows are shadowed by ``trainable_weight``
    ``(n_trainable, d_in)`` (and ``trainable_bias``), copied from them at construction and placed
    at ``trainable_idx`` in the forward (one out-of-place row scatter, then one matmul). Gradients and
    optimizer state exist only for those rows. :meth:`merge` writes them back into ``base_layer``
    and returns it, a plain ``nn.Linear``.
    """

    def __init__(self, base: nn.Linear, frozen_rows: Tensor):
        super().__init__()
        frozen_rows = frozen_rows.to(torch.bool).flatten().cpu()
        if frozen_rows.numel() != base.out_features:
            raise ValueError(f"mask has {frozen_rows.numel()} rows, layer has {base.out_features}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.base_layer = base.requires_grad_(False)
        dev = base.weight.device
        t_idx = (~frozen_rows).nonzero().flatten().to(dev)
        self.register_buffer("frozen_rows", frozen_rows.to(dev), persistent=False)
        self.register_buffer("trainable_idx", t_idx, persistent=False)
        self.trainable_weight = nn.Parameter(base.weight.detach()[t_idx].clone())   # (n_trainable, d_in)
        self.trainable_bias = (nn.Parameter(base.bias.detach()[t_idx].clone()) if base.bias is not None
                               else None)

    def weight_full(self) -> Tensor:
        """The current full weight ``(d_out, d_in)``: base rows, trainable rows put in place."""
        return self.base_layer.weight.index_put((self.trainable_idx,), self.trainable_weight)

    def bias_full(self) -> Tensor | None:
        if self.trainable_bias is None:
            return None
        return self.base_layer.bias.index_put((self.trainable_idx,), self.trainable_bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight_full(), self.bias_full())

    @torch.no_grad()
    def merge(self) -> nn.Linear:
        """Write the trainable rows into ``base_layer`` (in place) and return it."""
        self.base_layer.weight[self.trainable_idx] = self.trainable_weight
        if self.trainable_bias is not None:
            self.base_layer.bias[self.trainable_idx] = self.trainable_bias
        return self.base_layer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"frozen_rows={int(self.frozen_rows.sum())}")


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def apply(model: nn.Module, masks: Mapping[str, Tensor]) -> nn.Module:
    """Freeze the whole model, then make the non-retained rows of each masked Linear trainable.

    ``masks``: ``{module name: BoolTensor[d_out]}``, ``True`` = retained (frozen) row, as returned
    by :func:`lab.aware.masking.select`. Modifies ``model`` in place and returns it. Build the
    optimizer *after* calling this, from the parameters that require grad.
    """
    if not masks:
        raise ValueError("no masks given: nothing to fine-tune")
    modules = dict(model.named_modules())
    for name in masks:
        if not isinstance(modules.get(name), nn.Linear):
            raise ValueError(f"{name!r} is not an nn.Linear of this model")
    for p in model.parameters():
        p.requires_grad_(False)
    for name, mask in masks.items():
        _set_module(model, name, RowSplitLinear(modules[name], mask))
    return model


def merge(model: nn.Module) -> nn.Module:
    """Replace every :class:`RowSplitLinear` by an equivalent ``nn.Linear`` (in place)."""
    for name, mod in list(model.named_modules()):
        if isinstance(mod, RowSplitLinear):
            _set_module(model, name, mod.merge())
    return model


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (tied weights counted once). ``total`` is the size of
    the model itself: a :class:`RowSplitLinear`'s trainable rows shadow rows of its ``base_layer``
    and are not counted twice."""
    trainable = total = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    shadow = sum(p.numel() for m in model.modules() if isinstance(m, RowSplitLinear)
                 for p in (m.trainable_weight, m.trainable_bias) if p is not None)
    return trainable, total - shadow
