"""Seeded, honest components as tests: adapters start from the run's own seed whatever ran before;
multiple-choice scoring cannot be gamed (option order drawn per question, ties and non-finite scores
wrong, so a constant or a diverged model scores no better than chance); a diverged run is reported
as diverged and not ranked. Tiny random models and stub records only: seconds."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lab.aware.config import AwareConfig
from lab.aware.methods import MethodSpec, prepare
from lab.experiments.aware.run import finetune
from lab.experiments.aware.study import plan, tables as study_tables
from lab.experiments.aware.views import study as study_views
from lab.experiments.aware.run.finetune import TrainConfig, evaluate, strictly_best
from lab.experiments.aware.run.prompts import ChatEncoder
from lab.experiments.aware.run.tasks import QASet, probe, shuffled_options
from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

COLORS = ("red", "blue", "dark green", "teal blue green")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(list(COLORS) + ["what color is the shape ?"])


def _qa(n=40, seed=0):
    g = np.random.RandomState(seed)
    return QASet("toy", ["what color is the shape ?"] * n, [COLORS[g.randint(4)] for _ in range(n)], [COLORS] * n,
                 np.arange(n), torch.randn(n, 4, 8, generator=torch.Generator().manual_seed(seed)))


def _adapters(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n or "magnitude" in n}


@pytest.mark.parametrize("method", ["lora", "dora"])
def test_adapters_come_from_the_runs_seed_whatever_ran_before(tok, method):
    spec = MethodSpec(method, AwareConfig(rho=0.3))
    got = []
    for draws in (0, 1, 7):            # different amounts of global random state used beforehand
        torch.manual_seed(123)
        torch.rand(draws)
        model, _, _ = prepare(tiny_minillava(tok, 8, seed=0), spec, TrainConfig(seed=3))
        got.append(_adapters(model))
    assert got[0] and any("lora_A" in n for n in got[0])
    for other in got[1:]:
        assert got[0].keys() == other.keys()
        assert all(torch.equal(got[0][n], other[n]) for n in got[0])
    torch.manual_seed(123)
    seed4 = _adapters(prepare(tiny_minillava(tok, 8, seed=0), spec, TrainConfig(seed=4))[0])
    assert any(not torch.equal(got[0][n], seed4[n]) for n in got[0] if "lora_A" in n)   # the seed matters


def test_a_tie_or_a_non_finite_score_is_wrong_whatever_the_gold_position():
    for gold in range(4):
        assert not strictly_best(torch.zeros(4), gold)                       # a constant model: all tied
        assert not strictly_best(torch.full((4,), float("nan")), gold)       # a diverged model
        s = torch.zeros(4)
        s[gold] = float("inf")
        assert not strictly_best(s, gold)
        s[gold] = 1.0
        assert strictly_best(s, gold)


def test_the_gold_option_position_is_drawn_per_question_and_seeded():
    qa = probe().test           # the file lists every answer first; the task draws each question's order
    pos = np.array([o.index(a) for o, a in zip(qa.options, qa.answers)])
    k = len(qa.options[0])
    assert len(qa) >= 300
    assert np.bincount(pos, minlength=k).max() / len(qa) < 1 / k + 0.1      # no position is right far above chance
    again = probe().test
    assert again.options == qa.options                                       # the same order on every load
    toy = _qa(400)
    toy.options = [(a, *[c for c in COLORS if c != a]) for a in toy.answers]  # gold first, as in a data file
    toy = shuffled_options(toy)
    first = np.mean([o[0] == a for o, a in zip(toy.options, toy.answers)])
    assert abs(first - 0.25) < 0.08           # a model that always picks the first option scores at chance


def test_a_constant_and_a_diverged_model_score_no_better_than_chance(tok, monkeypatch):
    qa, enc = shuffled_options(_qa(40)), ChatEncoder(tok, 4)
    model = tiny_minillava(tok, 8, seed=0)
    diverged = tiny_minillava(tok, 8, seed=0)
    with torch.no_grad():
        for p in diverged.parameters():
            p.fill_(float("nan"))
    assert evaluate(diverged, qa, enc)["acc"] == 0.0              # every score NaN: every question wrong
    monkeypatch.setattr(finetune, "option_scores", lambda m, b, opts: torch.zeros(len(opts), len(opts[0])))
    assert evaluate(model, qa, enc)["acc"] == 0.0                 # a constant model: every option tied
    # a model that always ranks the options in their listed order (the first wins): chance, not more
    monkeypatch.setattr(finetune, "option_scores",
                        lambda m, b, opts: -torch.arange(len(opts[0]), dtype=torch.float).expand(len(opts), -1))
    first = evaluate(model, qa, enc)["acc"]
    assert first == pytest.approx(np.mean([o[0] == a for o, a in zip(qa.options, qa.answers)]))
    assert first <= qa.chance_rate() + 0.15


def _stub_env(n=20):
    cfg = plan.PRESETS["smoke"]
    answers = [COLORS[i % 4] for i in range(n)]
    test = QASet("stub", ["q"] * n, answers, [COLORS] * n, np.full(n, -1))
    ctx = SimpleNamespace(down={cfg.task: SimpleNamespace(test=test)}, easy=SimpleNamespace(test=test),
                          probe=SimpleNamespace(test=test))
    base = {"down": [0] * n, "easy_vqa": [1] * n, "probe": [1] * n}
    return SimpleNamespace(cfg=cfg, ctx=ctx, base_answers=base)


def _rec(variant, method, seed, down, up, diverged=False, n=20, scale=1.0):
    ones = lambda k: [1] * k + [0] * (n - k)  # noqa: E731
    return {"variant": variant, "method": method, "seed": seed, "scale": scale, "lr": 1e-4, "lr_projector": 1e-3,
            "precision": "bf16", "diverged": diverged,
            "answers": {"down": ones(down), "easy_vqa": ones(up), "probe": ones(up)},
            "trainable": 10, "total": 100, "lora_rank": 0, "steps": 2, "final_loss": float("nan") if diverged else 1.0,
            "train_s": 1.0, "seconds": 2.0}


def test_a_diverged_point_is_reported_as_diverged_and_not_learned():
    env = _stub_env()
    test = [_rec("methods/full", "full", s, 18, 15) for s in (0, 1)]
    test += [_rec("methods/aware", "aware", s, 19, 20, diverged=True) for s in (0, 1)]   # high scores, but diverged
    tables = study_tables.build(env, {"test": test, "tune": [], "continual": []})
    fr = tables["fronts"].set_index("variant")
    assert bool(fr.loc["methods/aware", "diverged"]) and not bool(fr.loc["methods/aware", "learned"])
    assert bool(fr.loc["methods/full", "learned"])
    shown = study_views.fronts_table({"fronts": tables["fronts"]}).set_index("variant")
    assert shown.loc["AWARe (rho 0.3)", "learned?"] == "no"


def test_a_damaged_probe_file_is_one_line_naming_it(tmp_path):
    from lab import cli
    from lab._io import CorruptFile
    from lab.experiments.aware.run import tasks

    good = tasks.PROBE_FILE.read_text()
    for name, text in (("truncated", good[:300]), ("a list", "[]"), ("no items", '{"items": [{"q": 1}]}')):
        f = tmp_path / f"{name}.json"
        f.write_text(text)
        with pytest.raises(CorruptFile, match=str(f)) as info:
            tasks.probe(f)
        assert isinstance(info.value, cli.EXPECTED) and "\n" not in str(info.value)
