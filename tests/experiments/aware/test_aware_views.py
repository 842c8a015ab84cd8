"""lab.experiments.aware.views on hand-made saliency, masks and result tables (no model, no data)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from lab.experiments.aware.views import ablation as ablation_views, figures, prose
from lab.experiments.aware.run import profiling
from lab.experiments.aware.study import profile_tables as tables
from lab.experiments.aware.study.profiles import Study
from lab.aware.masking import select

WIDTH = {"q_proj": 12, "k_proj": 4, "v_proj": 4}


def lm_name(i, t):
    return f"language_model.model.layers.{i}.self_attn.{t}"


def scores(layers=3, seed=0, heavy=True):
    """Per-sample-normalised-looking saliency: a few large neurons per layer when ``heavy``."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(layers):
        for t, d in WIDTH.items():
            v = torch.rand(d, generator=g) + 0.1
            if heavy:
                v[torch.randint(d, (1,), generator=g)] += 5.0
            out[lm_name(i, t)] = v / v.norm()
    for j in (0, 2):
        v = torch.rand(8, generator=g) + 0.1
        out[f"mm_projector.{j}"] = v / v.norm()
    return out


def study(n_profiles=2):
    s = scores()
    profiles = {"upstream-8": s, "proxy-8": scores(seed=1)}
    profiles = dict(list(profiles.items())[:n_profiles])
    g = torch.Generator().manual_seed(3)
    norms = {k: torch.rand(v.numel(), generator=g) for k, v in s.items()}
    return Study(profiles, {k: v / v.norm() for k, v in norms.items()})


def test_layer_names_are_parsed_into_targets_and_layers():
    assert tables.parse_layer(lm_name(12, "q_proj")) == ("q_proj", 12)
    assert tables.parse_layer("model.layers.3.mlp.down_proj") == ("down_proj", 3)
    assert tables.parse_layer("mm_projector.2") == ("projector", None)
    assert tables.parse_layer("model.multi_modal_projector.linear_1") == ("projector", None)
    lt = tables.layer_table(scores(layers=2))
    assert list(lt[lt.target == "projector"].layer) == [0, 1]
    assert list(lt[lt.target == "k_proj"].layer) == [0, 1] and set(lt.d_out) == {12, 4, 8}


def test_relative_saliency_is_one_for_a_uniform_layer():
    v = torch.ones(16) / 4.0                       # unit norm, all equal
    np.testing.assert_allclose(tables.relative(v), 1.0, rtol=1e-6)


def test_concentration_uniform_vs_heavy_tail():
    d = 100
    uniform = {lm_name(0, "q_proj"): torch.ones(d) / math.sqrt(d)}
    c = tables.concentration(uniform).iloc[0]
    assert c["top1%_share"] == pytest.approx(0.01) and c["top10%_share"] == pytest.approx(0.10)
    assert c["half_mass_frac"] == pytest.approx(0.5) and c["max_x_uniform"] == pytest.approx(1.0, rel=1e-5)
    v = torch.full((d,), 0.01)
    v[0] = 1.0                                      # one neuron holds ~99 % of the energy
    h = tables.concentration({lm_name(0, "q_proj"): v / v.norm()}).iloc[0]
    assert h["top1%_share"] > 0.98 and h["half_mass_frac"] == pytest.approx(0.01)
    summ = tables.concentration_summary(tables.concentration(scores()))
    assert list(summ.target) == ["q_proj", "k_proj", "v_proj", "projector"] and (summ.layers > 0).all()


def test_lorenz_curves_run_from_zero_to_one_and_dominate_uniform():
    lz = tables.lorenz(scores())
    for t, df in lz.groupby("target"):
        y = df.energy_share.to_numpy()
        assert y[0] == pytest.approx(0) and y[-1] == pytest.approx(1)
        assert (np.diff(y) >= -1e-12).all()
        assert (y >= df.neuron_frac.to_numpy() - 1e-9).all(), t   # most-salient-first is above the diagonal
    d = tables.density(scores())
    assert set(d.target) == {"q_proj", "k_proj", "v_proj", "projector"} and (d.density >= 0).all()


def test_frozen_tables_global_vs_balanced():
    s = scores()
    bal = select(s, 0.5, "activation-balanced")
    ft = tables.frozen_table(bal)
    assert np.allclose(ft.fraction, 0.5) and ft.rows.sum() == sum(v.numel() for v in s.values())
    glob = select(s, 0.5)
    by = tables.frozen_by_target({"global": glob, "balanced": bal})
    assert by.loc["all targets", "global"] == pytest.approx(0.5) and by.loc["all targets", "balanced"] == pytest.approx(0.5)
    assert np.allclose(by["balanced"], 0.5)


def test_overlap_table_and_chance_levels():
    s, s2 = scores(), scores(seed=5)
    a = select(s, 0.3)
    sel = {"a": a, "same": {k: v.clone() for k, v in a.items()}, "other": select(s2, 0.3)}
    ot = tables.overlap_table(sel, "a").set_index("compared")
    assert ot.loc["same", "jaccard"] == pytest.approx(1.0) and ot.loc["same", "overlap"] == pytest.approx(1.0)
    p = sum(int(m.sum()) for m in a.values()) / sum(m.numel() for m in a.values())
    assert ot.loc["other", "chance_jaccard"] == pytest.approx(p / (2 - p))
    jm = tables.jaccard_matrix(sel)
    assert jm.shape == (3, 3) and np.allclose(np.diag(jm), 1.0)


def test_rank_agreement_is_spearman():
    s = scores()
    assert tables.rank_agreement(s, s) == pytest.approx(1.0)
    assert tables.rank_agreement(s, {k: -v for k, v in s.items()}) == pytest.approx(-1.0)


def test_study_reselects_like_the_library_including_weight_norm():
    lins = {n: nn.Linear(3, v.numel()) for n, v in scores().items()}
    from lab.aware.masking import row_norms

    st = Study({"p": scores()}, row_norms(lins))
    got = st.select("p", 0.4, "weight-norm")
    want = select(scores(), 0.4, "weight-norm", weights=lins)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert all(torch.equal(st.select("p", 0.4, "random", seed=3)[k], select(scores(), 0.4, "random", seed=3)[k])
               for k in want)
    assert set(st.layers("qkv")) == {k for k in want if "proj" in k and "mm_" not in k}
    assert set(st.select("p", 0.3, targets="qkv")) == set(st.layers("qkv"))


def test_why_global_explains_which_targets_the_global_rule_freezes():
    d = 64
    flat_narrow = torch.ones(16) / 4.0                     # every neuron at the equal share 1/sqrt(16)
    heavy_wide = torch.full((d,), 0.02)
    heavy_wide[:2] = 0.7                                   # two huge neurons, the rest far below 1/sqrt(64)
    s = {lm_name(0, "v_proj"): flat_narrow, lm_name(0, "q_proj"): heavy_wide / heavy_wide.norm()}
    masks = select(s, 0.3)
    w = tables.why_global(s, masks).set_index("target")
    assert w.loc["v_proj", "frozen"] == 1.0 and w.loc["q_proj", "frozen"] == pytest.approx(8 / 64)   # 24 rows: all v first
    assert w.loc["v_proj", "median_s"] >= w.loc["v_proj", "global_threshold_s"] >= w.loc["q_proj", "median_s"]
    assert w.loc["q_proj", "equal_share_s"] == pytest.approx(1 / 8)


def test_parameter_budget_counts_trainable_rows():
    model = nn.ModuleDict({"q_proj": nn.Linear(5, 4), "other": nn.Linear(5, 5, bias=False)})
    masks = {"q_proj": torch.tensor([True, False, False, True])}
    b = tables.parameter_budget(model, masks)
    assert b["trainable"] == 2 * (5 + 1) and b["total"] == 24 + 25 and b["target_params"] == 24
    assert b["trainable_frac"] == pytest.approx(12 / 49)


def test_saliency_figures():
    s = scores()
    fig = figures.saliency_heatmaps(s)
    assert len(fig.data) == 4 and fig.layout.coloraxis.colorscale
    srt = figures.saliency_heatmaps(s, sort=True)
    z = np.asarray(srt.data[0].z, dtype=float)
    assert (np.diff(z, axis=1) <= 1e-9).all()          # each row non-increasing when sorted
    masks = select(s, 0.3)
    m = figures.mask_image(masks, "q_proj")
    assert set(np.unique(np.asarray(m.data[0].z, dtype=float))) <= {0.0, 1.0}
    assert len(figures.frozen_by_layer({"global": masks}).data) == 4
    prof = figures.layer_profile(s, lm_name(0, "q_proj"), masks[lm_name(0, "q_proj")])
    assert len(prof.data[0].y) == 12
    assert len(figures.lorenz_figure(s).data) == 5 and len(figures.density_figure(s).data) == 4
    with pytest.raises(ValueError, match="no layers of target"):
        figures.mask_image(masks, "gate_proj")


def results_table():
    """A tidy table shaped like lab.experiments.aware.run.ablate.sweep's (two seeds), with shared reference rows."""
    rows = []
    spec = [("methods", "zero-shot", "zero-shot", np.nan, 100, 40), ("methods", "full", "full", np.nan, 60, 100),
            ("methods", "lora", "lora", np.nan, 85, 90), ("methods", "dora", "dora", np.nan, 86, 91),
            ("methods", "aware", "aware", 0.3, 95, 97), ("rule", "weight-norm", "aware", 0.3, 80, 99),
            ("rule", "random", "aware", 0.3, 70, 99), ("rho", "rho=0.9", "aware", 0.9, 99, 80),
            ("rho", "rho=0", "aware", 0.0, 65, 100), ("calib_size", "n=16", "aware", 0.3, 93, 97)]
    for seed in (0, 1):
        for g, v, m, rho, r, e in spec:
            rows.append({"group": g, "variant": v, "method": m, "seed": seed, "rho": rho, "calib_n": 16 if v == "n=16" else 64,
                         "R": r + seed, "E": e, "H": 2 * (r + seed) * e / (r + seed + e), "downstream": e / 100,
                         "up_easy_vqa": 0.9, "up_probe": 0.6, "trainable_frac": 0.1})
    df = pd.DataFrame(rows)
    main = df[(df.group == "methods") & (df.variant == "aware")]
    ref = {"rule": "activation-global", "rho": "rho=0.3", "calib_size": "n=200"}
    df = pd.concat([df] + [main.assign(group=g, variant=v, shared=True) for g, v in ref.items()], ignore_index=True)
    return df


def test_summary_orders_groups_and_relabels_the_calibration_reference():
    s = ablation_views.summary(results_table())
    assert (s.seeds == 2).all()
    rho = s[s.group == "rho"]
    assert list(rho.variant) == ["rho=0", "rho=0.3", "rho=0.9"]
    assert list(s[s.group == "rule"].variant)[0] == "activation-global"
    assert list(s[s.group == "calib_size"].variant) == ["n=16", "n=64"]      # the runner's label said n=200
    assert s.set_index(["group", "variant"]).loc[("methods", "aware"), "R"] == pytest.approx(95.5)


def test_findings_and_ablation_figures():
    res = results_table()
    f = ablation_views.findings(res)
    assert f["aware_R"] == pytest.approx(95.5) and f["full_E"] == pytest.approx(100)
    assert f["best_rho"] == pytest.approx(0.3) and math.isnan(f["rule_balanced_H"])
    fig = ablation_views.tradeoff(res)
    assert list(fig.data[0].x) == pytest.approx([100, 97, 80])               # rho = 0, 0.3, 0.9
    assert {t.name for t in fig.data[1:]} == {"zero-shot", "full", "lora", "dora"}
    assert len(ablation_views.rho_curves(res).data) == 3
    assert len(ablation_views.rhe_bars(res, "rule").data) == 3
    missing = ablation_views.rhe_bars(res, "targets")                  # not swept: a note, not an empty chart
    assert not missing.data and "not in this run" in missing.layout.annotations[0].text
    assert "not in this run" in ablation_views.continual_figure(pd.DataFrame()).layout.annotations[0].text
    text = ablation_views.describe_ablation({"results": res, "config": {"task": "even"}, "continual_summary": pd.DataFrame()})
    assert "chance 0.500 (2 options)" in text and "aware R 95.5" in text


def test_continual_figures():
    rows = []
    order = ("fashion", "digits", "even")
    for m in ("full", "aware"):
        for i, t in enumerate(order):
            for j in order[: i + 1]:
                rows.append({"method": m, "seed": 0, "stage": i, "stage_task": t, "task": j, "acc": 0.5})
        rows.append({"method": m, "seed": 0, "stage": 2, "stage_task": "even", "task": "upstream:easy_vqa", "acc": 0.9})
    fig = ablation_views.continual_figure(pd.DataFrame(rows))
    assert {t.name for t in fig.data} == set(order)
    cs = pd.DataFrame([{"method": m, "seed": 0, "avg": 0.5, "last": 0.5, "bwt": -0.1, "stage0_avg": 0.5,
                        "stage1_avg": 0.5, "stage2_avg": 0.5, "R_after_sequence": 90.0} for m in ("full", "aware")])
    assert len(ablation_views.continual_bars(cs).data) == 2


def test_load_run_reads_tables_and_fails_clearly(tmp_path, monkeypatch):
    from lab._io import write_json, write_table

    with pytest.raises(FileNotFoundError, match="not an AWARe ablation run"):
        ablation_views.load_run(tmp_path)
    write_table(tmp_path / "results", results_table())
    write_json(tmp_path / "config.json", {"seeds": [0, 1]})
    run = ablation_views.load_run(tmp_path)
    assert len(run["results"]) == len(results_table()) and run["config"]["seeds"] == [0, 1]
    assert run["continual"].empty
    newest = tmp_path / "runs" / "aware" / "20990101-000000-ablate-fashion-1-x"
    newest.mkdir(parents=True)
    write_json(newest / "config.json", {"seeds": [3]})
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    assert ablation_views.load_run("latest")["run_dir"] == newest


def test_sweep_size_overrides_train_config():
    size = ablation_views.sweep_size("smoke", steps=3, batch_size=2, n_eval=5, rhos=(0.0, 0.5))
    assert size.train.steps == 3 and size.train.batch_size == 2 and size.n_eval == 5 and size.rhos == (0.0, 0.5)


def test_profile_nested_equals_profiling_each_nested_set():
    """The first-n profiles, combined from chunks, are the profiles of the first n samples."""
    from types import SimpleNamespace

    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.tasks import QASet
    from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

    words = ["red", "blue", "green", "what", "color", "is", "it", "?"]
    tok = tiny_tokenizer(words)
    g = np.random.RandomState(0)
    qa = QASet("toy", ["what color is it ?"] * 20, [("red", "blue", "green")[g.randint(3)] for _ in range(20)],
               [("red", "blue", "green")] * 20, np.arange(20), torch.randn(20, 4, 8, generator=torch.Generator().manual_seed(0)))
    ctx = SimpleNamespace(base=tiny_minillava(tok, 8), enc=ChatEncoder(tok, 4),
                          calib={("upstream", 20): qa, ("upstream", 5): qa.subset(range(5)),
                                 ("upstream", 12): qa.subset(range(12))})
    nested = profiling.profile_nested(ctx, (5, 12), progress=False)
    assert list(nested) == [("upstream", 20), ("upstream", 12), ("upstream", 5)]
    direct = profiling.profile_sets(ctx, list(nested), progress=False)
    for k in nested:
        assert nested[k].n_samples == k[1]
        for n in direct[k].scores:
            torch.testing.assert_close(nested[k].scores[n], direct[k].scores[n], rtol=1e-5, atol=1e-6)


def test_calibration_agreement_and_findings():
    st = study()
    agree, sel = tables.calibration_agreement(st, 0.3, "upstream-8")
    assert list(agree.compared) == ["proxy-8", "weight-norm", "random"]
    assert agree.jaccard.between(0, 1).all() and np.isnan(agree.set_index("compared").loc["random", "spearman"])
    assert -1 <= agree.set_index("compared").loc["proxy-8", "spearman"] <= 1
    fig = figures.calibration_size_figure(agree)
    assert fig.layout.xaxis.type == "log"
    f = prose.saliency_findings(st, rho=0.3)
    assert f["reference"] == "upstream-8" and 0 < f["q_proj_top1_share"] <= 1 and "jaccard_proxy-8" in f
    text = prose.describe_saliency(f, st)
    assert "Heavy tail" in text and f"{f['jaccard_proxy-8']:.2f}" in text and "nan" not in text
    assert tables.layer_name(st.profiles["upstream-8"], "k_proj", 99) == lm_name(2, "k_proj")   # clamped


def test_target_summary_counts_layer_shapes():
    from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

    model = tiny_minillava(tiny_tokenizer(["a"]), 8)
    ts = tables.target_summary(model).set_index("target")
    assert ts.loc["q_proj", "layers"] == 2 and ts.loc["projector", "layers"] == 2
    assert ts.loc["projector", "d_in"] == 32 and ts["share_of_model_%"].sum() < 100


def test_run_info_summarises_a_run():
    res = results_table().assign(step_s=2.0, train_s=12.0)
    line = ablation_views.run_info({"run_dir": "x", "results": res, "config": {"timings": {"total_s": 61.0, "seeds": 1}}})
    assert "20 runs (2 seed(s))" in line and "median training step 2.00 s" in line and "total 61 s" in line


def test_study_saves_and_loads_and_reads_runner_files(tmp_path):
    st = study()
    st.n_samples = {"upstream-8": 8, "proxy-8": 8}
    st.save(tmp_path / "a")
    back = Study.load(tmp_path / "a")
    assert back.labels == ["upstream-8", "proxy-8"] and back.n_samples["upstream-8"] == 8
    for lab_ in st.labels:
        for rule in ("activation-global", "weight-norm"):
            a, b = st.select(lab_, 0.3, rule), back.select(lab_, 0.3, rule)
            assert all(torch.equal(a[k], b[k]) for k in a)
    # the runner's layout (no norms): activation rules work, weight-norm explains what is missing
    from lab.experiments.aware.run.ablate import _save_saliency
    from lab.aware.saliency import Saliency

    _save_saliency(tmp_path / "run", ("upstream", 8), Saliency(scores(), 8, 1.0))
    run = Study.load(tmp_path / "run")
    assert run.labels == ["upstream-8"] and run.select("upstream-8", 0.3)
    with pytest.raises(ValueError, match="weight-row norms"):
        run.select("upstream-8", 0.3, "weight-norm")


def test_majority_rate_of_the_fixed_test_questions():
    rate = ablation_views.majority_rate("fashion", 16)
    if rate is None:
        pytest.skip("fashion_mnist_mini not available here")
    assert 1 / 10 <= rate <= 1 and (rate * 16).is_integer()


# ---------------------------------------------------------------- legibility of the figures and prose


def test_mask_heatmaps_are_two_discrete_colours_with_a_legend_and_projector_rows_of_their_own():
    masks = select(scores(), 0.3)
    fig = figures.mask_image(masks)
    ca = fig.layout.coloraxis
    assert ca.showscale is False                                  # no continuous colour bar
    stops = [tuple(x) for x in ca.colorscale]
    assert len({c for _, c in stops}) == 2 and (0.5, stops[1][1]) in stops and (0.5, stops[2][1]) in stops
    legend = [t for t in fig.data if t.type == "scatter"]
    assert [t.name for t in legend] == ["trainable", "frozen"] and all(t.showlegend for t in legend)
    assert {t.marker.color for t in legend} == {c for _, c in stops}
    heat = {t.yaxis: t for t in fig.data if t.type == "heatmap"}
    assert list(heat["y4"].y) == ["projector Linear 1", "projector Linear 2"]  # not language-model layers 0, 1
    assert list(heat["y"].y) == ["0", "1", "2"]


def test_frozen_by_layer_draws_the_projector_in_its_own_panel_in_percent():
    masks = select(scores(), 0.3)
    fig = figures.frozen_by_layer({"global": masks, "balanced": select(scores(), 0.3, "activation-balanced")})
    by = {(t.name, t.xaxis) for t in fig.data}
    proj_axes = {ax for n, ax in by if n == "projector"}
    lm_axes = {ax for n, ax in by if n != "projector"}
    assert proj_axes and lm_axes and not proj_axes & lm_axes          # never on the language model's layer axis
    proj = next(t for t in fig.data if t.name == "projector")
    assert list(proj.x) == ["Linear 1", "Linear 2"] and max(proj.y) <= 100
    assert sum(t.showlegend is not False for t in fig.data) == 4      # one legend entry per target
    assert "%{y:.1f}%" in proj.hovertemplate
    assert len(figures.frozen_by_layer({"g": {k: v for k, v in masks.items() if "projector" not in k}}).data) == 3


def test_calibration_size_figure_labels_reference_lines_in_the_legend_not_on_the_plot():
    st = study()
    st.n_samples = {"upstream-8": 8, "proxy-8": 8}
    agree, _ = tables.calibration_agreement(st, 0.3, "upstream-8")
    fig = figures.calibration_size_figure(agree)
    assert not fig.layout.annotations
    names = [t.name for t in fig.data]
    assert any(n.startswith("proxy-8: ") for n in names) and any(n.startswith("chance") for n in names)


def test_random_jaccard_is_rho_over_two_minus_rho_and_matches_random_masks():
    for rho in (0.1, 0.3, 0.5):
        assert prose.random_jaccard(rho) == pytest.approx(rho / (2 - rho))
        g = torch.Generator().manual_seed(0)
        a, b = (torch.rand(200_000, generator=g) < rho for _ in range(2))
        assert float((a & b).sum() / (a | b).sum()) == pytest.approx(prose.random_jaccard(rho), abs=0.01)
    assert math.isnan(prose.random_jaccard(0.0))


def test_the_calibration_verdict_is_chosen_by_the_numbers():
    c = prose.random_jaccard(0.3)
    assert prose.calibration_verdict(0.94, 0.3)[0] == "mostly generic"
    assert prose.calibration_verdict(c + 0.6 * (1 - c), 0.3)[0] == "largely generic"
    assert prose.calibration_verdict(c + 0.3 * (1 - c), 0.3)[0] == "partly data-specific"
    assert prose.calibration_verdict(c, 0.3)[0] == "data-specific"
    assert prose.calibration_verdict(0.5, 0.0)[0] == "not measurable"
    share = prose.calibration_verdict(0.94, 0.3)[3]
    assert share == pytest.approx((0.94 - c) / (1 - c))


def test_calibration_reading_states_the_measured_and_the_random_jaccard():
    st = study()
    st.n_samples = {"upstream-8": 8, "proxy-8": 8}
    f = prose.saliency_findings(st, rho=0.3)
    text = prose.calibration_reading(f, st)
    verdict = prose.calibration_verdict(f["jaccard_proxy-8"], 0.3)[0]
    assert f"**Upstream vs proxy masks: {verdict}.**" in text
    assert f"{f['jaccard_proxy-8']:.2f}" in text and f"{prose.random_jaccard(0.3):.2f}" in text
    assert f"{100 * f['overlap_proxy-8']:.1f}%" in text and "nan" not in text
    assert verdict[1:] in prose.describe_saliency(f, st)
    one = study(n_profiles=1)
    one.n_samples = {"upstream-8": 8}
    assert "No proxy" in prose.calibration_reading(prose.saliency_findings(one, rho=0.3), one)


def test_ablation_tradeoff_has_no_text_labels_on_its_points():
    fig = ablation_views.tradeoff(results_table())
    assert all(t.mode and "text" not in t.mode for t in fig.data)
    assert all(not t.text for t in fig.data)


def fake_study(complete: bool = False) -> dict:
    """The tables of a partly run study, shaped like lab.experiments.aware.views.study.load_study's:
    two methods' fronts (3 scales, 3 seeds) and one rule's short front."""
    import json
    from dataclasses import asdict

    from lab.experiments.aware.study import plan, tables as study_tables

    rows = []
    for v, g, lbl, shift in (("methods/full", "methods", "full", 0.0), ("methods/aware", "methods", "aware", 8.0),
                             ("rule/random", "rule", "random", 3.0)):
        for sc, d, r in ((1 / 9, 0.35, 92.0), (1 / 3, 0.62, 75.0), (1.0, 0.74, 40.0)):
            for seed in (0, 1, 2):
                rows.append({"variant": v, "group": g, "label": lbl, "method": lbl.replace("random", "aware"),
                             "scale": sc, "lr": 1e-4 * sc, "lr_projector": 1e-3 * sc, "seed": seed, "precision": "bf16",
                             "downstream": d + 0.01 * seed, "R": r + shift + seed, "R_probe": 101.0,
                             "R_easy_vqa": r + shift, "trainable_frac": 0.1, "diverged": False})
    runs = pd.DataFrame(rows)
    cfg = json.loads(json.dumps(asdict(plan.PRESETS["smoke"])))
    cfg.update(seeds=[0, 1, 2], ablation_seeds=3)
    comps = pd.DataFrame(study_tables.compare_rows(runs, "AWARe vs full fine-tuning", "methods/aware", "methods/full",
                                                   (0, 1, 2)))
    return {"manifest": {"config": cfg, "complete": complete}, "runs": runs,
            "fronts": study_tables.fronts_table(runs, 0.13), "comparisons": comps,
            "baselines": pd.DataFrame([{"set": "downstream (fashion)", "reference": "most common answer", "acc": 0.13,
                                        "n": 400}])}


def test_the_plane_is_one_line_per_method_with_intervals_and_no_text_on_the_points():
    from lab.experiments.aware.views import study as study_views

    fig = study_views.plane(fake_study())
    assert [t.name for t in fig.data] == ["AWARe (rho 0.3)", "full fine-tuning"]
    assert all(t.mode == "lines+markers" and not t.text for t in fig.data)
    assert all(t.error_x.array is not None and t.error_y.array is not None for t in fig.data)
    assert "downstream accuracy" in fig.layout.xaxis.title.text and "R (%)" in fig.layout.yaxis.title.text


def test_matched_comparisons_and_the_short_fronts_read_as_words():
    from lab.experiments.aware.views import study as study_views

    st = fake_study()
    t = study_views.comparisons(st, ["AWARe vs full fine-tuning"])
    assert set(t.comparison) == {"AWARe (rho 0.3) − full fine-tuning"}
    assert all(r.endswith("pts") for r in t["difference [95 %]"]) and set(t.reading) == {"higher"}
    assert "mean over the shared levels" in set(t["read at"])
    g = study_views.group_plane(st, "rule")
    assert [tr.name for tr in g.data] == ["AWARe (rho 0.3)", "random rows"]
    assert study_views.scale_str(1 / 27) == "1/27" and study_views.scale_str(3.0) == "3"
