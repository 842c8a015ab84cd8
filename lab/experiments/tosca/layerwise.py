"""Layer-wise adapter baseline (APER-adapter in PILOT; Zhou et al. 2024), the reference point for
TOSCA's parameter and time ratios (docs/tosca.md, "Baselines").

A bottleneck adapter sits in EVERY backbone block; the adapters (plus a cosine head) are trained on
the first task only and then frozen. Every class, first task included, is then represented by the
class-mean prototype of the concatenation [frozen feature, adapted feature] (APER's aggregation)
in a cosine classifier. Training needs the backbone in the loop, so it cannot use cached features.

Adapter placement (peft-style: the original layer is kept as ``base``, the adapter sits beside it):
* ViT (timm blocks with ``.mlp``): AdaptFormer's parallel adapter on each block's MLP,
  ``mlp(z) + 0.1 · up(ReLU(down(z)))``, bottleneck 64, down Kaiming-uniform, up and biases zero.
* EfficientNet (timm ``blocks`` = stages): a residual 1x1-conv adapter after each stage (ours: a
  CNN has no APER recipe), bottleneck min(64, C), same init.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from ._base import Method, register
from .augment import random_resized_crop_flip
from lab.tosca.head import CosineHead, class_means
from lab.tosca.learner import NonFiniteLoss, ToscaConfig, cosine_lr, sgd_step

BOTTLENECK, SCALE = 64, 0.1


class _Bottleneck(nn.Module):
    def __init__(self, dim: int, r: int, conv: bool):
        super().__init__()
        layer = (lambda i, o: nn.Conv2d(i, o, 1)) if conv else nn.Linear
        self.down, self.up = layer(dim, r), layer(r, dim)
        nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
        for p in (self.up.weight, self.down.bias, self.up.bias):
            nn.init.zeros_(p)

    def forward(self, x):
        return self.up(F.relu(self.down(x)))


class ParallelAdapterMLP(nn.Module):
    """``base(z) + scale · adapter(z)`` in place of a ViT block's MLP."""

    def __init__(self, base: nn.Module, dim: int, r: int = BOTTLENECK, scale: float = SCALE):
        super().__init__()
        self.base, self.adapter, self.scale = base, _Bottleneck(dim, r, conv=False), scale

    def forward(self, z):
        return self.base(z) + self.scale * self.adapter(z)


class StageAdapter(nn.Module):
    """``y = base(x); y + scale · adapter(y)`` after a CNN stage (1x1 convs)."""

    def __init__(self, base: nn.Module, channels: int, r: int = BOTTLENECK, scale: float = SCALE):
        super().__init__()
        self.base = base
        self.adapter, self.scale = _Bottleneck(channels, min(r, channels), conv=True), scale

    def forward(self, x):
        y = self.base(x)
        return y + self.scale * self.adapter(y)


def add_adapters(model: nn.Module, r: int = BOTTLENECK) -> nn.Module:
    """Insert adapters into every block of a timm ViT or EfficientNet (in place); returns the model."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None and len(blocks) and hasattr(blocks[0], "mlp"):
        for blk in blocks:
            blk.mlp = ParallelAdapterMLP(blk.mlp, model.embed_dim, r)
        return model
    if blocks is not None and len(blocks) and isinstance(blocks[0], nn.Sequential):
        for i, stage in enumerate(blocks):
            channels = [m for m in stage.modules() if isinstance(m, nn.Conv2d)][-1].out_channels
            blocks[i] = StageAdapter(stage, channels, r)
        return model
    raise NotImplementedError(f"layer-wise adapters support timm ViTs (blocks with .mlp) and EfficientNets, "
                              f"not {type(model).__name__}")


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' parameters, found by module structure (not by parameter names)."""
    return [p for m in model.modules() if isinstance(m, _Bottleneck) for p in m.parameters()]


def adapter_param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in adapter_parameters(model))


@register("layerwise_adapter", needs_backbone=True, cosine_head=True, augments=True)
class LayerwiseAdapter(Method):
    def __init__(self, dim: int, cfg: ToscaConfig, *, backbone=None, mode: str = "cached", r: int = BOTTLENECK):
        super().__init__(dim, cfg, backbone=backbone, mode=mode)
        self.augment, self.r = mode == "augment", r
        self.adapted = None  # a Backbone whose model carries the adapters (the original is untouched)
        self.head = CosineHead(2 * dim)  # prototypes of [frozen, adapted]
        self.train_head = None
        self.feats: dict[str, torch.Tensor] = {}  # split -> [N, 2d]

    def _build(self) -> None:
        model = add_adapters(copy.deepcopy(self.backbone.model), self.r)
        model.eval().requires_grad_(False)
        for p in adapter_parameters(model):
            p.requires_grad_(True)
        self.adapted = dataclasses.replace(self.backbone, model=model)

    def _train_first_task(self, classes, images, y, on_epoch=None) -> None:
        cfg, gen = self.cfg, torch.Generator().manual_seed(self.cfg.seed)
        torch.manual_seed(cfg.seed)
        self._build()
        dev = self.backbone.device  # train where the backbone lives (the run moves it to cfg.device)
        self.train_head = CosineHead(self.backbone.feature_dim, len(classes), scale=cfg.head_scale,
                                     param=cfg.head_scale_param).to(dev)
        params = [*adapter_parameters(self.adapted.model), *self.train_head.parameters()]
        bufs = [torch.zeros_like(p) for p in params]
        for epoch in range(cfg.epochs):
            lr, total = cosine_lr(cfg, epoch), 0.0
            for idx in torch.randperm(len(y), generator=gen).split(cfg.batch_size):
                x = self.adapted.preprocess(images[idx.numpy()]).float()
                if self.augment:
                    x = random_resized_crop_flip(x, gen)
                loss = F.cross_entropy(self.train_head(self.adapted.features(x)), y[idx].to(dev))
                sgd_step(params, torch.autograd.grad(loss, params), bufs, lr=lr, momentum=cfg.momentum,
                         weight_decay=cfg.weight_decay)
                total += float(loss.detach()) * len(idx)
            if not math.isfinite(total):
                raise NonFiniteLoss(f"layer-wise adapter: loss became {total} in task 0, epoch {epoch}")
            if on_epoch:
                on_epoch({"task": 0, "epoch": epoch, "loss": total / len(y), "lr": lr})
        self.adapted.model.requires_grad_(False)

    def _aggregate(self, data) -> None:
        """[frozen (cached), adapted] features for every train and test image: one pass each."""
        for split in ("train", "test"):
            z = self.adapted.embed(data.images(split), batch_size=128, progress=False)
            self.feats[split] = torch.cat([getattr(data, f"{split}_x"), z], dim=1)

    def learn_task(self, t, classes, data, on_epoch=None) -> None:
        if t == 0:
            m = (data.train_task == 0).numpy()
            self._train_first_task(classes, data.images("train")[m], data.train_y[m] - classes[0], on_epoch)
            self._aggregate(data)
        m = data.train_task == t
        self.head.grow(len(classes))
        self.head.set_rows(classes, class_means(self.feats["train"][m], data.train_y[m], classes))

    @torch.no_grad()
    def logits(self, data, idx) -> torch.Tensor:
        return self.head(self.feats["test"][idx])[None]

    def task_tensors(self, t) -> dict:
        out = {"head.weight": self.head.weight.detach()}
        if t == 0:
            ad = adapter_parameters(self.adapted.model)
            out.update({f"adapter.{i}": p.detach().cpu() for i, p in enumerate(ad)})
        return out

    def restore_task(self, t, tensors, classes, data) -> None:
        if t == 0:
            self._build()
            with torch.no_grad():
                for i, p in enumerate(adapter_parameters(self.adapted.model)):
                    p.copy_(tensors[f"adapter.{i}"])
            self.adapted.model.requires_grad_(False)
            self._aggregate(data)
        self.head.weight = nn.Parameter(tensors["head.weight"].clone())

    def trainable_parameters(self, t) -> int:
        if t:
            return 0
        return adapter_param_count(self.adapted.model) + self.train_head.weight.numel() + 1
