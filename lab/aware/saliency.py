"""Phase 1 of AWARe — knowledge profiling (docs/aware.md, "Phase 1").

For every target Linear with output activation ``A`` of shape ``[B, L, d_out]`` and each sample:

1. ``a'  = ||A||_2`` over the sequence dimension ``L`` (padding positions masked out) -> ``[B, d_out]``
2. ``a'' = a' / ||a'||_2`` over the hidden dimension (per sample)                     -> ``[B, d_out]``
3. ``s   = mean of a''`` over all calibration samples                                 -> ``[d_out]``

No gradients are computed (``torch.inference_mode``). Works on any ``nn.Module`` whose forward
takes the calibration batches: a transformers Llava from the hub as well as the offline mini-LLaVA.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from lab.aware.targets import DEFAULT_TARGETS, VISION_EXCLUDE, find_targets

_EPS = 1e-12


@dataclass
class Saliency:
    """Saliency vectors ``{layer name: Tensor[d_out]}`` (float32) and how they were obtained."""

    scores: dict[str, Tensor]
    n_samples: int
    seconds: float
    meta: dict = field(default_factory=dict)

    def matrix(self) -> Tensor:
        """``[layers, max d_out]`` float32, NaN-padded: the layer x neuron heatmap."""
        width = max(v.numel() for v in self.scores.values())
        out = torch.full((len(self.scores), width), float("nan"))
        for i, v in enumerate(self.scores.values()):
            out[i, : v.numel()] = v
        return out


def sample_saliency(act: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-sample saliency of one layer's output ``act`` ``[B, L, d]`` -> ``[B, d]`` (steps 1-2).

    ``mask`` ``[B, L]`` (1 = real token, 0 = padding) zeroes padding before the sequence norm.
    A 2-D ``act`` ``[B, d]`` is treated as a sequence of length 1; extra middle dimensions
    (``[B, h, w, d]``) are flattened into the sequence.
    """
    a = act.float()
    if a.dim() == 2:
        a = a[:, None]
    a = a.reshape(a.shape[0], -1, a.shape[-1])                     # (B, L, d)
    if mask is not None:
        a = a * mask.to(a.dtype)[..., None]
    per_neuron = a.norm(dim=1)                                       # (B, d): L2 over the sequence
    return per_neuron / per_neuron.norm(dim=-1, keepdim=True).clamp_min(_EPS)  # unit L2 per sample


def _non_empty(batches: Iterable) -> Iterable:
    """Fail before any work if the calibration set is empty; keep generators lazy otherwise."""
    it = iter(batches)
    try:
        first = next(it)
    except StopIteration:
        raise ValueError("the calibration set is empty: profiling needs at least one sample") from None
    return itertools.chain([first], it)


def _default_forward(model: nn.Module, batch: Any) -> Any:
    dev = next(model.parameters()).device
    if isinstance(batch, Mapping):
        return model(**{k: v.to(dev) if isinstance(v, Tensor) else v for k, v in batch.items()})
    return model(batch.to(dev) if isinstance(batch, Tensor) else batch)


def profile(model: nn.Module, batches: Iterable[Mapping[str, Any]],
            targets: str | Iterable[str] = DEFAULT_TARGETS, *,
            exclude: str | None = VISION_EXCLUDE,
            forward: Callable[[nn.Module, Any], Any] | None = None,
            mask_key: str = "attention_mask", total: int | None = None,
            progress: bool = True) -> Saliency:
    """Profile the saliency of every target output neuron on a calibration set.

    ``batches`` yields model keyword arguments (e.g. ``input_ids``, ``attention_mask``). A hooked
    output ``[B, L, d]`` is masked with ``batch[mask_key]`` when its first two dimensions equal the
    mask's (language-model positions); outputs of other lengths — the projector running over image
    tokens only — contain no padding and are used whole. Samples are counted per layer, so batches
    that skip the projector (text-only) do not dilute its mean.
    """
    layers = find_targets(model, targets, exclude=exclude)        # errors before any work
    batches = _non_empty(batches)
    forward = forward or _default_forward
    sums = {n: torch.zeros(m.out_features, dtype=torch.float64) for n, m in layers.items()}
    counts = dict.fromkeys(layers, 0)
    state: dict[str, Tensor | None] = {"mask": None}

    def make_hook(name: str):
        def hook(_module, _inputs, output):
            mask = state["mask"]
            if mask is not None:
                mask = mask.to(output.device)
            if mask is not None and (output.dim() < 3 or tuple(output.shape[:2]) != tuple(mask.shape)):
                mask = None
            s = sample_saliency(output.detach(), mask)               # (B, d_out)
            sums[name] += s.sum(0).to(sums[name].device, torch.float64)
            counts[name] += s.shape[0]
        return hook

    from tqdm.auto import tqdm

    handles = [m.register_forward_hook(make_hook(n)) for n, m in layers.items()]
    was_training = model.training
    model.eval()
    start, n_samples = time.perf_counter(), 0
    try:
        with torch.inference_mode():
            for batch in tqdm(batches, total=total, desc="AWARe profiling", unit="batch",
                              disable=not progress, leave=False):
                state["mask"] = batch.get(mask_key) if isinstance(batch, Mapping) else None
                forward(model, batch)
                n_samples += _batch_size(batch)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    scores = {n: (sums[n] / max(counts[n], 1)).float().cpu() for n in layers}
    silent = [n for n in layers if counts[n] == 0]
    return Saliency(scores, n_samples, time.perf_counter() - start,
                    meta={"never_called": silent, "counts": counts})


def _batch_size(batch: Any) -> int:
    if isinstance(batch, Mapping):
        for v in batch.values():
            if isinstance(v, Tensor) and v.dim() > 0:
                return int(v.shape[0])
        return 1
    return int(batch.shape[0]) if isinstance(batch, Tensor) else 1
