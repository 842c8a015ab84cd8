"""The vision notebooks' widget panels, driven without a browser: set a control, check the outputs move."""
import pytest
import torch

pytest.importorskip("ipywidgets")

from lab.widgets import BUSY_CLASS, PLOTLY_MIME, Panel, StagePanel, ToscaPanel  # noqa: E402


def shown(panel):
    """What the reader sees inside the panel: (title, data) of every figure in its output area,
    each a plotly JSON bundle (no empty display_data, nothing that needs IPython's formatter)."""
    out = []
    for o in panel.output.outputs:
        assert o["output_type"] == "display_data" and PLOTLY_MIME in o["data"], o
        fig = o["data"][PLOTLY_MIME]
        assert fig["data"], "an empty figure"
        out.append((fig["layout"]["title"]["text"], fig["data"]))
    assert len(out) == len(panel.figures) > 0
    return out


def _stages(n=120, seed=0):
    """Three 'stages' of 4 classes: noise, partly separable, well separable."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    means = 4 * torch.randn(4, 6, generator=g)
    feats = {"early": torch.randn(n, 5, generator=g),
             "middle": means[y] * 0.3 + torch.randn(n, 6, generator=g),
             "late": means[y] + 0.3 * torch.randn(n, 6, generator=g)}
    return feats, y


def test_stage_panel_recomputes_when_the_stage_changes():
    tr, ytr = _stages()
    te, yte = _stages(seed=1)
    p = StagePanel(tr, ytr, te, yte, ["a", "b", "c", "d"], epochs=15, max_points=50)
    assert p.result["stage"] == "late" and p.refreshes == 1 and len(p.figures) == 2
    before = shown(p)
    assert before[0][0].startswith("late") and "PCA" in before[0][0]
    late = p.result["linear_probe"]
    p.controls["stage"].value = "early"
    assert p.refreshes == 2 and p.error is None
    after = shown(p)
    assert after[0][0].startswith("early (5 channels)") and "early" in after[1][0]
    assert after[0][1][0]["x"] != before[0][1][0]["x"]          # the scatter's points moved
    assert p.result["stage"] == "early" and p.result["linear_probe"] < late - 0.2
    assert p.result["cka"]["early"] == pytest.approx(1.0)
    assert "early" in p.status.value and "linear probe" in p.status.value
    p.controls["projection"].value = "tsne"
    assert p.refreshes == 3 and p.result["stage"] == "early"
    assert "t-SNE" in shown(p)[0][0] and "PCA" not in shown(p)[0][0] and "t-SNE" in p.status.value
    p.reset_button.click()                                       # back to the notebook's parameters, one refresh
    assert p.refreshes == 4 and p.values() == {"stage": "late", "projection": "pca"}
    assert shown(p)[0][0] == before[0][0] and shown(p)[0][1] == before[0][1]


def _scenario(num_tasks=3, seed=0):
    from lab.experiments.tosca.methods import ScenarioData

    g = torch.Generator().manual_seed(seed)
    C, dim = 2 * num_tasks, 24
    means = 3 * torch.randn(C, dim, generator=g)

    def split(n):
        y = torch.arange(C).repeat_interleave(n)
        return means[y] + torch.randn(len(y), dim, generator=g), y, y // 2

    tasks = [[2 * t, 2 * t + 1] for t in range(num_tasks)]
    return ScenarioData(*split(30), *split(15), tasks)


def test_tosca_panel_retrains_on_l1_and_routes_on_request():
    p = ToscaPanel(_scenario(), epochs=2)
    r0 = dict(p.result)
    assert p.refreshes == 1 and 0 <= r0["accuracy"] <= 100 and r0["overlap"].shape == (3, 3)
    assert len(p._models) == 1 and r0["head_scale"] > 0 and r0["sigma"] == "positive"
    before = shown(p)
    assert "L1=5.0e-04" in before[0][0] and "simplecil" in before[2][0]
    p.controls["l1"].value = 1e-1  # a much stronger penalty: different modules, gates pushed to neutral
    assert p.error is None and len(p._models) == 2
    after = shown(p)
    assert all("L1=1.0e-01" in t for t, _ in after)
    assert after[1][1][0]["y"] != before[1][1][0]["y"]           # the gate bars moved
    assert p.result["l1"] == pytest.approx(1e-1)
    assert p.result["gate_mean_departure"] < r0["gate_mean_departure"]
    p.controls["routing"].value = "oracle"  # no retraining: the model is memoised
    assert len(p._models) == 2 and p.result["routing_accuracy"] == 100.0
    p.controls["routing"].value = "per-batch (class-ordered)"
    p.controls["batch_size"].value = 15  # one class per batch
    ordered = p.result["routing_accuracy"]
    p.controls["routing"].value = "per-batch (shuffled)"
    assert p.result["routing"] == "per-batch (shuffled)" and p.error is None
    assert ordered >= p.result["routing_accuracy"]
    p.controls["epochs"].value = 1
    assert len(p._models) == 3 and p.result["epochs"] == 1
    p.controls["baseline"].value = "joint"  # trained once on the same features, then memoised
    assert p.error is None and 0 <= p.result["baseline_accuracy"] <= 100
    assert "vs joint" in shown(p)[2][0] and [b["x"] for b in shown(p)[2][1]][0][-1] == "joint"
    p.controls["sigma"].value = "free"  # the reference's unconstrained σ: another model
    assert len(p._models) == 4 and p.result["sigma"] == "free" and "σ free" in shown(p)[2][0]
    assert "warning" not in p.status.value
    p.reset_button.click()
    assert p.values() == {"l1": 5e-4, "epochs": 2, "sigma": "positive", "routing": "per-sample",
                          "batch_size": 48, "baseline": "simplecil"}
    assert len(p._models) == 4 and shown(p) == before            # memoised: the first figures again


def test_tosca_panel_warns_when_the_head_scale_ends_negative():
    p = ToscaPanel(_scenario(), epochs=1, sigma="free", baseline="none")
    assert "warning" not in p.status.value and len(p.figures[2].data[0].x) == 2
    key, (model, _, gates, ov) = next(iter(p._models.items()))
    model.head.set_scale(-2.0)            # what a free σ can reach (seen with a strong L1 on real features)
    p._models[key] = (model, model.all_logits(p.data.test_x), gates, ov)
    p.controls["routing"].value = "oracle"  # re-routes the memoised model
    assert p.result["head_scale"] == -2.0 and p.result["warning"]
    assert "σ ended at -2 <= 0" in p.status.value and p.result["accuracy"] < 50


def test_panel_keeps_running_after_a_failing_update():
    import ipywidgets as w

    class Boom(Panel):
        def __init__(self):
            super().__init__({"x": w.IntSlider(value=0, min=0, max=5)})

        def compute(self, x):
            if x == 3:
                raise RuntimeError("no threes")
            return {"x": x}, []

    p = Boom()
    assert p.output.outputs == () and not p.controls["x"].disabled   # no figures; not left "computing…"
    p.controls["x"].value = 3
    assert p.error == "RuntimeError: no threes" and "no threes" in p.status.value and p.result == {"x": 0}
    assert not p.controls["x"].disabled and BUSY_CLASS not in p.output._dom_classes
    p.controls["x"].value = 4
    assert p.error is None and p.result == {"x": 4}


def test_panel_shows_computing_while_it_refreshes_and_writes_no_stray_output(capsys):
    import ipywidgets as w
    import plotly.graph_objects as go

    seen = []

    class Slow(Panel):
        def __init__(self):
            super().__init__({"n": w.IntSlider(value=2, min=1, max=5)})

        def compute(self, n):
            seen.append((self.status.value, self.controls["n"].disabled, BUSY_CLASS in self.output._dom_classes))
            return {"n": n}, [go.Figure(go.Bar(y=list(range(n))), layout={"title": f"n={n}"})]

    p = Slow()
    p.controls["n"].value = 4
    assert seen[-1] == ("<i>computing…</i>", True, True)           # dimmed: a class the browser styles
    assert BUSY_CLASS not in p.output._dom_classes and f".{BUSY_CLASS}" in p.widget.children[0].value
    assert shown(p) == [("n=4", [{"type": "bar", "y": [0, 1, 2, 3]}])]
    assert not p.controls["n"].disabled and "(0.0 s)" in p.status.value
    assert capsys.readouterr().out == ""  # nothing displayed outside the panel


def test_tosca_panel_disables_the_test_batch_for_routers_that_do_not_read_one():
    p = ToscaPanel(_scenario(), epochs=1, baseline="none")
    batch = p.controls["batch_size"]
    assert p.result["routing"] == "per-sample" and batch.disabled and "routes each image on its own" in batch.tooltip
    assert "batch 48" not in p.status.value and "test batch: not used by per-sample" in p.status.value
    p.controls["routing"].value = "energy"                      # a per-sample router: the status names no batch
    assert batch.disabled and "batch" not in p.status.value.split("<br>")[0]
    p.controls["routing"].value = "per-batch (shuffled)"        # the batch matters: enabled, named
    assert not batch.disabled and not batch.tooltip and "per-batch (shuffled), batch 48" in p.status.value
    p.controls["routing"].value = "ridge"
    assert batch.disabled and p.error is None
