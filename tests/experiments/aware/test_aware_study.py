"""The study runner: per-variant rates chosen on validation, cached by configuration, the paired
bootstrap intervals, and the tables notebook 04 reads (on the random tiny model: seconds)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.aware import metrics as M
from lab.experiments.aware import intervals as I
from lab.experiments.aware import plan, runner, shipped


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


def _env(base=None):
    return runner.Env(None, None, plan.PRESETS["smoke"], base or {"val:easy_vqa": [1] * 10}, {}, "x", "code")


def test_every_variant_gets_its_own_rate_full_by_accuracy_others_by_h():
    recs = _records([("methods/full", "full", 1e-5, 0.5, 0.9), ("methods/full", "full", 2e-5, 0.7, 0.5),
                     ("rho/rho=0.1", "aware", 1e-4, 0.6, 0.9), ("rho/rho=0.1", "aware", 1e-3, 0.7, 0.4),
                     ("rho/rho=0.5", "aware", 1e-4, 0.3, 1.0), ("rho/rho=0.5", "aware", 1e-3, 0.7, 0.9)])
    chosen, rows = runner.choose_rates(_env(), recs)
    assert chosen == {"methods/full": 2e-5, "rho/rho=0.1": 1e-4, "rho/rho=0.5": 1e-3}
    assert sum(r["chosen"] for r in rows) == 3
    assert {r["variant"] for r in rows if r["edge"]} == {"methods/full", "rho/rho=0.1", "rho/rho=0.5"}


def test_a_diverged_run_is_never_chosen():
    recs = _records([("methods/full", "full", 1e-5, 0.5, 0.9), ("methods/full", "full", 2e-5, 0.9, 0.9)])
    recs[1]["diverged"] = True
    chosen, _ = runner.choose_rates(_env(), recs)
    assert chosen == {"methods/full": 1e-5}


def test_an_edge_choice_extends_the_grid_by_its_own_ratio():
    assert runner._beyond([1e-5, 2e-5, 4e-5], 4e-5) == pytest.approx(8e-5)
    assert runner._beyond([1e-5, 2e-5, 4e-5], 1e-5) == pytest.approx(5e-6)
    assert runner._beyond([1e-5, 2e-5, 4e-5], 2e-5) is None


def test_plan_tunes_every_compared_variant_and_reuses_the_tuning_run():
    cfg = plan.PRESETS["smoke"]
    tune = plan.plan_tuning(cfg)
    ids = {plan.variant_id(j.variant) for j in tune}
    for need in ("methods/full", "methods/lora", "methods/dora", "methods/aware", "methods/rho=0", "rule/weight-norm",
                 "rule/random", "rule/activation-balanced", "rho/rho=0.5", "targets/qkv", "calibration/proxy",
                 "calib_size/n=4"):
        assert need in ids
    assert plan.variant_id(tune[0].variant) == "methods/full"          # E needs it first
    assert all(len(cfg.grid(j.variant.spec.method)) >= 2 for j in tune)
    chosen = {plan.variant_id(j.variant): j.lr for j in reversed(tune)}   # a rate of each variant's grid
    tests = plan.plan_tests(cfg, chosen)
    first = [j for j in tests if j.seed == cfg.tune_seed and j.lr is not None]
    keys = {plan.job_key("f", j, cfg) for j in tune}
    assert all(plan.job_key("f", j, cfg) in keys for j in first)            # the same configuration: a cache hit
    # rho = 0 in the methods group and in the rho group is one run
    assert plan.job_key("f", replace(first[0], variant=next(j.variant for j in tune if j.variant.label == "rho=0"
                                                                      and j.variant.group == "rho")), cfg) == \
        plan.job_key("f", replace(first[0], variant=next(j.variant for j in tune if j.variant.label == "rho=0"
                                                                 and j.variant.group == "methods")), cfg)
    assert len(set(tests)) == len(tests)


def test_the_methods_group_has_more_seeds_than_the_ablations():
    cfg = plan.PRESETS["shipped"]
    assert len(cfg.seeds_for("methods")) == 5 and len(cfg.seeds_for("rho")) == 3
    # the headline pair (full fine-tuning, AWARe) on 16 seeds; the other methods keep 5
    assert cfg.seeds_for("methods", "methods/full") == cfg.seeds_for("methods", "methods/aware") == tuple(range(16))
    assert cfg.seeds_for("methods", "methods/lora") == tuple(range(5))
    chosen = {plan.variant_id(v): 1e-4 for v in plan.variants(cfg)}
    tests = plan.plan_tests(cfg, chosen, ("methods",))
    per = {}
    for j in tests:
        per.setdefault(plan.variant_id(j.variant), set()).add(j.seed)
    assert per["methods/full"] == per["methods/aware"] == set(range(16))
    assert per["methods/dora"] == per["methods/rho=0"] == set(range(5)) and per["methods/zero-shot"] == set(range(5))
    assert all(len(cfg.grid(m)) >= 3 for m in ("full", "lora", "dora", "aware"))
    assert {v.label for v in plan.variants(cfg) if v.group == "rho"} == {"rho=0", "rho=0.1", "rho=0.5", "rho=0.7",
                                                                         "rho=0.9"}
    assert {v.label for v in plan.variants(cfg) if v.group == "calib_size"} == {"n=8", "n=16", "n=64"}


def test_phases_run_the_headline_then_the_findings_then_the_rest():
    cfg = plan.PRESETS["shipped"]
    ids = [plan.variant_id(v) for v in plan.variants(cfg)]
    first = [next(i for i, ph in enumerate(plan.PHASES) if plan.in_phase(v, ph)) for v in plan.variants(cfg)]
    phase = dict(zip(ids, first))
    assert phase["methods/full"] == phase["methods/aware"] == 0
    finding = ("rule/weight-norm", "rule/random", "rho/rho=0.1", "rho/rho=0.5", "targets/qkv+projector+mlp",
               "calibration/proxy")
    rest = ("rho/rho=0.7", "rho/rho=0.9", "targets/qkv", "calib_size/n=8")
    assert max(phase[i] for i in finding) < min(phase[i] for i in rest)
    assert plan.PHASES[-1] is None        # the last phase: every variant, so nothing is left out
    every = [j for ph in plan.PHASES for j in plan.plan_tuning(cfg, groups=ph)]
    assert {plan.job_key("f", j, cfg) for j in every} == {plan.job_key("f", j, cfg) for j in plan.plan_tuning(cfg)}


def test_job_key_changes_with_the_configuration_only():
    cfg = plan.PRESETS["smoke"]
    v = plan.variants(cfg)[1]
    j = plan.Job(v, 1e-4, 0)
    k = plan.job_key("f", j, cfg)
    assert k == plan.job_key("f", replace(j, variant=replace(v, group="other")), cfg)
    assert k != plan.job_key("f", replace(j, lr=3e-4), cfg)
    assert k != plan.job_key("f", replace(j, seed=1), cfg)
    assert k != plan.job_key("g", j, cfg)
    assert k != plan.job_key("f", j, replace(cfg, steps=3))
    # adding variants, seeds or grid points does not touch a finished run's key
    assert k == plan.job_key("f", j, replace(cfg, seeds=(0, 1, 2, 3), rhos=(0.9,), grids=()))
    assert plan.data_fingerprint(cfg, "cpu") != plan.data_fingerprint(replace(cfg, n_eval=17), "cpu")
    assert plan.data_fingerprint(cfg, "cpu") == plan.data_fingerprint(replace(cfg, seeds=(5,)), "cpu")


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    out = tmp_path_factory.mktemp("study") / "aware"
    res = shipped.run_study(plan.PRESETS["smoke"], out, command="test", cache_dir=cache, progress=False)
    return res, cache, out


def test_smoke_study_writes_every_table_and_a_manifest(smoke_study):
    res, cache, out = smoke_study
    man = res["manifest"]
    for name in man["tables"]:
        assert (out / name).exists(), name
    assert man["command"] == "test" and man["sources"]["sha256"] == shipped.source_hashes()["sha256"]
    assert man["complete"] is True
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs.seed) == {0, 1} and runs.groupby("variant").seed.nunique().min() == 2
    assert runs.groupby("variant").lr.nunique().max() == 1                 # one rate per variant, every seed
    assert set(runs.group) >= {"methods", "rule", "rho", "targets", "calibration", "calib_size"}
    summ = pd.read_csv(out / "summary.csv")
    for col in ("variant", "group", "seeds", "metric", "estimate", "lo", "hi", "learned"):
        assert col in summ.columns
    ok = summ.estimate.notna()
    assert (summ.lo[ok] <= summ.estimate[ok] + 1e-9).all() and (summ.estimate[ok] <= summ.hi[ok] + 1e-9).all()
    assert {"R_easy_vqa", "R_probe", "R"} <= set(summ.metric)
    # E and H only for variants that learned
    eh = summ[summ.metric.isin(["E", "H"])]
    assert eh[~eh.learned].estimate.isna().all()
    mean = runs.groupby("variant")[["R", "downstream"]].mean()
    for (v, m), x in summ.set_index(["variant", "metric"]).estimate.items():
        if m in mean.columns:
            assert x == pytest.approx(mean.loc[v, m], abs=1e-9), (v, m)
    base = pd.read_csv(out / "baselines.csv")
    assert list(base.columns) == ["set", "reference", "acc", "n"]
    assert set(base.reference) >= {"most common answer", "zero-shot"}
    assert set(pd.read_csv(out / "findings.csv").verdict) <= {"reproduced", "contradicted", "not detected",
                                                              "not comparable"}
    cs = pd.read_csv(out / "continual_summary.csv")
    assert set(cs.protocol) == {p for p, _, _ in plan.CONTINUAL}
    assert set(cs.metric) == {"Avg", "Last", "BWT", "R_after"}
    assert len(list((out / "runs").glob("*.json"))) > 20


def test_a_resumed_study_runs_only_what_is_missing_and_gives_the_same_tables(smoke_study, tmp_path):
    import shutil

    res, cache, out = smoke_study
    again = tmp_path / "again"
    shutil.copytree(out, again)
    files = sorted((again / "runs").glob("lora-*.json"))
    victim = files[0]
    victim.unlink()
    before = {p.name: p.stat().st_mtime_ns for p in (again / "runs").glob("*.json")}
    res2 = shipped.run_study(plan.PRESETS["smoke"], again, command="test", cache_dir=cache, progress=False)
    after = {p.name: p.stat().st_mtime_ns for p in (again / "runs").glob("*.json")}
    assert victim.name in after and all(after[k] == v for k, v in before.items())    # only the missing one ran
    pd.testing.assert_frame_equal(res2["summary"], res["summary"])
    # tables from the finished runs alone, nothing run
    only = shipped.run_study(plan.PRESETS["smoke"], again, command="test", cache_dir=cache, progress=False,
                             tables_only=True)
    pd.testing.assert_frame_equal(only["summary"], res["summary"])


def test_status_lists_finished_and_missing_runs(smoke_study, tmp_path):
    import shutil

    res, cache, out = smoke_study
    part = tmp_path / "part"
    shutil.copytree(out, part)
    for p in list((part / "runs").glob("dora-*.json")):
        p.unlink()
    st = shipped.run_study(plan.PRESETS["smoke"], part, cache_dir=cache, progress=False, status_only=True)["status"]
    n = len(plan.plan_tuning(plan.PRESETS["smoke"]))
    assert f"tuning (base grids): {n - 2}/{n} finished" in st, st
    assert [ln.split()[0] for ln in st.splitlines() if "methods/dora " in ln] == ["....", "...."], st
    only = shipped.run_study(plan.PRESETS["smoke"], part, cache_dir=cache, progress=False, tables_only=True)
    assert only["manifest"]["complete"] is False


def test_study_views_fill_every_section(smoke_study):
    from lab.experiments.aware import prose, study_views

    res, cache, out = smoke_study
    st = study_views.load_study(out)
    for g in ("methods", "rule", "rho", "targets", "calibration", "calib_size"):
        t = study_views.table(st, g)
        assert len(t) >= 2 and all("[" in x for x in t.R)
    text = prose.describe_study(st)
    assert "AWARe vs full fine-tuning" in text and "Continual" in text
    for line in st["comparisons"].itertuples():
        if "not compared" not in line.verdict:
            assert ("no difference detected" in line.verdict) == (line.lo <= 0 <= line.hi)


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


def test_a_new_method_is_one_registry_entry_and_appears_in_a_study(tmp_path):
    """A toy method (full fine-tuning of the projector alone) registered with its lr field and grid
    runs through the study with no other change."""
    from lab.aware.methods import METHODS, Method, param_groups, register_method
    from lab.aware.targets import is_projector

    class ProjectorOnly(Method):
        lr_field, grid, role = "lr_projector", (1e-4, 1e-3), "baseline"

        def prepare(self, model, spec, cfg, saliency=None):
            for n, p in model.named_parameters():
                p.requires_grad_(is_projector(n))
            return model, param_groups(model, cfg.lr, cfg.lr_projector), {}

    register_method("toy-projector")(ProjectorOnly)
    try:
        cfg = replace(plan.PRESETS["smoke"], methods=("full", "toy-projector", "aware"), rules=(), rhos=(), targets=(),
                      proxy=False, calib_sizes=(), continual=False, rho0_in_methods=False, seeds=(0,), ablation_seeds=1)
        res = shipped.run_study(cfg, tmp_path / "s", command="test", cache_dir=tmp_path / "c", progress=False)
        assert "methods/toy-projector" in set(res["summary"].variant)
        assert set(res["tuning"][res["tuning"].variant == "methods/toy-projector"].lr) == {1e-4, 1e-3}
        from lab.experiments.aware import tune

        assert tune.default_grids()["toy-projector"] == (1e-4, 1e-3)      # lab aware tune's default grid
        assert tune.flags({"toy-projector": 1e-3}) == "--lr-projector 0.001"
    finally:
        METHODS.unregister("toy-projector")


def test_the_run_pipeline_names_no_method_outside_the_registry():
    """Roles, lr fields, grids and table columns come from :mod:`lab.aware.methods`; the modules
    that plan, run, tune and tabulate compare no method name (variant labels are data, not code)."""
    import re

    pipeline = ("plan", "runner", "tune", "ablate", "study_tables", "continual", "finetune")
    here = Path(plan.__file__).parent
    pat = re.compile(r"""(==|!=|\bin)\s*\(?\s*["'](full|lora|dora|zero-shot)["']""")
    bad = [f"{m}.py:{i}: {ln.strip()}" for m in pipeline
           for i, ln in enumerate((here / f"{m}.py").read_text().splitlines(), 1) if pat.search(ln)]
    assert not bad, "\n".join(bad)


def test_check_reruns_a_finished_run_and_finds_the_same_answers(smoke_study, tmp_path):
    import json
    import shutil

    res, cache, out = smoke_study
    env = runner.build_env(plan.PRESETS["smoke"], cache_dir=cache, progress=False, store=out / "saliency")
    got = runner.check(env, out, log=None)
    assert got["same"] and got["key"].startswith("full-") and all(r["questions"] > 0 for r in got["rows"])
    # a tampered run is caught
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    f = bad / "runs" / f"{got['key']}.json"
    rec = json.loads(f.read_text())
    rec["answers"]["down"] = [1 - x for x in rec["answers"]["down"]]
    f.write_text(json.dumps(rec))
    assert not runner.check(env, bad, got["key"], log=None)["same"]
    with pytest.raises(ValueError, match="no finished run"):
        runner.check(env, out, "nope", log=None)
