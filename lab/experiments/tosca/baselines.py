"""Baselines in the same harness, on the same cached features (docs/tosca.md, "Baselines").

* :class:`SimpleCIL` — Zhou et al. 2023: a cosine classifier whose rows are class-mean prototypes
  of the frozen features; nothing is trained.
* :class:`NCM` — nearest class mean in Euclidean distance on the frozen features (Mensink et al. 2013).
* :class:`FeCAM` — Goswami et al., NeurIPS 2023: a Tukey-transformed, class-wise Mahalanobis
  distance with shrunk, normalised covariances; nothing is trained.
* :class:`RanPAC` — McDonnell et al., NeurIPS 2023: a frozen random projection with ReLU and a
  ridge-regression read-out from running Gram statistics, λ chosen on held-out training data.
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
from lab.tosca.ridge import RIDGES, RidgeRouter  # noqa: F401  (RIDGES: RanPAC's λ grid, re-exported)
from lab.tosca.routing import shrink

from ._base import Method, register


def train_head(head: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: ToscaConfig,
               generator: torch.Generator, *, what: str = "head", on_epoch=None) -> list[float]:
    """Train ``head`` alone on features ``x [n, d]`` with CE and TOSCA's optimiser; per-epoch losses.
    Runs on ``cfg.device``: the head moves there, ``x`` and ``y`` are copied there."""
    head.to(cfg.device)
    x, y = x.to(cfg.device), y.to(cfg.device)
    with cpu_threads(cfg.threads):
        return _train_head(head, x, y, cfg, generator, what, on_epoch)


def _train_head(head, x, y, cfg, generator, what, on_epoch) -> list[float]:
    params = list(head.parameters())
    bufs = [torch.zeros_like(p) for p in params]
    losses = []
    for epoch in range(cfg.epochs):
        lr, total = cosine_lr(cfg, epoch), torch.zeros((), device=x.device)
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


@register("simplecil", trains=False, headline=1)
class SimpleCIL(Method):
    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
        super().__init__(dim, cfg, backbone=backbone, mode=mode)
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



@register("finetune")
class FineTune(Method):
    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
        super().__init__(dim, cfg, backbone=backbone, mode=mode)
        self.head, self.seen = None, 0

    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        gen = torch.Generator().manual_seed(self.cfg.seed + t)
        self.head = grown_linear(self.head, self.dim, len(classes), gen)
        self.seen += len(classes)
        m = data.train_task == t
        train_head(self.head, data.train_x[m], data.train_y[m], self.cfg, gen, what=f"finetune task {t}",
                   on_epoch=on_epoch)

    @torch.no_grad()
    def logits(self, data, idx) -> torch.Tensor:
        return self.head(data.test_x[idx].to(self.head.weight.device)).cpu()[None]

    def task_tensors(self, t) -> dict:
        return {"head.weight": self.head.weight.detach().cpu(), "head.bias": self.head.bias.detach().cpu()}

    def restore_task(self, t, tensors, classes, data) -> None:
        w = tensors["head.weight"]
        self.head = nn.Linear(w.shape[1], w.shape[0])
        self.head.load_state_dict({"weight": w, "bias": tensors["head.bias"]})
        self.seen = w.shape[0]

    def trainable_parameters(self, t) -> int:
        return self.seen * (self.dim + 1)


@register("joint")
class Joint(FineTune):
    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        gen = torch.Generator().manual_seed(self.cfg.seed + t)
        self.seen += len(classes)
        self.head = grown_linear(None, self.dim, self.seen, gen)  # from scratch on everything seen
        m = data.train_task <= t
        train_head(self.head, data.train_x[m], data.train_y[m], self.cfg, gen, what=f"joint stage {t}",
                   on_epoch=on_epoch)


class _Stored(Method):
    """A classifier computed (not trained) from the frozen features; its state is a dict of tensors."""

    state: dict

    def task_tensors(self, t) -> dict:
        return {k: v.detach().clone() for k, v in self.state.items()}

    def restore_task(self, t, tensors, classes, data) -> None:
        self.state = {k: v.clone() for k, v in tensors.items()}


@register("ncm", trains=False)
class NCM(_Stored):
    """Nearest class mean, Euclidean: logits = -‖x - μ_c‖²."""

    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
        super().__init__(dim, cfg, backbone=backbone, mode=mode)
        self.state = {"means": torch.empty(0, dim)}

    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        m = data.train_task == t
        self.state["means"] = torch.cat([self.state["means"], class_means(data.train_x[m], data.train_y[m], classes)])

    @torch.no_grad()
    def logits(self, data, idx) -> torch.Tensor:
        return -torch.cdist(data.test_x[idx].float(), self.state["means"]).pow(2)[None]


def tukey(x: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Tukey's ladder of powers, ``sign(x)·|x|^β`` (FeCAM uses β = 0.5 on non-negative features;
    the sign keeps it defined for features that can be negative, e.g. a ViT's)."""
    return x.sign() * x.abs().pow(beta)


@register("fecam", trains=False, headline=3)
class FeCAM(_Stored):
    """FeCAM (Goswami et al., NeurIPS 2023, Sec. 3; their public code ``fecam.py``): features
    Tukey-transformed (β = 0.5), one covariance per class, shrunk (γ1 = γ2 = 1), normalised to unit
    diagonal, then the class of the smallest Mahalanobis distance between L2-normalised features
    and means. Stored per class: mean and precision ([C, d, d]); nothing is trained."""

    beta, gamma = 0.5, 1.0

    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
        super().__init__(dim, cfg, backbone=backbone, mode=mode)
        self.state = {"means": torch.empty(0, dim), "precisions": torch.empty(0, dim, dim)}

    @torch.no_grad()
    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        m = data.train_task == t
        x, y = tukey(data.train_x[m].double(), self.beta), data.train_y[m]
        means, precs = [], []
        for c in classes:
            xc = x[y == c]
            cov = torch.cov(xc.T) if len(xc) > 1 else torch.zeros(self.dim, self.dim, dtype=x.dtype)
            cov = shrink(cov, self.gamma, self.gamma)
            sd = cov.diagonal().clamp_min(1e-12).sqrt()
            cov = cov / (sd[:, None] * sd[None, :])  # FeCAM's normalize_cov
            means.append(F.normalize(xc.mean(0), dim=0))
            precs.append(torch.cholesky_inverse(torch.linalg.cholesky(cov)))  # shrunk: positive definite
        self.state = {"means": torch.cat([self.state["means"], torch.stack(means).float()]),
                      "precisions": torch.cat([self.state["precisions"], torch.stack(precs).float()])}

    @torch.no_grad()
    def logits(self, data, idx) -> torch.Tensor:
        x = F.normalize(tukey(data.test_x[idx].float(), self.beta), dim=1)
        out = []
        for mu, p in zip(self.state["means"], self.state["precisions"]):
            diff = x - mu  # [n, d]
            out.append(((diff @ p) * diff).sum(1))
        return -torch.stack(out, 1)[None]


@register("ranpac", trains=False, headline=2)
class RanPAC(_Stored):
    """RanPAC (McDonnell et al., NeurIPS 2023, Sec. 4; their public code ``RanPAC.py``) on frozen
    features, without its first-session adaptation: ``h = ReLU(x W)`` with a frozen Gaussian
    ``W [d, M]``, running ``G = Σ h hᵀ`` and ``Q = Σ h yᵀ`` (one-hot), read-out
    ``W_o = (G + λ I)⁻¹ Q``. λ per stage, as their code: from 10⁻⁸..10¹³, the one with the least
    MSE when the stage's training data is split 80 / 20 (here after a seeded shuffle, because our
    training rows are ordered by class). ``M`` = 2,000 here (ours; the paper's 10,000 costs minutes
    of CPU per stage) — set ``RanPAC.projection``.

    The classifier is :class:`lab.tosca.ridge.RidgeRouter`, the implementation the ``ridge`` router
    uses, with RanPAC's choices: raw (not L2-normalised) features and λ ``"auto"``."""

    projection = 2000

    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
        super().__init__(dim, cfg, backbone=backbone, mode=mode)
        self.ridge = RidgeRouter(dim, self.projection, seed=cfg.seed, lam="auto", normalize=False)
        self.Wo = torch.zeros(self.projection, 0)  # the solved read-out, float32

    @property
    def state(self) -> dict:
        """What a stage saves: the ridge's W, G, Q, λ and counts, and the solved ``Wo``."""
        return {**self.ridge.state_dict(), "Wo": self.Wo}

    @state.setter
    def state(self, tensors: dict) -> None:
        self.ridge.load_state_dict(tensors)
        self.Wo = tensors["Wo"].float()

    @torch.no_grad()
    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        m = data.train_task == t
        self.ridge.update(data.train_x[m], data.train_y[m], num_classes=classes[-1] + 1)  # λ chosen here
        self.Wo = self.ridge.solve().float()

    @torch.no_grad()
    def logits(self, data, idx) -> torch.Tensor:
        return (self.ridge.features(data.test_x[idx]).float() @ self.Wo)[None]
