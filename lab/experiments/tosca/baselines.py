"""Baselines in the same harness, on the same cached features (docs/tosca.md, "Baselines").

* :class:`SimpleCIL` — Zhou et al. 2023: a cosine classifier whose rows are class-mean prototypes
  of the frozen features; nothing is trained.
* :class:`FineTune` — sequential fine-tuning of one linear head: each task trains on its own data
  only (loss over every class seen so far) — the forgetting lower bound.
* :class:`Joint` — after each stage, a fresh linear head trained on the data of every class seen
  so far — the upper bound of a linear read-out of the frozen features.

The linear heads train with TOSCA's optimiser settings (SGD momentum .9, cosine lr, epochs, batch)
so the comparison changes one thing: what is learned. Each baseline answers with a single model:
logits ``[1, N, C]``, routing 'single'.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lab.tosca.head import CosineHead, class_means
from lab.tosca.learner import NonFiniteLoss, ToscaConfig, cosine_lr, cpu_threads, sgd_step


def train_head(head: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: ToscaConfig,
               generator: torch.Generator, *, what: str = "head", on_epoch=None) -> list[float]:
    """Train ``head`` alone on features ``x [n, d]`` with CE and TOSCA's optimiser; per-epoch losses."""
    with cpu_threads(cfg.threads):
        return _train_head(head, x, y, cfg, generator, what, on_epoch)


def _train_head(head, x, y, cfg, generator, what, on_epoch) -> list[float]:
    params = list(head.parameters())
    bufs = [torch.zeros_like(p) for p in params]
    losses = []
    for epoch in range(cfg.epochs):
        lr, total = cosine_lr(cfg, epoch), torch.zeros(())
        for idx in torch.randperm(len(y), generator=generator).split(cfg.batch_size):
            loss = F.cross_entropy(head(x[idx]), y[idx])
            sgd_step(params, torch.autograd.grad(loss, params), bufs, lr=lr, momentum=cfg.momentum,
                     weight_decay=cfg.weight_decay)
            total += loss.detach() * len(idx)
        losses.append(float(total) / len(y))
        if not math.isfinite(losses[-1]):
            raise NonFiniteLoss(f"{what}: loss became {losses[-1]} in epoch {epoch}")
        if on_epoch:
            on_epoch({"epoch": epoch, "loss": losses[-1], "lr": lr})
    return losses


def grown_linear(old: nn.Linear | None, dim: int, n_new: int, generator: torch.Generator) -> nn.Linear:
    """A linear head with ``n_new`` more outputs; old rows kept, new rows as nn.Linear's init."""
    n_old = old.out_features if old is not None else 0
    new = nn.Linear(dim, n_old + n_new)
    bound = 1 / math.sqrt(dim)
    with torch.no_grad():
        new.weight.uniform_(-bound, bound, generator=generator)
        new.bias.uniform_(-bound, bound, generator=generator)
        if old is not None:
            new.weight[:n_old] = old.weight
            new.bias[:n_old] = old.bias
    return new


class SimpleCIL:
    name = "simplecil"

    def __init__(self, dim: int, cfg: ToscaConfig, **_):
        self.head = CosineHead(dim)

    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        m = data.train_task == t
        self.head.grow(len(classes))
        self.head.set_rows(classes, class_means(data.train_x[m], data.train_y[m], classes))

    @torch.no_grad()
    def logits(self, data, idx) -> torch.Tensor:
        return self.head(data.test_x[idx])[None]

    def task_tensors(self, t) -> dict:
        return {"head.weight": self.head.weight.detach()}

    def restore_task(self, t, tensors, classes, data) -> None:
        self.head.weight = nn.Parameter(tensors["head.weight"].clone())

    def trainable_parameters(self, t) -> int:
        return 0  # prototypes are computed, not trained


class FineTune:
    name = "finetune"

    def __init__(self, dim: int, cfg: ToscaConfig, **_):
        self.dim, self.cfg, self.head, self.seen = dim, cfg, None, 0

    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        gen = torch.Generator().manual_seed(self.cfg.seed + t)
        self.head = grown_linear(self.head, self.dim, len(classes), gen)
        self.seen += len(classes)
        m = data.train_task == t
        train_head(self.head, data.train_x[m], data.train_y[m], self.cfg, gen, what=f"finetune task {t}",
                   on_epoch=on_epoch)

    @torch.no_grad()
    def logits(self, data, idx) -> torch.Tensor:
        return self.head(data.test_x[idx])[None]

    def task_tensors(self, t) -> dict:
        return {"head.weight": self.head.weight.detach(), "head.bias": self.head.bias.detach()}

    def restore_task(self, t, tensors, classes, data) -> None:
        w = tensors["head.weight"]
        self.head = nn.Linear(w.shape[1], w.shape[0])
        self.head.load_state_dict({"weight": w, "bias": tensors["head.bias"]})
        self.seen = w.shape[0]

    def trainable_parameters(self, t) -> int:
        return self.seen * (self.dim + 1)


class Joint(FineTune):
    name = "joint"

    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        gen = torch.Generator().manual_seed(self.cfg.seed + t)
        self.seen += len(classes)
        self.head = grown_linear(None, self.dim, self.seen, gen)  # from scratch on everything seen
        m = data.train_task <= t
        train_head(self.head, data.train_x[m], data.train_y[m], self.cfg, gen, what=f"joint stage {t}",
                   on_epoch=on_epoch)
