"""TOSCA core: LuCA formulas and counts, head, learner, routing, metrics (tiny synthetic inputs)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lab.tosca import metrics as M
from lab.experiments.tosca._synthetic import synthetic_data
from lab.tosca.head import CosineHead, class_means
from lab.tosca.learner import NonFiniteLoss, Tosca, ToscaConfig, add_l1_grad, cosine_lr, sgd_step
from lab.tosca.luca import FLOWS, LuCA, bottleneck, param_count
from lab.tosca.routing import ROUTINGS, RouteContext, choose, entropy, predict, route


# --- LuCA ---------------------------------------------------------------------------------------
def test_param_count_matches_the_paper_figure():
    assert bottleneck(768) == 48
    assert param_count(768, 48) == 149_808 == 4 * 768 * 48 + 48 + 3 * 768
    assert LuCA(768).num_parameters() == 149_808


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("dim,ratio", [(768, 16), (1280, 16), (64, 8), (20, 16)])
def test_module_count_equals_formula(flow, dim, ratio):
    m = LuCA(dim, ratio=ratio, flow=flow)
    assert m.num_parameters() == param_count(dim, bottleneck(dim, ratio), flow)


@pytest.mark.parametrize("flow", FLOWS)
def test_flows_match_their_formulas(flow):
    torch.manual_seed(0)
    m = LuCA(32, ratio=4, flow=flow)
    with torch.no_grad():  # non-trivial LayerNorm so the formula is really tested
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(5, 32)

    def mlp(v):
        return F.linear(F.gelu(F.linear(v, m.down.weight, m.down.bias)), m.up.weight, m.up.bias)

    def ln(v):
        return F.layer_norm(v, (32,), m.norm.weight, m.norm.bias)

    def se(v):
        return torch.sigmoid(torch.relu(v @ m.se_down.weight.T) @ m.se_up.weight.T)

    want = {"tosca": lambda: ln(x + mlp(x)) * se(ln(x + mlp(x))), "adapter": lambda: ln(mlp(x)),
            "calibrator": lambda: x * se(x), "tosca_r": lambda: x * se(x) + ln(mlp(x))}[flow]()
    torch.testing.assert_close(m(x), want)


def test_reference_initialisation():
    m = LuCA(64, ratio=16)
    bound = math.sqrt(6 / (64 + 4))
    for lin in (m.down, m.up, m.se_down, m.se_up):
        assert lin.weight.abs().max() <= bound
    assert m.se_down.bias is None and m.se_up.bias is None
    assert (m.down.bias == 0).all() and (m.up.bias == 0).all()
    assert (m.norm.weight == 1).all() and (m.norm.bias == 0).all()


def test_unknown_flow_lists_valid():
    with pytest.raises(ValueError, match="valid flows: tosca, adapter, calibrator, tosca_r"):
        LuCA(8, flow="nope")


# --- head, optimiser -----------------------------------------------------------------------------
def test_cosine_head_grows_and_keeps_rows_and_scale():
    h = CosineHead(8, 2)
    assert h.scale == 1.0
    old = h.weight.detach().clone()
    h.set_scale(3.0)
    h.grow(3)
    assert h.num_classes == 5 and h.scale == 3.0
    torch.testing.assert_close(h.weight[:2].detach(), old)
    x = torch.randn(4, 8)
    out = h(x)
    assert out.abs().max() <= 3.0 + 1e-5


def test_head_scale_stays_positive_by_default_and_free_can_flip_sign():
    from lab.tosca.head import scale_warning

    x, y = torch.randn(16, 8), torch.arange(16) % 2
    for param, ends_positive in (("positive", True), ("free", False)):
        h = CosineHead(8, 2, param=param)
        assert h.scale == 1.0  # both start where the reference starts
        h.set_rows([0, 1], class_means(x, y, [0, 1]))  # every true-class cosine > 0
        opt = torch.optim.SGD([p for n, p in h.named_parameters() if n != "weight"], lr=0.5)
        for _ in range(20):  # a loss that rewards a negative σ: push every logit of the true class down
            opt.zero_grad()
            h(x).gather(1, y[:, None]).sum().backward()
            opt.step()
        assert (h.scale > 0) == ends_positive, (param, h.scale)
        assert (scale_warning(h.scale) == "") == ends_positive
    with pytest.raises(ValueError, match="positive"):
        CosineHead(8, 2).set_scale(-1.0)
    with pytest.raises(ValueError, match="valid: positive, free"):
        ToscaConfig(head_scale_param="exp")


def test_class_means():
    x = torch.tensor([[1.0, 0], [3, 0], [0, 2], [0, 4]])
    y = torch.tensor([5, 5, 6, 6])
    torch.testing.assert_close(class_means(x, y, [5, 6]), torch.tensor([[2.0, 0], [0, 3]]))
    with pytest.raises(ValueError, match=r"no training samples for classes \[7\]"):
        class_means(x, y, [7])


def test_manual_sgd_and_l1_equal_torch_sgd_on_ce_plus_l1():
    torch.manual_seed(0)
    a, b = LuCA(16, ratio=4), LuCA(16, ratio=4)
    b.load_state_dict(a.state_dict())
    x, t = torch.randn(8, 16), torch.randn(8, 16)
    opt = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9)
    params = list(b.parameters())
    bufs = [torch.zeros_like(p) for p in params]
    for _ in range(3):
        opt.zero_grad()
        ((a(x) - t).pow(2).mean() + 1e-2 * a.l1()).backward()
        opt.step()
        g = list(torch.autograd.grad((b(x) - t).pow(2).mean(), params))
        add_l1_grad(params, g, 1e-2)
        sgd_step(params, g, bufs, lr=0.05, momentum=0.9)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def test_cosine_schedule_is_torchs():
    cfg = ToscaConfig(epochs=5, lr=0.1, eta_min=1e-3)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5, eta_min=1e-3)
    for e in range(5):
        assert cosine_lr(cfg, e) == pytest.approx(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()


@pytest.mark.parametrize("bad", [dict(l1=-1e-4), dict(epochs=0), dict(lr=float("nan")), dict(flow="x"),
                                 dict(batch_size=0), dict(head_scale=0)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        ToscaConfig(**bad)


# --- learner --------------------------------------------------------------------------------------
def _train(data, **kw):
    model = Tosca(data.dim, ToscaConfig(epochs=kw.pop("epochs", 3), **kw))
    for t, classes in enumerate(data.task_classes):
        m = data.train_task == t
        model.learn_task(classes, data.train_x[m], data.train_y[m])
    return model


def test_same_seed_same_numbers_and_other_seed_differs():
    data = synthetic_data(num_tasks=2, dim=16, noise=2.0)
    a, b, c = _train(data), _train(data), _train(data, seed=7)
    torch.testing.assert_close(a.all_logits(data.test_x), b.all_logits(data.test_x), rtol=0, atol=0)
    assert not torch.equal(a.all_logits(data.test_x), c.all_logits(data.test_x))
    assert [r["loss"] for r in a.log] == [r["loss"] for r in b.log]


def test_prototypes_overwrite_the_tasks_rows_and_modules_are_frozen():
    data = synthetic_data(num_tasks=2, dim=16)
    model = _train(data)
    m = data.train_task == 1
    with torch.no_grad():
        protos = class_means(model.luca[1](data.train_x[m]), data.train_y[m], [2, 3])
    torch.testing.assert_close(model.head.weight[2:4].detach(), protos)
    assert model.num_tasks == 2 and all(not p.requires_grad for p in model.luca.parameters())
    assert model.log[-1]["head_scale"] != 1.0  # σ is learned (and logged)


def test_non_contiguous_classes_rejected():
    data = synthetic_data(num_tasks=2, dim=8)
    model = Tosca(8, ToscaConfig(epochs=1))
    with pytest.raises(ValueError, match="continue the label space at 0"):
        model.learn_task([2, 3], data.train_x[:4], data.train_y[:4])


def test_nan_loss_names_task_and_epoch():
    data = synthetic_data(num_tasks=2, dim=8)
    model = Tosca(8, ToscaConfig(epochs=2))
    m = data.train_task == 0
    model.learn_task([0, 1], data.train_x[m], data.train_y[m])
    x = data.train_x[data.train_task == 1].clone()
    x[3, 0] = float("nan")
    with pytest.raises(NonFiniteLoss, match=r"task 1, epoch 0"):
        model.learn_task([2, 3], x, data.train_y[data.train_task == 1])


# --- routing --------------------------------------------------------------------------------------
def test_entropy():
    torch.testing.assert_close(entropy(torch.zeros(2, 4)), torch.full((2,), math.log(4)))
    assert entropy(torch.tensor([[100.0, 0, 0]]))[0] < 1e-6


def _toy_logits():
    # 2 modules, 4 samples (tasks 0,0,1,1), 4 classes; module t is confident on its own task's samples.
    L = torch.zeros(2, 4, 4)
    L[0, 0, 0] = L[0, 1, 1] = 9.0  # module 0 confident on samples 0,1
    L[1, 2, 2] = L[1, 3, 3] = 9.0
    L[0, 2, 1] = 1.0  # module 0 mildly wrong on sample 2
    L[1, 1, 3] = 8.0  # module 1 confident AND wrong on sample 1 -> but module 0 is more confident
    return L, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 3])


def test_per_sample_routing_with_the_oracles_choice_gives_the_oracles_accuracy():
    L, task, y = _toy_logits()
    ps, orc = route(L, "per-sample", task_ids=task), route(L, "oracle", task_ids=task)
    assert torch.equal(ps.choice, orc.choice) and ps.routing_accuracy == 1.0
    assert M.accuracy(ps.preds, y) == M.accuracy(orc.preds, y) == 100.0
    # and end to end on learned modules: wherever per-sample picks the oracle's module the predictions agree
    data = synthetic_data(num_tasks=3, dim=16, noise=1.0)
    model = _train(data, epochs=5)
    logits = model.all_logits(data.test_x)
    ps = route(logits, "per-sample", task_ids=data.test_task)
    orc = route(logits, "oracle", task_ids=data.test_task)
    same = ps.choice == orc.choice
    assert same.float().mean() > 0.5
    assert torch.equal(ps.preds[same], orc.preds[same])


def _logits_with_entropy_order(ent):
    """Logits [T, N, 2] whose softmax entropy is ordered as ``ent [T, N]`` (lower ent, lower entropy)."""
    x = 10 * (1 - ent)
    return torch.stack([x, torch.zeros_like(x)], -1)


def test_per_batch_uses_class_order_and_one_module_per_batch():
    ent = torch.tensor([[0.1, 0.1, 0.9, 0.9, 0.2, 0.2], [0.5, 0.5, 0.1, 0.1, 0.9, 0.9]])
    L = _logits_with_entropy_order(ent)
    labels = torch.tensor([0, 0, 2, 2, 1, 1])  # class order: samples 0,1,4,5 | 2,3
    ch = choose(L, "per-batch", RouteContext(labels=labels, batch_size=4))
    assert ch.tolist() == [0, 0, 1, 1, 0, 0]
    ch2 = choose(L, "per-batch", RouteContext(labels=labels, batch_size=1))
    assert torch.equal(ch2, choose(L, "per-sample"))
    r = route(torch.randn(2, 6, 3), "per-batch", labels=labels, batch_size=4)
    assert r.batch_size == 4 and "class-ordered" in r.order


def test_routing_errors():
    with pytest.raises(ValueError, match="valid routings: per-sample, per-batch, oracle, max-softmax"):
        choose(torch.zeros(2, 3, 2), "random")
    with pytest.raises(ValueError, match="task_ids"):
        choose(torch.zeros(2, 3, 2), "oracle")
    with pytest.raises(ValueError, match="labels"):
        choose(torch.zeros(2, 3, 2), "per-batch")
    with pytest.raises(ValueError, match="features"):
        choose(torch.zeros(2, 3, 2), "ncm")
    assert ROUTINGS == ("per-sample", "per-batch", "oracle")


def test_predict_takes_the_chosen_modules_argmax():
    L = torch.tensor([[[1.0, 0], [1, 0]], [[0, 1.0], [0, 1]]])
    assert predict(L, torch.tensor([0, 1])).tolist() == [0, 1]


# --- metrics on a hand-made accuracy matrix ----------------------------------------------------------
R = np.array([[90.0, 80.0, 70.0],
              [np.nan, 60.0, 65.0],
              [np.nan, np.nan, 50.0]])


def test_metrics_hand_made_matrix():
    sizes = [10, 30, 20]
    a_b = M.stage_accuracies(R, sizes)
    np.testing.assert_allclose(a_b, [90.0, (800 + 1800) / 40, (700 + 1950 + 1000) / 60])
    assert M.average_incremental_accuracy([90, 65, 60]) == pytest.approx(215 / 3)
    assert M.last_accuracy([90, 65, 60]) == 60
    # forgetting: task 0: max(90, 80) - 70 = 20; task 1: max(60) - 65 = -5 -> mean 7.5
    assert M.forgetting(R) == pytest.approx(7.5)
    # BWT: (70 - 90 + 65 - 60) / 2 = -7.5
    assert M.backward_transfer(R) == pytest.approx(-7.5)
    assert math.isnan(M.forgetting(R[:1, :1])) and math.isnan(M.backward_transfer(R[:1, :1]))


def test_task_accuracies_and_matrix():
    preds = np.array([0, 1, 1, 3, 9])
    labels = np.array([0, 1, 2, 3, 4])
    tasks = np.array([0, 0, 1, 1, 2])
    col = M.task_accuracies(preds, labels, tasks, 4)
    np.testing.assert_allclose(col[:3], [100.0, 50.0, 0.0])
    assert np.isnan(col[3])
    assert M.accuracy(preds, labels) == 60.0
    mat = M.accuracy_matrix([col, col])
    assert mat.shape == (4, 2)
    s = M.summarize(R, [90, 65, 60])
    assert set(s) == {"avg_inc_acc", "last_acc", "forgetting", "bwt"}


def test_static_engine_matches_the_eager_loop():
    data = synthetic_data(num_tasks=2, dim=16, noise=2.0, n_train=37)  # 74 samples: a padded last batch
    a, b = _train(data), _train(data, engine="static")
    torch.testing.assert_close(a.all_logits(data.test_x), b.all_logits(data.test_x), rtol=1e-4, atol=1e-4)
    assert [r["epoch"] for r in a.log] == [r["epoch"] for r in b.log]
    for ra, rb in zip(a.log, b.log):
        assert ra["ce"] == pytest.approx(rb["ce"], rel=1e-4)
    with pytest.raises(ValueError, match="needs device='cuda'"):
        ToscaConfig(engine="cuda_graph")
