"""AWARe selection rule ``activation-x-weight``: freeze the rows both salient and heavy.

A row (output neuron) of a target Linear scores the product of its activation saliency (the
profile's, unit length per layer) and the L2 norm of its weight row (unit length per layer, as the
built-in ``weight-norm``); the top ``rho`` fraction of all target rows together is frozen, as the
default ``activation-global`` does with the saliency alone. A row that is active but tiny (or large
but silent) now counts less.

Use: ``lab aware finetune --rule activation-x-weight``, or ``AwareConfig(rule="activation-x-weight")``
anywhere a selection rule is named (sweeps: ``Size(rules=(..., "activation-x-weight"))``).
"""
from __future__ import annotations

from lab.aware.masking import register_rule, row_norms, select


@register_rule("activation-x-weight", saliency=True)
def activation_x_weight(scores, rho, *, weights=None, seed=0):
    """``scores {layer: Tensor[d_out]}`` -> ``{layer: BoolTensor[d_out]}``, True = frozen row."""
    if weights is None:
        raise ValueError("rule 'activation-x-weight' needs weights={name: Linear}")
    missing = set(scores) - set(weights)
    if missing:
        raise ValueError(f"weights missing for layers: {sorted(missing)[:5]}")
    norms = row_norms({n: weights[n] for n in scores})
    product = {n: scores[n].float().cpu() * norms[n] for n in scores}
    return select(product, rho, "activation-global")  # the global top-rho of the product
