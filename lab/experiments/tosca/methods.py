"""Every method of the class-incremental harness behind one small interface, in one registry.

A method sees the scenario through :class:`ScenarioData` and implements

    learn_task(t, classes, data, on_epoch)  # stage t
    logits(data, idx) -> [M, n, C]          # test samples idx; M = task modules (TOSCA) or 1
    task_tensors(t) / restore_task(t, tensors, classes, data)   # save / resume one stage
    trainable_parameters(t) -> int          # trained during stage t

TOSCA answers with one logit set per task module and is routed (``lab.tosca.routing``); the
baselines answer with a single model (routing 'single').
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lab._registry import Registry

from .augment import AugmentedFeatures
from .baselines import FineTune, Joint, SimpleCIL
from .layerwise import LayerwiseAdapter
from lab.tosca.learner import Tosca, ToscaConfig

METHODS = Registry("method")
MODES = ("cached", "augment")


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


@METHODS.register("tosca", routed=True, needs_backbone=False)
class ToscaMethod:
    name = "tosca"

    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, augment: bool = False):
        if augment and backbone is None:
            raise ValueError("augment mode needs the backbone")
        self.model, self.cfg, self.backbone, self.augment = Tosca(dim, cfg), cfg, backbone, augment

    def learn_task(self, t, classes, data: ScenarioData, on_epoch=None) -> None:
        m = data.train_task == t
        batch_features = None
        if self.augment:  # the backbone runs on augmented images every epoch (the reference's setting)
            images = data.images("train")[m.numpy()]
            batch_features = AugmentedFeatures(self.backbone, images, seed=self.cfg.seed + 1000 + t,
                                               device=self.cfg.device)
        self.model.learn_task(classes, data.train_x[m], data.train_y[m], batch_features=batch_features,
                              on_epoch=on_epoch)

    def logits(self, data: ScenarioData, idx) -> torch.Tensor:
        return self.model.all_logits(data.test_x[idx]).cpu()

    def task_tensors(self, t) -> dict:
        return self.model.task_tensors(t)

    def restore_task(self, t, tensors, classes, data) -> None:
        self.model.restore_task(tensors, classes)

    def trainable_parameters(self, t) -> int:
        return self.model.trainable_parameters(t)


METHODS.register("simplecil", routed=False, needs_backbone=False)(SimpleCIL)
METHODS.register("finetune", routed=False, needs_backbone=False)(FineTune)
METHODS.register("joint", routed=False, needs_backbone=False)(Joint)
METHODS.register("layerwise_adapter", routed=False, needs_backbone=True)(LayerwiseAdapter)


def list_methods() -> list[str]:
    return METHODS.names()


def create(name: str, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached"):
    """Build a method by name; unknown names list the valid ones."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    METHODS.check(name)
    if name == "tosca":
        return ToscaMethod(dim, cfg, backbone=backbone, augment=mode == "augment")
    if name == "layerwise_adapter":
        return LayerwiseAdapter(dim, cfg, backbone, augment=mode == "augment")
    return METHODS.create(name, dim=dim, cfg=cfg)
