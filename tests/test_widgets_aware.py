"""The AWARe notebooks' panels, driven without a browser: set a control, check the outputs move."""
import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")

from lab.aware import views  # noqa: E402
from lab.widgets.aware import AblationPanel, MaskPanel  # noqa: E402

from test_aware_views import results_table, study  # noqa: E402


def test_mask_panel_reselects_live_from_saved_saliency():
    p = MaskPanel(study())
    r0 = p.result
    assert p.refreshes == 1 and p.error is None
    assert r0["frozen_fraction"] == pytest.approx(0.3, abs=0.02) and r0["overlap_with_reference"] == pytest.approx(1.0)
    assert len(p.figures) == 3 and "frozen" in p.status.value

    p.controls["rho"].value = 0.6                              # rho slider: more rows frozen
    assert p.refreshes == 2 and p.result["frozen_fraction"] == pytest.approx(0.6, abs=0.02)
    assert p.result["overlap_with_reference"] < 1.0

    p.controls["rule"].value = "activation-balanced"          # the same fraction in every layer
    ft = views.frozen_table(p.result["masks"])
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
    assert "v_proj" in p.figures[1].layout.title.text and "layer 2" in p.figures[2].layout.title.text
    assert len(p.figures[2].data[0].y) == 4                   # v_proj is 4 neurons wide here
    p.controls["rho"].value = 1.0
    assert p.result["layer_frozen"] == 1.0


def test_ablation_panel_switches_group_and_metric():
    p = AblationPanel(results_table())
    assert p.result["group"] == "methods" and p.result["best"] == "aware"     # highest H
    p.controls["metric"].value = "R"
    assert p.result["best"] == "zero-shot" and p.refreshes == 2
    p.controls["group"].value = "rho"
    assert list(p.result["table"].variant) == ["rho=0", "rho=0.3", "rho=0.9"]
    assert p.result["best"] == "rho=0.9" and "rho" in p.status.value and p.error is None
