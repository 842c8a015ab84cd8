"""The shipped AWARe study in results/aware: its manifest, its tables and the README's AWARe
section agree with each other (the README section is regenerated from the tables and compared)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.experiments.aware import shipped, study_views

ROOT = Path(__file__).resolve().parents[3]
STUDY = ROOT / "results" / "aware"

pytestmark = pytest.mark.skipif(not (STUDY / "manifest.json").exists(), reason="no shipped study in results/aware")


@pytest.fixture(scope="module")
def study():
    return study_views.load_study(STUDY)


def test_manifest_lists_exactly_the_files_shipped_and_its_provenance(study):
    m = study["manifest"]
    shipped_files = sorted(p.name for p in STUDY.iterdir() if p.is_file() and not p.name.endswith(".sha256"))
    assert sorted(m["tables"] + ["manifest.json"]) == shipped_files
    assert m["command"].startswith("lab aware study") and "--out results/aware" in m["command"]
    assert len(m["sources"]["sha256"]) == 64 and m["sources"]["files"]
    assert all(k.startswith(("lab/aware/", "lab/experiments/aware/")) for k in m["sources"]["files"])
    assert m["wall_s"] > 0 and m["machine"]["cpu_count"] >= 1 and m["finished"] >= m["started"]
    assert len(m["config"]["seeds"]) >= 3


def test_every_variant_ran_on_every_seed_at_its_one_chosen_rate(study):
    runs, m = study["runs"], study["manifest"]
    assert set(runs.seed) == set(m["config"]["seeds"])
    assert (runs.groupby("variant").seed.nunique() == len(m["config"]["seeds"])).all()
    for v, lr in m["chosen_lr"].items():
        assert np.allclose(runs[runs.variant == v].lr, lr), v
    tuning = study["tuning"]
    chosen = tuning[tuning.chosen].set_index("variant").lr
    assert chosen.to_dict() == pytest.approx(m["chosen_lr"])
    assert (tuning.groupby("variant").lr.nunique() >= 2).all()            # every variant chose among rates
    cfg = shipped.StudyConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in m["config"].items()
                                 if k != "grids"})
    assert {shipped.variant_id(v) for v in shipped.variants(cfg)} == set(runs.variant)


def test_summary_is_the_mean_over_seeds_and_inside_its_interval(study):
    runs, s = study["runs"], study["summary"]
    mean = runs.groupby("variant")[["downstream", "R", "E", "H"]].mean()
    for r in s.itertuples():
        if r.metric in mean.columns and np.isfinite(r.estimate):
            assert r.estimate == pytest.approx(mean.loc[r.variant, r.metric], abs=1e-6), (r.variant, r.metric)
            assert r.lo - 1e-9 <= r.estimate <= r.hi + 1e-9
    c = study["comparisons"]
    assert ((c.lo <= 0) & (c.hi >= 0) == ~c.detected).all()
    assert (c.verdict.str.contains("no difference detected") == ~c.detected).all()


def test_continual_has_both_protocols_with_intervals(study):
    cs = study["continual_summary"]
    assert set(cs.protocol) == {p for p, _, _ in shipped.CONTINUAL}
    assert any("paper" in p for p in cs.protocol) and any("extension" in p for p in cs.protocol)
    assert set(cs.metric) == {"Avg", "Last", "BWT", "R_after"} and (cs.lo <= cs.hi).all()
    cont = study["continual"]
    assert set(cont.seed) == set(study["manifest"]["config"]["seeds"])


def test_answers_reproduce_the_runs_table(study):
    a, runs = study["answers"], study["runs"]
    acc = a[a.variant != "base"].groupby(["variant", "seed", "set"]).correct.mean().unstack("set")
    merged = runs.set_index(["variant", "seed"]).join(acc)
    assert np.allclose(merged.downstream, merged["down"]) and np.allclose(merged.up_easy_vqa, merged["easy_vqa"])


def test_readme_section_is_the_shipped_study(study):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert study_views.readme_block(readme) == study_views.readme_section(study), (
        "README's AWARe section differs from results/aware: regenerate it with "
        "lab.experiments.aware.study_views.readme_section(load_study('results/aware'))")
    assert "the paper's picture" not in study_views.readme_block(readme)


def test_the_shipped_projector_seeds_an_empty_cache_once_checked_and_never_overwrites(tmp_path):
    import shutil

    import torch

    from lab._io import load_tensors

    shipped_files = sorted((STUDY / study_views.SHIPPED_CACHE).glob("projectors/*.safetensors"))
    assert shipped_files, "results/aware/cache/projectors holds the study's aligned projector"
    written = study_views.seed_caches(STUDY, cache_dir=tmp_path / "cache")
    assert [p.name for p in written] == [p.name for p in shipped_files]
    assert all(p.parent == tmp_path / "cache" / "aware" / "projectors" for p in written)
    for src, dest in zip(shipped_files, written):
        a, b = load_tensors(src)[0], load_tensors(dest)[0]        # both pass their sha256 check
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert set(a) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # MiniLlava.mm_projector's state
    before = {p: p.read_bytes() for p in written}
    assert study_views.seed_caches(STUDY, cache_dir=tmp_path / "cache") == []   # present: left alone
    assert {p: p.read_bytes() for p in written} == before

    bad = tmp_path / "bad_study"                                  # a damaged copy is refused, loudly
    shutil.copytree(STUDY / study_views.SHIPPED_CACHE, bad / study_views.SHIPPED_CACHE)
    damaged = bad / study_views.SHIPPED_CACHE / "projectors" / shipped_files[0].name
    data = bytearray(damaged.read_bytes())
    data[-8:] = b"\x00" * 8
    damaged.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="fails its check"):
        assert study_views.seed_caches(bad, cache_dir=tmp_path / "other") == []
    assert not (tmp_path / "other" / "aware" / "projectors" / damaged.name).exists()
