"""Static copies of the registries' names, for the command line and the report's parameter checks.

``lab <command> --help`` and every usage error answer without importing torch (~3-5 s on a slow
machine): the parsers' ``choices=`` come from these tables, not from the registries (which import
torch to define their entries). A registry's table is a :class:`lab.plugins.Names`: the built-in
names, which also accepts a name an installed plugin adds (looked up in the registry only then).
``tests/test_cli.py::test_static_names_match_the_registries`` compares every table with the real
registry, so a built-in method, router or rule added to a registry without a line here fails the
tests (add it here, in the registry's order).
"""
from __future__ import annotations

from lab.plugins import Names

# lab.experiments.tosca.methods.list_methods(), with each entry's registry info (the capabilities
# lab.experiments.tosca._base.register declares): what `lab tosca` and the study tables read
# without importing torch
_BASELINE = {"role": "baseline", "routed": False, "needs_backbone": False, "trains": True, "luca": False,
             "cosine_head": False, "augments": False, "headline": None}     # register()'s defaults
_TOSCA_INFO = {
    "tosca": {**_BASELINE, "role": "method", "routed": True, "luca": True, "cosine_head": True, "augments": True},
    "simplecil": {**_BASELINE, "trains": False, "headline": 1},
    "ncm": {**_BASELINE, "trains": False},
    "fecam": {**_BASELINE, "trains": False, "headline": 3},
    "ranpac": {**_BASELINE, "trains": False, "headline": 2},
    "finetune": dict(_BASELINE),
    "joint": dict(_BASELINE),
    "layerwise_adapter": {**_BASELINE, "needs_backbone": True, "cosine_head": True, "augments": True},
}
TOSCA_METHODS = Names("tosca method", _TOSCA_INFO, _TOSCA_INFO)
TOSCA_MODES = ("cached", "augment")                               # lab.experiments.tosca._base.MODES
TOSCA_FLOWS = ("tosca", "adapter", "calibrator", "tosca_r")       # lab.tosca.luca.FLOWS
REFERENCE_FLOW = TOSCA_FLOWS[0]                                   # lab.tosca.luca.REFERENCE_FLOW
# lab.tosca.routing.list_routings()
ROUTINGS = Names("router", ("per-sample", "per-batch", "oracle", "max-softmax", "energy", "ncm", "mahalanobis",
                           "entropy-ncm", "ridge"))
DEFAULT_ROUTINGS = ("per-sample", "per-batch", "oracle")         # lab.tosca.routing.ROUTINGS

AWARE_METHODS = Names("aware method", ("zero-shot", "full", "lora", "dora", "aware"))   # lab.aware.methods.method_names()
AWARE_RULES = Names("aware rule", ("activation-global", "activation-balanced", "weight-norm", "random"))   # .masking.rule_names()
AWARE_TASKS = ("fashion", "digits", "even")                      # lab.experiments.aware.run.tasks.TEMPLATES
AWARE_SIZES = ("smoke", "default", "large")                      # lab.experiments.aware.run.context.SIZES
AWARE_PRESETS = ("shipped", "smoke")                             # lab.experiments.aware.study.plan.PRESETS

DEFAULT_BACKBONE = "efficientnet_lite0"                          # lab.backbones.DEFAULT_BACKBONE
DEFAULT_DATASET = "fashion_mnist_mini"                           # lab.data.DEFAULT_DATASET
PREPROCESS = ("reference", "timm")                               # lab.backbones.PREPROCESS
PRECISIONS = ("auto", "fp32", "bf16")                             # lab.backbones.PRECISIONS

# bounds the command line and lab.experiments.tosca.run.RunConfig both check (here: no torch, no cycle)
RIDGE_DIM_MAX = 100_000    # the ridge router's projection D (its [D, D] Gram matrix: 40 GB in float32 here)
RIDGE_LAMBDA_MAX = 1e12    # its λ (RanPAC's grid ends at 1e13)
