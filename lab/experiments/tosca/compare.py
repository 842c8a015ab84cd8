"""Your router against the built-in ones, over seeds, with intervals and computed verdicts (notebook 05).

A router only acts at test time (:mod:`lab.tosca.routing`), so ONE trained TOSCA per seed serves
every router: :func:`run_seeds` trains TOSCA once per seed through the same harness as ``lab tosca``
(:func:`lab.experiments.tosca.run.run`: every stage evaluated, every router on the same modules) and
keeps one row per (seed, router). Everything after that is arithmetic on those rows — the widget
panel (:class:`lab.widgets.compare.RouterComparePanel`) re-draws from them without training.

* a mean over seeds carries its 95 % Student-t interval (:func:`lab.experiments.tosca.study.t_interval`);
* a comparison is **paired by seed** (each seed is its own class order, and both routers read the same
  trained modules): the per-seed difference ``yours − built-in``, then its t-interval;
* the verdict is computed from that interval (:func:`verdict`): ``better`` when it lies above zero,
  ``worse`` below, ``no difference detected`` when it spans zero (``no interval`` with one seed).
  Each comparison is its own 95 % interval: nothing is corrected for making several.

The template plugin's router (``margin``, ``examples/continual-lab-plugin-example``) can be used
without installing the package: :func:`example_plugin` puts its folder on ``sys.path`` and imports
the module, whose ``@register`` decorator adds the entry (an installed copy is used as it is).
"""
from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from .study import t_interval

if TYPE_CHECKING:
    import pandas as pd

    from .methods import ScenarioData
    from .run import RunConfig

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_PLUGIN = REPO / "examples" / "continual-lab-plugin-example"
# what a comparison reads, in the harness's units: accuracies in %, routing accuracy turned into %
METRICS = {"last_acc": "A_B (%)", "avg_inc_acc": "Ā (%)", "routing_accuracy_last": "routing accuracy (%)"}
SHORT = {"last_acc": "A_B", "avg_inc_acc": "Ā", "routing_accuracy_last": "routing accuracy"}
UNIT = {"last_acc": " points", "avg_inc_acc": " points", "routing_accuracy_last": " points"}
# built-ins that are not methods: an upper bound, and a protocol that reads the test set's order
REFERENCES = {"oracle": "upper bound (true task)", "per-batch": "protocol: one module per class-ordered batch"}
VERDICTS = ("better", "worse", "no difference detected", "no interval")


# --- the template plugin, without installing it ------------------------------------------------------
def example_plugin(module: str = "margin", folder: Path | str = EXAMPLE_PLUGIN) -> str:
    """Make the template plugin's ``module`` (``margin``: the router; ``product``: the AWARe rule
    ``activation-x-weight``) usable here, without installing the package: its folder goes on
    ``sys.path`` and the module is imported, so its ``@register(...)`` decorator adds the entry to
    the registry (source: the module's name). An installed copy (entry points) is used as it is.
    Returns one line saying which."""
    import importlib

    from lab import plugins

    kind = "aware rule" if module == "product" else "router"
    reg = plugins.registry(kind)   # its first lookup loads the installed plugins, if any
    name = "activation-x-weight" if module == "product" else "margin"
    if name in reg:
        return f"{kind} {name!r} already registered (from {reg.source(name)})"
    folder = Path(folder)
    if not (folder / "lab_plugin_example" / f"{module}.py").is_file():
        raise FileNotFoundError(f"no lab_plugin_example/{module}.py in {folder}")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    importlib.import_module(f"lab_plugin_example.{module}")
    return f"{kind} {name!r} registered from {folder / 'lab_plugin_example' / (module + '.py')} (not installed)"


# --- the runs ---------------------------------------------------------------------------------------------
@dataclass
class Comparison:
    """Per-seed results of TOSCA under every router (``runs``: one row per seed and router)."""

    runs: "pd.DataFrame"     # seed, router, source, role, avg_inc_acc, last_acc, routing_accuracy_last, ...
    candidates: tuple[str, ...]   # the routers under test ("yours")
    builtins: tuple[str, ...]     # what they can be compared against
    config: "RunConfig"
    seconds: float = 0.0          # wall time of every run together

    @property
    def seeds(self) -> list[int]:
        return sorted(int(s) for s in self.runs.seed.unique())

    @property
    def routers(self) -> list[str]:
        return [*self.candidates, *self.builtins]

    def per_seed(self, router: str, metric: str = "last_acc") -> "pd.Series":
        """``metric`` of ``router`` indexed by seed."""
        _check_metric(metric)
        if router not in self.routers:
            raise KeyError(f"router {router!r} was not evaluated; evaluated: {', '.join(self.routers)}")
        r = self.runs[self.runs.router == router]
        return r.set_index("seed")[metric].sort_index()


def _source(comp: Comparison, router: str) -> str:
    """Where ``router`` came from, as recorded when it ran (``"__main__"``: a notebook cell)."""
    src = comp.runs.loc[comp.runs.router == router, "source"]
    return str(src.iloc[0]) if len(src) else "?"


def _check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise KeyError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    return metric


def scenario_data(config: "RunConfig", seed: int) -> "ScenarioData":
    """The scenario of ``config`` with ``seed``'s class order, on the cached features (the backbone runs
    only for images not in the cache)."""
    from lab import backbones, data, features

    from .methods import ScenarioData

    key = (config.backbone, config.resolution)
    if _BACKBONE.get("key") != key:
        _BACKBONE.update(key=key, bb=backbones.load(config.backbone, resolution=config.resolution))
    scn = data.scenario(list(config.datasets), init=config.init, inc=config.inc, seed=int(seed))
    return ScenarioData.from_scenario(scn, features.scenario_features(scn, _BACKBONE["bb"], progress=False))


_BACKBONE: dict = {}   # the last backbone loaded (every seed of a comparison reads the same one)


def run_seeds(candidates: Sequence[str], builtins: Sequence[str], *, seeds: Sequence[int],
              config: "RunConfig | None" = None, data: Callable[[int], "ScenarioData"] | None = None,
              runs_root=None, log: Callable[[str], None] | None = print) -> Comparison:
    """Train TOSCA once per seed (``config``'s settings, its ``seed`` replaced) and evaluate it under
    ``candidates`` (your routers) and ``builtins`` at every stage. ``data(seed)``: the scenario's
    ScenarioData (default: ``config``'s datasets, cached features). Run folders go into ``runs_root``
    (default: a temporary folder, removed afterwards). Names are checked before any training."""
    import pandas as pd

    from lab.tosca.routing import ROUTERS, check_routing

    from .methods import METHODS
    from .run import RunConfig, run

    config = config or RunConfig()
    candidates, builtins = tuple(dict.fromkeys(candidates)), tuple(dict.fromkeys(builtins))
    seeds = [int(s) for s in dict.fromkeys(seeds)]
    if not candidates:
        raise ValueError("name at least one router to test (candidates)")
    for r in (*candidates, *builtins):
        check_routing(r)
    both = set(candidates) & set(builtins)
    if both:
        raise ValueError(f"router(s) {', '.join(sorted(both))} named both as yours and as a built-in")
    if len(seeds) < 2:
        raise ValueError(f"at least two seeds are needed for an interval over seeds (got {seeds})")
    if not METHODS.info(config.method)["routed"]:
        routed = " or ".join(repr(m) for m in METHODS.names() if METHODS.info(m)["routed"])
        raise ValueError(f"routers route TOSCA's modules: method must be {routed} (got {config.method!r})")
    routings = (*candidates, *builtins)
    rows, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lab-compare-") as tmp:
        for i, seed in enumerate(seeds):
            cfg = replace(config, seed=seed, routings=routings, routing=candidates[0])
            t1 = time.perf_counter()
            res = run(cfg, data=(data or (lambda s: scenario_data(config, s)))(seed),
                      runs_root=runs_root or tmp, progress=False)
            for r in res.summary.to_dict("records"):
                name = r["routing"]
                rows.append({"seed": seed, "router": name, "source": ROUTERS.source(name),
                             "role": "yours" if name in candidates else "built-in",
                             "avg_inc_acc": r["avg_inc_acc"], "last_acc": r["last_acc"],
                             "routing_accuracy_last": 100 * r["routing_accuracy_last"],
                             "routing_accuracy_mean": 100 * r["routing_accuracy_mean"],
                             "train_s": res.info["seconds"]["training"]})
            if log:
                log(f"seed {seed} ({i + 1}/{len(seeds)}): TOSCA trained and routed {len(routings)} ways in "
                    f"{time.perf_counter() - t1:.1f} s")
    return Comparison(pd.DataFrame(rows), candidates, builtins, config, time.perf_counter() - t0)


# --- numbers -----------------------------------------------------------------------------------------
def verdict(mean: float, half: float) -> str:
    """``yours − built-in`` with its 95 % half-width -> better / worse / no difference detected
    (the interval spans zero) / no interval (one seed, or nothing measured)."""
    if not (mean == mean) or not (half == half):
        return "no interval"
    if abs(mean) <= half:
        return "no difference detected"
    return "better" if mean > 0 else "worse"


def fmt(mean: float, half: float, digits: int = 1) -> str:
    """``'76.1 ± 2.3'`` (``'76.1'`` without an interval)."""
    return f"{mean:.{digits}f}" if half != half else f"{mean:.{digits}f} ± {half:.{digits}f}"


def fmt_diff(mean: float, half: float, digits: int = 1) -> str:
    """``'+3.1 ± 1.2'`` with a proper minus sign (never ``−0.0``)."""
    m = f"{mean:+.{digits}f}"
    m = "+" + m[1:] if float(m) == 0 else m
    return (m if half != half else f"{m} ± {half:.{digits}f}").replace("-", "−")


def means(comp: Comparison, routers: Sequence[str] | None = None) -> "pd.DataFrame":
    """Tidy: per router and metric, the mean over seeds, its 95 % t half-width, the interval, seeds."""
    import pandas as pd

    rows = []
    for r in routers or comp.routers:
        for m in METRICS:
            v = comp.per_seed(r, m)
            mean, half = t_interval(v.tolist())
            rows.append({"router": r, "role": "yours" if r in comp.candidates else "built-in",
                         "metric": m, "mean": mean, "ci95": half, "lo": mean - half, "hi": mean + half,
                         "seeds": int(v.notna().sum())})
    return pd.DataFrame(rows)


def summary_table(comp: Comparison, routers: Sequence[str] | None = None) -> "pd.DataFrame":
    """One row per router: where it comes from, A_B, Ā and routing accuracy as mean ± 95 % t over seeds."""
    import pandas as pd

    m = means(comp, routers)
    rows = []
    for r in routers or comp.routers:
        g = m[m.router == r].set_index("metric")
        src = _source(comp, r)
        rows.append({"router": r, "yours / built-in": ("yours" if r in comp.candidates else "built-in")
                     + (f" ({REFERENCES[r]})" if r in REFERENCES else ""),
                     "from": "this notebook" if src == "__main__" else src,
                     "seeds": int(g.seeds.max()),
                     **{label: fmt(g.loc[k, "mean"], g.loc[k, "ci95"]) for k, label in METRICS.items()}})
    return pd.DataFrame(rows)


def differences(comp: Comparison, candidate: str | None = None, against: Sequence[str] | None = None,
                metrics: Sequence[str] = tuple(METRICS)) -> "pd.DataFrame":
    """Tidy: ``candidate − each of against`` per metric, paired by seed: mean, 95 % t half-width, the
    interval, seeds and the verdict. Defaults: the first candidate against every built-in."""
    import pandas as pd

    candidate = candidate or comp.candidates[0]
    against = list(comp.builtins if against is None else against)
    if candidate not in comp.routers:
        raise KeyError(f"router {candidate!r} was not evaluated; evaluated: {', '.join(comp.routers)}")
    rows = []
    for b in against:
        for m in metrics:
            d = (comp.per_seed(candidate, m) - comp.per_seed(b, m)).dropna()
            mean, half = t_interval(d.tolist())
            rows.append({"router": candidate, "against": b, "metric": m, "diff": mean, "ci95": half,
                         "lo": mean - half, "hi": mean + half, "seeds": len(d), "verdict": verdict(mean, half)})
    return pd.DataFrame(rows, columns=["router", "against", "metric", "diff", "ci95", "lo", "hi", "seeds", "verdict"])


def difference_table(diffs: "pd.DataFrame") -> "pd.DataFrame":
    """``differences`` for reading: one row per built-in, per metric ``diff ± half (verdict)``."""
    import pandas as pd

    rows = []
    for b, g in diffs.groupby("against", sort=False):
        row = {"yours − built-in": f"{g.router.iloc[0]} − {b}", "seeds": int(g.seeds.max())}
        for r in g.itertuples():
            row[f"{SHORT[r.metric]} difference"] = f"{fmt_diff(r.diff, r.ci95)} ({r.verdict})"
        rows.append(row)
    return pd.DataFrame(rows)


def _count(diffs, metric: str) -> dict[str, list[str]]:
    d = diffs[diffs.metric == metric]
    return {v: d[d.verdict == v].against.tolist() for v in VERDICTS}


def _said(counts: dict[str, list[str]]) -> str:
    """``'better than energy; no difference detected with ncm; worse than mahalanobis'``."""
    return "; ".join(f"{'better than' if v == 'better' else 'worse than' if v == 'worse' else v + ' with'} "
                     f"{', '.join(names)}" for v, names in counts.items() if names)


def headline(diffs: "pd.DataFrame", metric: str = "last_acc") -> str:
    """A title computed from the verdicts, e.g. ``'margin − built-in (A_B, 5 seeds, paired): better
    than energy; no difference detected with ncm; worse than mahalanobis'``."""
    if diffs.empty:
        return "nothing to compare against"
    parts = [_said(_count(diffs, metric))]
    n = int(diffs.seeds.max())
    return f"{diffs.router.iloc[0]} − built-in ({SHORT[metric]}, {n} seeds, paired): " + "; ".join(parts)


def sentences(diffs: "pd.DataFrame", metrics: Sequence[str] = ("last_acc", "routing_accuracy_last")) -> str:
    """Markdown bullets, one per built-in, each computed from the paired intervals."""
    out = []
    for b, g in diffs.groupby("against", sort=False):
        g = g.set_index("metric")
        parts = []
        for m in metrics:
            if m not in g.index:
                continue
            r = g.loc[m]
            what = {"better": "higher", "worse": "lower"}.get(r.verdict)
            parts.append(f"{SHORT[m]} {what} by {fmt(abs(r['diff']), r.ci95)}{UNIT[m]} ({r.verdict})" if what else
                         f"{SHORT[m]}: {r.verdict} ({fmt_diff(r['diff'], r.ci95)}{UNIT[m]})")
        ref = f" — {REFERENCES[b]}, not a method to beat" if b in REFERENCES else ""
        out.append(f"* **{g.router.iloc[0]} vs {b}**{ref}: " + "; ".join(parts) + f" — {int(g.seeds.max())} seeds.")
    return "\n".join(out)


def findings(comp: Comparison, against: Sequence[str], metric: str = "last_acc") -> str:
    """One Markdown paragraph per candidate: its mean with interval, and what the paired intervals say."""
    out = []
    for c in comp.candidates:
        mean, half = t_interval(comp.per_seed(c, metric).tolist())
        d = differences(comp, c, [b for b in against if b != c], metrics=(metric,))
        said = _said(_count(d, metric)) or "compared with no built-in"
        src = _source(comp, c)
        line = (f"* **{c}** (from {'this notebook' if src == '__main__' else src}): {SHORT[metric]} "
                f"{fmt(mean, half)} % over {len(comp.seeds)} seeds; paired by seed: {said}.")
        methods = [b for b in comp.builtins if b not in REFERENCES]
        if methods:
            best = max(methods, key=lambda b: t_interval(comp.per_seed(b, metric).tolist())[0])
            line += (f" The built-in with the highest mean {SHORT[metric]} here (oracle and per-batch aside) is "
                     f"**{best}** ({fmt(*t_interval(comp.per_seed(best, metric).tolist()))} %).")
        out.append(line)
    return "\n".join(out)


# --- figures -------------------------------------------------------------------------------------------
COLOURS = {"better": "#1a7f37", "worse": "#cf222e", "no difference detected": "#6e7781", "no interval": "#6e7781"}


def difference_figure(diffs: "pd.DataFrame", metric: str = "last_acc"):
    """``yours − built-in`` per built-in with its 95 % interval (paired by seed), coloured by verdict,
    zero marked; the title is :func:`headline`."""
    import plotly.graph_objects as go

    d = diffs[diffs.metric == metric]
    fig = go.Figure()
    for v in VERDICTS:
        g = d[d.verdict == v]
        if g.empty:
            continue
        fig.add_trace(go.Scatter(x=g["diff"], y=g.against, mode="markers", name=v,
                                 marker=dict(size=11, color=COLOURS[v]),
                                 error_x=dict(type="data", array=g.ci95.fillna(0), visible=True),
                                 hovertemplate="%{y}: %{x:+.2f} ± %{error_x.array:.2f}<extra>" + v + "</extra>"))
    fig.add_vline(x=0, line_dash="dot", line_color="grey")
    # plotly does not wrap titles: the headline's verdicts one per line, so none is cut off
    lines = (headline(diffs, metric).replace("): ", "):; ", 1).split("; ") if not d.empty
             else ["nothing to compare against"])
    fig.update_layout(title=dict(text="<br>".join(lines), font=dict(size=14)), margin=dict(t=40 + 22 * len(lines)),
                      xaxis_title=f"{SHORT[metric]}: yours − built-in (points, mean ± 95 % t over seeds)",
                      yaxis_title="built-in router", height=140 + 22 * len(lines) + 45 * max(len(d), 1),
                      legend_title_text="verdict",
                      yaxis=dict(categoryorder="array", categoryarray=list(d.against)[::-1], type="category"))
    return fig


def means_figure(comp: Comparison, routers: Sequence[str] | None = None, metric: str = "last_acc"):
    """Mean over seeds with its 95 % t-interval per router, yours highlighted, every seed as a dot."""
    import plotly.graph_objects as go

    routers = list(routers or comp.routers)
    m = means(comp, routers)
    m = m[m.metric == metric].set_index("router").loc[routers]
    colour = ["#0969da" if r in comp.candidates else "#8c959f" for r in routers]
    fig = go.Figure(go.Bar(x=routers, y=m["mean"], marker_color=colour, name="mean over seeds",
                           error_y=dict(type="data", array=m.ci95.fillna(0), visible=True),
                           text=[f"{v:.1f}" for v in m["mean"]], textposition="inside"))
    pts = comp.runs[comp.runs.router.isin(routers)]
    fig.add_trace(go.Scatter(x=pts.router, y=pts[metric], mode="markers", name="one seed",
                             marker=dict(color="black", size=5, opacity=0.6),
                             customdata=pts.seed, hovertemplate="%{x}, seed %{customdata}: %{y:.1f}<extra></extra>"))
    fig.update_layout(title=f"{METRICS[metric]} per router: mean ± 95 % t over {len(comp.seeds)} seeds "
                            f"(yours in blue; the same trained TOSCA per seed)",
                      yaxis_title=METRICS[metric], height=420, yaxis_range=[0, 100],
                      xaxis=dict(type="category"))
    return fig
