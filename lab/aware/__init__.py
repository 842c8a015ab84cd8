"""AWARe — Activation-Weighted Adaptive REtention (Liao et al., EMNLP 2026; docs/aware.md).

The method alone, usable on any torch model (a hub LLaVA as well as the offline mini-LLaVA)::

    from lab import aware
    sal = aware.profile(model, calibration_batches, targets="qkv+projector")   # phase 1
    masks = aware.select(sal.scores, rho=0.3, rule="activation-global")      # masking rule
    aware.apply(model, masks)                     # retained rows frozen, the rest trainable
    ...train with any optimizer over the params that require grad...
    aware.merge(model)                            # a standard model again

One concept per file: ``targets`` (which layers), ``saliency`` (the profiler), ``masking`` (the
selection rules, a registry), ``freeze`` (row split / merge), ``metrics`` (R, E, H, continual),
``config`` (what to freeze), ``methods`` (the fine-tuning methods compared, a registry).
The experiments built on it — the offline mini-LLaVA, its tasks, the training harness, sweeps,
views and ``lab aware ...`` — live in :mod:`lab.experiments.aware`. Heavy imports happen on first use.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "AwareConfig": "lab.aware.config", "RULES": "lab.aware.masking", "register_rule": "lab.aware.masking",
    "METHODS": "lab.aware.methods", "register_method": "lab.aware.methods", "MethodSpec": "lab.aware.methods",
    "prepare": "lab.aware.methods", "finish": "lab.aware.methods",
    "TARGET_PRESETS": "lab.aware.targets", "find_targets": "lab.aware.targets",
    "profile": "lab.aware.saliency", "Saliency": "lab.aware.saliency",
    "select": "lab.aware.masking", "frozen_fraction": "lab.aware.masking",
    "apply": "lab.aware.freeze", "merge": "lab.aware.freeze", "RowSplitLinear": "lab.aware.freeze",
    "trainable_parameters": "lab.aware.freeze",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lab.aware' has no attribute {name!r}")
