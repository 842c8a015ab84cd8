"""The vision notebooks' widget panels, driven without a browser: set a control, check the outputs move."""
import pytest
import torch

pytest.importorskip("ipywidgets")

from lab.widgets import Panel, StagePanel, ToscaPanel  # noqa: E402


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
    late = p.result["linear_probe"]
    p.controls["stage"].value = "early"
    assert p.refreshes == 2 and p.error is None
    assert p.result["stage"] == "early" and p.result["linear_probe"] < late - 0.2
    assert p.result["cka"]["early"] == pytest.approx(1.0)
    assert "early" in p.status.value and "linear probe" in p.status.value
    p.controls["projection"].value = "tsne"
    assert p.refreshes == 3 and p.result["stage"] == "early"


def _scenario(num_tasks=3, seed=0):
    from lab.tosca.methods import ScenarioData

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
    assert len(p._models) == 1
    p.controls["l1"].value = 1e-1  # a much stronger penalty: different modules, gates pushed to neutral
    assert p.error is None and len(p._models) == 2
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
    p.controls["x"].value = 3
    assert p.error == "RuntimeError: no threes" and "no threes" in p.status.value and p.result == {"x": 0}
    p.controls["x"].value = 4
    assert p.error is None and p.result == {"x": 4}
