"""The cheap training step (lab/tosca/engines/_step.py) computes exactly what autograd + the per-tensor
update compute: gradients, updates and whole trained models compared bit for bit."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lab.experiments.tosca._synthetic import synthetic_data
from lab.tosca.engines._step import FlatParams, autograd_grads, by_name, flat_update, tosca_grads
from lab.tosca.head import CosineHead
from lab.tosca.learner import Tosca, add_l1_grad, cosine_lr, sgd_step
from lab.tosca.luca import FLOWS, LuCA
from tests.tosca._modules import luca_head_batch, train_tosca


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here at one intra-op thread (the numbers are a property of the thread count)."""


@pytest.mark.parametrize("d,k,batch,zero_rows", [(1280, 10, 48, 0), (768, 100, 48, 2), (96, 5, 17, 3), (40, 3, 1, 0)])
@pytest.mark.parametrize("param", ["positive", "free"])
def test_tosca_grads_are_autograds_bit_for_bit(d, k, batch, zero_rows, param):
    luca, head, x, y = luca_head_batch(d, k, batch, param, seed=d + batch, zero_rows=zero_rows)
    params = [*luca.parameters(), *head.parameters()]
    want_ce = F.cross_entropy(head(luca(x)), y)
    want = torch.autograd.grad(want_ce, params)
    got = [torch.full_like(p, float("nan")) for p in params]
    n = len(list(luca.parameters()))
    ce = tosca_grads(luca, head, x, y, by_name(luca, got[:n]), by_name(head, got[n:]))
    assert torch.equal(ce, want_ce.detach())
    for (name, _), a, b in zip([*luca.named_parameters(), *head.named_parameters()], want, got):
        assert torch.equal(a, b), name


def test_flat_update_is_the_per_tensor_update_bit_for_bit():
    luca, head, x, y = luca_head_batch(48, 7, 12, "positive", seed=3)
    ref_luca, ref_head = LuCA(48), CosineHead(48, 7, scale=1.3)
    ref_luca.load_state_dict(luca.state_dict())
    ref_head.load_state_dict(head.state_dict())
    fp = FlatParams([*luca.parameters(), *head.parameters()])
    ref = [*ref_luca.parameters(), *ref_head.parameters()]
    bufs = [torch.zeros_like(p) for p in ref]
    n_luca = len(list(luca.parameters()))
    for lr in (0.025, 0.01, 1e-3):
        autograd_grads(luca, head, x, y, fp.grads)
        flat_update(fp, fp.prefix(n_luca), lr=lr, l1=5e-4, momentum=0.9, weight_decay=1e-4)
        g = list(torch.autograd.grad(F.cross_entropy(ref_head(ref_luca(x)), y), ref))
        add_l1_grad(ref[:n_luca], g[:n_luca], 5e-4)
        sgd_step(ref, g, bufs, lr=lr, momentum=0.9, weight_decay=1e-4)
    for a, b in zip(fp.params, ref):
        assert torch.equal(a, b)
    fp.release()
    assert all(p.untyped_storage().data_ptr() != fp.flat.untyped_storage().data_ptr() for p in fp.params)


def _autograd_epochs(self, luca, x, y, batch_features, gen):
    """The eager loop as it was: autograd, then add_l1_grad + sgd_step per tensor."""
    cfg = self.config
    params = [*luca.parameters(), *self.head.parameters()]
    n_luca = len(list(luca.parameters()))
    bufs = [torch.zeros_like(p) for p in params]
    for epoch in range(cfg.epochs):
        lr = cosine_lr(cfg, epoch)
        ce_sum = torch.zeros(())
        for idx in torch.randperm(len(y), generator=gen).split(cfg.batch_size):
            ce = F.cross_entropy(self.head(luca(batch_features(idx))), y[idx])
            grads = list(torch.autograd.grad(ce, params))
            add_l1_grad(params[:n_luca], grads[:n_luca], cfg.l1)
            sgd_step(params, grads, bufs, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
            ce_sum += ce.detach() * len(idx)
        yield epoch, lr, float(ce_sum) / len(y)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("head_scale_param", ["positive", "free"])
def test_the_eager_loop_trains_the_same_model_as_autograd(flow, head_scale_param, monkeypatch):
    data = synthetic_data(num_tasks=3, dim=32, noise=2.0, n_train=37)  # 74 per task: a short last batch
    kw = dict(flow=flow, ratio=4, head_scale_param=head_scale_param, weight_decay=1e-4, engine="eager")
    new = train_tosca(data, 2, **kw)
    monkeypatch.setattr(Tosca, "_epochs", _autograd_epochs)
    old = train_tosca(data, 2, **kw)
    assert [r["loss"] for r in new.log] == [r["loss"] for r in old.log]
    assert torch.equal(new.all_logits(data.test_x), old.all_logits(data.test_x))
    for a, b in zip(new.state_dict().values(), old.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("head_scale_param", ["positive", "free"])
def test_the_plain_step_trains_the_model_the_eager_accelerator_trains(flow, head_scale_param):
    """The default engine ('autograd': loss.backward(), torch.optim.SGD) and the 'eager' accelerator
    (hand-written backward, flat buffers) give the same model: same losses, logits and weights."""
    data = synthetic_data(num_tasks=3, dim=32, noise=2.0, n_train=37)  # 74 per task: a short last batch
    kw = dict(flow=flow, ratio=4, head_scale_param=head_scale_param, weight_decay=1e-4)
    plain, eager = train_tosca(data, 2, **kw), train_tosca(data, 2, engine="eager", **kw)
    assert {r["engine"] for r in plain.log} == {"autograd"} and {r["engine"] for r in eager.log} == {"eager"}
    assert [r["loss"] for r in plain.log] == pytest.approx([r["loss"] for r in eager.log], rel=1e-6)
    torch.testing.assert_close(plain.all_logits(data.test_x), eager.all_logits(data.test_x), rtol=1e-5, atol=1e-6)
    for a, b in zip(plain.state_dict().values(), eager.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_step_benchmark_runs_and_prints_its_ratios():
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "benchmarks/bench_tosca_step.py", "--threads", "1", "--rounds", "1",
                        "--reps", "1"], cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:7] == ["shape", "thr", "step", "ms", "eager", "ms", "floor"]
    assert sum(line.startswith(("lite0", "vit-b16")) for line in lines) == 2
    assert lines[-1].startswith("worst step/floor")
