"""The ablation runner end to end on a tiny random mini-LLaVA, and the `lab aware` CLI surface."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from lab.experiments.aware.run import ablate
from lab.experiments.aware.run.context import SIZES, Context
from lab.experiments.aware.run.prompts import ChatEncoder
from lab.experiments.aware.run.tasks import QASet, Task
from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

WORDS = ["red", "blue", "green", "yes", "no", "what", "color", "is", "it", "?", "capital", "Paris", "Rome"]


def toy(n, seed, text=False):
    g = np.random.RandomState(seed)
    opts = ("red", "blue", "green")
    if text:
        return QASet("probe", ["what is the capital ?"] * n, ["Paris"] * n, [("Paris", "Rome")] * n,
                     np.full(n, -1), None, [("Paris",)] * n)
    return QASet("toy", ["what color is it ?"] * n, [opts[g.randint(3)] for _ in range(n)], [opts] * n,
                 np.arange(n), torch.randn(n, 4, 8, generator=torch.Generator().manual_seed(seed)))


@pytest.fixture(scope="module")
def ctx():
    tok = tiny_tokenizer(WORDS)
    size = replace(SIZES["smoke"], n_calib=8, calib_sizes=(4,), rhos=(0.0, 0.3, 0.9))
    return Context(tiny_minillava(tok, 8), ChatEncoder(tok, 4), Task("easy_vqa", toy(16, 0), toy(8, 1)),
                   Task("probe", None, toy(6, 2, text=True)),
                   {t: Task(t, toy(16, 3 + i), toy(8, 6 + i)) for i, t in enumerate(("fashion", "digits", "even"))},
                   size, {("upstream", 8): toy(8, 9), ("upstream", 4): toy(4, 9), ("proxy", 8): toy(8, 10)})


def test_variants_cover_every_axis():
    labels = {(v.group, v.label) for v in ablate.variants(SIZES["default"])}
    for want in [("methods", m) for m in ("zero-shot", "full", "lora", "dora", "aware")] + [
            ("rule", "weight-norm"), ("rule", "random"), ("rho", "rho=0"), ("rho", "rho=0.9"),
            ("targets", "qkv"), ("targets", "qkv+projector+mlp"), ("calibration", "proxy"), ("calib_size", "n=16")]:
        assert want in labels


def test_sweep_writes_tidy_tables_tensors_and_config(ctx, tmp_path):
    out = ablate.sweep(ctx, run_dir=tmp_path, progress=False)
    res = out["results"]
    assert {"R", "E", "H", "downstream", "up_easy_vqa", "up_probe", "trainable_frac", "seed"} <= set(res.columns)
    full = res[(res.group == "methods") & (res.variant == "full")].iloc[0]
    assert full.E == pytest.approx(100.0)
    zs = res[(res.group == "methods") & (res.variant == "zero-shot")].iloc[0]
    assert zs.R == pytest.approx(100.0) and zs.trainable == 0
    # the main AWARe row is repeated as the reference of each ablation group
    shared = res[res.get("shared", False) == True]  # noqa: E712
    assert set(shared.group) == set(ablate._MAIN_LABEL)
    assert shared[shared.group == "calib_size"].variant.tolist() == [f"n={ctx.size.n_calib}"]  # the real n
    rho0 = res[res.variant == "rho=0"].iloc[0]
    rho9 = res[res.variant == "rho=0.9"].iloc[0]
    assert rho0.trainable > rho9.trainable
    assert len(out["overlap"]) >= 4 and out["overlap"].jaccard.between(0, 1).all()
    cs = out["continual_summary"]
    assert set(cs.method) == {"full", "aware"} and {"avg", "last", "bwt", "R_after_sequence"} <= set(cs.columns)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"results.parquet", "config.json", "saliency_upstream_8.safetensors", "overlap.parquet"} <= files
    assert any(f.startswith("masks_methods_aware") for f in files)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["seeds"] == [0] and "torch" in cfg["versions"] and cfg["timings"]["total_s"] > 0
    from lab._io import load_tensors

    t, meta = load_tensors(tmp_path / "saliency_upstream_8.safetensors")
    assert t["matrix"].shape[0] == len(json.loads(meta["layers"]))
    assert len(ablate.summary(res)) >= 10
    from lab.experiments.aware.study.results import load_run

    back = load_run(tmp_path)
    assert len(back["results"]) == len(res) and "upstream_8" in back["saliency"]
    mat, names = back["saliency"]["upstream_8"]
    assert mat.shape[0] == len(names) and any(k.startswith("methods_aware") for k in back["masks"])


def test_cli_help_and_early_errors(capsys):
    from lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["aware", "ablate", "--help"])
    assert e.value.code == 0 and "--groups" in capsys.readouterr().out
    assert main(["aware", "finetune", "--rho", "1.5"]) == 2
    assert "rho" in capsys.readouterr().err
    assert main(["aware", "profile", "--n", "0"]) == 2
    assert "--n 0: must be an integer >= 1" in capsys.readouterr().err


def test_methods_filter_keeps_full_and_aware_and_rejects_unknown_names():
    from dataclasses import replace

    size = replace(SIZES["smoke"], methods=("lora",))
    labels = [v.label for v in ablate.variants(size) if v.group == "methods"]
    assert labels == ["full", "lora", "aware"]          # E needs full; aware is the reference
    with pytest.raises(ValueError, match="unknown methods"):
        ablate.variants(replace(size, methods=("lora", "qlora")))


def test_sweep_on_a_task_the_context_lacks_fails_before_training(ctx, tmp_path):
    with pytest.raises(ValueError, match="no downstream task"):
        ablate.sweep(ctx, task="not-built", groups=("methods",), run_dir=tmp_path, progress=False)
    assert not any(tmp_path.iterdir())
