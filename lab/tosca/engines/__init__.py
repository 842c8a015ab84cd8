"""Opt-in accelerators of the TOSCA training step.

The default engine, ``'autograd'``, is the plain step in lab/tosca/learner.py: the loss
``CE(head(LuCA(x)), y) + l1·Σ|p_luca|``, ``loss.backward()``, ``torch.optim.SGD.step()``. Each
engine here computes the same update (same batches, same L1 + SGD-momentum maths) by other means;
tests/test_regression_numbers.py holds every one of them to the plain step's stored numbers.

============  ==================================================================================
engine        what it does (file)
============  ==================================================================================
eager         the 'tosca' flow's backward written out with autograd's own kernels, parameters,
              gradients and momentum as views of flat buffers (``_step.py``); bit-identical
              gradients
fused         ``eager``'s step with the element-wise work in C kernels built at first use with
              the machine's C compiler (``_fused.py``, ``_fused.c``, ``lab/_cc.py``); the 'tosca'
              flow on the CPU only, else ``eager`` (said in one line); other roundings
compile       the plain step with its loss compiled by ``torch.compile`` (inductor: forward and
              backward), torch.optim.SGD's update
static        fixed-shape buffers, the last batch padded with weight-0 rows (``_graph.py``)
cuda_graph    ``static`` with each epoch captured once as a CUDA graph and replayed (needs cuda)
============  ==================================================================================

Which to use: docs/measurements.md ("The plain step, torch.compile and the fused step").
"""
from __future__ import annotations

import sys

ACCELERATORS = ("eager", "fused", "compile", "static", "cuda_graph")
EPOCH_ENGINES = ("static", "cuda_graph")  # run a whole epoch themselves (static_epochs), not a step
_WARNED: set[str] = set()  # fused-engine fallbacks already said in this process
_COMPILED: dict = {}  # loss function -> its torch.compile'd version (one per process: reused by every task)


def step_for(engine: str, luca, head, cfg, plain_step):
    """``(step, engine that runs)`` for a per-batch ``engine`` of :data:`ACCELERATORS`. A step is
    called as ``step(x, y, lr) -> CE`` and closed with ``step.close()`` when the task is done.
    ``plain_step``: the learner's plain step class (``compile`` builds it around a compiled loss)."""
    if engine == "compile":
        import torch

        loss = plain_step.loss
        if loss not in _COMPILED:
            _COMPILED[loss] = torch.compile(loss)
        return plain_step(luca, head, cfg, loss=_COMPILED[loss]), "compile"
    if engine == "fused":
        from ._fused import FusedStep, covers, kernels, why_not_built

        if covers(luca, cfg) and kernels() is not None:
            return FusedStep(luca, head, cfg), "fused"
        why = why_not_built() if covers(luca, cfg) else ""
        if why and why not in _WARNED:   # one line per process and reason, as the other notes of lab
            _WARNED.add(why)
            print(f"note: TOSCA trains with the 'eager' engine here, not 'fused': {why}. The same maths in "
                  f"torch's kernels; results differ from the fused engine's in the last digits.",
                  file=sys.stderr, flush=True)
    elif engine != "eager":
        raise ValueError(f"engine {engine!r} is not a per-step engine; valid: eager, fused, compile")
    from ._step import TrainStep

    return TrainStep(luca, head, cfg), "eager"


def static_epochs(luca, head, x, y, cfg, gen, *, batch_features=None):
    """The ``static`` / ``cuda_graph`` engines: one task's epochs, yielding ``(epoch, lr, mean CE)``."""
    from ._graph import static_epochs as run

    return run(luca, head, x, y, cfg, gen, capture=cfg.engine == "cuda_graph", batch_features=batch_features)
