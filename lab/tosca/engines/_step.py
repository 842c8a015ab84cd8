"""The 'eager' accelerator: the plain TOSCA step (lab/tosca/learner.py: ``loss.backward()``, then
torch.optim.SGD) made cheap without changing its numbers. The 'fused' accelerator
(lab/tosca/engines/_fused.py) runs the 'tosca' flow's element-wise work in C kernels instead, and
falls back to this step where it cannot run.

The loss is ``CE(head(LuCA(x)), y) + l1·Σ|p_luca|`` and the update SGD with momentum, as
``add_l1_grad`` + ``sgd_step`` (lab/tosca/_optim.py) define them. At batch 48 on cached features the
step's ~15 matmuls take a few hundred microseconds; autograd's graph, fresh gradient tensors every
step and ~50 per-tensor update kernels cost nearly as much again (benchmarks/bench_tosca_step.py
times this step against the bare matmuls + update of the same shapes). Here:

* :class:`FlatParams`: every trained tensor becomes a view of one flat buffer, and so do its
  gradient and its momentum (allocated once per task), so the L1 + SGD update is five kernels
  over one buffer (:func:`flat_update`) instead of five per tensor.
* :func:`tosca_grads`: for the default 'tosca' flow, the forward and backward pass written out with
  the kernels autograd itself runs (the same ATen ops on the same operands; gradients bit-identical,
  tests/tosca/test_step.py), the weight gradients written straight into the gradient buffer. Other
  flows take :func:`autograd_grads`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.tosca.luca import REFERENCE_FLOW

aten = torch.ops.aten
_NORM_EPS = 1e-12  # F.normalize's default, as the cosine head calls it
_ALIGN = 128  # floats (512 bytes): each tensor starts as aligned as a fresh CPU or CUDA allocation


class FlatParams:
    """``params`` re-seated as views of one flat buffer ``flat``, with ``grad`` and ``momentum``
    buffers of the same layout (``grads``: the per-parameter views of ``grad``). Each tensor starts
    at an aligned offset, zero padding between them, because a BLAS may round differently on
    differently aligned operands. :meth:`release` gives every parameter its own storage back."""

    def __init__(self, params):
        self.params = list(params)
        self.offsets, n = [], 0
        for p in self.params:
            self.offsets.append(n)
            n += -(-p.numel() // _ALIGN) * _ALIGN
        self.flat = torch.zeros(n, dtype=self.params[0].dtype, device=self.params[0].device)
        self.grad, self.momentum = torch.zeros_like(self.flat), torch.zeros_like(self.flat)
        self.grads = self._views(self.grad)
        with torch.no_grad():
            for p, view in zip(self.params, self._views(self.flat)):
                view.copy_(p)
                p.data = view

    def _views(self, buf):
        return [buf[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params)]

    def prefix(self, k: int) -> int:
        """How many flat elements the first ``k`` parameters span (their padding included)."""
        return self.offsets[k] if k < len(self.params) else self.flat.numel()

    def release(self) -> None:
        with torch.no_grad():
            for p in self.params:
                p.data = p.data.clone()


@torch.no_grad()
def flat_update(fp: FlatParams, n_l1: int, *, lr: float, l1: float, momentum: float, weight_decay: float) -> None:
    """``add_l1_grad`` on the first ``n_l1`` flat elements (the LuCA's), then ``sgd_step``: the
    same element-wise operations in the same order as the per-tensor versions."""
    g, p, m = fp.grad, fp.flat, fp.momentum
    if l1:
        g[:n_l1].add_(torch.sign(p[:n_l1]), alpha=l1)
    if weight_decay:
        g.add_(p, alpha=weight_decay)
    m.mul_(momentum)
    m.add_(g)
    p.add_(m, alpha=-lr)


def autograd_grads(luca, head, x, y, grads) -> torch.Tensor:
    """Any flow: the CE by autograd, its gradients copied into ``grads``; returns the CE."""
    ce = F.cross_entropy(head(luca(x)), y)
    with torch.no_grad():
        torch._foreach_copy_(grads, torch.autograd.grad(ce, [*luca.parameters(), *head.parameters()]))
    return ce.detach()


# -- the 'tosca' flow by hand; each helper is one piece's forward or backward ----------------------
def _normalize(v):
    """``F.normalize(v, dim=1)`` = ``v / max(‖v‖, eps)``, with what its backward needs."""
    norm = torch.linalg.vector_norm(v, 2, [1], True)
    denom = norm.clamp_min(_NORM_EPS)
    vn = v / denom
    return vn, (vn, norm, denom)


def _normalize_backward(g, saved, out=None):
    """autograd's chain back through F.normalize (div by the expanded denominator, clamp_min, the
    2-norm) with its redundant passes left out, the same numbers: autograd's ``(v / denom) / denom``
    reuses the forward's ``vn = v / denom``; ``sum(-g · q)`` is ``-sum(g · q)`` exactly (rounding
    is sign-symmetric); clamp_min's ``where(norm >= eps, ., 0)`` a masked fill (a NaN norm makes the
    row NaN either way); and the norm's ``(v / norm).masked_fill_(norm == 0, 0)`` is ``vn`` wherever
    norm >= eps (there denom == norm), while every other row is multiplied by the clamp's zero.
    (``addcdiv`` rounds the quotient, then the sum: autograd's two kernels in one; ``addcmul``
    would not do: it fuses a multiply-add into one rounding.)"""
    vn, norm, denom = saved
    g_norm = (g * (vn / denom)).sum_to_size(denom.shape).neg_().masked_fill_(norm < _NORM_EPS, 0)
    return torch.addcdiv(g_norm * vn, g, denom, out=out)  # g / denom + g_norm · vn, each rounded as autograd's


def _luca_forward(m, x):
    """LuCA 'tosca': ``h = LN(x + up(gelu(down(x))))``, ``out = h · sigmoid(se_up(relu(se_down(h))))``."""
    z1 = torch.addmm(m.down.bias, x, m.down.weight.t())
    a1 = F.gelu(z1)
    res = x + torch.addmm(m.up.bias, a1, m.up.weight.t())
    h, mean, rstd = torch.native_layer_norm(res, [m.dim], m.norm.weight, m.norm.bias, m.norm.eps)
    a3 = torch.relu(torch.mm(h, m.se_down.weight.t()))
    s = torch.sigmoid(torch.mm(a3, m.se_up.weight.t()))
    return h * s, (x, z1, a1, res, h, mean, rstd, a3, s)


def _luca_backward(m, g_out, saved, g) -> None:
    """Every LuCA gradient into ``g`` (parameter name -> tensor), from d loss / d out."""
    x, z1, a1, res, h, mean, rstd, a3, s = saved
    g_z4 = aten.sigmoid_backward(g_out * h, s)
    torch.mm(g_z4.t(), a3, out=g["se_up.weight"])
    g_z3 = aten.threshold_backward(torch.mm(g_z4, m.se_up.weight), a3, 0)
    torch.mm(g_z3.t(), h, out=g["se_down.weight"])
    g_h = g_out * s + torch.mm(g_z3, m.se_down.weight)  # h feeds the gate and the product
    g_res, g_lw, g_lb = aten.native_layer_norm_backward(g_h, res, [m.dim], mean, rstd, m.norm.weight,
                                                        m.norm.bias, [True, True, True])
    g["norm.weight"].copy_(g_lw)
    g["norm.bias"].copy_(g_lb)
    torch.sum(g_res, 0, keepdim=True, out=g["up.bias"].view(1, -1))  # autograd's sum_to, written in place
    torch.mm(g_res.t(), a1, out=g["up.weight"])
    g_z1 = aten.gelu_backward(torch.mm(g_res, m.up.weight), z1)
    torch.sum(g_z1, 0, keepdim=True, out=g["down.bias"].view(1, -1))
    torch.mm(g_z1.t(), x, out=g["down.weight"])


def _head_forward_backward(head, feats, y, g):
    """``CE(σ · cos(feats, w), y)``; the head's gradients into ``g`` ('weight' and σ's parameter).
    Returns the CE and d CE / d feats."""
    xn, x_saved = _normalize(feats)
    wn, w_saved = _normalize(head.weight)
    cos = torch.mm(xn, wn.t())
    free = head.param == "free"
    s_param = head.sigma if free else head.sigma_raw
    sigma = s_param if free else F.softplus(s_param)
    log_p = torch._log_softmax(sigma * cos, 1, False)
    ce, total_weight = aten.nll_loss_forward(log_p, y, None, 1, -100)  # reduction 1 = mean, as F.cross_entropy
    g_logp = aten.nll_loss_backward(torch.ones_like(ce), log_p, y, None, 1, -100, total_weight)
    g_logits = aten._log_softmax_backward_data(g_logp, log_p, 1, log_p.dtype)
    g_sigma = (g_logits * cos).sum_to_size(sigma.shape)
    g["sigma" if free else "sigma_raw"].copy_(g_sigma if free else aten.softplus_backward(g_sigma, s_param, 1, 20))
    g_cos = g_logits * sigma
    _normalize_backward(torch.mm(g_cos.t(), xn), w_saved, out=g["weight"])
    return ce, _normalize_backward(torch.mm(g_cos, wn), x_saved)


def by_name(module, tensors) -> dict:
    """``{parameter name: tensor}`` pairing ``module.named_parameters()`` with ``tensors``, in order."""
    return dict(zip((name for name, _ in module.named_parameters()), tensors))


@torch.no_grad()
def tosca_grads(luca, head, x, y, luca_grads: dict, head_grads: dict) -> torch.Tensor:
    """The 'tosca' flow's CE and its gradients, without autograd, into ``luca_grads`` and
    ``head_grads`` (parameter name -> tensor, see :func:`by_name`); returns the CE."""
    feats, saved = _luca_forward(luca, x)
    ce, g_feats = _head_forward_backward(head, feats, y, head_grads)
    _luca_backward(luca, g_feats, saved, luca_grads)
    return ce


class TrainStep:
    """One task's step ``step(x, y, lr) -> CE``: the gradients (by hand for the 'tosca' flow, by
    autograd otherwise) into flat buffers, then the flat L1 + SGD update. ``close()`` when the task
    is done (the parameters get their own storage back)."""

    def __init__(self, luca, head, cfg):
        self.luca, self.head, self.cfg = luca, head, cfg
        n_luca = len(list(luca.parameters()))
        self.flat = FlatParams([*luca.parameters(), *head.parameters()])
        self.n_l1 = self.flat.prefix(n_luca)
        self.by_hand = luca.flow == REFERENCE_FLOW
        self.luca_grads = by_name(luca, self.flat.grads[:n_luca])
        self.head_grads = by_name(head, self.flat.grads[n_luca:])

    def gradients(self, x, y) -> torch.Tensor:
        """Fill the flat gradient buffer for the batch ``(x, y)``; returns the CE."""
        if self.by_hand:
            return tosca_grads(self.luca, self.head, x, y, self.luca_grads, self.head_grads)
        return autograd_grads(self.luca, self.head, x, y, self.flat.grads)

    def __call__(self, x, y, lr: float) -> torch.Tensor:
        cfg = self.cfg
        ce = self.gradients(x, y)
        flat_update(self.flat, self.n_l1, lr=lr, l1=cfg.l1, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        return ce

    def close(self) -> None:
        self.flat.release()
