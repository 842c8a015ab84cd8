"""The global ridge (lab.tosca.ridge): incremental statistics against the batch closed form, the
seeded projection, the ``ridge`` router on separable data, `lab tosca --routing ridge` end to end
(with resume), and RanPAC reading out through the same implementation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from lab.experiments.tosca import methods as Me
from lab.experiments.tosca._synthetic import synthetic_data
from lab.tosca import ridge as RG
from lab.tosca import routing as R
from lab.tosca.learner import Tosca, ToscaConfig
from lab.tosca.ridge import RidgeRouter


def _blobs(num_tasks=3, per_task=2, dim=16, n=30, seed=0):
    """Well-separated Gaussian blobs: class means 10 apart on their own axes, noise 0.5."""
    g = torch.Generator().manual_seed(seed)
    C = num_tasks * per_task
    means = 10.0 * torch.eye(dim)[:C]
    y = torch.arange(C).repeat_interleave(n)
    x = means[y] + 0.5 * torch.randn(len(y), dim, generator=g)
    return x, y, y // per_task


def test_ridge_router_routes_separable_tasks_perfectly_after_incremental_updates():
    x, y, task = _blobs()
    xt, yt, task_t = _blobs(seed=1)
    ridge = RidgeRouter(16, seed=3)  # the defaults: D = PROJ_DIM, λ = 1e3, L2-normalised
    for t in range(3):
        ridge.update(x[task == t], y[task == t])
    assert ridge.num_classes == 6 and ridge.count == len(y) and ridge.updates == 3
    ctx = R.RouteContext(features=xt, ridge=ridge, task_of_class=torch.arange(6) // 2)
    logits = torch.zeros(3, len(yt), 6)  # the ridge router looks only at the features
    r = R.route(logits, "ridge", ctx, task_ids=task_t)
    assert r.routing_accuracy == 1.0
    assert torch.equal(ridge.predict(xt).argmax(1), yt)


def test_incremental_statistics_equal_the_batch_ones_and_solve_is_the_closed_form(monkeypatch):
    monkeypatch.setattr(RG, "_CHUNK_ELEMENTS", 7 * 64)  # 7-row chunks inside every update
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(90, 16, generator=g), torch.arange(6).repeat_interleave(15)
    ridge = RidgeRouter(16, 64, seed=1, lam=0.5)
    for part in torch.arange(90).split(30):  # three tasks of two classes: Q grows by columns
        ridge.update(x[part], y[part])
    H = F.relu(F.normalize(x, dim=1) @ ridge.W).double()
    Y = F.one_hot(y, 6).double()
    torch.testing.assert_close(ridge.G, H.T @ H)
    torch.testing.assert_close(ridge.Q, H.T @ Y)
    eye = torch.eye(64, dtype=torch.float64)
    torch.testing.assert_close(ridge.solve(), torch.linalg.solve(ridge.G + 0.5 * eye, ridge.Q))
    torch.testing.assert_close(ridge.solve(lam=3.0), torch.linalg.solve(H.T @ H + 3.0 * eye, H.T @ Y))
    torch.testing.assert_close(ridge.predict(x[:5]), H[:5] @ ridge.solve())


def test_tiny_ridge_equals_least_squares_on_the_augmented_system():
    """min ‖H w - Y‖² + λ‖w‖² is least squares on [H; √λ I] w = [Y; 0] (numpy's lstsq)."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 5, generator=g), torch.randint(0, 3, (40,), generator=g)
    ridge = RidgeRouter(5, 6, seed=4, lam=2.0, normalize=False)
    ridge.update(x[:25], y[:25], num_classes=3)
    ridge.update(x[25:], y[25:], num_classes=3)
    H = torch.relu(x @ ridge.W).double().numpy()
    Y = np.eye(3)[y.numpy()]
    A = np.vstack([H, np.sqrt(2.0) * np.eye(6)])
    B = np.vstack([Y, np.zeros((6, 3))])
    w, *_ = np.linalg.lstsq(A, B, rcond=None)
    np.testing.assert_allclose(ridge.solve().numpy(), w, rtol=1e-8, atol=1e-10)


def test_projection_is_seeded_gaussian_and_the_solve_is_cached():
    a, b, c = RidgeRouter(16, 500, seed=7), RidgeRouter(16, 500, seed=7), RidgeRouter(16, 500, seed=8)
    assert torch.equal(a.W, b.W) and not torch.equal(a.W, c.W)
    assert a.W.shape == (16, 500) and abs(float(a.W.mean())) < 0.05 and abs(float(a.W.std()) - 1) < 0.05
    with pytest.raises(ValueError, match="no data"):
        a.solve()
    x, y = torch.randn(20, 16), torch.arange(2).repeat(10)
    a.update(x, y)
    assert a.solve() is a.solve()  # cached until the next update
    first = a.solve()
    a.update(x, y)
    assert a.solve() is not first
    with pytest.raises(ValueError, match="lam"):
        RidgeRouter(4, lam=0)


def test_auto_lambda_is_ranpacs_rule_and_ranpac_reads_out_through_the_same_ridge(monkeypatch):
    from lab.experiments.tosca.baselines import RIDGES, RanPAC

    monkeypatch.setattr(RanPAC, "projection", 256)  # the rule, not the size (2,000: a minute of eigh here)
    data = synthetic_data(num_tasks=2, dim=8, seed=6)
    m = Me.fit(RanPAC(data.dim, ToscaConfig(seed=0)), data)
    assert isinstance(m.ridge, RidgeRouter) and not m.ridge.normalize and m.ridge.lam_rule == "auto"
    ref = RidgeRouter(data.dim, RanPAC.projection, seed=0, lam="auto", normalize=False)
    for t, classes in enumerate(data.task_classes):
        k = data.train_task == t
        ref.update(data.train_x[k], data.train_y[k], num_classes=classes[-1] + 1)
    assert ref.lam == m.ridge.lam and ref.lam in RIDGES
    idx = torch.arange(len(data.test_y))
    torch.testing.assert_close(m.logits(data, idx)[0].double(), ref.predict(data.test_x), rtol=1e-4, atol=1e-4)


def test_learner_keeps_a_ridge_for_the_router_and_a_restored_one_says_it_has_none():
    data = synthetic_data(num_tasks=2, dim=8, noise=1.0, seed=3)
    model = Tosca(data.dim, ToscaConfig(epochs=1, seed=0), ridge_dim=128)
    for t, classes in enumerate(data.task_classes):
        k = data.train_task == t
        model.learn_task(classes, data.train_x[k], data.train_y[k])
    ctx = model.route_context(data.test_x)
    assert ctx.ridge.updates == 2 and ctx.ridge.num_classes == 4 and ctx.ridge.proj_dim == 128
    r = R.route(model.all_logits(data.test_x), "ridge", ctx, task_ids=data.test_task)
    assert r.routing_accuracy > 0.95
    fresh = Tosca(data.dim, ToscaConfig(epochs=1, seed=0), ridge_dim=128)
    for t, classes in enumerate(data.task_classes):
        fresh.restore_task(model.task_tensors(t), classes)
    with pytest.raises(ValueError, match="needs ridge"):
        R.route(fresh.all_logits(data.test_x), "ridge", fresh.route_context(data.test_x))


def test_lab_tosca_routing_ridge_end_to_end_and_resumed(tmp_path, monkeypatch):
    from lab import cli
    from lab.experiments.tosca.cli import config_from_args
    from lab.experiments.tosca.methods import ToscaMethod
    from lab.experiments.tosca.run import RunConfig, run

    assert "ridge" in R.list_routings()
    args = cli.build_parser().parse_args(["tosca", "--routing", "ridge", "--routings", "per-sample", "ridge"])
    cfg = config_from_args(args)
    assert cfg.routing == "ridge" and cfg.routings == ("per-sample", "ridge")

    data = synthetic_data(num_tasks=3, dim=16, noise=1.0, seed=1)
    cfg = RunConfig(epochs=2, routing="ridge", routings=("per-sample", "ridge"))
    full = run(cfg, data=data, runs_root=tmp_path, progress=False)
    assert list(full.summary.routing) == ["per-sample", "ridge"] and full.headline()["routing"] == "ridge"
    assert full.headline()["routing_accuracy_last"] > 0.95
    assert full.method._ridge.updates == 3 and full.method._ridge.proj_dim == ToscaMethod.ridge_dim

    real = ToscaMethod.learn_task

    def crash_at_task_2(self, t, *a, **k):
        if t == 2:
            raise KeyboardInterrupt("simulated interruption")
        return real(self, t, *a, **k)

    monkeypatch.setattr(ToscaMethod, "learn_task", crash_at_task_2)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, data=data, runs_root=tmp_path, progress=False)
    monkeypatch.setattr(ToscaMethod, "learn_task", real)
    crashed = max((tmp_path / "tosca").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert not (crashed / "stages" / "stage002.json").exists()
    resumed = run(cfg, data=data, resume=crashed, progress=False)  # the ridge is rebuilt from the features
    pd.testing.assert_frame_equal(resumed.summary, full.summary)
    pd.testing.assert_frame_equal(resumed.matrix, full.matrix)


def test_harness_builds_the_ridge_only_when_a_ridge_router_asks():
    data = synthetic_data(num_tasks=2, dim=8, seed=2)
    m = Me.fit(Me.create("tosca", data.dim, ToscaConfig(epochs=1, seed=0)), data)
    assert m.model.ridge is None  # the harness's learner collects none itself
    idx = torch.arange(len(data.test_y))
    ctx = m.route_context(data, idx)
    R.route(m.logits(data, idx), "per-sample", ctx)
    assert m._ridge is None
    R.route(m.logits(data, idx), "ridge", ctx)
    assert m._ridge is not None and m._ridge.updates == 2
