"""TOSCA (Yildirim et al., "Unlocking [CLS] Features for Continual Post-Training", TMLR 2026) and
the class-incremental harness around it. The method: docs/tosca.md.

One concept per file:

* :mod:`~lab.tosca.luca`      the LuCA module (adapter + calibrator) and its parameter formula
* :mod:`~lab.tosca.head`      the shared cosine classifier with a learnable scale
* :mod:`~lab.tosca.learner`   the TOSCA learner: one LuCA per task, prototypes after each task
* :mod:`~lab.tosca.routing`   inference: entropy routing per sample / per batch / oracle
* :mod:`~lab.experiments.tosca.baselines` SimpleCIL, sequential fine-tuning, joint training
* :mod:`~lab.experiments.tosca.layerwise` the layer-wise adapter baseline (APER-adapter)
* :mod:`~lab.tosca.metrics`   accuracy matrix, A_b, Ā, A_B, forgetting, BWT (pure functions)
* :mod:`~lab.experiments.tosca.analysis`  sparsity / orthogonality of the learned modules, entropy distributions
* :mod:`~lab.experiments.tosca.run`       a whole scenario -> a run directory and tidy tables
* :mod:`~lab.experiments.tosca.cli`       ``lab tosca``

Importing ``lab.tosca`` is cheap; the names below load their module on first use.
"""
from importlib import import_module

_LAZY = {
    "LuCA": "luca", "param_count": "luca", "FLOWS": "luca", "CosineHead": "head", "Tosca": "learner",
    "ToscaConfig": "learner", "ROUTINGS": "routing", "route": "routing",
}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f"lab.tosca.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lab.tosca' has no attribute {name!r}")
