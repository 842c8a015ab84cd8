"""Tables and plotly figures for notebook 04 (AWARe ablations): a sweep's results as R/E/H bars,
the rho trade-off, the continual sequence, the noise table and the findings in words.

Thin layer over :mod:`lab.experiments.aware.run.ablate` (which trains and scores) and :mod:`lab.experiments.aware.study.results`
(which loads a saved run): :func:`load_run`, :func:`sweep_size`, :func:`run_sweep`,
:func:`summary`, :func:`rhe_bars`, :func:`tradeoff`, :func:`rho_curves`, :func:`continual_figure`,
:func:`continual_bars`, :func:`noise_table`, :func:`findings`, :func:`describe_ablation`.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

_RULE_SHORT = {"activation-global": "global", "activation-balanced": "balanced"}


def load_run(run_dir) -> dict:
    """A saved ``lab aware ablate`` run (``'latest'``: the newest): see :func:`lab.experiments.aware.study.results.load_run`."""
    from lab.experiments.aware.study.results import load_run as _load

    return _load(run_dir)


def sweep_size(base: str = "default", *, n_align=None, align=None, **kw):
    """A :class:`lab.experiments.aware.run.context.Size` from a preset with some fields replaced; ``steps`` /
    ``batch_size`` / ``lr*`` go to its ``TrainConfig`` (``None`` keeps the preset's). Keep
    ``n_align``/``align`` at the preset's to reuse the cached aligned projector."""
    from lab.experiments.aware.run.context import SIZES

    size = SIZES[base]
    train_kw = {k: kw.pop(k) for k in ("steps", "batch_size", "lr", "lr_aware", "lr_projector", "lr_adapter") if k in kw}
    train_kw = {k: v for k, v in train_kw.items() if v is not None}       # None: the preset's
    size = replace(size, train=replace(size.train, **train_kw), **kw)
    if n_align is not None:
        size = replace(size, n_align=n_align)
    if align is not None:
        size = replace(size, align=align)
    return size


_COLS = ["downstream", "up_easy_vqa", "up_probe", "R", "E", "H", "trainable_frac"]


def _reference_first(results):
    """Each group's reference row (the main AWARe run, repeated by the runner with ``shared=True``)
    first, labelled with its real calibration size."""
    df = results.copy()
    shared = df["shared"].eq(True).to_numpy() if "shared" in df else np.zeros(len(df), bool)   # NaN: not shared
    fix = shared & (df.group == "calib_size")
    df.loc[fix, "variant"] = [f"n={int(n)}" for n in df.loc[fix, "calib_n"]]
    groups = list(dict.fromkeys(df.group))
    df["_g"] = df.group.map({g: i for i, g in enumerate(groups)})
    # within a group: rho and calibration size in numeric order, otherwise the reference first
    df["_k"] = np.where(df.group == "rho", df.get("rho", np.nan),
                        np.where(df.group == "calib_size", df.get("calib_n", 0), (~shared).astype(float)))
    return df.sort_values(["_g", "_k"], kind="stable").drop(columns=["_g", "_k"])


def summary(results, group: str | None = None):
    """Mean over seeds per (group, variant), in sweep order with each group's reference first."""
    df = _reference_first(results)
    df = df if group is None else df[df.group == group]
    g = df.groupby(["group", "variant"], sort=False)
    out = g[[c for c in _COLS if c in df.columns]].mean()
    out["seeds"] = g["seed"].nunique()
    return out.reset_index()


def _not_run(what: str, title: str):
    """A placeholder figure saying that a part of the sweep is not in this run (and how to get it)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=f"{what} is not in this run: add it to 'groups', or set 'run_dir'<br>"
                            f"to a run of 'lab aware ablate' that has it",
                       showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14))
    fig.update_layout(title=title, height=220, xaxis_visible=False, yaxis_visible=False)
    return fig


def rhe_bars(results, group: str, title: str = ""):
    """R, E and H per variant of one ablation group (mean over seeds; 100 = no forgetting /
    as good as full fine-tuning)."""
    from lab import plots

    title = title or f"{group}: retention R, efficiency E and their harmonic mean H"
    s = summary(results, group)
    if len(s) < 2:              # only the shared reference row: the group was not swept
        return _not_run(f"the '{group}' ablation", title)
    long = s.melt(id_vars=["variant"], value_vars=["R", "E", "H"], var_name="metric", value_name="percent")
    fig = plots.grouped_bar(long, x="variant", y="percent", color="metric", fmt=".1f", title=title)
    fig.add_hline(y=100, line_dash="dot", line_color="grey")
    return fig


def tradeoff(results, title: str = ""):
    """The R/E trade-off: the rho sweep as a curve (E on x, R on y), the other methods as points."""
    import plotly.express as px
    import plotly.graph_objects as go

    s = summary(results)
    rho = s[s.group == "rho"].copy()
    rho["rho"] = rho.variant.str.replace("rho=", "").astype(float)
    rho = rho.sort_values("rho")
    # no text on the points (close ones, e.g. LoRA and DoRA, would print over each other): rho is the
    # markers' colour, every method a legend entry, the numbers in the hover text
    fig = go.Figure(go.Scatter(x=rho.E, y=rho.R, mode="lines+markers", name="AWARe, rho sweep (colour: ρ)",
                               marker=dict(size=10, color=rho.rho, colorscale="Viridis",
                                           colorbar=dict(title="ρ", len=0.5, y=0.25)),
                               customdata=np.stack([rho.rho, rho.H], axis=-1),
                               hovertemplate="ρ=%{customdata[0]:g}<br>E %{x:.1f}%<br>R %{y:.1f}%<br>"
                                             "H %{customdata[1]:.1f}<extra></extra>"))
    from lab.aware.methods import main_method

    others = s[(s.group == "methods") & (s.variant != main_method())]
    palette = px.colors.qualitative.Set2
    for i, r in enumerate(others.itertuples()):
        fig.add_trace(go.Scatter(x=[r.E], y=[r.R], mode="markers", name=r.variant,
                                 marker=dict(size=12, symbol="diamond", color=palette[i % len(palette)]),
                                 hovertemplate=f"{r.variant}<br>E %{{x:.1f}}%<br>R %{{y:.1f}}%<br>H {r.H:.1f}"
                                               "<extra></extra>"))
    fig.update_layout(title=title or "Retention vs efficiency: what each method keeps and learns",
                      xaxis_title="E: downstream accuracy relative to full fine-tuning (%)",
                      yaxis_title="R: upstream skills retained (%)", height=500,
                      legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))   # the colour bar has the right side
    return fig


def rho_curves(results, title: str = ""):
    """R, E, H against rho (the sweep, mean over seeds)."""
    from lab import plots

    title = title or "The rho sweep: R rises, E falls; H finds the balance"
    s = summary(results, "rho")
    if len(s) < 2:
        return _not_run("the rho sweep", title)
    s["rho"] = s.variant.str.replace("rho=", "").astype(float)
    long = s.sort_values("rho").melt(id_vars=["rho"], value_vars=["R", "E", "H"], var_name="metric", value_name="percent")
    return plots.lines(long, x="rho", y="percent", color="metric", x_title="rho (fraction of target rows frozen)",
                       y_title="percent", title=title)


def continual_figure(continual, title: str = ""):
    """Accuracy on every task seen so far after each stage, one panel per method."""
    import plotly.express as px

    title = title or "Continual sequence: accuracy on each task after each stage"
    if continual is None or not len(continual):
        return _not_run("the continual sequence", title)
    df = continual[~continual.task.str.startswith("upstream:")].copy()
    df["after stage"] = [f"{s + 1}: {t}" for s, t in zip(df.stage, df.stage_task)]
    fig = px.line(df, x="after stage", y="acc", color="task", facet_col="method", markers=True, range_y=(0, 1.02),
                  title=title)
    fig.update_layout(height=400, yaxis_title="accuracy")
    fig.for_each_annotation(lambda a: a.update(text=a.text.partition("=")[2]))
    return fig


def continual_bars(cont_summary, title: str = ""):
    from lab import plots

    title = title or "Per-stage averages, Avg, Last and BWT (negative = forgetting)"
    if cont_summary is None or not len(cont_summary):
        return _not_run("the continual sequence", title)
    cols = [c for c in cont_summary.columns if c.startswith("stage")] + ["avg", "last", "bwt"]
    s = cont_summary.groupby("method", sort=False)[cols].mean().reset_index()
    long = s.melt(id_vars=["method"], value_vars=cols, var_name="metric", value_name="accuracy")
    return plots.grouped_bar(long, x="metric", y="accuracy", color="method", fmt=".2f", title=title)


def findings(results) -> dict:
    """Headline comparisons computed from a results table (mean over seeds); NaN where a group is absent."""
    s = summary(results).set_index(["group", "variant"])

    def get(g, v, col):
        return float(s.loc[(g, v), col]) if (g, v) in s.index else float("nan")

    from lab.aware.methods import compared_methods

    out = {f"{m}_{c}": get("methods", m, c) for m in compared_methods() for c in ("R", "E", "H")}
    for rule in ("activation-global", "weight-norm", "random", "activation-balanced"):
        out[f"rule_{_RULE_SHORT.get(rule, rule)}_H"] = get("rule", rule, "H")
    rho = summary(results, "rho")
    if len(rho):
        best = rho.loc[rho.H.idxmax()]
        out["best_rho"] = float(best.variant.replace("rho=", ""))
        out["best_rho_H"] = float(best.H)
    return out


def tasks_for(groups, task: str) -> tuple[str, ...]:
    """The downstream tasks a sweep of ``groups`` on ``task`` needs: :func:`lab.experiments.aware.run.ablate.tasks_for`."""
    from lab.experiments.aware.run import ablate

    return ablate.tasks_for(groups, task)


def run_sweep(ctx, *, groups=None, seeds=None, task: str = "fashion", run_dir=None, progress: bool = True) -> dict:
    """:func:`lab.experiments.aware.run.ablate.sweep` on ``ctx``, returned in the shape of :func:`load_run` (the
    tables, ``config`` and ``run_dir``), so a fresh sweep and a saved one are shown the same way."""
    from lab.experiments.aware.run import ablate

    out = ablate.sweep(ctx, groups=tuple(groups) if groups else None, seeds=tuple(seeds) if seeds else None,
                       task=task, run_dir=run_dir, progress=progress)
    return {**load_run(out["run_dir"]), "timings": out["timings"]}


def noise_table(run: dict):
    """How precise the run's accuracies are: per evaluation set, its size, the accuracy before
    fine-tuning, its binomial standard error, and what one standard error means in R points."""
    import pandas as pd

    size = run["config"]["size"]
    before = run["upstream_before"].set_index("skill") if len(run["upstream_before"]) else pd.DataFrame()
    rows = []
    for skill, n in (("easy_vqa", size["n_easy_eval"]), ("probe", min(size["n_probe"], 100))):
        if skill in before.index:
            p, n = float(before.loc[skill, "acc"]), int(before.loc[skill, "n"])
            se = math.sqrt(max(p * (1 - p), 1e-12) / n)
            rows.append({"set": f"upstream: {skill}", "questions": n, "acc_before": p, "std_error": se,
                         "one_question_pts": 100 / n, "R_points_per_SE": 100 * se / p if p > 0 else np.nan})
    from lab.aware.methods import reference_method

    res = run["results"]
    full = res[(res.group == "methods") & (res.variant == reference_method())]
    if len(full):
        p, n = float(full.downstream.mean()), int(size["n_eval"])
        se = math.sqrt(max(p * (1 - p), 1e-12) / n)
        rows.append({"set": f"downstream: {run['config'].get('task', '')} (full FT)", "questions": n, "acc_before": np.nan,
                     "std_error": se, "one_question_pts": 100 / n, "R_points_per_SE": np.nan,
                     "E_points_per_SE": 100 * se / p if p > 0 else np.nan})
    return pd.DataFrame(rows)


def chance_options(task: str) -> tuple:
    """The answer options a downstream task scores (``lab.experiments.aware.run.tasks.TEMPLATES``)."""
    from lab.experiments.aware.run.tasks import TEMPLATES

    _, tmpl, names = TEMPLATES[task]
    return tuple(dict.fromkeys(tmpl.render(c, names) for c in range(len(names))))


def chance_rate(task: str) -> float:
    return 1.0 / len(chance_options(task))


def majority_rate(task: str, n_eval: int) -> float | None:
    """Accuracy of always giving the most common answer of the task's fixed ``n_eval`` test questions
    (the same questions every run is scored on); ``None`` when the data is not available here."""
    from lab.experiments.aware.run.tasks import downstream

    try:
        return downstream(task, n_train=1, n_test=n_eval, progress=False).test.majority_rate()
    except (OSError, ValueError, RuntimeError):
        return None


def describe_ablation(run: dict) -> str:
    """Notebook 04's findings as Markdown bullets, computed from a run (sweep or saved)."""
    from lab.aware.methods import compared_methods, reference_method

    res = run["results"]
    f = findings(res)
    seeds = res.seed.nunique()
    g = lambda k: f.get(k, float("nan"))  # noqa: E731
    lines = [f"- **Methods** ({seeds} seed{'s' if seeds > 1 else ''}, task `{run['config'].get('task', '?')}`): "
             + "; ".join(f"{m} R {g(m + '_R'):.1f} / E {g(m + '_E'):.1f} / H {g(m + '_H'):.1f}"
                         for m in compared_methods() if not math.isnan(g(m + "_H"))) + "."]
    if not math.isnan(g("full_R")):
        verdict = "forgets" if g("full_R") < 97 else "barely forgets"
        lines.append(f"- **Does full fine-tuning forget here?** R = {g('full_R'):.1f}: it {verdict} at this size "
                     "(every protection result is only as informative as this gap).")
    task = run["config"].get("task")
    full = res[(res.group == "methods") & (res.variant == reference_method())]
    if task and len(full):
        acc, n = float(full.downstream.mean()), int(run["config"].get("size", {}).get("n_eval", 0))
        base, what = chance_rate(task), f"chance {chance_rate(task):.3f} ({len(chance_options(task))} options)"
        major = majority_rate(task, n) if n else None
        if major is not None:
            base, what = max(base, major), what + f", always giving the test set's most common answer {major:.3f}"
        se = math.sqrt(max(base * (1 - base), 1e-12) / n) if n else 0.0
        verdict = ("learned it" if acc > base + 2 * se else "is not clearly above what guessing one answer scores, "
                   "so E compares methods that have not learned the task yet")
        lines.append(f"- **Did full fine-tuning learn the task?** {acc:.3f} downstream accuracy vs {what}: it {verdict}.")
    rules = {k.split("_")[1]: v for k, v in f.items() if k.startswith("rule_") and not math.isnan(v)}
    if len(rules) > 1:
        best = max(rules, key=rules.get)
        lines.append("- **Selection rule (H):** " + ", ".join(f"{k} {v:.1f}" for k, v in rules.items())
                     + f" — highest: {best}.")
    if "best_rho" in f:
        lines.append(f"- **rho sweep:** the highest H ({g('best_rho_H'):.1f}) is at rho = {g('best_rho'):g} "
                     "(the paper finds 0.3 on LLaVA-7B).")
    for group in ("targets", "calibration", "calib_size"):
        s = summary(res, group)
        if len(s) > 1:
            lines.append(f"- **{group}:** " + ", ".join(f"{r.variant} R {r.R:.1f} / E {r.E:.1f}" for r in s.itertuples()) + ".")
    cs = run.get("continual_summary")
    if cs is not None and len(cs):
        c = cs.groupby("method", sort=False)[["avg", "last", "bwt", "R_after_sequence"]].mean()
        lines.append("- **Continual sequence:** " + "; ".join(
            f"{m} Avg {r.avg:.3f}, Last {r.last:.3f}, BWT {r.bwt:+.3f}, R after {r.R_after_sequence:.1f}"
            for m, r in c.iterrows()) + ".")
    return "\n".join(lines)


def run_info(run: dict) -> str:
    """One line: where the run lives, how many fine-tuning runs it holds, and its timings."""
    res = run["results"]
    own = ~res["shared"].eq(True).to_numpy() if "shared" in res else np.ones(len(res), bool)   # NaN: its own
    times = run["config"].get("timings", {})
    steps = res[own & res.step_s.notna()] if "step_s" in res else res.iloc[:0]
    per_step = (f"; median training step {steps.step_s.median():.2f} s, {steps.train_s.median():.0f} s per run"
                if len(steps) else "")
    return (f"run folder: {run['run_dir']}; {int(own.sum())} runs ({res.seed.nunique()} seed(s)){per_step}; "
            "timings: " + ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in times.items() if k.endswith("_s")))
