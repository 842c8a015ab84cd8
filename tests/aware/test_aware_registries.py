"""Every fine-tuning method and every selection rule honours its registry's one contract; a toy
entry of each, added here, is held to the same contract and removed again."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lab.aware.config import AwareConfig
from lab.aware.freeze import RowSplitLinear
from lab.aware.masking import RULES, needs_saliency, register_rule, rule_names, select
from lab.aware.methods import (METHODS, Method, MethodSpec, finish, method_names, param_groups, prepare,
                               register_method, uses_saliency)
from lab.aware.saliency import Saliency
from lab.aware.targets import find_targets, is_projector


class ProjectorOnly(Method):
    """A toy method: the projector alone trains (LLaVA's stage-1 recipe, as a fine-tuning method)."""

    def prepare(self, model, spec, cfg, saliency=None):
        for n, p in model.named_parameters():
            p.requires_grad_(is_projector(n))
        return model, param_groups(model, cfg.lr, cfg.lr_projector), {}


def least_salient(scores, rho, *, weights=None, seed=0):
    """A toy rule: freeze the *least* salient rows, the opposite of AWARe's choice."""
    return select({n: -v for n, v in scores.items()}, rho, "activation-global")


@pytest.fixture
def toys():
    register_method("toy")(ProjectorOnly)
    register_rule("toy-lowest", saliency=True)(least_salient)
    try:
        yield
    finally:
        METHODS.unregister("toy")
        RULES.unregister("toy-lowest")


class _LR:   # the learning-rate fields a method reads (TrainConfig's)
    lr, lr_projector, lr_adapter, aware_lr = 1e-3, 1e-2, 1e-2, 1e-2


def _tiny():
    """The tiny random mini-LLaVA and one training batch of two image questions."""
    import numpy as np

    from lab.experiments.aware.run.finetune import iterate
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.tasks import QASet
    from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

    tok = tiny_tokenizer(["what", "color", "?", "red", "blue"])
    qa = QASet("toy", ["what color ?"] * 2, ["red", "blue"], [("red", "blue")] * 2, np.arange(2),
               torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0)))
    return tiny_minillava(tok, 8, seed=0), next(iterate(qa, ChatEncoder(tok, 4), 2, answers=True))


def _saliency(model, targets="qkv+projector"):
    g = torch.Generator().manual_seed(0)
    return Saliency({n: torch.rand(m.out_features, generator=g) for n, m in find_targets(model, targets).items()}, 4, 0.0)


def _check_method(name, rule="activation-global"):
    from lab.experiments.aware.run.scoring import answer_loss

    base, batch = _tiny()
    spec = MethodSpec(name, AwareConfig(rho=0.3, rule=rule))
    sal = _saliency(base) if uses_saliency(spec) else None
    model, groups, info = prepare(copy.deepcopy(base), spec, _LR(), saliency=sal)
    in_groups = {id(p) for g in groups for p in g["params"]}
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert in_groups == {id(p) for p in trainable}, "the groups hold exactly the parameters that train"
    assert all(isinstance(g["lr"], float) and g["lr"] > 0 for g in groups)
    assert 0 <= info["trainable"] <= info["total"] and info["trainable"] == sum(p.numel() for p in trainable)
    if trainable:   # one optimiser step moves the model
        answer_loss(model, batch).backward()
        torch.optim.SGD([p for g in groups for p in g["params"]], lr=1.0).step()
    out = finish(model, name)
    assert not any(isinstance(m, RowSplitLinear) or "lora" in type(m).__name__.lower() for m in out.modules())
    assert set(out.state_dict()) == set(base.state_dict()), "finish gives back a standard model"
    assert not out.training
    return base, out, info


@pytest.mark.parametrize("name", method_names())
def test_every_method_honours_the_contract(name):
    base, out, info = _check_method(name)
    changed = [k for k, v in out.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert (name == "zero-shot") == (info["trainable"] == 0) == (not changed)


def test_the_method_names_exist_once_in_the_registry():
    assert method_names()[:5] == ("zero-shot", "full", "lora", "dora", "aware")
    with pytest.raises(ValueError, match="unknown method 'qlora'; choose from"):
        MethodSpec("qlora")


def _scores():
    g = torch.Generator().manual_seed(1)
    return {"a.q_proj": torch.rand(10, generator=g), "a.k_proj": torch.rand(6, generator=g)}


def _weights(scores):
    torch.manual_seed(0)
    return {n: nn.Linear(3, v.numel()) for n, v in scores.items()}


@pytest.mark.parametrize("rule", rule_names())
def test_every_rule_honours_the_contract(rule):
    scores = _scores()
    w = _weights(scores)
    for rho in (0.0, 0.3, 1.0):
        m = select(scores, rho, rule, weights=w, seed=0)
        assert set(m) == set(scores)
        assert all(v.dtype == torch.bool and v.shape == scores[n].shape for n, v in m.items())
        frozen = sum(int(v.sum()) for v in m.values())
        assert abs(frozen - rho * 16) <= len(scores), f"{rule} freezes {frozen} of 16 rows at rho={rho}"
    assert all(torch.equal(a, b) for a, b in zip(select(scores, 0.3, rule, weights=w, seed=3).values(),
                                                  select(scores, 0.3, rule, weights=w, seed=3).values()))
    assert isinstance(needs_saliency(rule), bool)


def test_toy_entries_join_the_registries_and_leave_again(toys):
    assert "toy" in method_names() and "toy-lowest" in rule_names()
    base, out, info = _check_method("toy")
    assert 0 < info["trainable"] < info["total"]
    test_every_rule_honours_the_contract("toy-lowest")
    s = _scores()
    low, high = select(s, 0.3, "toy-lowest"), select(s, 0.3, "activation-global")
    assert not any((low[n] & high[n]).any() for n in s)          # the least salient rows, not the most
    _check_method("aware", rule="toy-lowest")                    # AWARe runs any registered rule


def test_toy_entries_are_gone_after_the_test():
    assert "toy" not in method_names() and "toy-lowest" not in rule_names()
    with pytest.raises(KeyError, match="unknown method 'toy'"):
        METHODS.unregister("toy")
