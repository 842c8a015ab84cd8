"""Adding a fine-tuning method or a selection rule is one registry entry: a toy of each runs through
``lab aware finetune`` and through a sweep with no other change, and is removed afterwards."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lab.aware.freeze import apply, merge
from lab.aware.masking import RULES, needs_saliency, register_rule, select
from lab.aware.methods import METHODS, Method, param_groups, register_method
from lab.aware.targets import find_targets, is_projector


class ProjectorRows(Method):
    """Toy method: AWARe's row split on the projector alone; the language model stays frozen."""

    def needs_saliency(self, spec):
        return needs_saliency(spec.aware.rule)

    def prepare(self, model, spec, cfg, saliency=None):
        layers = {n: m for n, m in find_targets(model, spec.aware.targets, exclude=spec.aware.exclude).items()
                  if is_projector(n)}
        scores = ({n: saliency.scores[n] for n in layers} if saliency is not None
                  else {n: torch.zeros(m.out_features) for n, m in layers.items()})
        masks = select(scores, spec.aware.rho, spec.aware.rule, weights=layers, seed=spec.aware.seed)
        apply(model, masks)
        return model, param_groups(model, cfg.lr, cfg.lr_projector), {"masks": masks}

    def finish(self, model):
        return merge(model)


def least_salient(scores, rho, *, weights=None, seed=0):
    """Toy rule: freeze the least salient rows, the opposite of AWARe's choice."""
    return select({n: -v for n, v in scores.items()}, rho, "activation-global")


@pytest.fixture
def toys():
    register_method("toy")(ProjectorRows)
    register_rule("toy-lowest", saliency=True)(least_salient)
    try:
        yield
    finally:
        METHODS.unregister("toy")
        RULES.unregister("toy-lowest")


def test_a_toy_method_and_rule_run_through_a_sweep(toys, tmp_path):
    from test_aware_ablate import WORDS, toy   # the tiny random mini-LLaVA's toy questions

    from lab.experiments.aware.run import ablate
    from lab.experiments.aware.run.context import SIZES, Context
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.tasks import Task
    from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

    tok = tiny_tokenizer(WORDS)
    size = replace(SIZES["smoke"], n_calib=8, calib_sizes=(), rhos=(0.3,), methods=("full", "toy"),
                   rules=("toy-lowest",), continual_methods=())
    ctx = Context(tiny_minillava(tok, 8), ChatEncoder(tok, 4), Task("easy_vqa", toy(16, 0), toy(8, 1)),
                  Task("probe", None, toy(6, 2, text=True)), {"fashion": Task("fashion", toy(16, 3), toy(8, 6))},
                  size, {("upstream", 8): toy(8, 9), ("proxy", 8): toy(8, 10)})
    weights = {k: v.clone() for k, v in ctx.base.state_dict().items()}
    out = ablate.sweep(ctx, groups=("methods", "rule"), run_dir=tmp_path, progress=False)
    res = out["results"]
    mine = res[(res.group == "methods") & (res.variant == "toy")].iloc[0]
    assert mine.method == "toy" and 0 < mine.trainable_frac < 0.05 and mine.E == mine.E and mine.H == mine.H
    lowest = res[(res.group == "rule") & (res.variant == "toy-lowest")].iloc[0]
    assert lowest.rule == "toy-lowest" and lowest.trainable_frac > 0
    assert (tmp_path / "masks_methods_toy.safetensors").exists() and (tmp_path / "masks_rule_toy-lowest.safetensors").exists()
    assert all(torch.equal(v, weights[k]) for k, v in ctx.base.state_dict().items())   # the shared base is read only


@pytest.mark.slow
def test_a_toy_method_and_rule_run_through_lab_aware_finetune(toys, smollm2_in_cache, capsys, tmp_path, monkeypatch):
    """The command line offers registered entries by name (smoke size, the real SmolLM2 mini-LLaVA)."""
    pytest.importorskip("gguf")
    from lab.cli import main

    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path))
    assert main(["aware", "finetune", "--size", "smoke", "--steps", "1", "--quiet",
                 "--method", "toy", "--rule", "toy-lowest"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("toy on fashion: downstream acc"), line
    trainable = float(line.split("trainable ")[1].split("%")[0])
    assert 0 < trainable < 5, line                       # the projector's rows only
    with pytest.raises(SystemExit) as e:
        main(["aware", "finetune", "--method", "nope"])
    assert e.value.code == 2 and "'aware', 'toy')" in capsys.readouterr().err    # the choices come from the registry
