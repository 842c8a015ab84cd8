"""Plotly figures over saliency vectors and masks for notebook 03 (built on
:mod:`lab.experiments.aware.study.profile_tables`; "x uniform" units explained there).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from torch import Tensor

from lab.experiments.aware.study.profile_tables import (MAIN_TARGETS, density, frozen_table, layer_table, lorenz,
                                                       relative, targets_in)


def _grid(scores: Mapping[str, Tensor], target: str, *, sort: bool, values=None) -> tuple[np.ndarray, list[int]]:
    """``[layers, max d_out]`` of one target (NaN-padded), rows in layer order."""
    lt = layer_table(scores)
    lt = lt[lt.target == target].sort_values("layer")
    if lt.empty:
        raise ValueError(f"no layers of target {target!r}; have {sorted(set(layer_table(scores).target))}")
    width = int(lt.d_out.max())
    out = np.full((len(lt), width), np.nan)
    for i, name in enumerate(lt.name):
        row = relative(scores[name]) if values is None else np.asarray(values[name], dtype=float)
        out[i, : row.size] = -np.sort(-row) if sort else row
    return out, lt.layer.tolist()


FROZEN_COLOURS = {"trainable": "#d9d9d9", "frozen": "#c0392b"}   # the two states of a mask, everywhere


def layer_labels(target: str, layers) -> list[str]:
    """Row labels of one target's layers: the language model's layer numbers, and for the projector
    its own Linears (``projector Linear 1``, ...), so they never read as language-model layers."""
    if target == "projector":
        return [f"projector Linear {int(x) + 1}" for x in layers]
    return [str(x) for x in layers]


def _legend_swatches(fig, colours: Mapping[str, str]):
    """Legend entries for a discrete heatmap: one square marker per state (no data drawn)."""
    import plotly.graph_objects as go

    for name, colour in colours.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                                 marker=dict(symbol="square", size=14, color=colour), hoverinfo="skip"))


def saliency_heatmaps(scores: Mapping[str, Tensor], targets=MAIN_TARGETS, *, sort: bool = False,
                      masks: Mapping[str, Tensor] | None = None, title: str = "", height: int | None = None):
    """Layer x neuron heatmaps, one panel per target, colour = log10 of "x uniform" saliency
    (``masks`` given: two discrete colours instead, trainable / frozen, with a legend and no colour
    bar). ``sort``: neurons ordered by saliency within each layer (rank on x), which makes the heavy
    tail visible at a glance. The projector's panel labels its rows by its own Linears, never by a
    language-model layer number."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    wanted, targets = targets, targets_in(scores, targets)
    if not targets:
        raise ValueError(f"no layers of target {list(wanted)}; have {sorted(set(layer_table(scores).target))}")
    grids = {}
    for t in targets:
        if masks is None:
            g, layers = _grid(scores, t, sort=sort)
            g = np.round(np.log10(np.clip(g, 1e-3, None)), 3)
        else:
            g, layers = _grid(scores, t, sort=False, values={n: masks[n].float().numpy() for n in masks})
        grids[t] = (g, layers)
    heights = [max(len(l), 3) for _, l in grids.values()]
    fig = make_subplots(rows=len(targets), cols=1, row_heights=heights, vertical_spacing=0.1 if len(targets) > 1 else 0.05,
                        subplot_titles=[f"{t} ({grids[t][0].shape[0]} {'Linears' if t == 'projector' else 'layers'} x "
                                        f"{grids[t][0].shape[1]} neurons)" for t in targets])
    for i, t in enumerate(targets, 1):
        g, layers = grids[t]
        what = "%{z} (1 = frozen, 0 = trainable)" if masks is not None else "log10 x equal share %{z}"
        row = "%{y}" if t == "projector" else "layer %{y}"
        fig.add_trace(go.Heatmap(z=g.astype(np.float32), y=layer_labels(t, layers), coloraxis="coloraxis",
                                 hovertemplate=f"{row}<br>neuron %{{x}}<br>{what}<extra>{t}</extra>"), i, 1)
        fig.update_yaxes(title_text="Linear" if t == "projector" else "layer", type="category", row=i, col=1)
        if i == len(targets):
            fig.update_xaxes(title_text="neuron, most salient first" if sort else "neuron", row=i, col=1)
    if masks is None:
        # symmetric around 0 (= an equal share) and wide enough for the 99.9th percentile
        vals = np.concatenate([g[np.isfinite(g)] for g, _ in grids.values()])
        lim = float(max(np.quantile(np.abs(vals), 0.999), 0.1)) if vals.size else 1.0
        color = dict(colorscale="RdBu_r", cmid=0, cmin=-lim, cmax=lim,
                     colorbar=dict(title="log10<br>x equal<br>share"))
    else:   # a binary mask: two flat colours split at 0.5 (no gradient, no colour bar) and a legend
        lo, hi = FROZEN_COLOURS["trainable"], FROZEN_COLOURS["frozen"]
        color = dict(colorscale=[[0, lo], [0.5, lo], [0.5, hi], [1, hi]], cmin=0, cmax=1, showscale=False)
        _legend_swatches(fig, FROZEN_COLOURS)
    fig.update_layout(coloraxis=color, title=title, height=height or 160 + 14 * sum(heights) + 60 * len(targets),
                      margin=dict(t=80))
    if masks is not None:
        fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1,
                                      title_text="row "))
    return fig


def lorenz_figure(scores: Mapping[str, Tensor], title: str = ""):
    from lab import plots

    fig = plots.lines(lorenz(scores), x="neuron_frac", y="energy_share", color="target", range_y=(0, 1.01),
                      x_title="fraction of a layer's neurons (most salient first)",
                      y_title="share of activation energy", title=title or "How few neurons carry the activation mass")
    fig.update_traces(marker=dict(size=2))
    fig.for_each_trace(lambda tr: tr.update(line=dict(dash="dot", color="grey")) if tr.name == "uniform" else None)
    return fig


def density_figure(scores: Mapping[str, Tensor], title: str = ""):
    from lab import plots

    fig = plots.lines(density(scores), x="log10_x_uniform", y="density", color="target",
                      x_title="log10 saliency (x uniform share; 0 = an equal share)", y_title="density",
                      title=title or "Distribution of neuron saliency per target (all layers pooled)")
    fig.update_traces(marker=dict(size=3))
    fig.add_vline(x=0, line_dash="dot", line_color="grey")
    return fig


def frozen_by_layer(selections: Mapping[str, Mapping[str, Tensor]], targets=MAIN_TARGETS, title: str = ""):
    """Percent of each layer's rows frozen, one line per target, one row of panels per selection.
    The projector's Linears get a panel of their own beside the language model's layers (they come
    before the language model; their numbers are not language-model layers)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from lab.experiments.aware.study.profile_tables import ALL_TARGETS

    palette = dict(zip(ALL_TARGETS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")))
    per = {k: frozen_table(m) for k, m in selections.items()}
    per = {k: ft[ft.target.isin(targets)] for k, ft in per.items()}
    proj = any((ft.target == "projector").any() for ft in per.values())
    lm = any((ft.target != "projector").any() for ft in per.values())
    cols = [c for c, ok in (("projector", proj), ("language model", lm)) if ok] or ["language model"]
    names = list(selections)
    fig = make_subplots(rows=len(names), cols=len(cols), shared_yaxes=True, horizontal_spacing=0.04,
                        vertical_spacing=0.12 if len(names) > 1 else 0.05,
                        column_widths=[0.16, 0.84] if len(cols) == 2 else None,
                        subplot_titles=["projector" if c == "projector" else f"{k}: language-model layers"
                                        for k in names for c in cols])
    seen = set()
    for i, k in enumerate(names, 1):
        ft = per[k]
        for t in [t for t in ALL_TARGETS if t in set(ft.target)]:
            d = ft[ft.target == t].sort_values("layer")
            col = cols.index("projector" if t == "projector" else "language model") + 1
            x = [f"Linear {int(n) + 1}" for n in d.layer] if t == "projector" else d.layer   # the panel says projector
            fig.add_trace(go.Scatter(x=x, y=100 * d.fraction, mode="lines+markers", name=t, legendgroup=t,
                                     showlegend=t not in seen, line=dict(color=palette.get(t)),
                                     customdata=np.stack([d.frozen, d.rows], axis=-1),
                                     hovertemplate="%{x}: %{y:.1f}% frozen (%{customdata[0]} of %{customdata[1]} rows)"
                                                   f"<extra>{t}</extra>"), i, col)
            seen.add(t)
        fig.update_yaxes(range=(-2, 102), row=i, col=1, title_text="% of rows frozen")
        if "projector" in cols:
            fig.update_xaxes(type="category", row=i, col=1)
    fig.update_xaxes(title_text="language-model layer", row=len(names), col=len(cols))
    fig.update_layout(title=title or "Which layers the selection freezes", height=200 + 220 * len(names),
                      legend_title_text="target")
    return fig


def mask_image(masks: Mapping[str, Tensor], targets=MAIN_TARGETS, title: str = ""):
    """Frozen rows as layer x neuron maps (red = frozen), one panel per target."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    n = int(frozen_table(masks).target.isin(targets).sum())
    return saliency_heatmaps(masks, targets, masks=masks, title=title or f"frozen rows of {', '.join(targets)}",
                             height=200 + 12 * n + 60 * len(targets))


def calibration_size_figure(agreement, title: str = ""):
    """Jaccard with the reference mask against calibration-set size (nested upstream sets), with the
    proxy set, the other rules and the chance level as reference lines — legend entries carrying
    their values, not text on the plot (the random rule's line lies on the chance line)."""
    import plotly.graph_objects as go

    ref = agreement.reference.iloc[0]
    kind = ref.split("-")[0]
    nested = agreement[agreement.compared.str.startswith(kind + "-")].sort_values("samples")
    fig = go.Figure(go.Scatter(x=nested.samples, y=nested.jaccard, mode="lines+markers", name=f"first n {kind} samples",
                               hovertemplate="n = %{x}: Jaccard %{y:.3f}<extra></extra>"))
    xs = [float(nested.samples.min()), float(nested.samples.max())] if len(nested) else [1.0, 2.0]
    refs = [(r.compared, float(r.jaccard), "#e67e22" if r.compared.startswith("proxy") else "#7f8c8d", "dash")
            for r in agreement[~agreement.compared.str.startswith(kind + "-")].itertuples()]
    refs.append(("chance (two random masks)", float(agreement.chance_jaccard.iloc[0]), "black", "dot"))
    for name, y, colour, dash in refs:
        fig.add_scatter(x=xs, y=[y, y], mode="lines", name=f"{name}: {y:.2f}", line=dict(color=colour, dash=dash),
                        hovertemplate=f"{name}: Jaccard {y:.3f}<extra></extra>")
    fig.update_layout(title=title or f"How many calibration samples does the mask need? (Jaccard with {ref})",
                      xaxis_title="calibration samples", yaxis_title="Jaccard with the reference mask",
                      xaxis_type="log", yaxis_range=(0, 1.02), height=400)
    fig.update_xaxes(tickvals=list(nested.samples), ticktext=[str(int(n)) for n in nested.samples])
    return fig


def layer_profile(scores: Mapping[str, Tensor], name: str, frozen: Tensor | None = None, title: str = ""):
    """One layer's neurons sorted by saliency ("x uniform", log y), frozen ones in red."""
    import plotly.graph_objects as go

    v = relative(scores[name])
    order = np.argsort(-v)
    colors = None if frozen is None else np.where(frozen.bool().numpy()[order], "#c0392b", "#7f8c8d")
    fig = go.Figure(go.Bar(x=np.arange(v.size), y=v[order], marker_color=colors,
                           customdata=order, hovertemplate="rank %{x}<br>neuron %{customdata}<br>%{y:.2f}x<extra></extra>"))
    fig.add_hline(y=1, line_dash="dot", line_color="grey")
    fig.update_layout(title=title or name, height=320, bargap=0, xaxis_title="neurons, most salient first",
                      yaxis_title="saliency (x uniform)", yaxis_type="log")
    return fig
