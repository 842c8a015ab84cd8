"""Tables over saliency vectors and masks for notebook 03 (no model, no training): layers, how
concentrated the activation is, what a selection freezes and how two selections agree.

Saliency is shown as ``s * sqrt(d_out)`` ("x uniform"): profiling normalises every sample to unit
L2 norm over a layer's ``d_out`` neurons, so a layer whose neurons were all equal would read
``1/sqrt(d_out)`` everywhere. Scaled this way, 1 means "an equal share" in every layer, whatever
its width, and layers of different widths (q: 576, k/v: 192 in SmolLM2) can share a colour scale.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
from torch import Tensor

from lab.aware.targets import is_projector
from lab.experiments.aware.study.profiles import Study

MAIN_TARGETS = ("q_proj", "k_proj", "v_proj", "projector")
ALL_TARGETS = MAIN_TARGETS + ("gate_proj", "up_proj", "down_proj")
_KNOWN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_layer(name: str) -> tuple[str, int | None]:
    """``'language_model.model.layers.12.self_attn.q_proj'`` -> ``('q_proj', 12)``; projector
    Linears -> ``('projector', None)`` (numbered by :func:`layer_table`)."""
    if is_projector(name):
        return "projector", None
    parts = name.split(".")
    target = next((p for p in reversed(parts) if p in _KNOWN), parts[-1])
    num = next((int(p) for p in parts if p.isdigit()), None)
    return target, num


def layer_table(scores: Mapping[str, Tensor]):
    """One row per layer: ``name, target, layer, d_out`` (projector Linears numbered 0, 1, ...)."""
    import pandas as pd

    rows, counters = [], {}
    for name, v in scores.items():
        target, num = parse_layer(name)
        if num is None:
            num = counters.get(target, 0)
        counters[target] = num + 1
        rows.append({"name": name, "target": target, "layer": num, "d_out": int(v.numel())})
    return pd.DataFrame(rows)


def target_summary(model, targets: str = "qkv+projector+mlp"):
    """Per target kind: how many Linear layers, their shapes, and their share of all parameters."""
    from lab.aware.targets import find_targets

    layers = find_targets(model, targets)
    total = sum(p.numel() for p in model.parameters())
    lt = layer_table({n: m.weight[:, 0] for n, m in layers.items()})
    lt["d_in"] = [layers[n].in_features for n in lt.name]
    lt["params"] = [layers[n].weight.numel() + (layers[n].bias.numel() if layers[n].bias is not None else 0)
                    for n in lt.name]
    g = lt.groupby("target", sort=False).agg(layers=("name", "size"), d_out=("d_out", "max"),
                                             d_in=("d_in", "max"), params=("params", "sum"))
    g["share_of_model_%"] = 100 * g.params / total
    return g.reset_index()


def layer_name(scores: Mapping[str, Tensor], target: str, layer: int) -> str:
    """The module name of ``target`` in ``layer`` (clamped to the last layer of that target)."""
    lt = layer_table(scores)
    lt = lt[lt.target == target]
    if lt.empty:
        raise ValueError(f"no layers of target {target!r}")
    return lt[lt.layer == min(int(layer), int(lt.layer.max()))].name.iloc[0]


def relative(v: Tensor) -> np.ndarray:
    """``s * sqrt(d_out)``: 1 = an equal share of the layer's (unit-norm) activation."""
    v = v.detach().float().cpu().numpy()
    return v * math.sqrt(v.size)


def targets_in(scores: Mapping[str, Tensor], wanted=MAIN_TARGETS) -> list[str]:
    have = set(layer_table(scores).target)
    return [t for t in wanted if t in have]


def concentration(scores: Mapping[str, Tensor], tops=(0.01, 0.1)):
    """Per layer: the share of activation energy (``s**2``, which sums to ~1 per layer) held by the
    top 1 % / 10 % of its neurons, the fraction of neurons that hold half of it, and the largest
    neuron in "x uniform" units. A uniform layer would read 1 %, 10 %, 50 % and 1."""
    import pandas as pd

    lt = layer_table(scores)
    rows = []
    for r in lt.itertuples():
        e = np.sort(scores[r.name].double().cpu().numpy() ** 2)[::-1]
        c = np.cumsum(e) / e.sum()
        row = {"target": r.target, "layer": r.layer, "d_out": r.d_out}
        for t in tops:
            row[f"top{t * 100:g}%_share"] = float(c[max(1, round(t * e.size)) - 1])
        row["half_mass_frac"] = float((np.searchsorted(c, 0.5) + 1) / e.size)
        row["max_x_uniform"] = float(relative(scores[r.name]).max())
        rows.append(row)
    return pd.DataFrame(rows)


def concentration_summary(conc, targets=ALL_TARGETS):
    """Median over layers of :func:`concentration`, one row per target."""
    cols = [c for c in conc.columns if c not in ("target", "layer", "d_out")]
    g = conc.groupby("target", sort=False)[cols].median()
    g["layers"] = conc.groupby("target", sort=False).size()
    return g.loc[[t for t in targets if t in g.index]].reset_index()


def lorenz(scores: Mapping[str, Tensor], points: int = 101):
    """Cumulative share of activation energy held by the top-x fraction of neurons (mean over the
    layers of each target): tidy ``target, neuron_frac, energy_share``."""
    import pandas as pd

    lt = layer_table(scores)
    xs = np.linspace(0, 1, points)
    rows = []
    for target, names in lt.groupby("target", sort=False).name:
        curves = []
        for n in names:
            e = np.sort(scores[n].double().cpu().numpy() ** 2)[::-1]
            c = np.concatenate([[0.0], np.cumsum(e) / e.sum()])
            curves.append(np.interp(xs, np.linspace(0, 1, c.size), c))
        rows += [{"target": target, "neuron_frac": x, "energy_share": y} for x, y in zip(xs, np.mean(curves, 0))]
    rows += [{"target": "uniform", "neuron_frac": x, "energy_share": x} for x in xs]
    return pd.DataFrame(rows)


def density(scores: Mapping[str, Tensor], bins: int = 60):
    """Histogram (density over log10 of "x uniform" saliency) per target: tidy ``target, log10_x, density``."""
    import pandas as pd

    lt = layer_table(scores)
    vals = {t: np.log10(np.clip(np.concatenate([relative(scores[n]) for n in names]), 1e-6, None))
            for t, names in lt.groupby("target", sort=False).name}
    lo, hi = min(v.min() for v in vals.values()), max(v.max() for v in vals.values())
    edges = np.linspace(lo, hi, bins + 1)
    rows = []
    for t, v in vals.items():
        h, _ = np.histogram(v, edges, density=True)
        rows += [{"target": t, "log10_x_uniform": (a + b) / 2, "density": d} for a, b, d in zip(edges[:-1], edges[1:], h)]
    return pd.DataFrame(rows)


def frozen_table(masks: Mapping[str, Tensor]):
    """One row per layer: ``target, layer, frozen, rows, fraction``."""
    lt = layer_table(masks)
    lt["frozen"] = [int(masks[n].sum()) for n in lt.name]
    lt["rows"] = lt.d_out
    lt["fraction"] = lt.frozen / lt.rows
    return lt.drop(columns="d_out")


def frozen_by_target(selections: Mapping[str, Mapping[str, Tensor]]):
    """Fraction of rows frozen per target, one column per selection: how a rule spreads rho."""
    import pandas as pd

    cols = {}
    for lab_, masks in selections.items():
        ft = frozen_table(masks)
        g = ft.groupby("target", sort=False)[["frozen", "rows"]].sum()
        cols[lab_] = pd.concat([g.frozen / g.rows, pd.Series({"all targets": g.frozen.sum() / g.rows.sum()})])
    return pd.DataFrame(cols)


def why_global(scores: Mapping[str, Tensor], masks: Mapping[str, Tensor]):
    """Why a global ranking freezes some targets more than others. Per target: its width, the
    level every neuron would have if all were equal (``1/sqrt(d_out)``, the per-sample norm is 1),
    the median and the top neuron of its layers (raw saliency ``s``, which is what the global rule
    compares), the global threshold (the smallest frozen ``s``) and the fraction frozen. A target
    whose *median* neuron sits above the threshold is mostly frozen: narrow, flat layers win."""
    import pandas as pd

    lt = layer_table(scores)
    frozen = torch.cat([scores[n][masks[n].bool()] for n in masks if masks[n].any()])
    thr = float(frozen.min()) if frozen.numel() else float("nan")
    rows = []
    for target, names in lt.groupby("target", sort=False).name:
        v = torch.cat([scores[n].float() for n in names])
        m = torch.cat([masks[n].bool() for n in names if n in masks]) if all(n in masks for n in names) else None
        rows.append({"target": target, "d_out": int(lt[lt.target == target].d_out.max()),
                     "equal_share_s": 1 / math.sqrt(int(lt[lt.target == target].d_out.max())),
                     "median_s": float(v.median()), "top_s": float(v.max()), "global_threshold_s": thr,
                     "frozen": float(m.float().mean()) if m is not None else float("nan")})
    return pd.DataFrame(rows)


def parameter_budget(model, masks: Mapping[str, Tensor]) -> dict:
    """What freezing ``masks`` leaves trainable, counted from the layer shapes (nothing is modified):
    every other parameter of ``model`` is frozen, as :func:`lab.aware.freeze.apply` does."""
    mods = dict(model.named_modules())
    trainable = sum(int((~m.bool()).sum()) * (mods[n].in_features + (mods[n].bias is not None))
                    for n, m in masks.items())
    target_params = sum(mods[n].weight.numel() + (mods[n].bias.numel() if mods[n].bias is not None else 0)
                        for n in masks)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": trainable, "target_params": target_params, "total": total,
            "trainable_frac": trainable / total, "target_frac": target_params / total}


def overlap_table(selections: Mapping[str, Mapping[str, Tensor]], reference: str):
    """Agreement of every selection with ``reference``: Jaccard, overlap coefficient, and what two
    independent random selections of the same sizes would give (the chance level)."""
    import pandas as pd

    from lab.aware.masking import frozen_fraction
    from lab.aware.metrics import mask_overlap

    ref = selections[reference]
    rows = []
    for name, masks in selections.items():
        if name == reference:
            continue
        p, q = frozen_fraction(ref), frozen_fraction(masks)
        chance_j = p * q / (p + q - p * q) if p + q > 0 else 1.0
        rows.append({"reference": reference, "compared": name, **mask_overlap(ref, masks),
                     "chance_jaccard": chance_j, "chance_overlap": max(p, q) if min(p, q) > 0 else 1.0})
    return pd.DataFrame(rows)


def jaccard_matrix(selections: Mapping[str, Mapping[str, Tensor]]):
    import pandas as pd

    from lab.aware.metrics import mask_overlap

    names = list(selections)
    return pd.DataFrame([[mask_overlap(selections[a], selections[b])["jaccard"] for b in names] for a in names],
                        index=names, columns=names)


def _ranks(x: Tensor) -> Tensor:
    r = torch.empty_like(x)
    r[torch.argsort(x)] = torch.arange(x.numel(), dtype=x.dtype)
    return r


def rank_agreement(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """Spearman correlation of two saliency profiles over all common neurons (global ranking)."""
    common = [k for k in a if k in b]
    x = torch.cat([a[k].double().flatten() for k in common])
    y = torch.cat([b[k].double().flatten() for k in common])
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()).clamp_min(1e-12))


def calibration_agreement(study: Study, rho: float = 0.3, reference: str | None = None, *, seed: int = 0):
    """How much the rho-masks from every calibration profile (and from the weight-norm and random
    rules) agree with the reference profile's: Jaccard, overlap, chance levels, and the Spearman
    correlation of the saliency itself over all neurons (``nan`` for the non-activation rules)."""
    reference = reference or study.labels[0]
    sel = {lab_: study.select(lab_, rho) for lab_ in study.labels}
    sel["weight-norm"] = study.select(reference, rho, "weight-norm")
    sel["random"] = study.select(reference, rho, "random", seed=seed)
    ot = overlap_table(sel, reference)
    ref_scores = study.scores(reference)
    ot["spearman"] = [rank_agreement(ref_scores, study.scores(c)) if c in study.profiles else float("nan")
                      for c in ot.compared]
    ot["samples"] = [study.n_samples.get(c, np.nan) for c in ot.compared]
    return ot, sel
