"""The shipped-study reader (paired intervals, verdicts, stale sources, the README section) on a
hand-made study, and the efficiency comparison's exact parameter counts and step timing."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from lab.experiments.tosca import efficiency as E
from lab.experiments.tosca import results as R
from lab.experiments.tosca.study import summarise


def _rows():
    """Three seeds; TOSCA per-sample is SimpleCIL + (1, 2, 3) and RanPAC + (−1, 0, 1) by seed."""
    rows = []
    for seed, (sc, rp) in zip((1, 2, 3), ((80.0, 85.0), (70.0, 74.0), (75.0, 79.0))):
        base = dict(scenario="a", seed=seed, trainable_params=100, train_s=1.0, seconds=1.0)
        for i, init in enumerate((R.REF, R.OLD)):
            for routing, acc in (("per-sample", sc + seed), ("oracle", 95.0 + seed)):
                rows.append({**base, "method": "tosca", "flow": "tosca", "head_init": init[0], "luca_init": init[1],
                             "routing": routing, "avg_inc_acc": acc + 1, "last_acc": acc - i * seed,
                             "routing_accuracy_last": 80.0, "routing_accuracy_mean": 85.0})
        for flow, delta in (("adapter", -5.0), ("calibrator", -10.0), ("tosca_r", 0.5 * seed - 1)):
            for routing in ("per-sample", "oracle"):
                acc = (sc + seed if routing == "per-sample" else 95.0 + seed) + delta
                rows.append({**base, "method": "tosca", "flow": flow, "head_init": "reference",
                             "luca_init": "reference", "routing": routing, "avg_inc_acc": acc, "last_acc": acc,
                             "routing_accuracy_last": 80.0, "routing_accuracy_mean": 85.0})
        for m, acc in (("simplecil", sc), ("ranpac", rp + seed - 2)):
            rows.append({**base, "method": m, "flow": "", "head_init": "", "luca_init": "", "routing": "single",
                         "avg_inc_acc": acc, "last_acc": acc, "routing_accuracy_last": float("nan"),
                         "routing_accuracy_mean": float("nan")})
    return rows


@pytest.fixture
def study(tmp_path):
    rows = _rows()
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
    summarise(rows).to_csv(tmp_path / "summary.csv", index=False)
    src = tmp_path / "src.py"
    src.write_text("x = 1\n")
    import hashlib

    man = {"command": "python -m lab.experiments.tosca.study --seeds 1 2 3", "date": "2026-01-01T00:00:00+00:00",
           "machine": {"platform": "test", "cpus": 2, "torch": "x", "torch_threads": 1}, "wall_seconds": 60.0,
           "base_config": {"backbone": "efficientnet_lite0", "inc": 2, "epochs": 20, "init": 0, "lr": 0.025,
                           "l1": 5e-4, "resolution": None},
           "sources_sha256": {str(src): hashlib.sha256(src.read_bytes()).hexdigest()},
           "sha256": {t: hashlib.sha256((tmp_path / t).read_bytes()).hexdigest() for t in ("runs.csv", "summary.csv")}}
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    return tmp_path


def test_paired_difference_and_its_interval_by_hand(study):
    s = R.load(study)
    mean, half, n = R.paired(s.runs, "last_acc", dict(scenario="a", routing="per-sample"),
                             dict(scenario="a", method="simplecil"))
    assert (mean, n) == (2.0, 3) and half == pytest.approx(4.302652729911275 * 1.0 / 3 ** 0.5)
    # TOSCA − RanPAC per seed: (81 − 84, 72 − 74, 78 − 80) = (−3, −2, −2)
    mean, half, _ = R.paired(s.runs, "last_acc", dict(scenario="a", routing="per-sample"),
                             dict(scenario="a", method="ranpac"))
    assert mean == pytest.approx(-7 / 3)


def test_verdicts_say_no_difference_when_the_interval_spans_zero(study):
    s = R.load(study)
    assert R.fmt_diff(0.5, 1.0).endswith("(no difference detected)")
    assert "no difference" not in R.fmt_diff(2.0, 1.0) and R.fmt_diff(-2.0, 1.0).startswith("−2.0")
    t = R.beats(s.runs, "a", "simplecil").set_index("routing")
    assert t.loc["per-sample", "verdict"] == "no difference detected"  # 2 ± 2.48
    t = R.beats(s.runs, "a", "ranpac").set_index("routing")
    assert t.loc["per-sample", "verdict"] == "TOSCA lower"  # −2.33 ± 1.43
    text = R.answer(s.runs, "a")
    assert "no router puts TOSCA above simplecil (no difference detected with per-sample; below it with the others)" in text
    assert "below ranpac with every router" in text


def test_tables_init_flow_and_readme_section(study):
    s = R.load(study)
    init = R.init_table(s.runs).set_index("routing")
    assert init.loc["per-sample", "reference − both (former)"].startswith("+2.0 ± ")  # the old init loses `seed`
    assert "reference − uniform head only" not in init  # not in this study
    flows = R.flow_table(s.runs, "a").set_index("flow")
    assert flows.loc["adapter", "oracle A_B − tosca"] == "−5.0 ± 0.0"
    assert flows.loc["tosca_r", "oracle A_B − tosca"].endswith("(no difference detected)")
    title = R.flow_figure(s.runs, "a").layout.title.text
    assert "(97.0)" in title and "oracle 10.0" in title  # computed, not written ahead
    section = R.readme_section(s)
    assert section.startswith(R.README_HEADING) and "| TOSCA (per-sample) |" in section
    path = R.update_readme(study)
    assert path == study / "README.md" and path.read_text() == section


def test_headline_comparisons_and_half_widths_by_hand(study):
    runs = R.load(study).runs
    c = R.comparisons(runs).set_index(["a", "b"])
    # TOSCA (per-sample) − SimpleCIL per seed: (1, 2, 3): mean 2, half-width t(2) · 1 / sqrt(3)
    row = c.loc[("TOSCA (per-sample)", "simplecil")]
    assert row["diff"] == 2.0 and row.ci95 == pytest.approx(4.302652729911275 / 3 ** 0.5)
    assert row.verdict == "no difference detected" and row.seeds == 3
    assert c.loc[("TOSCA (per-sample)", "ranpac")].verdict == "TOSCA (per-sample) lower"
    assert "fecam" not in set(c.index.get_level_values("b"))           # not in this study: left out
    assert not any("oracle" in a for a in c.index.get_level_values("a"))  # the oracle is not a method
    hw = R.half_widths(runs).set_index("row")
    assert hw.loc["TOSCA (oracle)", "half_width"] == pytest.approx(4.302652729911275 / 3 ** 0.5)  # 96, 97, 98
    assert hw.loc["TOSCA (oracle)", "within_target"] == bool(True)                               # 2.48
    assert hw.loc["simplecil", "half_width"] == pytest.approx(4.302652729911275 * 5 / 3 ** 0.5)
    text = R.half_width_sentence(runs)
    assert text.startswith("A_B's 95 % half-width is within 2.5 points for 1 of 4 rows (3 seeds); not for ")
    assert "simplecil on a (± 12.4)" in text and "oracle" not in text


def test_ridge_against_entropy_is_a_paired_comparison(study):
    rows = _rows()
    rows += [{**r, "routing": "ridge", "last_acc": r["last_acc"] + 5.0 + r["seed"] % 2}
             for r in rows if r["method"] == "tosca" and r["routing"] == "per-sample"]
    runs = pd.DataFrame(rows).fillna({"flow": "", "head_init": "", "luca_init": ""})
    c = R.comparisons(runs).set_index(["a", "b"]).loc[("TOSCA (ridge)", "TOSCA (per-sample entropy)")]
    assert c["diff"] == pytest.approx(17 / 3) and c.verdict == "TOSCA (ridge) higher"   # 6, 5, 6
    text = R.answer(runs, "a")
    assert "against the paper's per-sample entropy: A_B higher (+5.7 ± " in text
    assert "the ridge router (PRISM's RanPAC-style global ridge" in text and "not the TOSCA paper's routing" in text


def test_stale_sources_are_named(study):
    s = R.load(study)
    assert R.stale_sources(s.manifest, root="/") == [] and R.stale_warning(s.manifest) == ""
    (src,) = s.manifest["sources_sha256"]
    with open(src, "a") as f:
        f.write("y = 2\n")
    assert R.stale_sources(s.manifest, root="/") == [src]
    assert "WARNING" in R.stale_warning(s.manifest) and src in R.stale_warning(s.manifest)


def test_missing_study_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="lab tosca study"):
        R.load(tmp_path)


def test_live_check_compares_only_at_the_studys_settings(study):
    from lab.experiments.tosca.run import RunConfig

    s = R.load(study)
    live = pd.DataFrame([{"method": "tosca", "routing": "per-sample", "last_acc": 76.0},
                         {"method": "simplecil", "routing": "single", "last_acc": 10.0}])
    out = R.live_check(s, live, RunConfig(datasets=("a",), seed=1)).splitlines()
    # seed 1's shipped per-sample A_B is 81 and SimpleCIL's 80: the live numbers differ from their own seed
    assert out[0] == "tosca (per-sample): live A_B 76.00; shipped seed 1: 81.00 — !!! DIFFERS by -5.00 points: check the setup !!!"
    assert "DIFFERS" in out[1]
    same = pd.DataFrame([{"method": "tosca", "routing": "per-sample", "last_acc": 81.0}])
    assert R.live_check(s, same, RunConfig(datasets=("a",), seed=1)).endswith("shipped seed 1: 81.00 — reproduced")
    # a seed the study lacks: the 95 % prediction interval of one more seed, 77 ± t(2)·4.58·√(4/3) (81, 72, 78)
    inside = R.live_check(s, pd.DataFrame([{"method": "tosca", "routing": "per-sample", "last_acc": 60.0}]),
                          RunConfig(datasets=("a",), seed=7))
    assert "a new seed would fall in 77.00 ± 22.77" in inside and inside.endswith("inside")
    assert "not comparable" in R.live_check(s, live, RunConfig(datasets=("a",), seed=1, epochs=2))
    assert "not in it" in R.live_check(s, live, RunConfig(datasets=("b",), seed=1))


# --- efficiency ----------------------------------------------------------------------------------------
def test_vit_b_parameter_counts_from_the_architecture():
    row = E.parameter_row(E.VIT_B)
    d, r = 768, 48
    assert (row["feature_dim"], row["luca_r"]) == (d, r)
    assert row["luca_params_per_task"] == 4 * d * r + r + 3 * d == 149_808
    assert row["adapter_blocks"] == 12
    assert row["layerwise_adapter_params"] == 12 * (2 * d * 64 + 64 + d) == 1_189_632
    assert row["ratio_layerwise_to_luca"] == pytest.approx(7.94, abs=0.01)  # the paper's "~8x"
    assert row["backbone_params"] == 85_798_656


def test_lite0_adapters_follow_its_stages():
    row = E.parameter_row(E.LITE0)
    stages = (16, 24, 40, 80, 112, 192, 320)  # tf_efficientnet_lite0's stage widths
    want = sum(2 * c * min(64, c) + min(64, c) + c for c in stages)
    assert row["adapter_blocks"] == 7 and row["layerwise_adapter_params"] == want
    assert row["luca_params_per_task"] == 4 * 1280 * 80 + 80 + 3 * 1280


def test_step_timing_runs_every_setting_and_trains_only_the_adapters():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32,
                              depth=2).eval().requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = E.time_settings(model, E._prelogits, torch.rand(4, 3, 32, 32), n_classes=3, steps=2)
    assert [r["setting"] for r in rows] == list(E.SETTINGS)
    assert all(r["step_seconds"] > 0 and r["step_seconds_ci95"] >= 0 and r["batch"] == 4 for r in rows)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original is untouched


def test_a_gated_router_equal_to_entropy_is_named(study):
    s = R.load(study)
    runs = s.runs
    extra = runs[(runs.method == "tosca") & (runs.routing == "per-sample")].assign(routing="entropy-ncm")
    runs = pd.concat([runs, extra], ignore_index=True)
    assert R.same_as_entropy(runs, "a") == ["entropy-ncm"] and "changed no routing choice" in R.answer(runs, "a")
    ref = runs.index[(runs.routing == "entropy-ncm") & (runs.head_init == "reference") & (runs.flow == "tosca")]
    runs.loc[ref[-1], "last_acc"] += 1.0  # one seed differs
    assert R.same_as_entropy(runs, "a") == []


def test_headline_seeds_beyond_the_ablations_keep_each_table_on_its_own_seeds():
    """A study whose headline (reference TOSCA, baselines) ran at a fourth seed: the router table and
    the comparisons use all four, the initialisation and flow ablations the three they share."""
    rows = _rows()
    head = [dict(r, seed=4, last_acc=r["last_acc"] + 30.0, avg_inc_acc=r["avg_inc_acc"] + 30.0) for r in rows
            if r["seed"] == 1 and (r["method"] != "tosca" or (r["flow"] == "tosca" and r["head_init"] == "reference"))]
    runs = pd.DataFrame(rows + head).fillna({"flow": "", "head_init": "", "luca_init": ""})
    assert R.headline_seeds(runs) == [1, 2, 3, 4] and R.ablation_seeds(runs) == [1, 2, 3]
    assert R.seeds_phrase(runs) == ("4 seeds (1–4) for the headline — TOSCA with the reference initialisation under "
                                    "every router, and the baselines — and 3 (1–3) for the initialisation and flow "
                                    "ablations")
    assert R.seeds_phrase(pd.DataFrame(rows)) == "3 seeds 1–3"
    init = R.init_table(runs).set_index("routing")
    assert init.loc["per-sample", "A_B reference"] == R.fmt(*R.t_interval([81.0, 72.0, 78.0]))  # seed 4 left out
    assert init.loc["per-sample", "reference − both (former)"].startswith("+2.0 ± ")
    flows = R.flow_table(runs, "a").set_index("flow")
    assert flows.loc["tosca", "A_B oracle"].startswith("97.0 ± ")      # 96, 97, 98: not seed 4's 126
    hw = R.half_widths(runs).set_index("row")
    assert hw.loc["TOSCA (per-sample)", "seeds"] == 4
    assert "(4 seeds)" in R.half_width_sentence(runs)
    c = R.comparisons(runs).set_index(["a", "b"]).loc[("TOSCA (per-sample)", "simplecil")]
    assert c.seeds == 4 and c["diff"] == pytest.approx((1 + 2 + 3 + 1) / 4)
