"""RowSplitLinear as a peft-style wrapper: the original Linear kept as ``base_layer`` and never
written while training, gradients and optimizer state only for the trainable rows, merge exact."""
from __future__ import annotations

import torch
from torch import nn

from lab.aware.freeze import RowSplitLinear, apply, merge, trainable_parameters
from lab.aware.masking import select
from lab.aware.targets import find_targets
from lab.experiments.aware.run.tiny import tiny_llama

MASK = torch.tensor([True, False, True, True, False, False, True, False])   # True = retained (frozen)


def _layer(bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(5, 8, bias=bias)


def test_forward_equals_the_original_layer_before_training():
    lin = _layer()
    x = torch.randn(3, 4, 5)
    ref = lin(x)
    split = RowSplitLinear(lin, MASK)
    assert split.base_layer is lin and not any(p.requires_grad for p in lin.parameters())
    assert torch.equal(split(x), ref)
    assert split.trainable_weight.shape == (int((~MASK).sum()), 5)


def test_gradients_only_on_trainable_rows_and_no_optimizer_state_for_frozen_ones():
    split = RowSplitLinear(_layer(), MASK)
    x = torch.randn(6, 5)
    split(x).pow(2).sum().backward()
    assert split.base_layer.weight.grad is None and split.base_layer.bias.grad is None
    # the gradient of the trainable rows is the plain Linear's gradient on those rows
    ref = _layer()
    ref(x).pow(2).sum().backward()
    assert torch.allclose(split.trainable_weight.grad, ref.weight.grad[~MASK])
    assert torch.allclose(split.trainable_bias.grad, ref.bias.grad[~MASK])
    opt = torch.optim.AdamW([p for p in split.parameters() if p.requires_grad], lr=0.1, weight_decay=0.1)
    opt.step()
    assert set(opt.state) == {split.trainable_weight, split.trainable_bias}
    assert opt.state[split.trainable_weight]["exp_avg"].shape == (int((~MASK).sum()), 5)


def test_base_layer_bit_identical_after_training_then_merge_is_exact():
    for bias in (True, False):
        lin = _layer(bias)
        w0 = lin.weight.detach().clone()
        b0 = lin.bias.detach().clone() if bias else None
        split = RowSplitLinear(lin, MASK)
        opt = torch.optim.AdamW([p for p in split.parameters() if p.requires_grad], lr=0.1, weight_decay=0.1)
        for _ in range(3):
            split(torch.randn(4, 5)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
        assert torch.equal(lin.weight, w0) and (not bias or torch.equal(lin.bias, b0))   # untouched
        x = torch.randn(7, 5)
        with torch.no_grad():
            trained = split(x)
        full = split.weight_full().detach().clone()
        merged = split.merge()
        assert type(merged) is nn.Linear and merged is lin
        assert torch.equal(merged.weight[MASK], w0[MASK])              # retained rows: bit-identical
        assert not torch.equal(merged.weight[~MASK], w0[~MASK])        # trained rows moved
        assert torch.equal(merged.weight, full)
        with torch.no_grad():
            assert torch.equal(merged(x), trained)


def test_apply_merge_on_a_model_keeps_counts_and_leaves_plain_linears():
    model = tiny_llama(64, hidden=16)
    targets = find_targets(model, "qkv")
    size = sum(p.numel() for p in model.parameters())
    masks = select({n: torch.rand(m.out_features) for n, m in targets.items()}, 0.25)
    apply(model, masks)
    trainable, total = trainable_parameters(model)
    assert total == size   # the shadowed rows are not counted twice
    assert trainable == sum(int((~m).sum()) * targets[n].in_features for n, m in masks.items())
    assert all(model.get_submodule(n).base_layer is targets[n] for n in masks)
    merge(model)
    assert all(model.get_submodule(n) is targets[n] for n in masks)
    assert not any(isinstance(m, RowSplitLinear) for m in model.modules())
