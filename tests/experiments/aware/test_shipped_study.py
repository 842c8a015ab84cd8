"""The shipped AWARe study in results/aware: its manifest, its tables and the README's AWARe
section agree with each other (the README section is regenerated from the tables and compared)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import json
from dataclasses import asdict

from lab.experiments.aware.study import plan, shipped
from lab.experiments.aware.views import study as study_views

ROOT = Path(__file__).resolve().parents[3]
STUDY = ROOT / "results" / "aware"

pytestmark = pytest.mark.skipif(not (STUDY / "manifest.json").exists(), reason="no shipped study in results/aware")


@pytest.fixture(scope="module")
def study():
    return study_views.load_study(STUDY)


def test_manifest_lists_exactly_the_files_shipped_and_its_provenance(study):
    m = study["manifest"]
    # .study.lock: the lock any `lab aware study` here takes (git ignores it)
    shipped_files = sorted(p.name for p in STUDY.iterdir() if p.is_file() and not p.name.endswith(".sha256")
                           and p.name not in ("README.md", ".study.lock"))
    assert sorted(m["tables"] + ["manifest.json"]) == shipped_files
    assert m["command"].startswith("lab aware study")
    assert len(m["sources"]["sha256"]) == 64 and m["sources"]["files"]
    assert all(k.startswith(("lab/aware/", "lab/experiments/aware/")) for k in m["sources"]["files"])
    assert m["machine"]["cpu_count"] >= 1 and m["finished"] >= m["started"]
    assert m["config"] == json.loads(json.dumps(asdict(plan.PRESETS["shipped"])))   # the shipped preset
    assert m["tuning_seeds"] and not set(m["tuning_seeds"]) & set(m["test_seeds"])    # never a test seed


def test_manifest_tells_the_regeneration_from_the_runs_and_states_the_budget(study):
    """compute_s counts every run file once (a tuning run that is also a test run, or a variant two
    groups share, is one run); a --tables-only regeneration says so, and the budget is stated."""
    m, recs = study["manifest"], _records()
    r = m["runs"]
    if m.get("complete"):
        assert r["count"] == len(recs) and m["compute_s"] == pytest.approx(sum(x["seconds"] for x in recs.values()))
    else:       # an incomplete study's runs go on landing after its tables were written
        assert r["count"] <= len(recs)
    assert r["machine_s"] <= r["run_s"] + 1e-6 and r["concurrent_s"] <= r["machine_s"]
    assert set(r["machines"]) <= {x["machine"] for x in recs.values()}
    assert r["budget_s"] == plan.BUDGETS["shipped"] and r["over_budget"] == (r["machine_s"] > r["budget_s"])
    if m.get("complete"):
        assert r["cut"] == [] and "Nothing was cut" in m["note"]
    else:
        assert "Not complete" in m["note"]
    if m.get("tables_only"):
        assert "--tables-only" in m["command"] and "regenerated from the" in m["note"]
    assert f"{r['run_s'] / 3600:.1f} h of summed run time" in m["note"]


def _records():
    from lab._io import read_json

    return {p.stem: read_json(p) for p in sorted((STUDY / "runs").glob("*.json"))}


def test_every_shipped_run_is_whole_and_belongs_to_the_shipped_plan(study):
    cfg = plan.PRESETS["shipped"]
    recs = _records()
    assert recs, "results/aware/runs holds the finished runs"
    sequences = {k: recs.pop(k) for k in [k for k in recs if k.startswith("continual-")]}
    for key, r in sequences.items():      # the continual sequences: whole records of a shipped method
        assert r["method"] in cfg.to_size().continual_methods and r["rows"] and r["code"] and r["seconds"] > 0, key
    sizes = {"down": cfg.n_eval, "easy_vqa": cfg.n_easy_eval, "probe": cfg.n_probe,
             "val:down": cfg.n_val, "val:easy_vqa": cfg.n_val}
    fp = study["manifest"]["fingerprint"]
    every = {plan.variant_id(v): tuple(cfg.scales) for v in plan.variants(cfg)}    # any kept scales
    jobs = plan.plan_fronts(cfg) + plan.plan_precision(cfg) + plan.plan_tuning(cfg) + plan.plan_tests(cfg, every)
    keys = {plan.job_key(fp, j, cfg): j for j in jobs}
    for key, r in recs.items():
        assert key in keys, f"{key}: not a run of the shipped plan"
        j = keys[key]
        steps = cfg.steps if plan.lr_field(r["method"]) else 0      # a method that does not train (zero-shot)
        assert r["steps"] == steps and len(r["losses"]) == steps, key
        want = {"test": {"down", "easy_vqa", "probe"}, "val": {"val:down", "val:easy_vqa"}}
        assert set(r["answers"]) == set().union(*(want[x] for x in (j.sets if steps else ("test", "val")))), key
        for st, a in r["answers"].items():
            assert len(a) == sizes[st] and set(a) <= {0, 1}, (key, st)
        if steps:
            assert r["seed"] == j.seed and r["scale"] == j.scale and r["precision"] == (j.precision or cfg.precision)
            assert (r["seed"] in cfg.tune_seeds) == (j.sets == ("val",)), key       # tuning seeds answer validation only
        assert r["code"] and r["machine"] and r["seconds"] > 0


def test_each_front_point_is_the_mean_over_seeds_and_inside_its_interval(study):
    runs, f = study["runs"], study["fronts"]
    if not len(f):
        pytest.skip("no test run finished yet")
    bf = runs[runs.precision == study["manifest"]["config"]["precision"]]
    mean = bf.groupby(["variant", "scale"])[["downstream", "R"]].mean()
    for r in f.itertuples():
        assert r.downstream == pytest.approx(mean.loc[(r.variant, r.scale), "downstream"], abs=1e-6)
        assert r.R == pytest.approx(mean.loc[(r.variant, r.scale), "R"], abs=1e-6)
        if r.seeds > 1:
            assert r.downstream_lo - 1e-9 <= r.downstream <= r.downstream_hi + 1e-9


def test_the_finished_study_spans_each_front(study):
    """Every method's front goes from barely learning to learning the task, and full fine-tuning's
    from keeping to clearly forgetting (so comparisons at matched levels have a range to read)."""
    f = study["fronts"]
    seeds = len(study["manifest"]["config"]["seeds"])
    if not study["manifest"].get("complete") and (f[f.variant.str.startswith("methods/")].seeds < seeds).any():
        pytest.skip("the shipped study's fronts are not complete yet (lab aware study --status)")
    floor = float(study["baselines"].query("set.str.startswith('downstream')", engine="python").acc.max())
    for v in ("methods/full", "methods/lora", "methods/dora", "methods/aware", "methods/rho=0"):
        g = f[f.variant == v]
        assert g.learned.any() and g.downstream.max() - g.downstream.min() >= 0.2, v
    full = f[f.variant == "methods/full"]
    assert full.R.min() <= 80 and full.R.max() >= 90
    assert floor < 0.2


def test_readme_section_is_the_shipped_study(study):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert study_views.readme_block(readme) == study_views.readme_section(study), (
        "README's AWARe section differs from results/aware: regenerate it with "
        "lab.experiments.aware.views.study.readme_section(load_study('results/aware'))")
    assert "the paper's picture" not in study_views.readme_block(readme)
    assert (STUDY / "README.md").read_text(encoding="utf-8") == study_views.results_readme(study)


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
