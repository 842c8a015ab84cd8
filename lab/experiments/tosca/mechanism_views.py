"""The mechanism study's views: sentences, tables and plotly figures computed from
:mod:`.mechanism_results` (numbers and verdicts), and the study's README — notebook 02's sections 4–6
render them. Every figure has one quantity per axis and human labels; every sentence is computed.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from lab import stats

from .mechanism_results import (DEAD, LABELS, REFERENCE, Mechanism, alive, claims, correlation_tests, dead_from, iv,
                                l1_text, overlap_tests, per_run, stat, summary)

SCENARIO_NAMES = {"fashion_mnist_mini": "fashion_mnist_mini (5 tasks)",
                  "mnist_5k+fashion_mnist_mini": "mnist_5k → fashion_mnist_mini (10 tasks)"}


# --- sentences, computed ---------------------------------------------------------------------------
def _vs(lo: float, hi: float, what: str = "chance") -> str:
    d = stats.direction(lo, hi)
    return {"higher": f"more than {what}", "lower": f"less than {what}"}.get(d, f"no difference from {what} detected"
                                                                              if d != "not enough seeds" else d)


def _first(m: Mechanism, scenario: str, epochs: int, cond) -> float | None:
    s = summary_wide(m, scenario, epochs)
    hit = [l1 for l1, r in s.iterrows() if cond(r)]
    return hit[0] if hit else None


def summary_wide(m: Mechanism, scenario: str, epochs: int) -> pd.DataFrame:
    """One row per L1 (index) at ``epochs``: every measure's seed mean (columns)."""
    runs = per_run(m)
    g = runs[(runs.scenario == scenario) & (runs.epochs == epochs)]
    return g.drop(columns=["scenario", "seed", "epochs"]).groupby("l1").mean(numeric_only=True)


def sparsity_sentence(m: Mechanism, scenario: str) -> str:
    eps = sorted(m.runs.epochs.unique())
    parts = []
    for ep in eps:
        none, ref = stat(m, scenario, 0.0, ep, "weight_near_zero"), stat(m, scenario, REFERENCE[0], ep, "weight_near_zero")
        full = _first(m, scenario, ep, lambda r: r.weight_near_zero >= 0.99)
        parts.append(f"after {ep} epochs {iv(*none, 2)} without L1 and {iv(*ref, 2)} at the reference's "
                     f"{l1_text(REFERENCE[0])}" + (f", at least 0.99 from L1 {l1_text(full)} on" if full else ""))
    return ("Weight sparsity (the fraction of the four weight matrices' entries with |w| < 1e-3; biases and "
            "LayerNorm apart): " + "; ".join(parts) + ".")


def gates_sentence(m: Mechanism, scenario: str) -> str:
    eps = sorted(m.runs.epochs.unique())
    init = stats.t_interval(m.runs[m.runs.scenario == scenario].gate_departure_init.tolist())
    trained = []
    for ep in eps:
        g0, gr = stat(m, scenario, 0.0, ep, "gate_departure"), stat(m, scenario, REFERENCE[0], ep, "gate_departure")
        trained.append(f"{iv(*g0)} without L1 and {iv(*gr)} at L1 {l1_text(REFERENCE[0])} after {ep} epochs")
    sub = m.runs[m.runs.scenario == scenario]
    most = float(100 * max(sub.gate_open.max(), sub.gate_closed.max()))
    dead = [(ep, dead_from(m, scenario, ep)) for ep in eps]
    dead_txt = "; ".join(f"from L1 {l1_text(d)} at {ep} epochs" for ep, d in dead if d is not None)
    rest = sub[[not alive(m, scenario, l1, ep) for l1, ep in zip(sub.l1, sub.epochs)]]
    residue = (f" Even there a module keeps up to {rest.groupby(['l1', 'epochs']).active_size.mean().max():.0f} "
               f"dimensions (seed mean) whose gate departs 0.01 from 0.5: L1 shrinks every weight below 1e-3 without "
               f"setting them all to zero." if len(rest) and rest.active_size.max() > 0 else "")
    return (f"Gates start near the neutral 0.5 (mean |g − 0.5| of a freshly initialised module {iv(*init)}). Trained, "
            f"they sit {'; '.join(trained)}. No run opens or closes more than {most:.1f} % of its gates "
            f"(g > 0.9 or g < 0.1)"
            + (f". The gates die — seed-mean |g − 0.5| below {DEAD:g}, under {100 * DEAD / init[0]:.0f} % of a fresh "
               f"module's — {dead_txt}.{residue}" if dead_txt else ", and in no regime do the gates die."))


def overlap_sentence(m: Mechanism, scenario: str) -> str:
    ov = overlap_tests(m)
    ov = ov[ov.scenario == scenario]
    cl = claims(m)
    c = cl[(cl.scenario == scenario) & cl.claim.str.startswith("L1 makes")].iloc[0]
    bits = []
    for ep in sorted(ov.epochs.unique()):
        for l1 in (0.0, REFERENCE[0]):
            r = ov[(ov.epochs == ep) & np.isclose(ov.l1, l1)]
            if r.empty or r.iloc[0].seeds < 2:
                continue
            r = r.iloc[0]
            j, n = stat(m, scenario, l1, ep, "jaccard"), stat(m, scenario, l1, ep, "jaccard_null")
            band = (stat(m, scenario, l1, ep, "jaccard_null_lo")[0], stat(m, scenario, l1, ep, "jaccard_null_hi")[0])
            bits.append(f"L1 {l1_text(l1)}, {ep} epochs: Jaccard {iv(*j)} against chance {n[0]:.3f} "
                        f"(band {band[0]:.3f}–{band[1]:.3f}), {_vs(r.excess_lo, r.excess_hi)}"
                        + (f" ({j[0] / n[0]:.1f}x)" if n[0] > 0 and stats.direction(r.excess_lo, r.excess_hi) != "no difference detected" else ""))
    worst = ov[(ov.l1 > 0) & (ov.vs_chance == "contradicted")].sort_values("excess", ascending=False)
    extra = ""
    if len(worst):
        w = worst.iloc[0]
        extra = (f" The most overlap above chance: L1 {l1_text(w.l1)}, {w.epochs} epochs, Jaccard minus chance "
                 f"{iv(w.excess, w.excess_lo, w.excess_hi)} ({'more' if w.vs_none > 0 else 'less'} than without L1: "
                 f"{iv(w.vs_none, w.vs_none_lo, w.vs_none_hi)}).")
    return (f"Active-dimension overlap on {scenario} — " + "; ".join(bits) + "." + extra
            + f" Verdict on \"L1 makes the active dimensions overlap less than chance\": **{c.verdict}**"
            + (f" ({c.regimes})." if c.regimes else "."))


def cosine_sentence(m: Mechanism, scenario: str) -> str:
    ov = overlap_tests(m)
    ov = ov[(ov.scenario == scenario) & (ov.seeds >= 2)]
    words = {}
    for r in ov.itertuples():
        words.setdefault(_vs(r.cosine_lo, r.cosine_hi), []).append(f"L1 {l1_text(r.l1)}/{r.epochs} ep "
                                                                    f"{iv(r.cosine_excess, r.cosine_lo, r.cosine_hi)}")
    return ("Cosine of centred mean gates minus its chance value (dimensions shuffled), per regime: "
            + "; ".join(f"{k} at {', '.join(v)}" for k, v in words.items()) + ".")


def correlation_sentence(m: Mechanism, scenario: str) -> str:
    co = correlation_tests(m)
    co = co[co.scenario == scenario]
    cl = claims(m)
    c = cl[(cl.scenario == scenario) & cl.claim.str.startswith("less overlap")].iloc[0]
    bits = [f"{'routing accuracy' if r.metric == 'routing_accuracy' else 'A_B'} at {r.epochs} epochs "
            f"r = {iv(r.r, r.lo, r.hi, 2)} ({r.seeds} seeds)" for r in co.itertuples()]
    return ("Across L1 strengths, per seed, the correlation of the Jaccard excess over chance with " + "; ".join(bits)
            + f". Verdict on \"less overlap goes with higher routing accuracy or A_B\": **{c.verdict}**"
            + (f" ({c.regimes})." if c.regimes else "."))


def _seeded_ab(m: Mechanism, scenario: str, l1: float, epochs: int) -> pd.Series:
    g = m.runs[(m.runs.scenario == scenario) & np.isclose(m.runs.l1, l1) & (m.runs.epochs == epochs)]
    return g.set_index("seed").A_B


def tradeoff_sentence(m: Mechanism, scenario: str) -> str:
    out = []
    for ep in sorted(m.runs.epochs.unique()):
        s = summary_wide(m, scenario, ep)
        best = s.A_B.idxmax()
        lo_, hi_ = s.index.min(), s.index.max()
        ab = stat(m, scenario, best, ep, "A_B")
        a, b = _seeded_ab(m, scenario, best, ep), _seeded_ab(m, scenario, 0.0, ep)
        d = stats.paired(*(x.tolist() for x in a.align(b, join="inner")))
        vs = (f"; paired against no L1 {iv(*d, 1)}, {stats.direction(*d[1:])}" if best != 0 else "")
        out.append(f"at {ep} epochs A_B is highest at L1 {l1_text(best)} ({iv(*ab, 1)}; without L1 "
                   f"{iv(*stat(m, scenario, 0.0, ep, 'A_B'), 1)}{vs}); from L1 {l1_text(lo_)} to {l1_text(hi_)} the "
                   f"earlier tasks' accuracy goes {s.old_tasks_acc[lo_]:.1f} → {s.old_tasks_acc[hi_]:.1f} and the newest "
                   f"task's {s.new_task_acc[lo_]:.1f} → {s.new_task_acc[hi_]:.1f}, routing accuracy "
                   f"{s.routing_accuracy[lo_]:.1f} → {s.routing_accuracy[hi_]:.1f}")
    return f"Stability and plasticity on {scenario} (per-sample entropy routing, seed means): " + "; ".join(out) + "."


def plainly(m: Mechanism, scenario: str) -> str:
    """The verdict on the overlap claim in one plain sentence, with what the gates do instead."""
    c = claims(m)
    c = c[(c.scenario == scenario) & c.claim.str.startswith("L1 makes")].iloc[0]
    ep = REFERENCE[1]
    g0, gr = stat(m, scenario, 0.0, ep, "gate_departure")[0], stat(m, scenario, REFERENCE[0], ep, "gate_departure")[0]
    gates = (f"L1 pulls the gates toward 0.5 (mean |g − 0.5| {g0:.3f} without L1, {gr:.3f} at L1 "
             f"{l1_text(REFERENCE[0])}, {ep} epochs)")
    if c.verdict == "reproduced":
        return f"On {scenario} the claim holds at {c.regimes}; {gates}."
    if c.verdict == "contradicted":
        return (f"On {scenario}, at this scale, the claim holds nowhere: {gates}, and the dimensions whose gates "
                f"still move are shared by the tasks more than random sets of their size would be ({c.regimes}).")
    return f"On {scenario} the claim is not detected: {gates}, and no regime separates the tasks' dimensions from chance."


def headline(m: Mechanism) -> str:
    """One sentence per scenario: the two verdicts."""
    cl = claims(m)
    return " ".join(f"{s}: L1 makes active dimensions overlap less than chance — **{g.iloc[0].verdict}**"
                    + (f" ({g.iloc[0].regimes})" if g.iloc[0].regimes else "")
                    + f"; less overlap goes with better routing — **{g.iloc[1].verdict}**"
                    + (f" ({g.iloc[1].regimes})" if g.iloc[1].regimes else "") + "."
                    for s, g in cl.groupby("scenario", sort=False))


# --- tables ----------------------------------------------------------------------------------------
def regime_table(m: Mechanism, scenario: str) -> pd.DataFrame:
    """Per L1 and epochs: sparsity, gates, overlap against chance (with verdicts), accuracy; seed means
    with 95 % intervals."""
    ov = overlap_tests(m)
    rows = []
    for r in ov[ov.scenario == scenario].sort_values(["epochs", "l1"]).itertuples():
        def s(measure, d=3):
            return iv(*stat(m, scenario, r.l1, r.epochs, measure), d)
        band = (stat(m, scenario, r.l1, r.epochs, "jaccard_null_lo")[0], stat(m, scenario, r.l1, r.epochs, "jaccard_null_hi")[0])
        dead = not r.alive
        rows.append({"L1": l1_text(r.l1), "epochs": r.epochs, "weights near zero": s("weight_near_zero", 2),
                     "mean |g − 0.5|": s("gate_departure"),
                     "gates open / closed (%)": f"{100 * stat(m, scenario, r.l1, r.epochs, 'gate_open')[0]:.1f} / "
                                                f"{100 * stat(m, scenario, r.l1, r.epochs, 'gate_closed')[0]:.1f}",
                     "active dims per task": f"{r.active_size:.0f}",
                     "Jaccard": "gates dead" if dead else s("jaccard") if r.seeds >= 2 else "n/a",
                     "chance [95 % band]": "" if dead else f"{stat(m, scenario, r.l1, r.epochs, 'jaccard_null')[0]:.3f} "
                                                           f"[{band[0]:.3f}, {band[1]:.3f}]",
                     "vs chance": "" if dead else _vs(r.excess_lo, r.excess_hi),
                     "vs no L1": "" if dead or r.l1 == 0 else _vs(r.vs_none_lo, r.vs_none_hi, "without L1"),
                     "cosine − chance": "" if dead else iv(r.cosine_excess, r.cosine_lo, r.cosine_hi),
                     "routing acc. (%)": s("routing_accuracy", 1), "A_B (%)": s("A_B", 1),
                     "earlier / newest task (%)": f"{stat(m, scenario, r.l1, r.epochs, 'old_tasks_acc')[0]:.1f} / "
                                                  f"{stat(m, scenario, r.l1, r.epochs, 'new_task_acc')[0]:.1f}"})
    return pd.DataFrame(rows)


def parts_table(m: Mechanism, scenario: str, epochs: int) -> pd.DataFrame:
    """Per L1: each part's fraction of entries with |w| < 1e-3 (seed means), weights and biases apart."""
    p = m.parts[(m.parts.scenario == scenario) & (m.parts.epochs == epochs)]
    t = p.groupby(["l1", "kind", "part"], sort=False).near_zero.mean().unstack(["kind", "part"])
    t.index = [l1_text(x) for x in t.index]
    t.columns = [f"{part} ({kind})" for kind, part in t.columns]
    return t.round(3).rename_axis("L1").reset_index()


# --- figures (plotly; one quantity per axis) -------------------------------------------------------
def _per_l1(m: Mechanism, scenario: str, measure: str) -> pd.DataFrame:
    s = summary(m)
    s = s[(s.scenario == scenario) & (s.measure == measure)].copy()
    s["L1"] = s.l1.map(l1_text)
    return s


def measure_figure(m: Mechanism, scenario: str, measure: str, *, title: str, y_range=None, hline=None):
    """One measure against L1 (categorical axis), one line per training length, 95 % intervals."""
    import plotly.graph_objects as go

    s = _per_l1(m, scenario, measure)
    fig = go.Figure()
    for ep, g in s.groupby("epochs"):
        g = g.sort_values("l1")
        fig.add_trace(go.Scatter(x=g.L1, y=g["mean"], mode="lines+markers", name=f"{ep} epochs per task",
                                 error_y=dict(type="data", symmetric=False, array=(g.hi - g["mean"]).fillna(0),
                                              arrayminus=(g["mean"] - g.lo).fillna(0))))
    if hline is not None:
        fig.add_hline(y=hline[0], line_dash="dot", annotation_text=hline[1])
    fig.update_layout(title=title, height=400, xaxis_title="L1 strength", yaxis_title=LABELS.get(measure, measure),
                      legend_title_text="training length")
    fig.update_xaxes(type="category")
    if y_range:
        fig.update_yaxes(range=y_range)
    return fig


def overlap_figure(m: Mechanism, scenario: str):
    """Observed Jaccard index of active dimensions against the permutation null's mean and 95 % band,
    per L1, one panel per training length."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    eps = sorted(m.runs.epochs.unique())
    fig = make_subplots(rows=1, cols=len(eps), shared_yaxes=True, subplot_titles=[f"{e} epochs per task" for e in eps])
    obs, null = _per_l1(m, scenario, "jaccard"), _per_l1(m, scenario, "jaccard_null")
    lo, hi = _per_l1(m, scenario, "jaccard_null_lo"), _per_l1(m, scenario, "jaccard_null_hi")
    dead = [not alive(m, scenario, l1, ep) for l1, ep in zip(obs.l1, obs.epochs)]
    obs.loc[dead, ["mean", "lo", "hi"]] = np.nan                # gates dead: nothing selected, no point
    for k, ep in enumerate(eps, start=1):
        o = obs[obs.epochs == ep].sort_values("l1")
        n, a, b = (d[d.epochs == ep].sort_values("l1") for d in (null, lo, hi))
        x, live = o.L1.tolist(), o["mean"].notna().to_numpy()
        xl = [v for v, keep in zip(x, live) if keep]                      # chance only where gates select
        fig.add_trace(go.Scatter(x=xl + xl[::-1], y=b["mean"][live].tolist() + a["mean"][live].tolist()[::-1],
                                 fill="toself", mode="lines", line=dict(width=0), fillcolor="rgba(120,120,120,0.25)",
                                 name="chance: 95 % band", showlegend=k == 1, hoverinfo="skip"), row=1, col=k)
        fig.add_trace(go.Scatter(x=xl, y=n["mean"][live], mode="lines", line=dict(dash="dash", color="grey"),
                                 name="chance: mean (same set sizes at random)", showlegend=k == 1), row=1, col=k)
        fig.add_trace(go.Scatter(x=x, y=o["mean"], mode="lines+markers", line=dict(color="#d62728"),
                                 name="observed (mean over seeds, 95 % interval)", showlegend=k == 1,
                                 error_y=dict(type="data", symmetric=False, array=(o.hi - o["mean"]).fillna(0),
                                              arrayminus=(o["mean"] - o.lo).fillna(0))), row=1, col=k)
        fig.update_xaxes(type="category", title_text="L1 strength", row=1, col=k)
    fig.update_yaxes(title_text="Jaccard index of active dimensions", row=1, col=1)
    fig.update_layout(height=430, title=f"{scenario}: do tasks share active gate dimensions more or less than "
                                        "chance? (no point: gates dead)", legend=dict(orientation="h", y=-0.25))
    return fig


def stability_plasticity_figure(m: Mechanism, scenario: str):
    """Accuracy on the earlier tasks against accuracy on the newest one at the last stage, one point per
    L1 strength (labelled), one line per training length, 95 % intervals both ways."""
    import plotly.graph_objects as go

    old, new = _per_l1(m, scenario, "old_tasks_acc"), _per_l1(m, scenario, "new_task_acc")
    fig = go.Figure()
    for ep in sorted(old.epochs.unique()):
        o, n = (d[d.epochs == ep].sort_values("l1") for d in (old, new))
        labels = [f"L1 {t}" if i in (0, len(o) - 1) or l1 >= 2e-3 else "" for i, (t, l1) in enumerate(zip(o.L1, o.l1))]
        fig.add_trace(go.Scatter(x=n["mean"], y=o["mean"], mode="lines+markers+text", name=f"{ep} epochs per task",
                                 text=labels, textposition="top right", hovertext=[f"L1 {t}" for t in o.L1],
                                 error_x=dict(type="data", symmetric=False, array=(n.hi - n["mean"]).fillna(0),
                                              arrayminus=(n["mean"] - n.lo).fillna(0)),
                                 error_y=dict(type="data", symmetric=False, array=(o.hi - o["mean"]).fillna(0),
                                              arrayminus=(o["mean"] - o.lo).fillna(0))))
    fig.update_layout(title=f"{scenario}: TOSCA's stability–plasticity curve as L1 grows (last stage, per-sample "
                            "entropy routing)", height=460, xaxis_title=LABELS["new_task_acc"],
                      yaxis_title=LABELS["old_tasks_acc"], legend_title_text="training length",
                      xaxis_range=(0, 101), yaxis_range=(0, 101))
    return fig


def heatmap_frame(m: Mechanism, scenario: str, l1: float, epochs: int, seed: int | None = None) -> pd.DataFrame:
    """Task x dimension: the centred mean gate (mean gate − 0.5) where the dimension is active for the
    task, NaN elsewhere; columns are the dimensions active in at least one task, those shared by more
    tasks first."""
    seed = m.seeds[0] if seed is None else seed
    g = m.modules[(m.modules.scenario == scenario) & np.isclose(m.modules.l1, l1) & (m.modules.epochs == epochs)
                  & (m.modules.seed == seed)].sort_values("task")
    cells = {}
    for r in g.itertuples():
        for d, v in zip(r.active_dims.split(), r.active_gates.split()):
            cells.setdefault(int(d), {})[int(r.task)] = float(v)
    order = sorted(cells, key=lambda d: (-len(cells[d]), min(cells[d]), d))
    return pd.DataFrame({d: [cells[d].get(t, np.nan) for t in g.task] for d in order},
                        index=[f"task {t}" for t in g.task])


def heatmap_figure(m: Mechanism, scenario: str, l1: float, epochs: int, seed: int | None = None):
    import plotly.express as px

    seed = m.seeds[0] if seed is None else seed
    f = heatmap_frame(m, scenario, l1, epochs, seed)
    shared = int((f.notna().sum() > 1).sum())
    fig = px.imshow(f.to_numpy(), x=[str(c) for c in f.columns], y=list(f.index), color_continuous_scale="RdBu_r",
                    zmin=-0.5, zmax=0.5, aspect="auto",
                    labels=dict(x="feature dimension (active in some task; shared ones first)", y="task module",
                                color="mean gate − 0.5"))
    fig.update_xaxes(type="category", showticklabels=False)
    fig.update_layout(height=360, title=f"{scenario}, L1 {l1_text(l1)}, {epochs} epochs, seed {seed}: active gates "
                                        f"per task ({f.shape[1]} dimensions, {shared} active in two tasks or more)")
    return fig


# --- the README and the derived tables --------------------------------------------------------------
def _md(df: pd.DataFrame) -> str:
    def cell(v) -> str:
        return str(v).replace("|", "\\|")     # |g − 0.5| inside a markdown table

    cols = list(df.columns)
    return "\n".join(["| " + " | ".join(map(cell, cols)) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)])


def readme(m: Mechanism) -> str:
    man = m.manifest
    mac = man["machine"]
    meas = man["measures"]
    parts = ["# TOSCA's mechanism, measured", "",
             "Generated by `python -m lab.experiments.tosca.mechanism_views` from the tables in this folder (do not "
             "edit); notebook 02 (sections 4–6) renders the same numbers with figures.", "",
             f"`{man['command']}`: TOSCA (efficientnet_lite0 cached features, B0 Inc2, the reference's initialisation "
             f"and optimiser) on {', '.join(m.scenarios)}, {len(m.seeds)} seeds ({m.seeds[0]}–{m.seeds[-1]}, each its "
             f"own class order), L1 {', '.join(l1_text(x) for x in man['l1'])}, {', '.join(map(str, man['epochs']))} "
             f"epochs per task: {man['runs']} runs, {man['wall_seconds'] / 60:.0f} min wall time on {mac['platform']} "
             f"({mac['cpus']} CPUs; one process, {mac['torch_threads']} torch thread), "
             f"{man['date']}. Intervals: {stats.KIND}.", "",
             "Measured per task module on its own task's training images (no test image describes a module): the "
             f"fraction of the four weight matrices' entries with |w| < {meas['threshold']:g} (adapter and calibrator, "
             "down and up; biases and LayerNorm apart, in `parts.csv`); the calibrator gate g's mean |g − 0.5| (with its "
             "weights at zero a gate is 0.5, where L1 pulls it) and the fractions of gates open (g > "
             f"{meas['open']:g}) and closed (g < {meas['closed']:g}); the active dimensions, the {meas['top'] * 100:.0f} % of "
             f"dimensions with the largest |mean gate − 0.5| among those departing at least {meas['active_min']:g}; "
             "and for every task pair the Jaccard index of active sets and the cosine of centred mean gates, each "
             f"against a permutation null of {meas['null_draws']} draws (random sets of the same sizes; each vector's "
             "dimensions shuffled). Accuracies on the test split at the last stage, per-sample entropy routing.", "",
             "## Verdicts", "", headline(m), "", " ".join(plainly(m, s) for s in m.scenarios), "",
             _md(claims(m).rename(columns={"regimes": "where"}))]
    for scn in m.scenarios:
        parts += ["", f"## {SCENARIO_NAMES.get(scn, scn)}", "", sparsity_sentence(m, scn), "", gates_sentence(m, scn),
                  "", overlap_sentence(m, scn), "", cosine_sentence(m, scn), "", correlation_sentence(m, scn), "",
                  tradeoff_sentence(m, scn), "", _md(regime_table(m, scn))]
    return "\n".join(parts) + "\n"


def live_sentence(run: dict, *, seed: int, l1: float, epochs: int) -> str:
    """This notebook's run (one seed) measured as the study measures a run, in words."""
    def val(k, d=3):
        v = run.get(k, float("nan"))
        return "n/a" if not math.isfinite(v) else f"{v:.{d}f}"

    head = f"This notebook's run (one seed, {seed}; L1 {l1_text(l1)}, {epochs} epochs)"
    if run.get("gate_departure", 0.0) < DEAD:
        return (f"{head}: the gates are dead (mean |g − 0.5| {val('gate_departure', 4)}, below {DEAD:g}), so they "
                f"select no dimensions and there is no overlap to measure.")
    if not math.isfinite(run.get("jaccard", float("nan"))):
        return (f"{head}: no two modules keep an active dimension (every gate within 0.01 of 0.5; mean |g − 0.5| "
                f"{val('gate_departure')}), so there is no overlap to measure.")
    where = ("above" if run["jaccard"] > run["jaccard_null_hi"] else
             "below" if run["jaccard"] < run["jaccard_null_lo"] else "inside")
    return (f"{head}: weight-matrix entries near zero {val('weight_near_zero', 2)}; mean |g − 0.5| "
            f"{val('gate_departure')} (at initialisation {val('gate_departure_init')}); Jaccard of active dimensions "
            f"{val('jaccard')} against chance {val('jaccard_null')} — {where} the null's 95 % band "
            f"[{val('jaccard_null_lo')}, {val('jaccard_null_hi')}]; cosine of centred mean gates {val('cosine')} "
            f"(chance band [{val('cosine_null_lo')}, {val('cosine_null_hi')}]). One seed: the study's intervals "
            f"above say how far another seed moves these.")


def write_derived(folder=None) -> Path:
    """``summary.csv``, ``verdicts.csv`` and ``README.md`` in ``folder`` from its tables, atomically."""
    from lab import _io

    from .mechanism_results import load, summary, verdicts

    m = load(folder)
    for name, df in (("summary.csv", summary(m)), ("verdicts.csv", verdicts(m))):
        _io.atomic_write(m.folder / name, lambda p, df=df: df.to_csv(p, index=False, float_format="%.4f"))
    text = readme(m)
    _io.atomic_write(m.folder / "README.md", lambda p: p.write_text(text))
    return m.folder


if __name__ == "__main__":
    import sys

    from . import mechanism_results as MR

    args = [a for a in sys.argv[1:] if a != "--check"]
    if "--check" in sys.argv[1:]:
        raise SystemExit(0 if MR.check(MR.load(args[0] if args else None)) else 1)
    print("wrote", write_derived(args[0] if args else None))
