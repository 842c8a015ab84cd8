"""The router registry (one contract, every entry plus a toy one) and the reference's
initialisation choices, checked against the reference's arithmetic."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lab.experiments.tosca._synthetic import synthetic_data
from lab.tosca import routing as R
from lab.tosca.head import CosineHead
from lab.tosca.learner import Tosca, ToscaConfig, sgd_step
from lab.tosca.luca import LuCA


def _trained(data, **kw):
    model = Tosca(data.dim, ToscaConfig(epochs=3, seed=0, **kw))
    for t, classes in enumerate(data.task_classes):
        m = data.train_task == t
        model.learn_task(classes, data.train_x[m], data.train_y[m])
    return model


@pytest.fixture(scope="module")
def trained():
    data = synthetic_data(num_tasks=3, dim=16, noise=1.0, seed=2)
    return data, _trained(data)


@pytest.fixture
def toy_router():
    """A toy entry added by the test: always module 0."""
    name = "toy-first"
    R.register(name)(lambda logits, ctx: torch.zeros(logits.shape[1], dtype=torch.long))
    yield name
    R.ROUTERS._entries.pop(name), R.ROUTERS._info.pop(name)


@pytest.mark.parametrize("name", [*R.list_routings(), "toy"])
def test_every_router_honours_the_contract(name, trained, toy_router):
    name = toy_router if name == "toy" else name
    data, model = trained
    logits = model.all_logits(data.test_x)  # [T, N, C]
    ctx = model.route_context(data.test_x)
    r = R.route(logits, name, ctx, task_ids=data.test_task, labels=data.test_y, batch_size=8)
    assert r.choice.shape == (len(data.test_y),) and r.choice.dtype == torch.long
    assert int(r.choice.min()) >= 0 and int(r.choice.max()) < model.num_tasks
    assert 0 <= r.routing_accuracy <= 1
    assert R.ROUTERS.info(name)["protocol"] in ("per-sample", "per-batch", "oracle")


def test_feature_routers_find_the_task_on_separable_data(trained):
    data, model = trained
    logits, ctx = model.all_logits(data.test_x), model.route_context(data.test_x)
    for name in ("ncm", "mahalanobis", "oracle"):
        assert R.route(logits, name, ctx, task_ids=data.test_task).routing_accuracy > 0.95, name


def test_confidence_routers_on_hand_made_logits():
    # module 0 is peaked on sample 0, module 1 on sample 1; module 1 has the larger log-sum-exp on both
    L = torch.tensor([[[5.0, 0.0], [0.0, 0.0]],
                      [[4.5, 4.5], [9.0, 0.0]]])
    assert R.choose(L, "per-sample").tolist() == [0, 1]
    assert R.choose(L, "max-softmax").tolist() == [0, 1]
    assert R.choose(L, "energy").tolist() == [1, 1]


def test_entropy_ncm_falls_back_only_where_entropy_is_unsure():
    L = torch.tensor([[[9.0, 0.0], [0.1, 0.0]],
                      [[0.0, 0.0], [0.0, 0.0]]])  # sample 0: module 0 sure; sample 1: nobody is
    ctx = R.RouteContext(features=torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
                         class_means=torch.tensor([[1.0, 0.0], [0.0, 1.0]]), task_of_class=torch.tensor([0, 1]))
    assert R.choose(L, "entropy-ncm", ctx).tolist() == [0, 1]


def test_shrinkage_and_mahalanobis_by_hand():
    cov = torch.tensor([[2.0, 0.5], [0.5, 4.0]], dtype=torch.float64)
    # V1 = mean variance 3, V2 = mean off-diagonal 0.5
    want = torch.tensor([[5.0, 1.0], [1.0, 7.0]], dtype=torch.float64)
    assert torch.allclose(R.shrink(cov), want)
    P = torch.linalg.inv(want)
    x, mu = torch.tensor([[1.0, 2.0]], dtype=torch.float64), torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    d = (x - mu) @ P @ (x - mu).T
    assert torch.allclose(R.mahalanobis(x, mu, P), d)


def test_learner_stores_class_means_and_pooled_scatter():
    data = synthetic_data(num_tasks=2, dim=6, noise=1.0, seed=3)
    model = _trained(data)
    x, y = data.train_x.double(), data.train_y
    means = torch.stack([x[y == c].mean(0) for c in range(4)])
    centred = x - means[y]
    assert torch.allclose(model.class_means, means) and model.scatter_count == len(y)
    assert torch.allclose(model.scatter, centred.T @ centred)


# --- the reference's initialisation -----------------------------------------------------------------
def test_zero_rows_first_sgd_step_matches_the_reference_arithmetic():
    """PILOT's CosineLinear with rows appended as torch.zeros (SimpleVitNet.update_fc), one SGD step."""
    torch.manual_seed(0)
    d = 8
    head = CosineHead(d)
    head.grow(2, torch.Generator().manual_seed(1))
    head.grow(2, init="zeros")
    assert torch.equal(head.weight[2:], torch.zeros(2, d))
    x, y = torch.randn(5, d), torch.tensor([0, 2, 3, 1, 2])
    # the reference, written out: a Parameter with zero rows, F.normalize, torch.optim.SGD
    w = nn.Parameter(head.weight.detach().clone())
    sigma = nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w, sigma], lr=0.025, momentum=0.9)
    ref_logits = sigma * F.linear(F.normalize(x, dim=1), F.normalize(w, dim=1))
    assert torch.equal(ref_logits[:, 2:], torch.zeros(5, 2))  # zero rows: logits exactly 0
    F.cross_entropy(ref_logits, y).backward()
    opt.step()
    ours = CosineHead(d, param="free")
    ours.weight = nn.Parameter(head.weight.detach().clone())
    params = list(ours.parameters())
    grads = torch.autograd.grad(F.cross_entropy(ours(x), y), params)
    sgd_step(params, grads, [torch.zeros_like(p) for p in params], lr=0.025, momentum=0.9)
    assert torch.allclose(ours.weight, w, rtol=1e-6) and torch.allclose(ours.sigma, sigma)
    xn = F.normalize(x, dim=1)
    p = torch.softmax(ref_logits.detach(), 1)
    dlogits = (p - F.one_hot(y, 4)) / len(y)  # d CE / d logits
    expected_row_grad = (dlogits[:, 2:].T @ xn) * 1.0 / 1e-12  # σ was 1; through w / max(‖w‖, eps)
    assert torch.allclose(w.detach()[2:], -0.025 * expected_row_grad, rtol=1e-4)


def test_tosca_grows_zero_rows_after_the_first_task_by_default(monkeypatch):
    calls = []
    grow = CosineHead.grow

    def spy(self, n_new, generator=None, *, init="uniform"):
        calls.append(init)
        return grow(self, n_new, generator, init=init)

    monkeypatch.setattr(CosineHead, "grow", spy)
    data = synthetic_data(num_tasks=3, dim=8, seed=0)
    _trained(data)
    assert calls == ["uniform", "zeros", "zeros"]
    calls.clear()
    _trained(data, head_init="uniform")
    assert calls == ["uniform", "uniform", "uniform"]


def test_luca_default_init_is_nn_linear_for_the_same_seed():
    d, seed = 32, 7
    luca = LuCA(d)
    luca.reset_parameters(torch.Generator().manual_seed(seed), init="default")
    torch.manual_seed(seed)
    down, up = nn.Linear(d, luca.r), nn.Linear(luca.r, d)  # in LuCA's module order
    se_down, se_up = nn.Linear(d, luca.r, bias=False), nn.Linear(luca.r, d, bias=False)
    for ours, ref in ((luca.down, down), (luca.up, up), (luca.se_down, se_down), (luca.se_up, se_up)):
        assert torch.equal(ours.weight, ref.weight)
        if ref.bias is not None:
            assert torch.equal(ours.bias, ref.bias)
    bound = 1 / math.sqrt(d)  # nn.Linear's default: Kaiming-uniform a=√5 -> U(±1/√fan_in)
    assert float(luca.down.weight.detach().abs().max()) <= bound and float(luca.down.weight.detach().std()) == pytest.approx(
        bound / math.sqrt(3), rel=0.1)
    assert torch.equal(luca.norm.weight, torch.ones(d)) and torch.equal(luca.norm.bias, torch.zeros(d))


def test_tosca_task0_luca_from_default_init_later_tasks_xavier(monkeypatch):
    inits = []
    reset = LuCA.reset_parameters

    def spy(self, generator=None, init="xavier"):
        inits.append(init)
        return reset(self, generator, init)

    data = synthetic_data(num_tasks=3, dim=8, seed=0)
    monkeypatch.setattr(LuCA, "reset_parameters", spy)
    _trained(data)
    assert [i for i in inits if i == "default"] == ["default"] and inits[-1] == "xavier"
    assert inits.index("default") < inits.index("xavier", inits.index("default"))
    inits.clear()
    _trained(data, luca_init="xavier")
    assert "default" not in inits


def test_bad_init_names():
    with pytest.raises(ValueError, match="head_init"):
        ToscaConfig(head_init="zeros")
    with pytest.raises(ValueError, match="luca_init"):
        ToscaConfig(luca_init="kaiming")
    with pytest.raises(ValueError, match="valid: uniform, zeros"):
        CosineHead(4).grow(1, init="normal")


def test_uniform_rows_are_cosine_linears_reset_parameters_for_the_same_generator():
    """The 'uniform' head option (and the reference's first task): PILOT's CosineLinear.reset_parameters,
    ``stdv = 1 / sqrt(in_features); weight.uniform_(-stdv, stdv)``, bit for bit."""
    d = 12
    head = CosineHead(d)
    head.grow(3, torch.Generator().manual_seed(5), init="uniform")
    ref = torch.empty(3, d)
    stdv = 1.0 / math.sqrt(ref.size(1))
    ref.uniform_(-stdv, stdv, generator=torch.Generator().manual_seed(5))
    assert torch.equal(head.weight.detach(), ref)


def test_xavier_option_is_reset_tosca_for_the_same_generator():
    """The 'xavier' LuCA option (and the reference's tasks after the first): Xavier-uniform weights,
    zero biases, in module order; LayerNorm at weight 1 / bias 0."""
    d = 32
    luca = LuCA(d)
    luca.reset_parameters(torch.Generator().manual_seed(9), init="xavier")
    gen = torch.Generator().manual_seed(9)
    for lin in (luca.down, luca.up, luca.se_down, luca.se_up):
        w = torch.empty_like(lin.weight)
        nn.init.xavier_uniform_(w, generator=gen)
        assert torch.equal(lin.weight, w)
        if lin.bias is not None:
            assert torch.equal(lin.bias, torch.zeros_like(lin.bias))
    assert torch.equal(luca.norm.weight, torch.ones(d)) and torch.equal(luca.norm.bias, torch.zeros(d))

