"""Learning rates are chosen on validation questions that no training pool or test set contains."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from lab.experiments.aware.run import tasks, tune
from lab.experiments.aware.run.tasks import Task


def test_validation_rows_are_disjoint_from_the_training_pool_and_seeded():
    val = tasks.validation_index(1000, 700, 100, seed=0)
    train = tasks._pick(1000, 700, 1)
    assert len(val) == 100 and not set(val) & set(train)
    assert np.array_equal(val, tasks.validation_index(1000, 700, 100, seed=0))
    assert len(tasks.validation_index(1000, 990, 100)) == 10          # only what is left
    with pytest.raises(ValueError, match="nothing left"):
        tasks.validation_index(50, 50, 10)


def test_easy_vqa_validation_asks_about_images_alignment_never_showed():
    ids = np.repeat(np.arange(40), 5)                                  # 40 images x 5 questions
    rows = tasks.unseen_image_index(ids, 60, 30, seed=0)
    seen = {ids[i] for i in tasks._pick(len(ids), 60, 0)}
    assert len(rows) == 30 and not {ids[i] for i in rows} & seen
    with pytest.raises(ValueError, match="every train image"):
        tasks.unseen_image_index(np.zeros(10, int), 5, 3)


def test_choice_rule_full_by_downstream_others_by_h_ties_to_smaller_lr():
    rows = [{"method": "full", "lr": 1e-5, "downstream": 0.4, "H": 90.0},
            {"method": "full", "lr": 2e-5, "downstream": 0.5, "H": 10.0},
            {"method": "aware", "lr": 1e-4, "downstream": 0.3, "H": 70.0},
            {"method": "aware", "lr": 3e-4, "downstream": 0.45, "H": 80.0},
            {"method": "aware", "lr": 1e-3, "downstream": 0.5, "H": 80.0},
            {"method": "lora", "lr": 1e-4, "downstream": 0.1, "H": float("nan")},
            {"method": "lora", "lr": 3e-4, "downstream": 0.2, "H": 30.0}]
    assert tune.choose(rows) == {"full": 2e-5, "aware": 3e-4, "lora": 3e-4}
    assert tune.flags({"full": 2e-5, "aware": 3e-4, "lora": 1e-3}) == "--lr 2e-05 --lr-aware 0.0003 --lr-adapter 0.001"


def test_bad_grids_fail_before_work():
    with pytest.raises(ValueError, match="include 'full'"):
        tune.check_grids({"aware": (1e-4,)})
    with pytest.raises(ValueError, match="tunable methods"):
        tune.check_grids({"full": (1e-5,), "qlora": (1e-4,)})
    with pytest.raises(ValueError, match="> 0"):
        tune.check_grids({"full": (0.0,)})
    with pytest.raises(ValueError, match="non-empty"):
        tune.check_grids({"full": ()})
    from lab.cli import main

    assert main(["aware", "tune", "--grid", "aware=abc"]) == 2
    assert main(["aware", "tune", "--grid", "aware"]) == 2
    assert main(["aware", "tune", "--n-val", "0"]) == 2


def test_tune_scores_on_validation_sets_and_never_on_test(monkeypatch, tmp_path):
    from test_aware_ablate import WORDS, toy   # the same tiny random mini-LLaVA and toy questions

    from lab.experiments.aware.run.context import SIZES, Context
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

    tok = tiny_tokenizer(WORDS)
    size = replace(SIZES["smoke"], n_calib=8)
    ctx = Context(tiny_minillava(tok, 8), ChatEncoder(tok, 4), Task("easy_vqa", toy(16, 0), toy(8, 1)),
                  Task("probe", None, toy(6, 2, text=True)), {"fashion": Task("fashion", toy(16, 3), toy(8, 6))},
                  size, {("upstream", 8): toy(8, 9)})
    seen = []

    def fake_validation(c, task, n_val, **kw):
        v = replace(c, easy=Task("easy_vqa", c.easy.train, toy(n_val, 20)), probe=None,
                    down={task: Task(task, c.down[task].train, toy(n_val, 21))})
        seen.append(v)
        return v

    monkeypatch.setattr(tune, "validation_context", fake_validation)
    out = tune.tune(ctx, grids={"full": (1e-5, 2e-5), "aware": (1e-4,)}, seeds=(0, 1), n_val=5, run_dir=tmp_path,
                    progress=False)
    t, runs = out["table"], out["runs"]
    assert list(zip(t.method, t.lr)) == [("full", 1e-5), ("full", 2e-5), ("aware", 1e-4)]
    assert len(runs) == 6 and set(runs.seed) == {0, 1} and (t.seeds == 2).all()
    mean = runs[(runs.method == "aware")].downstream.mean()                  # the choice sees seed means
    assert t[t.method == "aware"].downstream.iloc[0] == pytest.approx(mean)
    assert t.chosen.sum() == 2 and set(out["chosen"]) == {"full", "aware"}
    assert set(out["before"]) == {"easy_vqa"}                             # the text probe stays held out
    assert ctx.size == size and set(ctx.calib) == {("upstream", 8)}       # the sweep's context is untouched
    assert "lr@" not in str(seen[0].size) and seen[0].size == size        # lrs travel in the variants, not the size
    assert seen[0].easy.test is not ctx.easy.test and len(seen[0].down["fashion"].test) == 5
    full_chosen = t[(t.method == "full") & t.chosen].iloc[0]
    assert full_chosen.E == pytest.approx(100.0)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["chosen"] == out["chosen"] and cfg["seeds"] == [0, 1] and (tmp_path / "tune.parquet").exists()
