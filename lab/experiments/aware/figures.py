"""Plotly figures over saliency vectors and masks for notebook 03 (built on
:mod:`lab.experiments.aware.tables`; "x uniform" units explained there).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from torch import Tensor

from lab.experiments.aware.tables import MAIN_TARGETS, density, frozen_table, layer_table, lorenz, relative, targets_in


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


def saliency_heatmaps(scores: Mapping[str, Tensor], targets=MAIN_TARGETS, *, sort: bool = False,
                      masks: Mapping[str, Tensor] | None = None, title: str = "", height: int | None = None):
    """Layer x neuron heatmaps, one panel per target, colour = log10 of "x uniform" saliency
    (``masks`` given: 1 where a row is frozen instead). ``sort``: neurons ordered by saliency
    within each layer (rank on x), which makes the heavy tail visible at a glance."""
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
                        subplot_titles=[f"{t} ({grids[t][0].shape[0]} layers x {grids[t][0].shape[1]} neurons)"
                                        for t in targets])
    for i, t in enumerate(targets, 1):
        g, layers = grids[t]
        fig.add_trace(go.Heatmap(z=g.astype(np.float32), y=[str(x) for x in layers], coloraxis="coloraxis",
                                 hovertemplate="layer %{y}<br>neuron %{x}<br>%{z}<extra>" + t + "</extra>"), i, 1)
        fig.update_yaxes(title_text="layer", type="category", row=i, col=1)
        if i == len(targets):
            fig.update_xaxes(title_text="neuron, most salient first" if sort else "neuron", row=i, col=1)
    if masks is None:
        # symmetric around 0 (= an equal share) and wide enough for the 99.9th percentile
        vals = np.concatenate([g[np.isfinite(g)] for g, _ in grids.values()])
        lim = float(max(np.quantile(np.abs(vals), 0.999), 0.1)) if vals.size else 1.0
        color = dict(colorscale="RdBu_r", cmid=0, cmin=-lim, cmax=lim,
                     colorbar=dict(title="log10<br>x equal<br>share"))
    else:
        color = dict(colorscale=[[0, "#f0f0f0"], [1, "#c0392b"]], cmin=0, cmax=1,
                     colorbar=dict(title="frozen", tickvals=[0, 1], ticktext=["trained", "frozen"]))
    fig.update_layout(coloraxis=color, title=title, height=height or 160 + 14 * sum(heights) + 60 * len(targets),
                      margin=dict(t=80))
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
    """Fraction of each layer's rows frozen, one line per target, one panel per selection."""
    import pandas as pd
    import plotly.express as px

    df = pd.concat([frozen_table(m).assign(selection=k) for k, m in selections.items()])
    df = df[df.target.isin(targets)]
    fig = px.line(df, x="layer", y="fraction", color="target", facet_col="selection", markers=True,
                  range_y=(-0.02, 1.02), title=title or "Which layers the selection freezes",
                  hover_data=["frozen", "rows"])
    fig.update_layout(height=380, yaxis_title="frozen fraction of the layer's rows")
    fig.for_each_annotation(lambda a: a.update(text=a.text.partition("=")[2]))
    return fig


def mask_image(masks: Mapping[str, Tensor], targets=MAIN_TARGETS, title: str = ""):
    """Frozen rows as layer x neuron maps (red = frozen), one panel per target."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    n = int(frozen_table(masks).target.isin(targets).sum())
    return saliency_heatmaps(masks, targets, masks=masks, title=title or f"frozen rows of {', '.join(targets)}",
                             height=200 + 12 * n + 60 * len(targets))


def calibration_size_figure(agreement, title: str = ""):
    """Jaccard with the reference mask against calibration-set size (nested upstream sets), with the
    proxy set and the chance level as reference lines."""
    import plotly.graph_objects as go

    ref = agreement.reference.iloc[0]
    kind = ref.split("-")[0]
    nested = agreement[agreement.compared.str.startswith(kind + "-")].sort_values("samples")
    fig = go.Figure(go.Scatter(x=nested.samples, y=nested.jaccard, mode="lines+markers", name=f"first n {kind} samples"))
    for r in agreement[~agreement.compared.str.startswith(kind + "-")].itertuples():
        fig.add_hline(y=r.jaccard, line_dash="dash", annotation_text=r.compared, annotation_position="top left",
                      line_color="#e67e22" if r.compared.startswith("proxy") else "#7f8c8d")
    fig.add_hline(y=float(agreement.chance_jaccard.iloc[0]), line_dash="dot", line_color="black",
                  annotation_text="chance", annotation_position="bottom left")
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
