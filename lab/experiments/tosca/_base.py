"""The method contract of the harness: the scenario's data, the registry and the defaults.

Every entry of :data:`METHODS` is a class built the same way, ``cls(dim, cfg, *, backbone=None,
mode="cached")``, with its capabilities as registry info (:func:`register`: ``role``, ``routed``,
``needs_backbone``, ``trains``, ``luca``, ``cosine_head``, ``augments``, ``headline``); the harness
asks the info, never a method's name. The contract itself is described in
:mod:`lab.experiments.tosca.methods`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lab import plugins
from lab._registry import Registry
from lab.tosca.learner import ToscaConfig

METHODS = Registry("method", group="continual_lab.tosca_methods", contract=plugins.check_tosca_method)
MODES = ("cached", "augment")
ROLES = ("method", "baseline")


@dataclass
class ScenarioData:
    """Cached features and labels of a scenario (incremental label space), plus what augment mode
    and the layer-wise baseline need: the raw images and the frozen backbone."""

    train_x: torch.Tensor  # [N, d] float32, frozen-backbone features
    train_y: torch.Tensor  # [N] int64
    train_task: torch.Tensor  # [N] int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    test_task: torch.Tensor
    task_classes: list[list[int]]
    images: Callable[[str], np.ndarray] | None = None  # split -> uint8 images, same order as the labels
    backbone: object | None = None  # lab.backbones.Backbone

    @property
    def dim(self) -> int:
        return self.train_x.shape[1]

    @property
    def num_tasks(self) -> int:
        return len(self.task_classes)

    @classmethod
    def from_scenario(cls, scn, feats: dict, backbone=None) -> "ScenarioData":
        return cls(feats["train_x"].float(), feats["train_y"].long(), torch.from_numpy(scn.train_task_ids).long(),
                   feats["test_x"].float(), feats["test_y"].long(), torch.from_numpy(scn.test_task_ids).long(),
                   [list(t.classes) for t in scn.tasks], images=scn.images, backbone=backbone)


def register(name: str, *, role: str = "baseline", routed: bool = False, needs_backbone: bool = False,
             trains: bool = True, luca: bool = False, cosine_head: bool = False, augments: bool = False,
             headline: int | None = None):
    """Register a method class under ``name`` with its capabilities, which the harness reads instead
    of the name:

    - ``role``: ``"method"`` (the method under study, TOSCA: the study's ablations and routers vary it)
      or ``"baseline"`` (compared with it);
    - ``routed``: task modules chosen per test sample by a router (``--routing``);
    - ``needs_backbone``: it runs the frozen backbone itself (not only cached features);
    - ``trains``: it takes gradient steps (``--epochs``, ``--lr``, ...);
    - ``luca``: it has LuCA modules (``--l1``, ``--flow``, the initialisations, the engine, the ridge router);
    - ``cosine_head``: a trained cosine head with a scale (``--head-scale``);
    - ``augments``: ``--mode augment`` changes it (it trains on augmented images through the backbone);
    - ``headline``: its place among the baselines every router is compared with in the study's
      headline (1 first; None: not there).
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; valid roles: {', '.join(ROLES)}")
    return METHODS.register(name, role=role, routed=routed, needs_backbone=needs_backbone, trains=trains,
                            luca=luca, cosine_head=cosine_head, augments=augments, headline=headline)


class Method:
    """Defaults of the method contract; subclasses set what they have."""

    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
        self.dim, self.cfg, self.backbone, self.mode = dim, cfg, backbone, mode

    def route_context(self, data: ScenarioData, idx):
        return None

    def head_scale(self) -> float | None:
        return None

    def trainable_parameters(self, t) -> int:
        return 0


