"""The TOSCA learner (docs/tosca.md, "Training, per task t"), read top to bottom.

Per task t: a fresh LuCA (re-initialised as the reference) and the shared cosine head, grown by the
task's classes, are trained together with ``CE(head(LuCA(x)), y) + l1·Σ|p|`` (p: every LuCA
parameter, LayerNorm included) by SGD(momentum .9, lr .025, cosine to 1e-8 per epoch, wd 0), 20
epochs, batch 48. The loss covers every class seen so far and every head row is trainable, as the
reference. The step is the plain one: :func:`tosca_loss`, ``loss.backward()``, the optimizer's
step (:class:`PlainStep`); faster engines that compute the same update are opt-in
(``ToscaConfig(engine=...)``, lab/tosca/engines/). Afterwards the rows of task t's classes are overwritten by class-mean prototypes of the
LuCA-adapted, un-augmented training features; the LuCA is frozen and kept.

Training reads features through ``batch_features(idx) -> [B, d]``: in the default ``cached`` mode
that is a row lookup in a feature tensor (no backbone pass at all); ``augment`` mode (the
reference's setting) passes a callable that runs the frozen backbone on augmented images.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lab._alloc import tune_allocator

from .head import CosineHead, check_scale_param, class_means
from ._optim import add_l1_grad, cosine_lr, sgd_step  # noqa: F401  (re-exported)
from .engines import ACCELERATORS, EPOCH_ENGINES
from .luca import LuCA, check_flow
from .ridge import PROJ_DIM, RidgeRouter


ENGINES = ("autograd", *ACCELERATORS)  # the plain step, then the opt-in accelerators (lab/tosca/engines/)
HEAD_INITS = ("reference", "uniform")
LUCA_INITS = ("reference", "xavier")


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN/inf; the message names the task and epoch."""


@dataclass(frozen=True)
class ToscaConfig:
    """The reference's hyper-parameters. Anything not in the reference is marked 'ours'."""

    epochs: int = 20
    batch_size: int = 48
    lr: float = 0.025
    momentum: float = 0.9
    weight_decay: float = 0.0
    eta_min: float = 1e-8
    l1: float = 5e-4
    ratio: int = 16  # bottleneck r = d // ratio
    flow: str = "tosca"
    seed: int = 1993
    head_scale: float = 1.0  # initial σ of the cosine head (learned)
    # ours: 'positive' keeps σ > 0 (σ = softplus(s)); 'free' learns σ unconstrained, as the reference,
    # where it can cross zero and flip every logit (lab/tosca/head.py)
    head_scale_param: str = "positive"
    device: str = "cpu"  # ours: where the modules train ('cuda' for the GPU path)
    # ours: CPU intra-op threads while training (0 = leave torch's setting). At batch 48 each op is
    # too small to split, and on a busy machine OpenMP spin-waits dominate: measured 7 ms/step with
    # 1 thread vs 144 ms with 2 on the shared 2-core box (load ~6).
    threads: int = 1
    # 'autograd': the plain step below (loss.backward(), torch.optim.SGD). Opt-in accelerators of the
    # same update (lab/tosca/engines/): 'eager' (hand-written backward on flat buffers), 'fused' (its
    # element-wise work in C kernels; the 'tosca' flow on the CPU, else 'eager' with a note), 'compile'
    # (torch.compile of the loss), 'static' (fixed-shape buffers) and 'cuda_graph' (needs cuda). The
    # log's 'engine' says which ran.
    engine: str = "autograd"
    # how the head grows: 'reference' = the first task's rows uniform(±1/√d), every later task's rows
    # ZERO (PILOT's SimpleVitNet.update_fc); 'uniform' = uniform rows for every task (this library before)
    head_init: str = "reference"
    # LuCA's initialisation: 'reference' = task 0 from nn.Linear's default init (the reference calls
    # reset_tosca, Xavier, only in after_task), Xavier for later tasks; 'xavier' = Xavier for every task
    luca_init: str = "reference"

    def __post_init__(self):
        check_flow(self.flow)
        if self.head_init not in HEAD_INITS:
            raise ValueError(f"unknown head_init {self.head_init!r}; valid: {', '.join(HEAD_INITS)}")
        if self.luca_init not in LUCA_INITS:
            raise ValueError(f"unknown luca_init {self.luca_init!r}; valid: {', '.join(LUCA_INITS)}")
        if self.epochs < 1 or self.batch_size < 1 or self.ratio < 1:
            raise ValueError(f"epochs, batch_size and ratio must be >= 1 (got {self.epochs}, {self.batch_size}, {self.ratio})")
        for name in ("lr", "l1", "weight_decay", "eta_min", "momentum"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (got {v!r})")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; valid engines: {', '.join(ENGINES)}")
        if self.engine == "cuda_graph" and not str(self.device).startswith("cuda"):
            raise ValueError("engine 'cuda_graph' needs device='cuda'")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (got {self.threads})")
        if self.head_scale <= 0:
            raise ValueError(f"head_scale must be > 0 (got {self.head_scale})")
        check_scale_param(self.head_scale_param)

    def to_dict(self) -> dict:
        return asdict(self)


def tosca_loss(luca: LuCA, head: CosineHead, x: torch.Tensor, y: torch.Tensor, l1: float):
    """``(ce, loss)`` for a batch of features ``x [B, d]`` and labels ``y [B]``:
    ``ce = CE(head(LuCA(x)), y)`` over every class seen so far, ``loss = ce + l1·Σ|p_luca|``."""
    ce = F.cross_entropy(head(luca(x)), y)  # logits [B, C]
    return ce, ce + l1 * luca.l1()


class PlainStep:
    """One task's step ``step(x, y, lr) -> CE``: the loss, ``loss.backward()``, then
    ``torch.optim.SGD`` (momentum, no dampening; the L1 term's gradient is l1·sign(p), as autograd
    differentiates |p|) over the LuCA and every head row. ``loss``: the loss function (the
    'compile' engine passes :func:`tosca_loss` compiled)."""

    loss = staticmethod(tosca_loss)

    def __init__(self, luca: LuCA, head: CosineHead, cfg: ToscaConfig, *, loss=None):
        self.luca, self.head, self.l1 = luca, head, cfg.l1
        if loss is not None:
            self.loss = loss
        self.opt = torch.optim.SGD([*luca.parameters(), *head.parameters()], lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
        for group in self.opt.param_groups:
            group["lr"] = lr  # the epoch's cosine rate (cosine_lr)
        ce, loss = self.loss(self.luca, self.head, x, y, self.l1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return ce.detach()

    def close(self) -> None:
        """Nothing to release (the accelerators' steps re-seat parameters and give them back here)."""


@contextlib.contextmanager
def cpu_threads(n: int):
    """Temporarily set torch's intra-op threads (no-op for n == 0)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class Tosca(nn.Module):
    """Every task's LuCA plus the shared cosine head; ``learn_task`` adds one task.

    ``ridge_dim``: the projection dimension of the global ridge the ``ridge`` router uses
    (:class:`~lab.tosca.ridge.RidgeRouter`, seeded from ``config.seed``), accumulated from the
    frozen training features of every task; 0 collects none (the harness builds its own, from its
    cached features, only when a ridge router asks: lab/experiments/tosca/methods.py)."""

    def __init__(self, dim: int, config: ToscaConfig = ToscaConfig(), *, ridge_dim: int = PROJ_DIM):
        super().__init__()
        self.dim, self.config = dim, config
        self.luca = nn.ModuleList()  # one frozen LuCA per finished task
        self.head = CosineHead(dim, scale=config.head_scale, param=config.head_scale_param)
        self.task_classes: list[list[int]] = []
        self.log: list[dict] = []  # one row per (task, epoch): loss, lr, head scale
        self.engine_ran = config.engine  # the engine the last task trained with ('fused' may fall back to 'eager')
        # what routers may use (lab.tosca.routing.RouteContext): per-class means of the frozen
        # training features and their pooled within-class scatter, float64 on the CPU
        self.class_means = torch.empty(0, dim, dtype=torch.float64)  # [C, d]
        self.scatter = torch.zeros(dim, dim, dtype=torch.float64)  # [d, d]
        self.scatter_count = 0
        # the ridge router's statistics (G, Q of random ReLU features; not saved with the tasks)
        self.ridge = RidgeRouter(dim, ridge_dim, seed=config.seed) if ridge_dim else None
        self.to(config.device)

    @property
    def num_tasks(self) -> int:
        return len(self.luca)

    def learn_task(self, classes, x: torch.Tensor, y: torch.Tensor, *,
                   batch_features: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   on_epoch: Callable[[dict], None] | None = None) -> LuCA:
        """Train task ``len(self.luca)`` on its training set: ``x [n, d]`` un-augmented features,
        ``y [n]`` labels in incremental label space. Returns the new (frozen) LuCA."""
        cfg, t, dev = self.config, self.num_tasks, self.config.device
        classes = [int(c) for c in classes]
        if classes != list(range(self.head.num_classes, self.head.num_classes + len(classes))):
            raise ValueError(f"task {t}: classes must continue the label space at {self.head.num_classes}, got {classes}")
        x, y = x.to(dev, torch.float32), y.to(dev)
        cached = batch_features is None  # augment mode keeps torch's threads for the backbone
        batch_features = batch_features or (lambda idx: x[idx])
        tune_allocator()  # each step's ~0.4 MB gradients reuse heap pages, not fresh mmaps (lab/_alloc.py)
        with cpu_threads(cfg.threads if dev == "cpu" and cached else 0):
            return self._learn_task(t, classes, x, y, batch_features, on_epoch)

    def _learn_task(self, t, classes, x, y, batch_features, on_epoch) -> LuCA:
        cfg, dev = self.config, self.config.device
        gen = torch.Generator().manual_seed(cfg.seed + t)  # per task: a resumed run draws the same numbers

        luca = LuCA(self.dim, ratio=cfg.ratio, flow=cfg.flow)
        default = cfg.luca_init == "reference" and t == 0  # the reference resets (Xavier) only after task 0
        luca.reset_parameters(generator=gen, init="default" if default else "xavier")  # drawn on the CPU
        luca.to(dev)
        zeros = cfg.head_init == "reference" and self.head.num_classes > 0  # as SimpleVitNet.update_fc
        self.head.grow(len(classes), generator=gen, init="zeros" if zeros else "uniform")
        self._add_feature_stats(x, y, classes)
        if cfg.engine in EPOCH_ENGINES:  # the same maths on static buffers, optionally one CUDA graph per epoch
            from .engines import static_epochs

            epochs = static_epochs(luca, self.head, x, y, cfg, gen, batch_features=batch_features)
        else:
            epochs = self._epochs(luca, x, y, batch_features, gen)
        for epoch, lr, ce_mean in epochs:
            with torch.no_grad():
                l1_mass = float(luca.l1())
            if not (math.isfinite(ce_mean) and math.isfinite(l1_mass)):
                raise NonFiniteLoss(f"TOSCA loss became non-finite (ce {ce_mean}, Σ|p| {l1_mass}) in task {t}, "
                                    f"epoch {epoch} (lr {lr:.3g}, l1 {cfg.l1})")
            row = {"task": t, "epoch": epoch, "ce": ce_mean, "l1_mass": l1_mass, "loss": ce_mean + cfg.l1 * l1_mass,
                   "lr": lr, "head_scale": self.head.scale, "engine": self.engine_ran}
            self.log.append(row)
            if on_epoch:
                on_epoch(row)

        luca.eval().requires_grad_(False)
        with torch.no_grad():  # prototypes of the adapted, un-augmented features replace the trained rows
            self.head.set_rows(classes, class_means(luca(x), y, classes))
        self.luca.append(luca)
        self.task_classes.append(classes)
        return luca

    @torch.no_grad()
    def _add_feature_stats(self, x, y, classes) -> None:
        """Class means and within-class scatter of the frozen features ``x [n, d]`` (for routers),
        and the ridge's Gram statistics."""
        if self.ridge is not None:
            self.ridge.update(x, y, num_classes=classes[-1] + 1)
        x, y = x.detach().double().cpu(), y.cpu()
        means = class_means(x, y, classes)  # [K, d]
        centred = x - means[y - classes[0]]
        self.class_means = torch.cat([self.class_means, means])
        self.scatter += centred.T @ centred
        self.scatter_count += len(y)

    def route_context(self, x: torch.Tensor):
        """A :class:`~lab.tosca.routing.RouteContext` for test features ``x [N, d]``."""
        from .routing import RouteContext

        task_of_class = torch.tensor([t for t, cs in enumerate(self.task_classes) for _ in cs])
        return RouteContext(features=x.detach().cpu().float(), class_means=self.class_means, scatter=self.scatter,
                            scatter_count=self.scatter_count, task_of_class=task_of_class, ridge=self.ridge)

    def _step(self, luca):
        """The configured engine's step: :class:`PlainStep` by default, else an accelerator's
        (lab/tosca/engines/); ``self.engine_ran`` says which ran."""
        if self.config.engine == "autograd":
            self.engine_ran = "autograd"
            return PlainStep(luca, self.head, self.config)
        from .engines import step_for

        step, self.engine_ran = step_for(self.config.engine, luca, self.head, self.config, PlainStep)
        return step

    def _epochs(self, luca, x, y, batch_features, gen):
        """The training loop; yields (epoch, lr, mean CE) after each epoch: per epoch the cosine
        rate, a fresh permutation, one step per batch."""
        cfg, dev = self.config, self.config.device
        step = self._step(luca)
        try:
            for epoch in range(cfg.epochs):
                lr = cosine_lr(cfg, epoch)
                ce_sum = torch.zeros((), device=dev)
                perm = torch.randperm(len(y), generator=gen).to(dev)
                for idx in perm.split(cfg.batch_size):  # batches of indices [B]
                    ce_sum += step(batch_features(idx), y[idx], lr) * len(idx)
                yield epoch, lr, float(ce_sum) / len(y)
        finally:
            step.close()

    @torch.no_grad()
    def all_logits(self, x: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        """Logits of every task module on the same backbone features: ``[T, N, C]``."""
        x = x.to(self.config.device, torch.float32)
        out = [torch.cat([self.head(m(xc)) for xc in x.split(chunk)]) for m in self.luca]
        return torch.stack(out)

    # -- persistence: one file per task (module + head at the end of that task) --------------------
    def task_tensors(self, t: int) -> dict[str, torch.Tensor]:
        out = {f"luca.{k}": v for k, v in self.luca[t].state_dict().items()}
        first = sum(len(c) for c in self.task_classes[:t])
        out["stats.class_means"] = self.class_means[first:first + len(self.task_classes[t])]
        if t == self.num_tasks - 1:  # the scatter so far (a running sum, like the head)
            out.update({"stats.scatter": self.scatter, "stats.count": torch.tensor([self.scatter_count])})
            out.update({"head.weight": self.head.weight.detach(), "head.sigma": self.head.sigma_value().detach()})
        return out

    def restore_task(self, tensors: dict[str, torch.Tensor], classes) -> None:
        """Append a saved task (its LuCA; and the head, when the file carries it). The ridge's
        statistics are not saved (G is [D, D]: 32 MB at D = 2,000 per file), so a restored model has
        none: the ``ridge`` router then says so (the harness rebuilds them from its features)."""
        self.ridge = None
        luca = LuCA(self.dim, ratio=self.config.ratio, flow=self.config.flow).to(self.config.device)
        luca.load_state_dict({k[5:]: v for k, v in tensors.items() if k.startswith("luca.")})
        self.luca.append(luca.eval().requires_grad_(False))
        self.task_classes.append([int(c) for c in classes])
        if "stats.class_means" in tensors:  # runs saved before the router statistics lack them
            self.class_means = torch.cat([self.class_means, tensors["stats.class_means"].double()])
        if "stats.scatter" in tensors:
            self.scatter = tensors["stats.scatter"].double().clone()
            self.scatter_count = int(tensors["stats.count"][0])
        if "head.weight" in tensors:
            dev = self.config.device
            self.head.weight = nn.Parameter(tensors["head.weight"].to(dev).clone())
            self.head.set_scale(tensors["head.sigma"])  # σ itself is saved, whatever the parametrisation

    def trainable_parameters(self, t: int) -> int:
        """Parameters trained in task t: its LuCA plus the head as it stood (all rows trainable)."""
        seen = sum(len(c) for c in self.task_classes[: t + 1])
        return self.luca[t].num_parameters() + seen * self.dim + 1
