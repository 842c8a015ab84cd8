"""Every method of the class-incremental harness behind one contract, in one registry.

Every entry is a class built the same way, ``cls(dim, cfg, *, backbone=None, mode="cached")``,
and declares its capabilities as registry info (not by name):

* ``routed``         answers with one logit set per task module (TOSCA), to be routed by
                     :mod:`lab.tosca.routing`; otherwise with a single model (routing 'single')
* ``needs_backbone`` needs the raw images and the frozen backbone (not only cached features)
* ``trains``         runs gradient steps (a learning rate and epochs matter)

The instance implements (:class:`Method` holds the defaults)::

    learn_task(t, classes, data, on_epoch)  # stage t
    logits(data, idx) -> [M, n, C]          # test samples idx; M = task modules (routed) or 1
    route_context(data, idx) -> RouteContext | None   # what routers may use (routed only)
    task_tensors(t) / restore_task(t, tensors, classes, data)   # save / resume one stage
    trainable_parameters(t) -> int          # trained during stage t
    head_scale() -> float | None            # the cosine head's σ, where there is one

:func:`fit` is the one loop over a scenario's tasks (the run harness adds evaluation and resume).
"""
from __future__ import annotations

import torch

from lab.tosca.learner import Tosca, ToscaConfig
from lab.tosca.ridge import LAMBDA, PROJ_DIM, RidgeRouter

from . import baselines as _baselines  # noqa: F401  (registers the baselines)
from . import layerwise as _layerwise  # noqa: F401  (registers the layer-wise adapter)
from ._base import METHODS, MODES, Method, ScenarioData, register  # noqa: F401  (the contract)
from .augment import AugmentedFeatures

@register("tosca", role="method", routed=True, luca=True, cosine_head=True, augments=True)
class ToscaMethod(Method):
    """TOSCA (lab.tosca.learner): one LuCA per task, routed at test time.

    The ``ridge`` router's statistics are built here, not in the learner: from the cached
    (un-augmented) frozen training features of every learned task, on the first evaluation that
    asks for them, then one task per stage — so runs without that router pay nothing, training
    times stay TOSCA's own, and a resumed run rebuilds them (the same updates in the same order,
    the same numbers) instead of saving a [D, D] Gram matrix with every task."""

    ridge_dim = PROJ_DIM  # the ridge router's projection dimension (PRISM's: 15,000)
    ridge_lambda = LAMBDA  # the ridge router's λ (PRISM's)

    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
        super().__init__(dim, cfg, backbone=backbone, mode=mode)
        if mode == "augment" and backbone is None:
            raise ValueError("augment mode needs the backbone")
        self.model = Tosca(dim, cfg, ridge_dim=0)
        self._ridge: RidgeRouter | None = None

    def learn_task(self, t, classes, data: ScenarioData, on_epoch=None) -> None:
        m = data.train_task == t
        batch_features = None
        if self.mode == "augment":  # the backbone runs on augmented images every epoch (the reference's setting)
            images = data.images("train")[m.numpy()]
            batch_features = AugmentedFeatures(self.backbone, images, seed=self.cfg.seed + 1000 + t,
                                               device=self.cfg.device)
        self.model.learn_task(classes, data.train_x[m], data.train_y[m], batch_features=batch_features,
                              on_epoch=on_epoch)

    def logits(self, data: ScenarioData, idx) -> torch.Tensor:
        return self.model.all_logits(data.test_x[idx]).cpu()

    def route_context(self, data: ScenarioData, idx):
        ctx = self.model.route_context(data.test_x[idx])
        ctx.ridge = lambda: self.ridge(data)  # built only when a ridge router asks
        return ctx

    def ridge(self, data: ScenarioData) -> RidgeRouter:
        """The global ridge over every task learned so far (brought up to date from ``data``)."""
        if self._ridge is None:
            self._ridge = RidgeRouter(self.dim, self.ridge_dim, seed=self.cfg.seed, lam=self.ridge_lambda)
        while self._ridge.updates < self.model.num_tasks:
            t = self._ridge.updates
            m = data.train_task == t
            self._ridge.update(data.train_x[m], data.train_y[m], num_classes=self.model.task_classes[t][-1] + 1)
        return self._ridge

    def task_tensors(self, t) -> dict:
        return self.model.task_tensors(t)

    def restore_task(self, t, tensors, classes, data) -> None:
        self.model.restore_task(tensors, classes)

    def trainable_parameters(self, t) -> int:
        return self.model.trainable_parameters(t)

    def head_scale(self) -> float | None:
        return self.model.head.scale


def _place(name: str) -> tuple:
    """Where a method is listed: built-ins first; the method under study, then the baselines that train
    nothing, those that train on cached features, those that run the backbone; registration order last."""
    if METHODS.source(name) != "built-in":
        return (1,)
    info = METHODS.info(name)
    return (0, info["role"] != "method", info["trains"], info["needs_backbone"])


def list_methods() -> list[str]:
    """Every registered method: TOSCA, the baselines, then any added later (in registration order)."""
    names = METHODS.names()
    return sorted(names, key=lambda n: (_place(n), names.index(n)))


def create(name: str, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
    """Build a method by name (every entry the same way); unknown names list the valid ones."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if METHODS.info(name)["needs_backbone"] and backbone is None:
        raise ValueError(f"method {name!r} needs the backbone")
    return METHODS.create(name, dim=dim, cfg=cfg, backbone=backbone, mode=mode)


def fit(method, data: ScenarioData, on_epoch=None):
    """Learn every task of ``data`` in order; returns the method."""
    for t, classes in enumerate(data.task_classes):
        method.learn_task(t, classes, data, on_epoch=on_epoch)
    return method

