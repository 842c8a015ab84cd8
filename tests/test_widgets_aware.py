"""The AWARe notebooks' panels, driven without a browser: set a control, check the outputs move."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")

from lab.experiments.aware.study import profile_tables as tables  # noqa: E402
from lab.widgets import BUSY_CLASS  # noqa: E402
from lab.widgets.aware import AblationPanel, MaskPanel, RunsPanel  # noqa: E402

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


def _study_runs(n=2):
    """A ``runs.csv`` shaped like ``lab aware study``'s: methods at three scales, ``n`` seeds, one AWARe selection."""
    import pandas as pd

    rows = []
    for seed in range(n):
        for v, rule, rho in (("methods/full", None, None), ("methods/aware", "activation-global", 0.3)):
            for scale in (1 / 9, 1 / 3, 1.0):
                rows.append({"variant": v, "group": "methods", "label": v.split("/")[1], "method": v.split("/")[1],
                             "rho": rho, "rule": rule, "targets": "qkv+projector" if rule else None,
                             "calib": "upstream" if rule else None, "calib_n": 8 if rule else None,
                             "scale": scale, "lr": 1e-5 * scale, "seed": seed, "precision": "bf16",
                             "downstream": 0.2 + 0.5 * scale, "R": 100 - 40 * scale - (10 if v.endswith("full") else 0)
                             + seed, "R_probe": 100.0, "trainable_frac": 0.5})
    return pd.DataFrame(rows)


def test_mask_panel_on_a_study_folder_says_what_the_study_measured(tmp_path):
    """Notebook 04's second panel: re-select the frozen rows for a rho / rule on the study's stored
    saliency, show the mask, and say what the study measured for that exact selection."""
    st = study()
    st.norms = {k: torch.full_like(v, float("nan")) for k, v in st.norms.items()}  # as a saved run: no row norms
    st.save(tmp_path)
    (tmp_path / "row_norms.safetensors").unlink()
    p = MaskPanel.from_study({"path": tmp_path, "runs": _study_runs()})
    assert list(p.controls) == ["rho", "rule", "profile", "targets", "show", "layer"]
    assert "weight-norm" not in p.controls["rule"].options          # needs the model's weight rows
    assert p.result["frozen_fraction"] == pytest.approx(0.3, abs=0.02)
    assert "the study fine-tuned this selection: downstream" in p.status.value   # rho=0.3, global, upstream-8
    first = shown(p)
    assert len(first) == 3 and "activation-global, rho=0.3" in first[0][0] and "frozen rows" in first[1][0]
    p.controls["rho"].value = 0.5                                   # no fine-tuning: milliseconds
    assert p.result["frozen_fraction"] == pytest.approx(0.5, abs=0.02) and p.seconds < 2
    assert "rho=0.5" in shown(p)[0][0] and shown(p)[1][1][0]["z"] != first[1][1][0]["z"]   # the mask redrawn
    assert "no finished run with this selection" in p.status.value
    assert not p.controls["profile"].disabled and "calibration:" not in p.status.value
    p.controls["rule"].value = "random"                             # the calibration set changes nothing
    assert p.controls["profile"].disabled and "does not read the calibration saliency" in p.controls["profile"].tooltip
    assert "calibration: the random rule does not read the calibration saliency" in p.status.value
    p.controls["rule"].value = "activation-balanced"                # the same fraction in every layer
    assert not p.controls["profile"].disabled and p.controls["profile"].tooltip is None
    ft = tables.frozen_table(p.result["masks"])
    assert np.allclose(ft.fraction, np.round(0.5 * ft.rows) / ft.rows)
    p.reset_button.click()
    assert p.result["rho"] == 0.3 and p.result["rule"] == "activation-global" and shown(p) == first
    assert p.error is None


def test_mask_panel_with_one_calibration_set_greys_out_the_picker():
    p = MaskPanel(study(n_profiles=1))
    assert p.controls["profile"].disabled and "one calibration set" in p.status.value


def test_runs_panel_browses_the_finished_runs():
    """Notebook 04's first panel: one line per variant over the learning-rate scales, mean over seeds."""
    runs = _study_runs()
    p = RunsPanel({"path": "x", "runs": runs})
    assert list(p.controls) == ["group", "metric", "precision"] and p.error is None
    (title, data), = shown(p)
    assert title.startswith("methods: R, multimodal retention (%)") and [t["name"] for t in data] == \
        ["full fine-tuning", "AWARe (rho 0.3)"]
    assert data[0]["x"] == ["1/9", "1/3", "1"] and data[1]["y"][0] == pytest.approx(100 - 40 / 9 + 0.5)
    assert "<b>12</b> finished runs in methods (2 variants)" in p.status.value
    assert "AWARe (rho 0.3) at scale 1/9" in p.status.value
    # one group and one precision so far: those pickers change nothing, greyed out with the reason
    assert p.controls["group"].disabled and p.controls["precision"].disabled and not p.controls["metric"].disabled
    assert "all of one group" in p.controls["group"].tooltip and "every finished run trained in bf16" in p.status.value
    p.controls["metric"].value = "downstream"
    (title, data), = shown(p)
    assert "downstream accuracy" in title and data[0]["y"][2] == pytest.approx(0.7) and "at scale 1</b> (0.700)" in p.status.value
    more = runs.assign(group="rho", variant="rho/rho=0", precision="float32").iloc[:3]
    p2 = RunsPanel(pd_concat(runs, more), metric="R")
    assert not p2.controls["group"].disabled and not p2.controls["precision"].disabled
    p2.controls["group"].value = "rho"
    assert p2.output.outputs == () and "rho: no finished bf16 run" in p2.status.value
    p2.controls["precision"].value = "float32"
    assert [t["name"] for t in shown(p2)[0][1]] == ["rho 0"] and p2.error is None


def pd_concat(*frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("panel", [lambda runs: RunsPanel({"path": "x", "runs": runs}),
                                   lambda runs: AblationPanel(runs)], ids=["runs", "ablation"])
def test_a_browser_with_no_finished_run_says_so_and_greys_out_its_pickers(panel):
    import pandas as pd

    p = panel(pd.DataFrame(columns=["group", "variant", "scale", "seed", "R", "H", "downstream"]))
    assert p.error is None and p.output.outputs == () and p.figures == []
    assert "no finished run yet" in p.status.value
    assert all(c.disabled and c.tooltip == "no finished run yet" for c in p.controls.values())


def test_the_figures_stay_dimmed_until_the_new_ones_are_in_place():
    """The figure being recomputed is dimmed (a CSS class the panel's style draws at 35 % opacity, at
    once) until the new figures replace it; only then does the class go."""
    p = MaskPanel(study())
    seen = []
    p.output.observe(lambda ch: seen.append(BUSY_CLASS in p.output._dom_classes), names="outputs")
    p.controls["rho"].value = 0.5
    assert seen == [True] and BUSY_CLASS not in p.output._dom_classes
    style = p.widget.children[0].value
    assert f".{BUSY_CLASS}{{opacity:.35;transition:none}}" in style


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
    """The ablation panel's data inputs are unchanged; it browses the table and nothing else."""
    import inspect

    assert list(inspect.signature(AblationPanel.from_run).parameters) == ["run", "kw"]
    p = AblationPanel.from_run({"results": results_table(), "run_dir": "none"})
    assert list(p.controls) == ["group", "metric"] and len(p.figures) == 1
