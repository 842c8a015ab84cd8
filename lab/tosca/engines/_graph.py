"""One TOSCA task trained on fixed-shape buffers, optionally captured as ONE CUDA graph per epoch
(ours, opt-in: ``ToscaConfig(engine='static')`` or ``engine='cuda_graph'``; the GPU path of
benchmarks/bench_tosca.py).

Why: at batch 48 a step is ~70 tiny kernels, so a GPU spends its time launching them. Here the
epoch's batches are rows of a static index buffer ``[steps, B]`` (the last batch padded with
weight-0 rows), the learning rate is a device scalar, and every step of the epoch is recorded once
and replayed 20 times. The maths is the plain step's (lab/tosca/learner.py): same permutation, same batches,
CE averaged over the real rows, + l1·sign(p), SGD momentum — only float summation order differs.
``capture=False`` runs the same static code eagerly (that is how it is tested on a CPU).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._optim import add_l1_grad, cosine_lr, sgd_step


def static_epochs(luca, head, x, y, cfg, gen: torch.Generator, *, capture: bool, batch_features=None):
    """Train one task; yields (epoch, lr, mean CE) after each epoch, like the eager loop."""
    dev, B, n = x.device, cfg.batch_size, len(y)
    steps = math.ceil(n / B)
    params = [*luca.parameters(), *head.parameters()]
    n_luca = len(list(luca.parameters()))
    bufs = [torch.zeros_like(p) for p in params]
    perm_buf = torch.zeros(steps, B, dtype=torch.long, device=dev)
    w_buf = torch.zeros(steps * B, device=dev)
    w_buf[:n] = 1.0
    w_buf = w_buf.view(steps, B)
    lr_t = torch.zeros((), device=dev)  # the epoch's lr, refilled before each replay
    ce_sum = torch.zeros((), device=dev)
    feats = batch_features or (lambda idx: x[idx])

    def run_steps(k: int) -> None:
        for s in range(k):
            idx, w = perm_buf[s], w_buf[s]
            ce_rows = F.cross_entropy(head(luca(feats(idx))), y[idx], reduction="none")  # [B]
            ce = (ce_rows * w).sum() / w.sum()
            grads = list(torch.autograd.grad(ce, params))
            add_l1_grad(params[:n_luca], grads[:n_luca], cfg.l1)
            sgd_step(params, grads, bufs, lr=lr_t, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
            with torch.no_grad():
                ce_sum.add_(ce.detach() * w.sum())

    graph = None
    if capture:
        snap = [t_.detach().clone() for t_ in params + bufs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (cuBLAS handles, autograd) before capture
            run_steps(1)
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():  # undo the warm-up step
            for t_, s_ in zip(params + bufs, snap):
                t_.copy_(s_)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_steps(steps)

    for epoch in range(cfg.epochs):
        lr = cosine_lr(cfg, epoch)
        perm = torch.randperm(n, generator=gen)
        padded = torch.zeros(steps * B, dtype=torch.long)
        padded[:n] = perm
        perm_buf.copy_(padded.view(steps, B))
        lr_t.fill_(lr)
        ce_sum.zero_()
        graph.replay() if graph is not None else run_steps(steps)
        yield epoch, lr, float(ce_sum) / n
