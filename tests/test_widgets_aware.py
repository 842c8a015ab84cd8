"""The AWARe notebooks' panels, driven without a browser: set a control, check the outputs move."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")

from lab.experiments.aware import tables  # noqa: E402
from lab.widgets.aware import AblationPanel, MaskPanel  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "experiments" / "aware"))   # the views tests' hand-made inputs
from test_aware_views import results_table, study  # noqa: E402
from test_widgets_vision import shown  # noqa: E402


def test_mask_panel_reselects_live_from_saved_saliency():
    p = MaskPanel(study())
    r0 = p.result
    assert p.refreshes == 1 and p.error is None
    assert r0["frozen_fraction"] == pytest.approx(0.3, abs=0.02) and r0["overlap_with_reference"] == pytest.approx(1.0)
    assert len(p.figures) == 3 and "frozen" in p.status.value

    before = shown(p)
    p.controls["rho"].value = 0.6                              # rho slider: more rows frozen
    assert p.refreshes == 2 and p.result["frozen_fraction"] == pytest.approx(0.6, abs=0.02)
    after = shown(p)
    assert "rho=0.6" in after[0][0] and after[0][1][0]["y"] != before[0][1][0]["y"]
    assert after[1][1][0]["z"] != before[1][1][0]["z"]         # the frozen map redrawn
    assert p.result["overlap_with_reference"] < 1.0

    p.controls["rule"].value = "activation-balanced"          # the same fraction in every layer
    ft = tables.frozen_table(p.result["masks"])
    assert np.allclose(ft.fraction, np.round(0.6 * ft.rows) / ft.rows)

    p.controls["rule"].value = "random"                        # seeded: the same draw twice
    first = {k: v.clone() for k, v in p.result["masks"].items()}
    p.controls["rho"].value = 0.3
    p.controls["rho"].value = 0.6
    assert all(torch.equal(first[k], p.result["masks"][k]) for k in first)

    p.controls["rule"].value = "activation-global"
    p.controls["rho"].value = 0.3
    p.controls["profile"].value = "proxy-8"                    # another calibration set: another mask
    assert p.result["profile"] == "proxy-8" and p.result["overlap_with_reference"] < 1.0

    p.controls["targets"].value = "qkv"                        # the projector is no longer a target
    assert "projector" not in p.result["by_target"]
    assert p.error is None


def test_mask_panel_target_and_layer_pickers_change_the_figures():
    p = MaskPanel(study())
    assert "q_proj" in p.figures[1].layout.title.text
    p.controls["show"].value = "v_proj"
    p.controls["layer"].value = 2
    assert p.result["show"] == "v_proj" and p.result["layer"] == 2
    assert "v_proj" in shown(p)[1][0] and "layer 2" in shown(p)[2][0]
    assert "v_proj" in p.figures[1].layout.title.text and "layer 2" in p.figures[2].layout.title.text
    assert len(p.figures[2].data[0].y) == 4                   # v_proj is 4 neurons wide here
    p.controls["rho"].value = 1.0
    assert p.result["layer_frozen"] == 1.0


def test_ablation_panel_switches_group_and_metric():
    p = AblationPanel(results_table())
    assert p.result["group"] == "methods" and p.result["best"] == "aware"     # highest H
    assert list(p.controls) == ["group", "metric"] and shown(p)[0][0].startswith("methods: H")
    p.controls["metric"].value = "R"
    assert p.result["best"] == "zero-shot" and p.refreshes == 2
    assert shown(p)[0][0] == "methods: R (%) per variant, mean over seeds"
    p.controls["group"].value = "rho"
    assert list(p.result["table"].variant) == ["rho=0", "rho=0.3", "rho=0.9"]
    assert p.result["best"] == "rho=0.9" and "rho" in p.status.value and p.error is None
    assert shown(p)[0][1][0]["x"] == ["rho=0", "rho=0.3", "rho=0.9"]
    p.reset_button.click()
    assert p.values() == {"group": "methods", "metric": "H"} and shown(p)[0][0].startswith("methods: H")


def test_ablation_panel_reselects_masks_live_on_the_runs_saliency(tmp_path):
    res = results_table()
    res["rule"], res["targets"], res["calib"], res["calib_n"] = "activation-global", "qkv+projector", "upstream", 8
    st = study()
    st.norms = {k: torch.full_like(v, float("nan")) for k, v in st.norms.items()}  # as a saved run: no row norms
    st.save(tmp_path)
    (tmp_path / "row_norms.safetensors").unlink()
    p = AblationPanel.from_run({"results": res, "run_dir": tmp_path})
    assert list(p.controls) == ["group", "metric", "rule", "rho", "targets", "profile"]
    assert "weight-norm" not in p.controls["rule"].options          # needs the model's weight rows
    assert p.result["frozen_fraction"] == pytest.approx(0.3, abs=0.02)
    assert "the run measured R" in p.status.value                   # rho=0.3, global: a fine-tuned variant
    first = shown(p)
    assert len(first) == 2 and "activation-global, rho=0.3" in first[1][0]
    p.controls["rho"].value = 0.5                                   # no fine-tuning: milliseconds
    assert p.result["frozen_fraction"] == pytest.approx(0.5, abs=0.02) and p.seconds < 2
    assert "rho=0.5" in shown(p)[1][0] and shown(p)[1][1][0]["y"] != first[1][1][0]["y"]
    assert "not fine-tuned in this run" in p.status.value
    p.controls["rule"].value = "activation-balanced"                # the same fraction in every layer
    ft = tables.frozen_table(p.result["masks"])
    assert np.allclose(ft.fraction, np.round(0.5 * ft.rows) / ft.rows)
    p.controls["targets"].value = "qkv"
    assert "projector" not in p.result["by_target"] and "qkv, calibration" in shown(p)[1][0]
    p.controls["profile"].value = "proxy-8"
    assert p.result["profile"] == "proxy-8" and p.error is None
    assert shown(p)[0] == first[0]                                 # the results chart did not change
    p.reset_button.click()
    assert p.result["rho"] == 0.3 and p.result["rule"] == "activation-global" and shown(p) == first
    assert AblationPanel.from_run({"results": res, "run_dir": tmp_path / "none"}).study is None


def test_panels_show_percentages_with_one_decimal():
    import re

    p = MaskPanel(study())
    shown_pcts = re.findall(r"(\d+(?:\.\d+)?)%", p.status.value)
    assert shown_pcts and all(re.fullmatch(r"\d+\.\d", x) for x in shown_pcts), p.status.value
    a = AblationPanel(results_table())
    assert a.figures[0].data[0].texttemplate == "%{y:.1f}%" and re.search(r"aware</b> \(\d+\.\d\)", a.status.value)
    a.controls["metric"].value = "trainable_frac"
    assert list(a.figures[0].data[0].y) == pytest.approx([10.0] * len(a.figures[0].data[0].y))
    assert "(10.0%)" in a.status.value
    a.controls["metric"].value = "downstream"
    assert a.figures[0].data[0].texttemplate != "%{y:.1f}%"          # accuracies keep three decimals


def test_mask_panel_layer_slider_spans_the_layers_of_the_target_shown():
    p = MaskPanel(study(), layer=2)
    layer = p.controls["layer"]
    last_q = int(p._layers[p._layers.target == "q_proj"].layer.max())
    assert layer.max == last_q and layer.value == 2
    p.controls["show"].value = "projector"                      # two Linears: layers 0 and 1
    assert layer.max == 1 and layer.value == 1 and p.refreshes == 2   # clamped, one refresh
    assert len(p.figures) == 3 and "projector, layer 1" in shown(p)[2][0]   # the layer profile is drawn
    p.controls["show"].value = "q_proj"
    assert layer.max == last_q and layer.value == 1 and p.error is None


def test_ablation_panel_reads_the_same_inputs():
    """The ablation panel's data inputs are unchanged (its study tables are redesigned elsewhere)."""
    import inspect

    assert list(inspect.signature(AblationPanel.from_run).parameters) == ["run", "kw"]
