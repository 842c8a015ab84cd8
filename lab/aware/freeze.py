"""Phase 2 of AWARe — constrained fine-tuning by splitting rows (spec aware.md, "Phase 2").

``apply(model, masks)`` freezes every parameter of the model, then replaces each target
``nn.Linear`` by a :class:`RowSplitLinear` holding two parameters: the trainable rows
(``requires_grad=True``) and the retained rows (``requires_grad=False``), as the reference code
does. An optimizer built from ``p for p in model.parameters() if p.requires_grad`` never sees a
retained row, so neither AdamW's decoupled weight decay nor its momentum can move one: the
retained rows stay bit-identical. ``merge(model)`` turns every ``RowSplitLinear`` back into a plain
``nn.Linear``, so the fine-tuned model is a standard model again (``save_pretrained`` /
``from_pretrained``, any inference engine).
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RowSplitLinear(nn.Module):
    """A Linear whose output rows are split into a trainable block and a frozen block.

    The full weight is reassembled on the fly (a row gather), so the forward is one matmul and
    gradients reach only ``trainable_weight`` / ``trainable_bias``.
    """

    def __init__(self, base: nn.Linear, frozen_rows: Tensor):
        super().__init__()
        frozen_rows = frozen_rows.to(torch.bool).flatten().cpu()
        if frozen_rows.numel() != base.out_features:
            raise ValueError(f"mask has {frozen_rows.numel()} rows, layer has {base.out_features}")
        self.in_features, self.out_features = base.in_features, base.out_features
        dev = base.weight.device
        f_idx = frozen_rows.nonzero().flatten().to(dev)
        t_idx = (~frozen_rows).nonzero().flatten().to(dev)
        # position of row r in cat([trainable, frozen]) -> used to gather rows back in order
        order = torch.argsort(torch.cat([t_idx, f_idx]))
        self.register_buffer("frozen_rows", frozen_rows.to(dev), persistent=False)
        self.register_buffer("order", order, persistent=False)
        w = base.weight.detach()
        self.trainable_weight = nn.Parameter(w[t_idx].clone(), requires_grad=True)
        self.frozen_weight = nn.Parameter(w[f_idx].clone(), requires_grad=False)
        if base.bias is not None:
            b = base.bias.detach()
            self.trainable_bias = nn.Parameter(b[t_idx].clone(), requires_grad=True)
            self.frozen_bias = nn.Parameter(b[f_idx].clone(), requires_grad=False)
        else:
            self.trainable_bias = self.frozen_bias = None

    def weight_full(self) -> Tensor:
        return torch.cat([self.trainable_weight, self.frozen_weight])[self.order]   # (d_out, d_in)

    def bias_full(self) -> Tensor | None:
        if self.trainable_bias is None:
            return None
        return torch.cat([self.trainable_bias, self.frozen_bias])[self.order]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight_full(), self.bias_full())

    def merged(self) -> nn.Linear:
        lin = nn.Linear(self.in_features, self.out_features, bias=self.trainable_bias is not None,
                        device=self.trainable_weight.device, dtype=self.trainable_weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(self.weight_full())
            if lin.bias is not None:
                lin.bias.copy_(self.bias_full())
        return lin

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
            _set_module(model, name, mod.merged())
    return model


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (tied weights counted once)."""
    trainable = total = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total
