"""The study runner: per-variant rates chosen on validation, cached by configuration, the paired
bootstrap intervals, and the tables notebook 04 reads (on the random tiny model: seconds)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from lab.aware import metrics as M
from lab.experiments.aware import intervals as I
from lab.experiments.aware import shipped


def test_replicate_zero_is_the_observed_estimate_and_matches_lab_aware_metrics():
    rng = np.random.default_rng(0)
    before, after = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    d = I.draw([0, 1], {"s": 50}, replicates=300)
    b, a = I.accuracy(d, "s", before), I.accuracy(d, "s", after)
    assert b[0] == before.mean() and a[0] == after.mean()
    r = I.retention(b, a)
    assert r[0] == pytest.approx(M.retention(before.mean(), after.mean()))
    assert I.h_score(r, r * 0 + 80)[0] == pytest.approx(M.h_score(r[0], 80.0))
    s = I.summarise(r)
    assert s["lo"] <= s["estimate"] <= s["hi"] and s["hi"] > s["lo"]


def test_paired_differences_are_tighter_than_unpaired_and_zero_for_identical_runs():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2, 200)
    y = x.copy()
    y[:6] = 1 - y[:6]                                  # differs on 6 of 200 questions
    d = I.draw([0], {"s": 200}, replicates=1000)
    diff = I.summarise(I.accuracy(d, "s", x) - I.accuracy(d, "s", y))
    width_single = np.subtract(*[I.summarise(I.accuracy(d, "s", x))[k] for k in ("hi", "lo")])
    assert diff["hi"] - diff["lo"] < width_single / 2
    same = I.summarise(I.accuracy(d, "s", x) - I.accuracy(d, "s", x))
    assert same == {"estimate": 0.0, "lo": 0.0, "hi": 0.0}
    assert "no difference detected" in I.verdict("a", "b", same, "R")
    assert "is higher" in I.verdict("a", "b", {"estimate": 2.0, "lo": 0.5, "hi": 3.0}, "R")
    assert "is lower" in I.verdict("a", "b", {"estimate": -2.0, "lo": -3.0, "hi": -0.5}, "R")


def test_seed_resampling_widens_the_interval_when_seeds_disagree():
    d = I.draw([0, 1, 2], {"s": 10}, replicates=500)
    per = {0: np.full(501, 10.0), 1: np.full(501, 20.0), 2: np.full(501, 30.0)}
    s = I.summarise(I.over_seeds(d, per))
    assert s["estimate"] == pytest.approx(20.0) and s["lo"] < 15 and s["hi"] > 25
    with pytest.raises(ValueError, match="no result for seeds"):
        I.over_seeds(d, {0: per[0]})


def _records(rows):
    return [{"variant": v, "method": m, "lr": lr, "seed": 0,
             "answers": {"val:down": [1] * int(10 * acc) + [0] * (10 - int(10 * acc)),
                         "val:easy_vqa": [1] * int(10 * up) + [0] * (10 - int(10 * up))}}
            for v, m, lr, acc, up in rows]


def test_every_variant_gets_its_own_rate_full_by_accuracy_others_by_h():
    env = shipped.Env(None, None, "fashion", {"val:easy_vqa": [1] * 10}, {}, "x")
    recs = _records([("methods/full", "full", 1e-5, 0.5, 0.9), ("methods/full", "full", 2e-5, 0.7, 0.5),
                     ("rho/rho=0.1", "aware", 1e-4, 0.6, 0.9), ("rho/rho=0.1", "aware", 1e-3, 0.7, 0.4),
                     ("rho/rho=0.5", "aware", 1e-4, 0.3, 1.0), ("rho/rho=0.5", "aware", 1e-3, 0.7, 0.9)])
    chosen, rows = shipped.choose_rates(env, recs, shipped.PRESETS["smoke"])
    assert chosen == {"methods/full": 2e-5, "rho/rho=0.1": 1e-4, "rho/rho=0.5": 1e-3}
    assert sum(r["chosen"] for r in rows) == 3


def test_plan_tunes_every_compared_variant_and_reuses_the_tuning_run():
    cfg = shipped.PRESETS["smoke"]
    tune = shipped.plan_tuning(cfg)
    ids = {shipped.variant_id(j.variant) for j in tune}
    for need in ("methods/full", "methods/lora", "methods/dora", "methods/aware", "rule/weight-norm", "rule/random",
                 "rho/rho=0.1", "rho/rho=0.5", "targets/qkv", "targets/qkv+projector+mlp", "calibration/proxy",
                 "calib_size/n=4"):
        assert need in ids
    assert shipped.variant_id(tune[0].variant) == "methods/full"          # E needs it first
    chosen = {shipped.variant_id(j.variant): j.lr for j in reversed(tune)}   # a rate of each variant's grid
    tests = shipped.plan_tests(cfg, chosen)
    first = [j for j in tests if j.seed == cfg.tune_seed and j.lr is not None]
    keys = {shipped.job_key("f", j) for j in tune}
    assert all(shipped.job_key("f", j) in keys for j in first)            # the same configuration: a cache hit
    assert len({shipped.job_key("f", j) for j in tests}) > len(first)
    # every job is a frozen, hashable value (what a distributed executor maps over)
    assert len(set(tests)) == len(tests)


def test_job_key_changes_with_the_configuration_only():
    v = shipped.variants(shipped.PRESETS["smoke"])[1]
    j = shipped.Job(v, 1e-4, 0)
    assert shipped.job_key("f", j) == shipped.job_key("f", replace(j, variant=replace(v, group="other", label="x")))
    assert shipped.job_key("f", j) != shipped.job_key("f", replace(j, lr=3e-4))
    assert shipped.job_key("f", j) != shipped.job_key("f", replace(j, seed=1))
    assert shipped.job_key("f", j) != shipped.job_key("g", j)


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    out = tmp_path_factory.mktemp("study") / "aware"
    res = shipped.run_study(shipped.PRESETS["smoke"], out, command="test", cache_dir=cache, progress=False)
    return res, cache, out


def test_smoke_study_writes_every_table_and_a_manifest(smoke_study):
    res, cache, out = smoke_study
    man = res["manifest"]
    for name in man["tables"]:
        assert (out / name).exists(), name
    assert man["command"] == "test" and man["sources"]["sha256"] == shipped.source_hashes()["sha256"]
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs.seed) == {0, 1} and runs.groupby("variant").seed.nunique().min() == 2
    assert runs.groupby("variant").lr.nunique().max() == 1                 # one rate per variant, every seed
    assert set(runs.group) >= {"methods", "rule", "rho", "targets", "calibration", "calib_size"}
    summ = pd.read_csv(out / "summary.csv")
    assert (summ.lo <= summ.estimate + 1e-9).all() and (summ.estimate <= summ.hi + 1e-9).all()
    # the summary's estimate is the mean over seeds of the per-seed numbers
    mean = runs.groupby("variant")[["R", "downstream"]].mean()
    for (v, m), x in summ.set_index(["variant", "metric"]).estimate.items():
        if m in mean.columns:
            assert x == pytest.approx(mean.loc[v, m], abs=1e-9), (v, m)
    cs = pd.read_csv(out / "continual_summary.csv")
    assert set(cs.protocol) == {p for p, _, _ in shipped.CONTINUAL}
    assert set(cs.metric) == {"Avg", "Last", "BWT", "R_after"}
    assert len(pd.read_csv(out / "comparisons.csv")) and not list(out.parent.glob(".aware.*"))   # no temp left


def test_a_second_run_is_served_from_the_cache_and_gives_the_same_tables(smoke_study, tmp_path):
    res, cache, out = smoke_study
    again = shipped.run_study(shipped.PRESETS["smoke"], tmp_path / "again", command="test", cache_dir=cache, progress=False)
    assert again["manifest"]["timings"]["tuning_s"] < res["manifest"]["timings"]["tuning_s"]
    pd.testing.assert_frame_equal(again["summary"], res["summary"])
    lr_files = list((cache / "aware" / "study").glob("*/lr/*.json"))
    assert len(lr_files) == len(res["manifest"]["chosen_lr"])


def test_study_views_fill_every_section(smoke_study):
    from lab.experiments.aware import prose, study_views

    res, cache, out = smoke_study
    st = study_views.load_study(out)
    assert st["changed"] == []
    for g in ("methods", "rule", "rho", "targets", "calibration", "calib_size"):
        t = study_views.table(st, g)
        assert len(t) >= 2 and all("[" in x for x in t.R)
    text = prose.describe_study(st)
    assert "AWARe vs full fine-tuning" in text and "Continual" in text
    for line in st["comparisons"].itertuples():
        assert ("no difference detected" in line.verdict) == (line.lo <= 0 <= line.hi)
    assert all("[" in v for v in study_views.headline(st).values())


def test_changed_sources_are_reported(smoke_study, tmp_path):
    res, cache, out = smoke_study
    man = dict(res["manifest"])
    files = dict(man["sources"]["files"])
    k = next(f for f in files if f.endswith("lab/aware/masking.py"))
    files[k] = "0" * 64
    man["sources"] = {**man["sources"], "files": files}
    assert shipped.changed_sources(man) == [k]
    files2 = {**files, k: res["manifest"]["sources"]["files"][k],
              next(f for f in files if f.endswith("study_views.py")): "0" * 64}
    assert shipped.changed_sources({"sources": {"files": files2}}) == []    # presentation modules do not count
