"""The study: learning-rate fronts planned whole, scales chosen on tuning seeds that are never test
seeds, cached by configuration, and the tables notebook 04 reads (on the random tiny model: seconds)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.experiments.aware.study import plan, runner, shipped


def _records(rows, seed=100):
    return [{"variant": v, "method": m, "scale": sc, "lr": sc, "seed": seed,
             "answers": {"val:down": [1] * int(10 * acc) + [0] * (10 - int(10 * acc)),
                         "val:easy_vqa": [1] * int(10 * up) + [0] * (10 - int(10 * up))}}
            for v, m, sc, acc, up in rows]


def _env(base=None):
    return runner.Env(None, None, plan.PRESETS["smoke"], base or {"val:easy_vqa": [1] * 10}, {}, "x", "code")


def test_tuning_ranks_each_variant_full_by_accuracy_others_by_h_and_keeps_the_best():
    recs = _records([("methods/full", "full", 0.1, 0.5, 0.9), ("methods/full", "full", 1.0, 0.7, 0.5),
                     ("rho/rho=0.1", "aware", 0.1, 0.6, 0.9), ("rho/rho=0.1", "aware", 1.0, 0.7, 0.4),
                     ("rho/rho=0.5", "aware", 0.1, 0.3, 1.0), ("rho/rho=0.5", "aware", 1.0, 0.7, 0.9)])
    points, kept, rows = runner.choose(_env(), recs, keep=1)
    assert points == {"methods/full": 1.0, "rho/rho=0.1": 0.1, "rho/rho=0.5": 1.0}
    assert kept == {"methods/full": (1.0,), "rho/rho=0.1": (0.1,), "rho/rho=0.5": (1.0,)}
    assert sum(r["chosen"] for r in rows) == 3
    assert runner.choose(_env(), recs, keep=2)[1]["rho/rho=0.5"] == (0.1, 1.0)


def test_a_diverged_run_is_never_chosen_and_tuning_seeds_are_averaged():
    recs = _records([("methods/full", "full", 0.1, 0.5, 0.9), ("methods/full", "full", 1.0, 0.9, 0.9)])
    recs[1]["diverged"] = True
    assert runner.choose(_env(), recs, keep=1)[0] == {"methods/full": 0.1}
    two = _records([("methods/full", "full", 0.1, 0.5, 0.9), ("methods/full", "full", 1.0, 0.9, 0.9)]) + \
        _records([("methods/full", "full", 0.1, 0.9, 0.9), ("methods/full", "full", 1.0, 0.4, 0.9)], seed=101)
    points, _, rows = runner.choose(_env(), two, keep=1)
    assert points == {"methods/full": 0.1} and {r["seeds"] for r in rows} == {2}      # 0.7 vs 0.65


def test_tuning_seeds_are_never_test_seeds():
    with pytest.raises(ValueError, match="also test seeds"):
        replace(plan.PRESETS["shipped"], tune_seeds=(0,))
    cfg = plan.PRESETS["shipped"]
    tune = plan.plan_tuning(cfg)
    assert {j.seed for j in tune} == set(cfg.tune_seeds) and not set(cfg.tune_seeds) & set(cfg.seeds)
    assert all(j.sets == ("val",) for j in tune)                 # tuning runs answer validation questions only
    tests = plan.plan_fronts(cfg) + plan.plan_tests(cfg, {plan.variant_id(v): cfg.scales[:3] for v in plan.variants(cfg)})
    assert all(j.seed in cfg.seeds for j in tests) and all("val" not in j.sets for j in tests if j.scale is not None)


def test_the_shipped_plan_has_every_front_and_every_short_front():
    cfg = plan.PRESETS["shipped"]
    fronts = plan.plan_fronts(cfg)
    per = {}
    for j in fronts:
        if j.scale is not None:
            per.setdefault(plan.variant_id(j.variant), set()).add((j.scale, j.seed))
    assert set(per) == {"methods/full", "methods/lora", "methods/dora", "methods/aware", "methods/rho=0"}
    assert all(len({sc for sc, _ in v}) >= 5 and len({s for _, s in v}) >= 5 for v in per.values())
    scales = sorted(cfg.scales)
    assert all(b / a == pytest.approx(3.0) for a, b in zip(scales, scales[1:]))          # log-spaced
    kept = {plan.variant_id(v): cfg.scales[:cfg.keep] for v in plan.variants(cfg)}
    short = {}
    for j in plan.plan_tests(cfg, kept):
        short.setdefault(plan.variant_id(j.variant), set()).add((j.scale, j.seed))
    assert len(short) >= 13 and all(len({sc for sc, _ in v}) >= 3 and len({s for _, s in v}) >= 3 for v in short.values())
    # the lr and the projector's rate move together
    tc = plan.train_config(cfg, "full", 1 / 3, 0)
    assert tc.lr == pytest.approx(1e-5 / 3, rel=1e-3) and tc.lr_projector == pytest.approx(1e-3 / 3, rel=1e-3)
    assert tc.precision == "bf16" and plan.train_config(cfg, "full", 1.0, 0, precision="fp32").precision == "fp32"


def test_job_key_changes_with_the_configuration_only():
    cfg = plan.PRESETS["smoke"]
    v = plan.variants(cfg)[1]
    j = plan.Job(v, 1.0, 0)
    k = plan.job_key("f", j, cfg)
    assert k == plan.job_key("f", replace(j, variant=replace(v, group="other")), cfg)
    assert k != plan.job_key("f", replace(j, scale=0.1), cfg)
    assert k != plan.job_key("f", replace(j, seed=1), cfg)
    assert k != plan.job_key("f", replace(j, precision="fp32"), cfg)
    assert k != plan.job_key("g", j, cfg)
    assert k != plan.job_key("f", j, replace(cfg, steps=3))
    # adding variants, seeds or scales does not touch a finished run's key
    assert k == plan.job_key("f", j, replace(cfg, seeds=(0, 1, 2, 3), rhos=(0.9,), scales=(0.1, 1.0, 10.0)))
    assert plan.data_fingerprint(cfg, "cpu") != plan.data_fingerprint(replace(cfg, n_eval=17), "cpu")
    assert plan.data_fingerprint(cfg, "cpu") == plan.data_fingerprint(replace(cfg, seeds=(5,)), "cpu")
    # rho = 0 in the methods group and in the rho group is one run
    rho0 = [v for v in plan.variants(cfg) if v.label == "rho=0"]
    assert len(rho0) == 2 and len({plan.job_key("f", plan.Job(v, 1.0, 0), cfg) for v in rho0}) == 1


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
    assert man["complete"] is True and man["tuning_seeds"] == [100] and man["test_seeds"] == [0, 1]
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs.seed) == {0, 1}
    m = runs[runs.group == "methods"]
    assert (m.groupby("variant").scale.nunique() == 2).all()            # every method's whole front
    assert set(runs.group) >= {"methods", "rule", "rho", "targets", "calibration", "calib_size"}
    fr = pd.read_csv(out / "fronts.csv")
    ok = fr.downstream.notna() & fr.downstream_lo.notna()
    assert (fr.downstream_lo[ok] <= fr.downstream[ok] + 1e-9).all() and (fr.downstream[ok] <= fr.downstream_hi[ok] + 1e-9).all()
    mean = runs.groupby(["variant", "scale"]).downstream.mean()
    for r in fr.itertuples():
        assert r.downstream == pytest.approx(mean[(r.variant, r.scale)], abs=1e-9)
    base = pd.read_csv(out / "baselines.csv")
    assert {"easy-VQA: yes/no", "easy-VQA: shape", "easy-VQA: colour"} <= set(base.set)
    f = pd.read_csv(out / "findings.csv")
    assert all(v in {"reproduced", "contradicted", "no difference detected", "not enough seeds",
                     "not comparable (no shared downstream range)"} or v.startswith("not run yet (") for v in f.verdict)
    cs = pd.read_csv(out / "continual_summary.csv")
    assert set(cs.protocol) == {p for p, _, _ in plan.CONTINUAL}
    assert {"Avg", "Last", "BWT", "R_after"} <= set(cs.metric)
    assert len(pd.read_csv(out / "precision.csv")) > 0
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
    pd.testing.assert_frame_equal(res2["fronts"], res["fronts"])
    only = shipped.run_study(plan.PRESETS["smoke"], again, command="test", cache_dir=cache, progress=False,
                             tables_only=True)
    pd.testing.assert_frame_equal(only["fronts"], res["fronts"])
    pd.testing.assert_frame_equal(only["findings"], res["findings"])


def test_status_lists_finished_and_missing_runs(smoke_study, tmp_path):
    import shutil

    res, cache, out = smoke_study
    part = tmp_path / "part"
    shutil.copytree(out, part)
    gone = [p for p in (part / "runs").glob("dora-*.json")]
    for p in gone:
        p.unlink()
    st = shipped.run_study(plan.PRESETS["smoke"], part, cache_dir=cache, progress=False, status_only=True)["status"]
    assert "fronts" in st and "missing" in st and "not complete" in st, st
    only = shipped.run_study(plan.PRESETS["smoke"], part, cache_dir=cache, progress=False, tables_only=True)
    assert only["manifest"]["complete"] is False


def test_study_views_fill_every_section(smoke_study):
    from lab.experiments.aware.views import study as study_views

    res, cache, out = smoke_study
    st = study_views.load_study(out)
    assert len(study_views.fronts_table(st)) >= 10
    assert len(study_views.plane(st).data) == 5
    for g in ("rule", "rho", "targets", "calibration", "calib_size"):
        assert len(study_views.group_plane(st, g).data) >= 2
    assert "fronts" in study_views.takeaway(st)
    assert len(study_views.findings(st)) == len(st["findings"])
    assert len(study_views.continual_table(st)) == 3
    text = study_views.results_readme(st)
    assert "## Verdicts" in text and "t-interval" in text


def test_changed_sources_are_reported(smoke_study, tmp_path):
    res, cache, out = smoke_study
    man = dict(res["manifest"])
    files = dict(man["sources"]["files"])
    k = next(f for f in files if f.endswith("lab/aware/masking.py"))
    files[k] = "0" * 64
    man["sources"] = {**man["sources"], "files": files}
    assert shipped.changed_sources(man) == [k]
    files2 = {**files, k: res["manifest"]["sources"]["files"][k],
              next(f for f in files if f.endswith("views/study.py")): "0" * 64,
              next(f for f in files if f.endswith("study/tables.py")): "0" * 64}
    hashed = man["sources"]["hashed"]
    assert shipped.changed_sources({"sources": {"files": files2, "hashed": hashed}}) == []   # tables, views: no
    # a manifest written before the layout by concept (flat file names, ``not_hashed``): a file it
    # hashed that is gone now counts as changed, one it did not hash does not
    old = {**files2, "lab/experiments/aware/plan.py": "1" * 64, "lab/experiments/aware/study_views.py": "2" * 64}
    got = shipped.changed_sources({"sources": {"files": old, "not_hashed": ["study_views.py", "__init__.py"]}})
    assert "lab/experiments/aware/plan.py" in got and "lab/experiments/aware/study_views.py" not in got


def test_the_source_hash_is_the_code_that_determines_a_run():
    """Every file of lab/aware and of run/, and the study files that decide what runs; no view, no
    table, no command line."""
    hashed = shipped.source_hashes()["hashed"]
    assert "lab/experiments/aware/run/finetune.py" in hashed and "lab/aware/masking.py" in hashed
    assert {f"lab/experiments/aware/study/{n}" for n in shipped.STUDY_COMPUTING} <= set(hashed)
    assert not [f for f in hashed if "/views/" in f or f.endswith(("cli.py", "study/tables.py", "shipped.py"))]


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
        assert "methods/toy-projector" in set(res["fronts"].variant)
        assert set(res["tuning"][res["tuning"].variant == "methods/toy-projector"].scale) == set(cfg.scales)
        from lab.experiments.aware.run import tune

        assert tune.default_grids()["toy-projector"] == (1e-4, 1e-3)      # lab aware tune's default grid
        assert tune.flags({"toy-projector": 1e-3}) == "--lr-projector 0.001"
    finally:
        METHODS.unregister("toy-projector")


def test_the_run_pipeline_names_no_method_outside_the_registry():
    """Roles, lr fields, grids and table columns come from :mod:`lab.aware.methods`; the modules
    that plan, run, tune and tabulate compare no method name (variant labels are data, not code)."""
    import re

    pipeline = ("study/plan", "study/runner", "run/tune", "run/ablate", "study/tables", "run/continual",
                "run/finetune")
    here = Path(plan.__file__).parents[1]
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
    quick = runner.check(env, out, got["key"], steps=1, log=None)       # a prefix: the first step's loss
    assert quick["same"] and len(quick["rows"]) == 1
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


def test_tables_only_keeps_the_study_provenance_and_records_itself_beside_it(smoke_study, tmp_path):
    import json
    import shutil

    res, cache, out = smoke_study
    again = tmp_path / "again"
    shutil.copytree(out, again)
    before = json.loads((again / "manifest.json").read_text())
    shipped.run_study(plan.PRESETS["smoke"], again, command="regen", cache_dir=cache, progress=False, tables_only=True)
    after = json.loads((again / "manifest.json").read_text())
    for k in ("command", "started", "finished", "wall_s", "machine"):
        assert after[k] == before[k], k
    assert [r["command"] for r in after["regenerations"]] == ["regen"]
    shipped.run_study(plan.PRESETS["smoke"], again, command="regen2", cache_dir=cache, progress=False, tables_only=True)
    after2 = json.loads((again / "manifest.json").read_text())
    assert [r["command"] for r in after2["regenerations"]] == ["regen", "regen2"] and after2["command"] == "test"


def test_a_second_study_on_one_folder_stops_at_once(smoke_study, tmp_path):
    import shutil

    res, cache, out = smoke_study
    again = tmp_path / "again"
    shutil.copytree(out, again)
    with shipped.study_lock(again):
        with pytest.raises(shipped.StudyBusy, match="another `lab aware study`"):
            shipped.run_study(plan.PRESETS["smoke"], again, command="x", cache_dir=cache, progress=False,
                              tables_only=True)
    shipped.run_study(plan.PRESETS["smoke"], again, command="x", cache_dir=cache, progress=False, tables_only=True)


@pytest.mark.parametrize("damage", ["empty list", "another run", "edited answers", "truncated"])
def test_a_damaged_or_foreign_run_file_is_refused_by_name(smoke_study, tmp_path, damage):
    import json
    import shutil

    from lab._io import CorruptFile

    res, cache, out = smoke_study
    again = tmp_path / "again"
    shutil.copytree(out, again)
    files = sorted((again / "runs").glob("aware-aware-*.json"))
    f, other = files[0], files[1]
    rec = json.loads(f.read_text())
    if damage == "empty list":
        f.write_text("[]")
    elif damage == "another run":
        f.write_text(other.read_text() if json.loads(other.read_text())["seed"] != rec["seed"]
                     or json.loads(other.read_text())["scale"] != rec["scale"] else json.dumps({**rec, "seed": 99}))
    elif damage == "edited answers":
        rec["answers"]["down"] = [2] + rec["answers"]["down"][1:]
        f.write_text(json.dumps(rec))
    else:
        f.write_text(f.read_text()[:50])
    with pytest.raises((runner.BadRun, CorruptFile), match=f.name):
        shipped.run_study(plan.PRESETS["smoke"], again, command="x", cache_dir=cache, progress=False, tables_only=True)


def test_status_reads_run_files_without_a_model(smoke_study, monkeypatch):
    res, cache, out = smoke_study

    def no_model(*a, **k):
        raise AssertionError("--status built the model")

    monkeypatch.setattr(runner, "build_env", no_model)
    st = shipped.run_study(plan.PRESETS["smoke"], out, cache_dir=cache, progress=False, status_only=True)["status"]
    assert "complete" in st


def test_a_point_learned_only_when_its_pooled_answers_also_clear_the_floor():
    """Two seeds that agree exactly give a zero-width t-interval; 0.130 on 2 x 400 questions does not
    clear a floor of 0.128, while 0.36 does and one seed is never judged."""
    from lab.experiments.aware.study.tables import fronts_table

    def rows(vid, scale, accs):
        return [{"variant": vid, "group": "methods", "label": vid, "method": "m", "scale": scale, "lr": 1e-4,
                 "lr_projector": 1e-3, "seed": s, "trainable_frac": 0.1, "diverged": False, "n_down": 400,
                 "downstream": a, "R": 90.0, "R_probe": 100.0, "R_easy_vqa": 90.0}
                for s, a in enumerate(accs)]
    runs = pd.DataFrame(rows("a", 1.0, [0.130, 0.130]) + rows("b", 1.0, [0.36, 0.37]) + rows("c", 1.0, [0.9]))
    f = fronts_table(runs, floor=0.128).set_index("variant")
    assert f.loc["a", "downstream_lo"] > 0.128            # the seeds' interval alone would pass it
    assert not f.loc["a", "learned"] and f.loc["b", "learned"] and not f.loc["c", "learned"]


def test_a_study_resumed_across_code_versions_says_which_recorded_its_runs(smoke_study, tmp_path):
    """Runs recorded by two versions of the computing sources: the manifest (after its JSON round
    trip) lists both, oldest first, with their run counts, and the provenance line says so."""
    import json
    import shutil

    from lab.experiments.aware.views import study as sv

    res, cache, out = smoke_study
    again = tmp_path / "again"
    shutil.copytree(out, again)
    files = sorted((again / "runs").glob("*.json"), key=lambda p: json.loads(p.read_text())["finished"])
    old = files[: len(files) // 2]
    for p in old:    # the older half as if recorded before a refactor ("f" * 64 sorts last by name: order is by date)
        r = json.loads(p.read_text())
        r["code"], r["finished"] = "f" * 64, "2000-01-01T00:00:00+00:00"
        p.write_text(json.dumps(r))
    shipped.run_study(plan.PRESETS["smoke"], again, command="regen", cache_dir=cache, progress=False, tables_only=True)
    versions = json.loads((again / "manifest.json").read_text())["runs"]["code_versions"]
    assert [v["sha256"] for v in versions][0] == "f" * 12 and len(versions) == 2
    assert sum(v["runs"] for v in versions) == len(files) and versions[0]["runs"] == len(old)
    line = sv.provenance(sv.load_study(again), code_check=False)
    assert f"recorded by 2 versions of the computing sources (`{'f' * 12}` {len(old)}" in line
    assert "tables last regenerated from its runs" in line


def _precision_study(r_shift, r_lo, r_hi):
    """A study holding only the float32 twins' paired checks and one comparison's mean row."""
    no = "no difference detected"
    p = pd.DataFrame([
        {"variant": "methods/aware", "scale": 1.0, "metric": "downstream", "seeds": 3, "diff": -0.01, "lo": -0.05,
         "hi": 0.03, "direction": no},
        {"variant": "methods/aware", "scale": 1.0, "metric": "R", "seeds": 3, "diff": r_shift, "lo": r_lo, "hi": r_hi,
         "direction": no if r_lo < 0 < r_hi else ("lower" if r_hi < 0 else "higher")},
        {"variant": "methods/aware", "scale": 1.0, "metric": "answered alike: down", "seeds": 3, "diff": 0.95,
         "lo": np.nan, "hi": np.nan, "direction": np.nan}])
    c = pd.DataFrame([{"comparison": "AWARe vs full fine-tuning", "read": "retention", "level": np.nan,
                       "diff": -10.0, "lo": -12.0, "hi": -8.0},
                      {"comparison": "AWARe vs LoRA", "read": "retention", "level": np.nan,
                       "diff": 2.0, "lo": -1.0, "hi": 5.0}])
    return {"precision": p, "comparisons": c}


@pytest.mark.parametrize("shift, lo, hi, says", [
    (-0.5, -1.5, 0.5, "2 of 2 paired checks"),                        # nothing moved
    (-4.0, -5.0, -3.0, "is smaller than every method difference"),    # moved, far below 8-12 pts
    (-9.0, -11.0, -7.0, "may depend on the precision"),               # moved as much as a verdict
])
def test_the_precision_paragraph_is_computed_from_the_twins(shift, lo, hi, says):
    from lab.experiments.aware.views import study as sv

    text = sv.precision_summary(_precision_study(shift, lo, hi))
    assert says in text
    assert ("these do not" in text) == (hi < 0)
    if hi < 0:    # the detected comparison is the one set against the shift, the undetected one never is
        assert "AWARe vs full fine-tuning" in text and "AWARe vs LoRA" not in text
