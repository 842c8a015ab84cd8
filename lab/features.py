"""The feature cache: a frozen backbone's features are computed once and read back in milliseconds.

The backbone never changes, so every experiment downstream (TOSCA, baselines, probes, sweeps)
runs on cached features. A cache entry is keyed by everything that changes the numbers:

    backbone name, weights identity, dataset name, dataset fingerprint (sha256 of images+labels),
    split, resolution, layer, preprocessing version, and — only where they differ from the
    original float32 pass with the backbone's legacy transform — ``precision`` ("bf16": autocast on
    CUDA) and ``transform`` (the ViT's "reference" preprocessing). Leaving out the settings that
    equal the original keeps every entry written before they existed valid: the CPU float32
    numbers did not change.

The pass runs on the backbone's device (``device=`` moves it): a DataLoader hands uint8 batches
over (pinned memory and worker processes on CUDA; none on the CPU, where the images are already
in memory and workers would only compete for the cores), resizing and normalisation happen on the
device, and the forward runs under :meth:`lab.backbones.Backbone.autocast` (bf16 on CUDA, float32
on the CPU). Features are stored as float32.

Files are safetensors written atomically with a sha256 sidecar (:mod:`lab._io`); the key is stored
in the file's metadata and compared on read. A corrupt or mismatched file is reported and rebuilt.
Location: ``cache_dir=`` or ``$LAB_CACHE_DIR`` or ``~/.cache/continual-lab``.
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lab import backbones as _bb
from lab._cache import cache_root
from lab._io import CorruptFile, load_tensors, save_tensors

PREPROCESS_VERSION = "1"  # bump when Backbone.preprocess changes its output
DEFAULT_BACKBONE = _bb.DEFAULT_BACKBONE
DEFAULT_RESOLUTION = _bb.DEFAULT_RESOLUTION


@dataclass
class FeatureSet:
    features: "torch.Tensor"  # noqa: F821  [N, d] float32
    labels: "torch.Tensor"  # noqa: F821  [N] int64, the dataset's own labels
    meta: dict = field(default_factory=dict)
    seconds: float = 0.0  # wall time of this call (extraction or cache read)
    cache_hit: bool = False

    @property
    def images_per_second(self) -> float:
        return len(self.labels) / self.seconds if self.seconds else float("nan")


def cache_dir(path=None) -> Path:
    """The cache root (:func:`lab._cache.cache_root`); feature entries live under ``features/``."""
    return cache_root(path)


def fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(str(images.shape).encode())
    h.update(np.ascontiguousarray(images).data)
    h.update(np.ascontiguousarray(labels, dtype=np.int64).data)
    return h.hexdigest()[:20]


def _validate(split: str, batch_size: int) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; valid splits: train, test")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def cache_key(bb, dataset: str, fp: str, split: str, layer: str | None, precision: str = "auto") -> dict:
    """The dict that names one cache entry (see the module docstring)."""
    key = dict(backbone=bb.name, weights=bb.weights_id, dataset=dataset, data=fp, split=split,
               resolution=bb.resolution, layer=layer or "prelogits", preprocess=PREPROCESS_VERSION)
    if bb.precision(precision) != "fp32":
        key["precision"] = bb.precision(precision)
    if bb.transform == "reference":
        key["transform"] = "reference"
    return key


def default_workers(device) -> int:
    """DataLoader workers: none on the CPU (in-memory arrays), up to 8 feeding a GPU."""
    import os

    if str(device).startswith("cuda"):
        return max(1, min(8, (os.cpu_count() or 2) // 2))
    return 0


def extract_layers(backbone, dataset: str, split: str, layers: list[str | None], *, resolution=None,
                   batch_size: int = 128, cache_dir_=None, progress: bool = True, device=None,
                   precision: str = "auto", workers: int | None = None, preprocess: str | None = None) -> dict:
    """Features of several layers (``None`` = the decision point, else a stage name) in ONE pass.

    Returns ``{layer: FeatureSet}``; cached layers are read, missing ones computed together.
    ``device`` moves the backbone there (a name loads it there); ``precision`` 'auto' is bf16
    autocast on CUDA and float32 on the CPU; ``workers`` None = :func:`default_workers`.
    """
    import torch
    from lab.data import load_dataset

    _validate(split, batch_size)
    if workers is not None and (not isinstance(workers, int) or workers < 0):
        raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
    if precision not in _bb.PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(_bb.PRECISIONS)}")
    if isinstance(backbone, str):
        _bb.backbone_info(backbone)  # unknown names fail before any loading
    bad = [l for l in layers if l is not None and not isinstance(l, str)]
    if bad:
        raise ValueError(f"layers must be stage names or None, got {bad}")
    t0 = time.perf_counter()
    ds = load_dataset(dataset)
    sp = ds.split(split)
    if isinstance(backbone, _bb.Backbone):
        bb = backbone.to(device) if device is not None else backbone
    else:
        bb = _bb.load(backbone, resolution=resolution, device=device, preprocess=preprocess)
    unknown = [l for l in layers if l is not None and l not in bb.stage_names]
    if unknown:
        raise KeyError(f"unknown layer(s) {unknown} for {bb.name}; valid layers: {bb.stage_names}")
    fp = fingerprint(sp.images, sp.labels)
    labels = torch.from_numpy(sp.labels.astype(np.int64))
    out, todo, paths, keys = {}, [], {}, {}
    for layer in layers:
        key = cache_key(bb, dataset, fp, split, layer, precision)
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        path = cache_dir(cache_dir_) / "features" / bb.name / f"{dataset}-{split}-r{bb.resolution}-{key['layer']}-{digest}.safetensors"
        keys[layer], paths[layer] = key, path
        feats = _read(path, key, len(labels))
        if feats is None:
            todo.append(layer)
        else:
            out[layer] = FeatureSet(feats, labels, dict(key, path=str(path)), 0.0, True)
    if todo:
        nw = default_workers(bb.device) if workers is None else workers
        computed = _compute(bb, sp.images, todo, batch_size, progress, f"{bb.name}@{bb.resolution} {dataset}/{split}",
                            precision, nw)
        for layer in todo:
            save_tensors(paths[layer], {"features": computed[layer]}, {"key": json.dumps(keys[layer], sort_keys=True)})
            out[layer] = FeatureSet(computed[layer], labels, dict(keys[layer], path=str(paths[layer])), 0.0, False)
    dt = time.perf_counter() - t0
    for fs in out.values():
        fs.seconds = dt
    return out


def extract(backbone, dataset: str, split: str, *, resolution=None, layer: str | None = None,
            batch_size: int = 128, cache_dir=None, progress: bool = True, device=None,
            precision: str = "auto", workers: int | None = None, preprocess: str | None = None) -> FeatureSet:
    """Features of one dataset split (decision point by default, or a stage ``layer``), cached."""
    return extract_layers(backbone, dataset, split, [layer], resolution=resolution, batch_size=batch_size,
                          cache_dir_=cache_dir, progress=progress, device=device, precision=precision,
                          workers=workers, preprocess=preprocess)[layer]


def _read(path: Path, key: dict, n: int):
    if not path.exists():
        return None
    try:
        tensors, meta = load_tensors(path)
        stored = json.loads(meta.get("key", "{}"))
        if stored != key:
            raise CorruptFile(f"{path}: stored key {stored} does not match {key}")
        feats = tensors["features"]
        if feats.ndim != 2 or feats.shape[0] != n:
            raise CorruptFile(f"{path}: features {tuple(feats.shape)} do not match {n} samples")
        return feats
    except (CorruptFile, KeyError, json.JSONDecodeError) as exc:
        warnings.warn(f"feature cache entry rejected, rebuilding: {exc}", stacklevel=3)
        return None


class _Batches:
    """Batch i of an in-memory uint8 array, as a tensor (a map-style dataset of whole batches)."""

    def __init__(self, images: np.ndarray, batch_size: int):
        self.images, self.batch_size = images, batch_size

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def __getitem__(self, i: int):
        import torch

        return torch.from_numpy(np.ascontiguousarray(self.images[i * self.batch_size:(i + 1) * self.batch_size]))


def _compute(bb, images: np.ndarray, layers: list, batch_size: int, progress: bool, desc: str,
             precision: str = "auto", workers: int = 0) -> dict:
    """One pass over ``images``: uint8 batches -> device -> preprocess -> forward under autocast."""
    import torch
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from lab._alloc import tune_allocator

    tune_allocator()   # the batch's activations reuse heap pages instead of fresh mmaps (lab/_alloc.py)
    cuda = bb.device.type == "cuda"
    loader = DataLoader(_Batches(images, batch_size), batch_size=None, shuffle=False, num_workers=workers,
                        pin_memory=cuda, persistent_workers=False)
    outs = {l: [] for l in layers}
    stages = [l for l in layers if l is not None]
    with torch.inference_mode(), bb.autocast(precision):
        for batch in tqdm(loader, desc=desc, unit="batch", disable=not progress):
            x = bb.preprocess(batch)  # moved to the device, resized and normalised there
            if stages:
                pooled = bb.pooled_stages(x)
                for l in stages:
                    outs[l].append(pooled[l].float())
            if None in outs:
                outs[None].append(bb.features(x).float())
    return {l: torch.cat(v).cpu().contiguous() if v else torch.empty(0, bb.feature_dim) for l, v in outs.items()}


def scenario_features(scn, backbone=DEFAULT_BACKBONE, *, resolution=None, layer: str | None = None,
                      progress: bool = True, device=None, precision: str = "auto", preprocess: str | None = None) -> dict:
    """Cached features for a whole scenario, concatenated in the scenario's order.

    Returns ``train_x [N,d]``, ``train_y`` (incremental labels), ``test_x``, ``test_y`` and
    ``seconds`` (time spent extracting or reading the cache).
    """
    import torch

    if isinstance(backbone, _bb.Backbone):
        bb = backbone.to(device) if device is not None else backbone
    else:
        bb = _bb.load(backbone, resolution=resolution, device=device, preprocess=preprocess)
    out, seconds = {}, 0.0
    for split in ("train", "test"):
        sets = [extract(bb, name, split, layer=layer, progress=progress, precision=precision) for name in scn.datasets]
        seconds += sum(s.seconds for s in sets)
        out[f"{split}_x"] = torch.cat([s.features for s in sets])
        out[f"{split}_y"] = torch.from_numpy(getattr(scn, f"{split}_labels").astype(np.int64))
        if len(out[f"{split}_x"]) != len(out[f"{split}_y"]):
            raise RuntimeError("features and scenario labels disagree in length")
    out["seconds"] = seconds
    out["backbone"] = bb
    return out
