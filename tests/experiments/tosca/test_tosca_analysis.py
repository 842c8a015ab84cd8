"""Sparsity / orthogonality analysis of learned LuCA modules (synthetic features, tiny modules)."""
import numpy as np
import pytest

from lab.experiments.tosca import analysis as A
from lab.experiments.tosca._synthetic import synthetic_data
from lab.tosca.learner import Tosca, ToscaConfig


@pytest.fixture(scope="module")
def trained():
    data = synthetic_data(num_tasks=3, dim=32, noise=2.0, seed=4)
    model = Tosca(32, ToscaConfig(epochs=3, ratio=4))
    for t, c in enumerate(data.task_classes):
        m = data.train_task == t
        model.learn_task(c, data.train_x[m], data.train_y[m])
    return model, data


def test_weight_sparsity_table(trained):
    model, _ = trained
    df = A.weight_sparsity(model, threshold=1e-3)
    assert set(df.task) == {0, 1, 2}
    assert set(df.param) == {"down.weight", "down.bias", "up.weight", "up.bias", "norm.weight", "norm.bias",
                             "se_down.weight", "se_up.weight"}
    assert df.frac_below.between(0, 1).all() and (df.l1_mass >= 0).all()
    total = sum(float(p.abs().sum()) for p in model.luca[0].parameters())
    assert df[df.task == 0].l1_mass.sum() == pytest.approx(total, rel=1e-5)


def test_gates_and_overlap(trained):
    model, data = trained
    g = A.gates(model, data.train_x)
    assert g.shape == (3, len(data.train_x), 32) and ((g > 0) & (g < 1)).all()
    gs = A.gate_sparsity(model, data.train_x, data.train_task)
    assert list(gs.task) == [0, 1, 2] and gs.frac_closed.between(0, 1).all()
    dims = A.active_dims(model, data.train_x, data.train_task, top=0.25)
    assert [len(d) for d in dims] == [8, 8, 8]
    ov = A.overlap(model, data.train_x, data.train_task, top=0.25)
    assert len(ov) == 9
    diag = ov[ov.task_i == ov.task_j]
    np.testing.assert_allclose(diag.cosine, 1.0, atol=1e-5)
    np.testing.assert_allclose(diag.jaccard, 1.0)
    off = ov[ov.task_i != ov.task_j]
    assert off.jaccard.between(0, 1).all() and off.cosine.between(-1 - 1e-6, 1 + 1e-6).all()
    sym = ov.pivot(index="task_i", columns="task_j", values="jaccard").to_numpy()
    np.testing.assert_allclose(sym, sym.T)


def test_jaccard_of_hand_made_active_sets(monkeypatch, trained):
    model, data = trained
    monkeypatch.setattr(A, "active_dims", lambda *a, **k: [np.array([0, 1, 2]), np.array([2, 3]), np.array([7])])
    ov = A.overlap(model, data.train_x, data.train_task)
    j = ov.set_index(["task_i", "task_j"]).jaccard
    assert j[(0, 1)] == pytest.approx(1 / 4) and j[(0, 2)] == 0 and j[(1, 1)] == 1


def test_entropy_distributions(trained):
    model, data = trained
    df = A.entropy_distributions(model, data.test_x, data.test_task)
    assert len(df) == 3 * len(data.test_x)
    assert df.own.sum() == len(data.test_x)
    assert (df.entropy >= 0).all() and (df.entropy <= np.log(6) + 1e-5).all()


def test_adapter_flow_has_no_gate():
    data = synthetic_data(num_tasks=1, dim=16)
    model = Tosca(16, ToscaConfig(epochs=1, flow="adapter"))
    model.learn_task([0, 1], data.train_x, data.train_y)
    with pytest.raises(ValueError, match="no calibrator gate"):
        A.gates(model, data.train_x)


def test_l1_sweep_more_l1_more_sparsity():
    data = synthetic_data(num_tasks=2, dim=32, noise=2.0, seed=5)
    df = A.l1_sweep(data, [0.0, 5e-2], ToscaConfig(epochs=3, ratio=4))
    assert len(df) == 4 and set(df.l1) == {0.0, 0.05}
    by = df.groupby("l1").weight_l1_mass.mean()
    assert by[0.05] < by[0.0]
    assert df.accuracy_per_sample.between(0, 100).all()
