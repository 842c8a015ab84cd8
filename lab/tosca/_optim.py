"""TOSCA's optimisation primitives, shared by the eager loop (learner.py), the static / CUDA-graph
engine (_graph.py) and the baselines: PILOT's schedule and torch.optim.SGD's update, written with
foreach ops so one step is a handful of kernels."""
from __future__ import annotations

import math

import torch


def cosine_lr(cfg, epoch: int) -> float:
    """torch's CosineAnnealingLR(T_max=epochs, eta_min) stepped once per epoch, as PILOT."""
    return cfg.eta_min + (cfg.lr - cfg.eta_min) * (1 + math.cos(math.pi * epoch / cfg.epochs)) / 2


@torch.no_grad()
def sgd_step(params, grads, bufs, *, lr: float | torch.Tensor, momentum: float, weight_decay: float = 0.0) -> None:
    """torch.optim.SGD's update (dampening 0, no Nesterov); ``bufs`` start at zero. ``lr`` is a
    number, or a 0-d tensor on the device (read when the step runs, so a captured CUDA graph
    follows the schedule when the tensor is refilled)."""
    grads = list(grads)
    if weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, grads)
    if torch.is_tensor(lr):
        torch._foreach_add_(params, torch._foreach_mul(bufs, -lr))
    else:
        torch._foreach_add_(params, bufs, alpha=-lr)


@torch.no_grad()
def add_l1_grad(params, grads, l1: float) -> None:
    """grads += l1·sign(p): the gradient of l1·Σ|p| (autograd's abs backward, sign(0) = 0),
    added in place instead of differentiating through abs/sum — the same numbers, half the
    memory passes (on the CPU this penalty over ~0.4M parameters costs as much as the matmuls)."""
    if l1:
        torch._foreach_add_(grads, torch._foreach_sign(params), alpha=l1)
