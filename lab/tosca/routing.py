"""Inference for TOSCA: one backbone feature per image, every task module on it, a router picks one.

(docs/tosca.md, "Inference: entropy routing".) For module i, ``logits_i = head(LuCA_i(f))`` over
every class seen so far. A *router* is one registry entry with one contract::

    router(logits [T, N, C], ctx: RouteContext) -> module index per sample [N]

``ctx`` carries what a rule may look at besides the logits: the frozen test features, what the
learner stored about the frozen training features (class means and a pooled within-class
scatter), and — for the reference's per-batch protocol and the oracle only — the labels / task ids.

* ``per-sample`` (default, honest): each image picks the module with the lowest softmax entropy
  (the reference's rule, one choice per image).
* ``per-batch`` (the reference protocol): the entropy is averaged over a batch and ONE module answers
  for the whole batch. The reference's test loader is ordered class by class and not shuffled, so
  a batch is nearly one class and the choice leaks the task grouping. We reproduce that order
  (stable sort by label) and batch size (48), and record both with every result.
* ``oracle``: the module of the sample's true task (an upper bound, not a method).
* ``max-softmax``: the module whose largest softmax probability is highest (Hendrycks & Gimpel 2017).
* ``energy``: the module with the largest log-sum-exp of its logits (Liu et al. 2020, energy score).
* ``ncm``: the task of the nearest class mean of the frozen features (cosine, as SimpleCIL).
* ``mahalanobis``: the task of the class mean nearest in Mahalanobis distance under ONE shared
  within-class covariance of the frozen features, shrunk as FeCAM (Goswami et al. 2023).
* ``entropy-ncm`` (ours): entropy where it is confident — the winner's entropy below half of
  log C — and ``ncm`` elsewhere.
* ``ridge``: the task of the top-1 class of a global ridge classifier on random ReLU features of
  the frozen features (:class:`lab.tosca.ridge.RidgeRouter`; RanPAC's read-out): a RanPAC-style
  global ridge router from a follow-up method (PRISM) developed in the repository that first
  published TOSCA's code. The TOSCA paper's own routing is entropy (``per-sample`` / ``per-batch``).

Routing accuracy: the fraction of samples routed to their own task's module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lab import plugins
from lab._registry import Registry

ROUTERS = Registry("routing", group="continual_lab.routers", contract=plugins.check_router)
PER_BATCH_ORDER = "class-ordered (stable sort by incremental label, as the reference's test loader)"


@dataclass
class RouteContext:
    """What a router may use besides the logits. Tensors on the CPU."""

    features: torch.Tensor | None = None  # [N, d] frozen test features
    class_means: torch.Tensor | None = None  # [C, d] frozen training features, per class (the learner's)
    scatter: torch.Tensor | None = None  # [d, d] pooled within-class scatter Σ (x - μ_y)(x - μ_y)ᵀ
    scatter_count: int = 0  # samples behind ``scatter``
    task_of_class: torch.Tensor | None = None  # [C] task index of each class
    task_ids: torch.Tensor | None = None  # [N] true task (oracle; routing accuracy)
    labels: torch.Tensor | None = None  # [N] (per-batch: the reference's class-ordered test order)
    batch_size: int = 48  # per-batch protocol
    # the fitted global ridge (lab.tosca.ridge.RidgeRouter) over every class seen so far, or a
    # zero-argument callable that builds it on first use (the harness: only a ridge router pays)
    ridge: object | None = None

    def need(self, router: str, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise MissingContext(f"routing {router!r} needs {', '.join(missing)} in its RouteContext")


class MissingContext(ValueError):
    """A router was given a RouteContext without something it needs (:meth:`RouteContext.need`)."""


def register(name: str, **info):
    """Register a router ``fn(logits [T, N, C], ctx) -> [N]``; ``info``: its protocol."""
    return ROUTERS.register(name, protocol=info.pop("protocol", "per-sample"), **info)


def list_routings() -> list[str]:
    return ROUTERS.names()


ROUTINGS = ("per-sample", "per-batch", "oracle")  # what every TOSCA run reports unless told otherwise


def check_routing(name: str) -> str:
    """``name`` if it is a registered routing; a router that is not a built-in is also tried once
    on a small batch (:func:`probe`), so that a bad one fails before any training, naming it."""
    if name not in ROUTERS:
        raise ValueError(f"unknown routing {name!r}; valid routings: {', '.join(ROUTERS.names())}")
    if ROUTERS.source(name) != "built-in":
        probe(name)
    return name


def _who(name: str) -> str:
    src = ROUTERS.source(name)
    return f"routing {name!r}" + ("" if src == "built-in" else f" (registered by {src})")


def check_choice(choice, logits: torch.Tensor, name: str) -> torch.Tensor:
    """A router's answer must be a module index per sample: an integer tensor ``[N]`` with every
    value in ``0..T-1`` (a -1 would silently pick the last module, a float would fail after training)."""
    T, N = logits.shape[0], logits.shape[1]
    if not torch.is_tensor(choice):
        raise ValueError(f"{_who(name)} returned {type(choice).__name__}, not a tensor of module indices [{N}]")
    if tuple(choice.shape) != (N,):
        raise ValueError(f"{_who(name)} returned shape {tuple(choice.shape)}, expected ({N},): one module per sample")
    if choice.dtype == torch.bool or choice.dtype.is_floating_point or choice.dtype.is_complex:
        raise ValueError(f"{_who(name)} returned {choice.dtype} values; module indices must be integers")
    if N:
        lo, hi = int(choice.min()), int(choice.max())
        if lo < 0 or hi >= T:
            raise ValueError(f"{_who(name)} returned module index {lo if lo < 0 else hi}; the {T} modules are "
                             f"0..{T - 1}")
    return choice


_probed: dict[tuple[str, int], None] = {}


def probe(name: str) -> None:
    """Run router ``name`` once on a small made-up batch (3 modules, 6 samples, 6 classes, every
    field of the RouteContext filled) and check its answer (:func:`check_choice`): milliseconds,
    once per router and process. A router that raises fails here too, named; one that needs
    something the made-up context lacks (:class:`MissingContext`) is left to the real run."""
    fn = ROUTERS.get(name)
    if (name, id(fn)) in _probed:
        return
    from .ridge import RidgeRouter

    gen = torch.Generator().manual_seed(0)
    T, N, C, d = 3, 6, 6, 8
    task_of_class = torch.arange(C) // 2                              # [C] two classes per module
    labels = torch.arange(N) % C                                      # [N]
    features = torch.randn(N, d, generator=gen)                       # [N, d]
    ridge = RidgeRouter(d, 16, seed=0)
    ridge.update(torch.randn(2 * C, d, generator=gen), torch.arange(2 * C) % C)
    ctx = RouteContext(features=features, class_means=torch.randn(C, d, generator=gen), scatter=torch.eye(d),
                       scatter_count=2 * C, task_of_class=task_of_class, task_ids=task_of_class[labels],
                       labels=labels, batch_size=2, ridge=ridge)
    logits = torch.randn(T, N, C, generator=gen)                      # [T, N, C]
    try:
        choice = ROUTERS.create(name, logits=logits, ctx=ctx)
    except MissingContext:
        return
    except Exception as exc:
        raise ValueError(f"{_who(name)} failed on a test batch before training: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())}") from None
    try:
        check_choice(choice, logits, name)
    except ValueError as exc:
        raise ValueError(f"{exc} (on a test batch of {N} samples, {T} modules, before training)") from None
    _probed[(name, id(fn))] = None


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Softmax entropy over the last axis (nats): ``[..., C] -> [...]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _class_ordered_batches(cost: torch.Tensor, ctx: RouteContext, name: str) -> torch.Tensor:
    """ONE module per batch of the reference's class-ordered test order: lowest mean cost [T, N]."""
    ctx.need(name, "labels")
    if ctx.batch_size < 1:
        raise ValueError(f"per-batch routing needs batch_size >= 1 (got {ctx.batch_size})")
    order = torch.sort(ctx.labels.to(cost.device), stable=True).indices
    choice = torch.empty(cost.shape[1], dtype=torch.long, device=cost.device)
    for idx in order.split(ctx.batch_size):
        choice[idx] = cost[:, idx].mean(1).argmin()
    return choice


@register("per-sample", rule="entropy")
def _entropy_per_sample(logits, ctx):
    return entropy(logits).argmin(0)


@register("per-batch", rule="entropy", protocol="per-batch")
def _entropy_per_batch(logits, ctx):
    return _class_ordered_batches(entropy(logits), ctx, "per-batch")


@register("oracle", rule="true task", protocol="oracle")
def _oracle(logits, ctx):
    ctx.need("oracle", "task_ids")
    return ctx.task_ids.to(logits.device).long()


@register("max-softmax", rule="max softmax probability")
def _max_softmax(logits, ctx):
    return torch.softmax(logits.float(), -1).amax(-1).argmax(0)


@register("energy", rule="log-sum-exp")
def _energy(logits, ctx):
    return torch.logsumexp(logits.float(), -1).argmax(0)


def _nearest_class_task(dist: torch.Tensor, ctx: RouteContext) -> torch.Tensor:
    """dist ``[N, C]`` -> the task of the nearest class, restricted to the modules that exist."""
    return ctx.task_of_class[dist.argmin(1)].long()


@register("ncm", rule="nearest class mean (frozen features, cosine)")
def _ncm(logits, ctx):
    ctx.need("ncm", "features", "class_means", "task_of_class")
    f = torch.nn.functional.normalize(ctx.features.float(), dim=1)
    mu = torch.nn.functional.normalize(ctx.class_means.float(), dim=1)
    return _nearest_class_task(-(f @ mu.T), ctx).to(logits.device)


def shrink(cov: torch.Tensor, gamma1: float = 1.0, gamma2: float = 1.0) -> torch.Tensor:
    """FeCAM's covariance shrinkage (Goswami et al. 2023, eq. 6): ``Σ + γ1·V1·I + γ2·V2·(1 - I)``,
    V1 the mean variance (diagonal), V2 the mean off-diagonal covariance."""
    d = cov.shape[0]
    eye = torch.eye(d, dtype=cov.dtype)
    v1 = cov.diagonal().mean()
    v2 = (cov.sum() - cov.diagonal().sum()) / max(d * d - d, 1)
    return cov + gamma1 * v1 * eye + gamma2 * v2 * (1 - eye)


def mahalanobis(x: torch.Tensor, means: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """Squared Mahalanobis distances ``[N, C]`` of ``x [N, d]`` to ``means [C, d]`` under one
    precision matrix ``[d, d]``: x'Px - 2 x'Pμ + μ'Pμ."""
    xp = x @ precision
    mp = means @ precision
    return (xp * x).sum(1, keepdim=True) - 2 * xp @ means.T + (mp * means).sum(1)[None]


@register("mahalanobis", rule="shared-covariance Mahalanobis (frozen features, FeCAM shrinkage)")
def _mahalanobis(logits, ctx):
    ctx.need("mahalanobis", "features", "class_means", "scatter", "task_of_class")
    cov = ctx.scatter.double() / max(ctx.scatter_count - 1, 1)
    precision = torch.cholesky_inverse(torch.linalg.cholesky(shrink(cov)))  # shrunk: positive definite
    dist = mahalanobis(ctx.features.double(), ctx.class_means.double(), precision)
    return _nearest_class_task(dist, ctx).to(logits.device)


@register("entropy-ncm", rule="entropy where confident, else nearest class mean")
def _entropy_ncm(logits, ctx):
    ent = entropy(logits)  # [T, N]
    best, choice = ent.min(0)
    unsure = best > 0.5 * math.log(logits.shape[-1])
    return torch.where(unsure, _ncm(logits, ctx), choice)


@register("ridge", rule="top-1 class of a global ridge on random ReLU features (frozen features; RanPAC read-out)")
def _ridge(logits, ctx):
    ctx.need("ridge", "features", "ridge", "task_of_class")
    ridge = ctx.ridge() if callable(ctx.ridge) else ctx.ridge
    scores = ridge.predict(ctx.features)  # [N, C]
    if scores.shape[1] != len(ctx.task_of_class):
        raise ValueError(f"routing 'ridge': the ridge knows {scores.shape[1]} classes, the modules "
                         f"{len(ctx.task_of_class)}")
    return ctx.task_of_class[scores.argmax(1)].long().to(logits.device)


def predict(logits: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """Class predictions ``[N]`` from ``logits [T, N, C]`` and the chosen module per sample ``[N]``."""
    n = torch.arange(logits.shape[1], device=logits.device)
    return logits[choice.to(logits.device), n].argmax(-1)


def choose(logits: torch.Tensor, routing: str, ctx: RouteContext | None = None) -> torch.Tensor:
    """Module index per sample ``[N]`` under one registered routing."""
    choice = ROUTERS.create(check_routing(routing), logits=logits, ctx=ctx or RouteContext())
    return check_choice(choice, logits, routing)


@dataclass
class Routed:
    routing: str
    preds: torch.Tensor  # [N] predicted class
    choice: torch.Tensor  # [N] module used
    routing_accuracy: float  # fraction routed to their own task's module (NaN without task ids)
    batch_size: int | None = None  # per-batch only
    order: str | None = None  # per-batch only


def route(logits: torch.Tensor, routing: str, ctx: RouteContext | None = None, *,
          task_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
          batch_size: int | None = None) -> Routed:
    """Apply one routing to precomputed ``logits [T, N, C]`` (T learned modules)."""
    ctx = ctx or RouteContext()
    if task_ids is not None:
        ctx.task_ids = task_ids
    if labels is not None:
        ctx.labels = labels
    if batch_size is not None:
        ctx.batch_size = batch_size
    choice = choose(logits, routing, ctx)
    tid = ctx.task_ids
    racc = float((choice.cpu() == tid.cpu()).float().mean()) if tid is not None else float("nan")
    per_batch = ROUTERS.info(routing)["protocol"] == "per-batch"
    return Routed(routing, predict(logits, choice).cpu(), choice.cpu(), racc,
                  ctx.batch_size if per_batch else None, PER_BATCH_ORDER if per_batch else None)
