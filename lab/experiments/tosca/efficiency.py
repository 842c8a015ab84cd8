"""TOSCA vs layer-wise adapters: trainable parameters and training time (the paper's "~8x fewer
parameters" claim, checked).

    python -m lab.experiments.tosca.efficiency --out results/tosca

Parameters are exact counts from the architectures, built on the meta device (no weights read):
one LuCA (lab.tosca.luca, r = d // 16) against the layer-wise adapters of
:mod:`lab.experiments.tosca.layerwise` inserted into every block (APER/AdaptFormer bottleneck 64 for
a ViT; a 1x1-conv adapter after each EfficientNet stage). The cosine head (d per class + σ) is the
same for both and is listed apart.

Time is one training step (forward, backward, SGD) at a given batch, measured with
``time.perf_counter`` after a warm-up step, repeated; the mean and its 95 % t-interval over steps:

* ``tosca_cached``      LuCA + head on cached features (this project's default: no backbone pass)
* ``tosca_augment``     the frozen backbone's forward (no graph) + the LuCA step: the reference,
                        which runs the backbone on augmented images every epoch
* ``layerwise_adapter`` the backbone with adapters in every block, forward and backward through it

EfficientNet-Lite0 runs with its real weights on images of ``fashion_mnist_mini``; the ViT-B/16
shape runs with random weights on random images (a step's time does not depend on the weights'
values) at a small batch, reported per image as well.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from lab.tosca.head import CosineHead
from lab.tosca.learner import add_l1_grad, sgd_step
from lab.tosca.luca import LuCA, bottleneck, param_count

from .layerwise import BOTTLENECK, add_adapters, adapter_param_count, adapter_parameters

VIT_B = "vit_base_patch16_224.augreg_in21k"
LITE0 = "efficientnet_lite0"
SETTINGS = ("tosca_cached", "tosca_augment", "layerwise_adapter")


def _meta_model(backbone: str):
    import timm

    from lab import backbones

    arch, kw = backbones.backbone_info(backbone)["arch"]
    with torch.device("meta"):
        return timm.create_model(arch, pretrained=False, **kw)


def parameter_row(backbone: str, *, ratio: int = 16, classes_per_task: int = 10, tasks: int = 10) -> dict:
    """Exact trainable-parameter counts of one LuCA and of the layer-wise adapters on ``backbone``."""
    model = _meta_model(backbone)
    backbone_params = sum(p.numel() for p in model.parameters())
    d = model.num_features
    with torch.device("meta"):
        adapted = add_adapters(model, BOTTLENECK)
        luca = LuCA(d, ratio=ratio)
    r = bottleneck(d, ratio)
    assert luca.num_parameters() == param_count(d, r)  # the formula and the module agree
    layerwise = adapter_param_count(adapted)
    head = classes_per_task * d + 1
    return {"backbone": backbone, "feature_dim": d, "luca_r": r, "backbone_params": backbone_params,
            "luca_params_per_task": luca.num_parameters(), "layerwise_adapter_params": layerwise,
            "adapter_blocks": sum(1 for m in adapted.modules() if type(m).__name__ in
                                  ("ParallelAdapterMLP", "StageAdapter")),
            "ratio_layerwise_to_luca": layerwise / luca.num_parameters(),
            "tasks": tasks, "luca_params_all_tasks": tasks * luca.num_parameters(),
            "head_params_per_task": head}


def _t(values) -> tuple[float, float]:
    from .study import t_interval

    return t_interval(values)


def _time_steps(step, steps: int) -> list[float]:
    step()  # warm-up (allocations, first-call overheads)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def _luca_step(d: int, n_classes: int, ratio: int, seed: int):
    """A step of the LuCA + head on given features (TOSCA's loop: CE + L1 on the LuCA, SGD)."""
    gen = torch.Generator().manual_seed(seed)
    luca, head = LuCA(d, ratio=ratio), CosineHead(d, n_classes)
    luca.reset_parameters(gen)
    params = [*luca.parameters(), *head.parameters()]
    n_luca = len(list(luca.parameters()))
    bufs = [torch.zeros_like(p) for p in params]

    def step(feats, y):
        ce = F.cross_entropy(head(luca(feats)), y)
        grads = list(torch.autograd.grad(ce, params))
        add_l1_grad(params[:n_luca], grads[:n_luca], 5e-4)
        sgd_step(params, grads, bufs, lr=0.025, momentum=0.9, weight_decay=0.0)

    return step


def time_settings(model, features, x: torch.Tensor, *, n_classes: int, steps: int, ratio: int = 16,
                  seed: int = 0) -> list[dict]:
    """Seconds per training step of each setting on a backbone ``model`` (timm) with
    ``features(model, x) -> [B, d]`` and a preprocessed batch ``x``."""
    import copy

    y = torch.arange(len(x)) % n_classes
    with torch.no_grad():
        cached = features(model, x)
    d = cached.shape[1]
    luca = _luca_step(d, n_classes, ratio, seed)

    def augment():
        with torch.no_grad():
            f = features(model, x)
        luca(f, y)

    adapted = add_adapters(copy.deepcopy(model), BOTTLENECK).eval().requires_grad_(False)
    ad_params = adapter_parameters(adapted)
    for p in ad_params:
        p.requires_grad_(True)
    head = CosineHead(d, n_classes)
    params = [*ad_params, *head.parameters()]
    bufs = [torch.zeros_like(p) for p in params]

    def layerwise():
        loss = F.cross_entropy(head(features(adapted, x)), y)
        sgd_step(params, torch.autograd.grad(loss, params), bufs, lr=0.025, momentum=0.9, weight_decay=0.0)

    runs = {"tosca_cached": lambda: luca(cached, y), "tosca_augment": augment, "layerwise_adapter": layerwise}
    rows = []
    for name in SETTINGS:
        secs = _time_steps(runs[name], steps)
        mean, half = _t(secs)
        rows.append({"setting": name, "batch": len(x), "steps": steps, "step_seconds": mean,
                     "step_seconds_ci95": half, "image_ms": 1000 * mean / len(x),
                     "image_ms_ci95": 1000 * half / len(x)})
    return rows


def _prelogits(model, x):
    return model.forward_head(model.forward_features(x), pre_logits=True)


def time_lite0(*, batch: int, steps: int, seed: int = 0) -> list[dict]:
    """EfficientNet-Lite0 with its weights, on ``batch`` fashion_mnist_mini training images."""
    from lab import backbones

    bb = backbones.load(LITE0)
    x = bb.preprocess(_images("fashion_mnist_mini", batch, seed)).float()
    rows = time_settings(bb.model, _prelogits, x, n_classes=10, steps=steps, seed=seed)
    return [{"backbone": LITE0, "weights": "ImageNet", "resolution": bb.resolution, **r} for r in rows]


def _images(name: str, n: int, seed: int):
    from lab import data

    scn = data.scenario([name], init=0, inc=2, seed=1993)
    imgs = scn.images("train")
    idx = torch.randperm(len(imgs), generator=torch.Generator().manual_seed(seed))[:n].numpy()
    return imgs[idx]


def time_vit_b(*, batch: int, steps: int, seed: int = 0) -> list[dict]:
    """The ViT-B/16 shape with random weights (timm vit_base_patch16_224, no head) on random 224 px
    inputs: the architecture's step time, not a pretrained model's accuracy."""
    import timm

    from lab import backbones

    arch, kw = backbones.backbone_info(VIT_B)["arch"]
    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, **kw).eval().requires_grad_(False)
    x = torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(seed))
    rows = time_settings(model, _prelogits, x, n_classes=10, steps=steps, seed=seed)
    return [{"backbone": VIT_B, "weights": "random", "resolution": 224, **r} for r in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.experiments.tosca.efficiency", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/tosca")
    p.add_argument("--steps", type=int, default=5, help="timed steps per setting (after one warm-up step)")
    p.add_argument("--lite0-batch", type=int, default=48, help="EfficientNet-Lite0 batch (the reference's 48)")
    p.add_argument("--vit-batch", type=int, default=4, help="ViT-B/16 batch (small: a CPU step is seconds)")
    p.add_argument("--no-vit-time", action="store_true", help="skip the ViT-B/16 timing (parameters still counted)")
    args = p.parse_args(argv)
    import pandas as pd

    from lab import _io

    from .study import _write_csv, machine, sources_sha256, table_hashes

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = sources_sha256(unhashed=("results.py", "cli.py", "sweep.py"))   # what the measurement runs
    load_before = list(os.getloadavg())  # a shared machine: other work slows every setting
    t0 = time.perf_counter()
    params = pd.DataFrame([parameter_row(b) for b in (VIT_B, LITE0)])
    rows = time_lite0(batch=args.lite0_batch, steps=args.steps)
    if not args.no_vit_time:
        rows += time_vit_b(batch=args.vit_batch, steps=args.steps)
    wall = time.perf_counter() - t0
    _write_csv(out / "efficiency_params.csv", params)
    _write_csv(out / "efficiency_time.csv", pd.DataFrame(rows))
    _io.write_json(out / "efficiency_manifest.json", {
        "command": "python -m lab.experiments.tosca.efficiency " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine(), "loadavg_before": load_before, "loadavg_after": list(os.getloadavg())},
        "wall_seconds": round(wall, 1), "sources_sha256": sources,
        "files": ["efficiency_params.csv", "efficiency_time.csv"],
        "sha256": table_hashes(out, ("efficiency_params.csv", "efficiency_time.csv"))})
    print(params.to_string(index=False))
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"wrote {out}/efficiency_params.csv, efficiency_time.csv, efficiency_manifest.json ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
