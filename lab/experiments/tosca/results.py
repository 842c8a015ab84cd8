"""The shipped TOSCA study (``results/tosca``) read back: tables with 95 % intervals, paired
comparisons, figures, provenance, a stale-source check and prose computed from the numbers.

``lab tosca study`` writes ``runs.csv`` (one row per scenario, seed, method,
flow, initialisation and routing), ``summary.csv`` and ``manifest.json``;
``python -m lab.experiments.tosca.efficiency`` writes ``efficiency_*.csv`` and
``efficiency_manifest.json``. Notebook 02 and the README's TOSCA section are rendered from these.
Each manifest records the sha256 of every table it ships; :func:`load` checks them (one line naming
the file when anything is wrong: :mod:`lab._manifest`).

Intervals follow the lab's one rule (:mod:`lab.stats`): a mean over seeds carries the 95 % Student-t
interval over seeds; a comparison of two methods is paired by seed (same class order): the per-seed
difference, then its t-interval. A difference whose interval spans zero is reported as "no difference
detected".
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lab import stats as _stats
from lab._names import REFERENCE_FLOW, TOSCA_METHODS

from .study import METHOD, t_interval   # METHOD: the method under study (TOSCA); t_interval: (mean, half-width)

RESULTS = Path(__file__).resolve().parents[3] / "results" / "tosca"
REPO = Path(__file__).resolve().parents[3]
REF = ("reference", "reference")  # (head_init, luca_init)
OLD = ("uniform", "xavier")
CONFIDENCE_ROUTERS = ("per-sample", "max-softmax", "energy", "entropy-ncm")
SCENARIO_NAMES = {"fashion_mnist_mini": "fashion_mnist_mini B0 Inc2 (5 tasks)",
                  "mnist_5k+fashion_mnist_mini": "mnist_5k → fashion_mnist_mini B0 Inc2 (10 tasks)"}


@dataclass
class Shipped:
    folder: Path
    runs: pd.DataFrame
    manifest: dict
    efficiency_params: pd.DataFrame | None = None
    efficiency_time: pd.DataFrame | None = None
    efficiency_manifest: dict | None = None

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs.seed.unique().tolist())

    @property
    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(self.runs.scenario))


RUNS_COLUMNS = ("scenario", "seed", "method", "flow", "head_init", "luca_init", "routing", "avg_inc_acc",
                "last_acc", "routing_accuracy_last", "routing_accuracy_mean", "trainable_params")
SUMMARY_COLUMNS = ("scenario", "method", "flow", "head_init", "luca_init", "routing", "seeds", "avg_inc_acc",
                   "avg_inc_acc_ci95", "last_acc", "last_acc_ci95")
EFFICIENCY_COLUMNS = {"efficiency_params.csv": ("backbone", "feature_dim", "luca_r", "luca_params_per_task",
                                                "layerwise_adapter_params", "ratio_layerwise_to_luca", "tasks",
                                                "luca_params_all_tasks"),
                      "efficiency_time.csv": ("backbone", "weights", "setting", "batch", "step_seconds",
                                              "step_seconds_ci95", "image_ms", "image_ms_ci95")}


def load(folder=None) -> Shipped:
    """The shipped study in ``folder`` (default ``results/tosca``), verified: each manifest records
    the sha256 of every table it ships and names files of its own folder only; every table is
    checked against it (a truncated ``runs.csv`` is never read as the study), then read with the
    columns the views use. Anything wrong is one line naming the file
    (:class:`lab._manifest.BadShipped`); a missing study says how to make one."""
    from lab import _manifest

    folder = Path(folder or RESULTS)
    if not (folder / "manifest.json").is_file():
        raise FileNotFoundError(f"no shipped TOSCA study in {folder}: run "
                                f"`lab tosca study --out {folder}`")
    mpath = folder / "manifest.json"
    fix = f"rerun `lab tosca study --out {folder}`"
    manifest = _manifest.read(mpath, fix=fix)
    paths = _manifest.verify(folder, manifest, mpath, TABLES, fix=fix)
    runs = _manifest.read_csv_table(paths["runs.csv"], columns=RUNS_COLUMNS, rows=True,
                                    keep_default_na=False, na_values=[""])
    _manifest.read_csv_table(paths["summary.csv"], columns=SUMMARY_COLUMNS, rows=True)
    for k in ("flow", "head_init", "luca_init"):
        runs[k] = runs[k].fillna("")
    out = Shipped(folder, runs, manifest)
    epath = folder / "efficiency_manifest.json"
    if epath.is_file():
        efix = f"rerun `python -m lab.experiments.tosca.efficiency --out {folder}`"
        em = _manifest.read(epath, fix=efix)
        listed = _manifest.names(em, "files", epath)
        epaths = _manifest.verify(folder, em, epath, listed, fix=efix)
        for name in EFFICIENCY_COLUMNS:
            if name not in epaths:
                raise _manifest.BadShipped(f"{epath}: does not list {name}; {efix}")
        out.efficiency_params, out.efficiency_time = (
            _manifest.read_csv_table(epaths[n], columns=cols, rows=True) for n, cols in EFFICIENCY_COLUMNS.items())
        out.efficiency_manifest = em
    return out


TABLES = ("runs.csv", "summary.csv")   # what manifest.json's sha256 covers (lab tosca study writes them)


# --- provenance --------------------------------------------------------------------------------------
def stale_sources(manifest: dict, root=REPO) -> list[str]:
    """Sources listed in ``manifest['sources_sha256']`` that changed (or vanished) since the run."""
    out = []
    for rel, digest in manifest["sources_sha256"].items():
        f = Path(root) / rel
        if not f.is_file() or hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            out.append(rel)
    return out


def provenance(manifest: dict, what: str = "study") -> str:
    m = manifest["machine"]
    return (f"{what}: `{manifest['command']}` on {manifest['date']}, {m['platform']} ({m.get('cpus', '?')} CPUs, "
            f"torch {m['torch']}, {m['torch_threads']} thread(s)), wall time {manifest['wall_seconds'] / 60:.1f} min")


def stale_warning(manifest: dict, what: str = "study") -> str:
    """A loud line when the sources changed since the shipped run (empty otherwise)."""
    changed = stale_sources(manifest)
    if not changed:
        return ""
    return (f"WARNING: the {what}'s sources changed since it was run ({', '.join(changed)}); the shipped "
            f"numbers may not be what this code gives — rerun `{manifest['command']}`")


def provenance_lines(shipped: Shipped) -> str:
    lines = [provenance(shipped.manifest), stale_warning(shipped.manifest) or
             f"sources unchanged since the study (sha256 of {len(shipped.manifest['sources_sha256'])} files)"]
    if shipped.efficiency_manifest:
        lines += [provenance(shipped.efficiency_manifest, "efficiency"),
                  stale_warning(shipped.efficiency_manifest, "efficiency measurement") or
                  "efficiency sources unchanged"]
    return "\n".join(lines)


# --- numbers ------------------------------------------------------------------------------------------
def fmt(mean: float, half: float, digits: int = 1) -> str:
    if half != half:  # one seed
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def fmt_diff(mean: float, half: float, digits: int = 1) -> str:
    m = f"{mean:+.{digits}f}"
    m = "+" + m[1:] if float(m) == 0 else m  # no "−0.0"
    s = f"{m} ± {half:.{digits}f}".replace("-", "−")
    return s + (" (no difference detected)" if spans_zero(mean, half) else "")


def spans_zero(mean: float, half: float) -> bool:
    """The interval ``mean ± half`` holds zero, or there is none (:func:`lab.stats.direction`)."""
    return _stats.direction(mean - half, mean + half) not in ("higher", "lower")


def _info(method: str) -> dict:
    """A method's registry info (lab.experiments.tosca._base.register, read without torch); none for a
    method no registry here knows (a row of a study run elsewhere, with a plugin)."""
    try:
        return TOSCA_METHODS.info(method)
    except KeyError:
        return {}


def _under_study(runs):
    """Row mask: the method under study (role "method": TOSCA), not a baseline."""
    return runs.method.map(lambda m: _info(m).get("role") == "method")


def _select(runs, *, scenario, method=METHOD, flow=REFERENCE_FLOW, init=REF, routing=None):
    q = (runs.scenario == scenario) & (runs.method == method)
    info = _info(method)
    if info.get("luca"):
        q &= (runs.flow == flow) & (runs.head_init == init[0]) & (runs.luca_init == init[1])
    if info.get("routed") and routing is not None:
        q &= runs.routing == routing
    return runs[q].set_index("seed")


def stat(runs, metric: str, **sel) -> tuple[float, float]:
    """Mean and 95 % t half-width over seeds of ``metric`` for one selection."""
    return t_interval(_select(runs, **sel)[metric])


def paired(runs, metric: str, a: dict, b: dict) -> tuple[float, float, int]:
    """Mean, 95 % t half-width and number of seeds of ``a − b``, paired by seed."""
    x, y = _select(runs, **a)[metric], _select(runs, **b)[metric]
    d = (x - y).dropna()
    mean, half = t_interval(d.tolist())
    return mean, half, len(d)


def _reference_tosca(runs):
    """Row mask: TOSCA with the 'tosca' flow and the reference initialisation."""
    return (runs.flow == REFERENCE_FLOW) & (runs.head_init == REF[0]) & (runs.luca_init == REF[1])


def headline_seeds(runs) -> list[int]:
    """Seeds of the headline: TOSCA with the reference initialisation (and the baselines beside it)."""
    return sorted(runs[_under_study(runs) & _reference_tosca(runs)].seed.unique().tolist())


def ablation_seeds(runs) -> list[int]:
    """Seeds at which the initialisation and flow ablations ran (every variant; the study may run
    the headline at more seeds, ``lab tosca study --headline-seeds``)."""
    abl = _under_study(runs) & ~_reference_tosca(runs)
    return sorted(runs[abl].seed.unique().tolist()) or headline_seeds(runs)


def on_ablation_seeds(runs):
    """``runs`` at the ablation seeds only, so an ablation's reference row and its alternatives
    are means over the same seeds (class orders)."""
    return runs[runs.seed.isin(ablation_seeds(runs))]


def seeds_phrase(runs) -> str:
    """How many seeds the tables rest on, e.g. '50 seeds (1993–2042) for the headline, 10 (1993–2002)
    for the initialisation and flow ablations'."""
    def span(s):
        return f"{s[0]}–{s[-1]}" if len(s) > 1 else f"{s[0]}"

    head, abl = headline_seeds(runs), ablation_seeds(runs)
    if head == abl:
        return f"{len(head)} seeds {span(head)}"
    return (f"{len(head)} seeds ({span(head)}) for the headline — TOSCA with the reference initialisation under "
            f"every router, and the baselines — and {len(abl)} ({span(abl)}) for the initialisation and flow ablations")


def routings(runs) -> list[str]:
    return list(dict.fromkeys(runs[_under_study(runs)].routing))


def baselines(runs) -> list[str]:
    return [m for m in dict.fromkeys(runs.method) if _info(m).get("role") != "method"]


def headline_baselines(runs) -> list[str]:
    """The baselines in ``runs`` every router of TOSCA is compared with: those whose registry info gives
    them a place in the headline (``headline``: 1 first), in that order."""
    return sorted((b for b in baselines(runs) if _info(b).get("headline")), key=lambda b: _info(b)["headline"])


def router_rows(runs, scenario: str) -> list[tuple[str, str, dict]]:
    """The rows of the router table, as (name, kind, selection): TOSCA (reference initialisation)
    under every router, then each baseline."""
    return ([(f"TOSCA ({r})", "TOSCA", dict(scenario=scenario, routing=r)) for r in routings(runs)]
            + [(b, "baseline", dict(scenario=scenario, method=b)) for b in baselines(runs)])


def router_table(runs, scenario: str) -> pd.DataFrame:
    """TOSCA (reference init) under every router and each baseline: Ā, A_B, routing accuracy, and
    TOSCA's A_B minus SimpleCIL's and RanPAC's, paired by seed."""
    rows = []
    for name, kind, sel in router_rows(runs, scenario):
        row = {"method": name, "Ā": fmt(*stat(runs, "avg_inc_acc", **sel)), "A_B": fmt(*stat(runs, "last_acc", **sel)),
               "routing acc. (%)": fmt(*stat(runs, "routing_accuracy_last", **sel)) if kind == "TOSCA" else ""}
        for b in headline_baselines(runs) if kind == "TOSCA" else ():
            m, h, _ = paired(runs, "last_acc", sel, dict(scenario=scenario, method=b))
            row[f"A_B − {b}"] = fmt_diff(m, h)
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


# the ridge router's origin, as every sentence that names it says it (lab.tosca.ridge.ORIGIN, copied here so
# that reading the tables imports no torch; a test holds the two equal)
RIDGE_ORIGIN = ("a RanPAC-style global ridge router from a follow-up method (PRISM) developed in the repository "
                "that first published TOSCA's code; the TOSCA paper's own routing is entropy")
RIDGE_SHORT = ("PRISM's RanPAC-style global ridge, from a follow-up method developed in the repository that first "
               "published TOSCA's code — not the TOSCA paper's routing, which is entropy")
# the built-in baselines every router of TOSCA is compared with (:func:`headline_baselines`: those of a study)
HEADLINE_BASELINES = tuple(sorted((m for m in TOSCA_METHODS.builtin(role="baseline") if _info(m)["headline"]),
                                  key=lambda m: _info(m)["headline"]))
HALF_WIDTH_TARGET = 2.5   # points: A_B's 95 % half-width the shipped study aims at for every row


def comparisons(runs) -> pd.DataFrame:
    """The study's headline comparisons as tidy rows, each a paired difference of A_B (by seed) with
    its 95 % t-interval and a verdict: TOSCA under every router (not the oracle) vs SimpleCIL,
    RanPAC and FeCAM, and the ``ridge`` router (:data:`lab.tosca.ridge.ORIGIN`) vs the paper's per-sample
    entropy."""
    rows = []
    for scn in dict.fromkeys(runs.scenario):
        rs = [r for r in routings(runs) if r != "oracle"]
        pairs = [(f"TOSCA ({r})", dict(scenario=scn, routing=r), b, dict(scenario=scn, method=b))
                 for r in rs for b in headline_baselines(runs)]
        if {"ridge", "per-sample"} <= set(rs):
            pairs.append(("TOSCA (ridge)", dict(scenario=scn, routing="ridge"), "TOSCA (per-sample entropy)",
                          dict(scenario=scn, routing="per-sample")))
        for a_name, a, b_name, b in pairs:
            m, h, n = paired(runs, "last_acc", a, b)
            rows.append({"scenario": scn, "a": a_name, "b": b_name, "metric": "A_B", "diff": m, "ci95": h,
                         "lo": m - h, "hi": m + h, "seeds": n, "verdict": verdict(a_name, m, h)})
    return pd.DataFrame(rows)


def verdict(a: str, mean: float, half: float) -> str:
    """``a − b``'s verdict from its mean and 95 % half-width: no difference detected, or a higher / lower."""
    if spans_zero(mean, half):
        return "no difference detected"
    return f"{a} higher" if mean > 0 else f"{a} lower"


def comparisons_table(runs, scenario: str) -> pd.DataFrame:
    """:func:`comparisons` of one scenario, formatted: A_B a − b [95 %] and the verdict."""
    c = comparisons(runs)
    c = c[c.scenario == scenario]
    return pd.DataFrame({"a": c.a, "b": c.b, "A_B a − b (points)": [fmt_diff(m, h) for m, h in zip(c["diff"], c.ci95)],
                         "95 % interval": [f"[{lo:+.1f}, {hi:+.1f}]".replace("-", "−") for lo, hi in zip(c.lo, c.hi)],
                         "seeds": c.seeds, "verdict": c.verdict}).reset_index(drop=True)


def half_widths(runs) -> pd.DataFrame:
    """Per scenario and row of the router table (TOSCA under each router, each baseline): seeds, A_B's
    mean and 95 % half-width, and whether the half-width is within :data:`HALF_WIDTH_TARGET`."""
    rows = []
    for scn in dict.fromkeys(runs.scenario):
        for name, _, sel in router_rows(runs, scn):
            m, h = stat(runs, "last_acc", **sel)
            rows.append({"scenario": scn, "row": name, "seeds": len(_select(runs, **sel)), "A_B": m,
                         "half_width": h, "within_target": bool(h == h and h <= HALF_WIDTH_TARGET)})
    return pd.DataFrame(rows)


def half_width_sentence(runs) -> str:
    """How many rows meet the half-width target, naming the ones that do not (computed)."""
    hw = half_widths(runs)
    miss = hw[~hw.within_target]
    s = (f"A_B's 95 % half-width is within {HALF_WIDTH_TARGET:g} points for {int(hw.within_target.sum())} of "
         f"{len(hw)} rows ({len(headline_seeds(runs))} seeds)")
    if miss.empty:
        return s + "."
    return s + "; not for " + ", ".join(f"{r.row} on {r.scenario} (± {r.half_width:.1f})" for r in miss.itertuples()) + "."


def beats(runs, scenario: str, baseline: str) -> pd.DataFrame:
    """Per router: TOSCA's A_B − the baseline's (paired), and whether the interval excludes zero."""
    rows = []
    for r in routings(runs):
        if r == "oracle":
            continue
        m, h, n = paired(runs, "last_acc", dict(scenario=scenario, routing=r), dict(scenario=scenario, method=baseline))
        rows.append({"routing": r, "diff": m, "ci95": h, "seeds": n, "verdict": verdict("TOSCA", m, h)})
    return pd.DataFrame(rows)


ALTERNATIVES = {OLD: "both (former)", ("uniform", "reference"): "uniform head only",
                ("reference", "xavier"): "Xavier task-0 LuCA only"}


def init_table(runs) -> pd.DataFrame:
    """Reference initialisation (zero head rows after task 0, task 0's LuCA from nn.Linear's
    default) vs this library's former one (uniform rows, Xavier LuCA) and each change alone:
    A_B reference − alternative, paired by seed (alternatives not in the study are left out), at
    the ablation seeds."""
    runs = on_ablation_seeds(runs)
    rows = []
    for scn in dict.fromkeys(runs.scenario):
        for r in ("per-sample", "oracle", "mahalanobis"):
            if r not in routings(runs):
                continue
            ref = dict(scenario=scn, routing=r, init=REF)
            row = {"scenario": scn, "routing": r, "A_B reference": fmt(*stat(runs, "last_acc", **ref))}
            for init, name in ALTERNATIVES.items():
                alt = dict(scenario=scn, routing=r, init=init)
                if not _select(runs, **alt).empty:
                    row[f"reference − {name}"] = fmt_diff(*paired(runs, "last_acc", ref, alt)[:2])
            if len(row) > 3:
                rows.append(row)
    return pd.DataFrame(rows).fillna("")


FLOW_TEXT = {"tosca": "h = LN(x + a(x)); h·s(h)", "adapter": "LN(a(x))", "calibrator": "x·s(x)",
             "tosca_r": "x·s(x) + LN(a(x))"}


def flow_long(runs, scenario: str) -> pd.DataFrame:
    """Per flow and routing (oracle, per-sample): mean and half-width of A_B and Ā (for the figure),
    at the ablation seeds."""
    runs = on_ablation_seeds(runs)
    rows = []
    for f in FLOW_TEXT:
        for r in ("oracle", "per-sample"):
            sel = dict(scenario=scenario, flow=f, routing=r)
            if _select(runs, **sel).empty:
                continue
            for metric, name in (("last_acc", "A_B"), ("avg_inc_acc", "Ā")):
                m, h = stat(runs, metric, **sel)
                rows.append({"flow": f, "routing": r, "metric": name, "accuracy": m, "ci95": h})
    return pd.DataFrame(rows)


def flow_table(runs, scenario: str) -> pd.DataFrame:
    """The LuCA flow ablation (reference init): A_B under the oracle and per-sample routing, and
    each flow's difference from 'tosca' (paired by seed); trainable parameters in all; at the
    ablation seeds."""
    runs = on_ablation_seeds(runs)
    rows = []
    for f in FLOW_TEXT:
        o, p = dict(scenario=scenario, flow=f, routing="oracle"), dict(scenario=scenario, flow=f, routing="per-sample")
        if _select(runs, **o).empty:
            continue
        row = {"flow": f, "output": FLOW_TEXT[f], "A_B oracle": fmt(*stat(runs, "last_acc", **o)),
               "A_B per-sample": fmt(*stat(runs, "last_acc", **p)),
               "Ā per-sample": fmt(*stat(runs, "avg_inc_acc", **p))}
        if f != REFERENCE_FLOW:
            base_o, base_p = dict(o, flow=REFERENCE_FLOW), dict(p, flow=REFERENCE_FLOW)
            row["oracle A_B − tosca"] = fmt_diff(*paired(runs, "last_acc", o, base_o)[:2])
            row["per-sample A_B − tosca"] = fmt_diff(*paired(runs, "last_acc", p, base_p)[:2])
        row["trainable params (all tasks, head incl.)"] = f"{int(_select(runs, **o).trainable_params.iloc[0]):,}"
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


def flow_figure(runs, scenario: str):
    import plotly.express as px

    df = flow_long(runs, scenario)
    df = df[df.metric == "A_B"].assign(half=lambda d: d.ci95.fillna(0))
    spread = df.groupby("routing").accuracy.agg(lambda a: a.max() - a.min())
    best = df[df.routing == "oracle"].sort_values("accuracy").iloc[-1]
    fig = px.bar(df, x="flow", y="accuracy", color="routing", barmode="group", error_y="half",
                 text_auto=".1f", range_y=(0, 100),
                 title=f"LuCA flow ablation, {scenario}: highest oracle A_B with flow {best.flow} "
                       f"({best.accuracy:.1f}); spread across flows: oracle {spread.get('oracle', float('nan')):.1f}, "
                       f"per-sample {spread.get('per-sample', float('nan')):.1f} points "
                       f"(± 95 %, {len(ablation_seeds(runs))} seeds)")
    fig.update_layout(height=420, yaxis_title="A_B (%)")
    return fig


def router_figure(runs, scenario: str):
    """A_B per router (TOSCA, reference init) beside the baselines, with 95 % intervals."""
    import plotly.express as px

    rows = []
    for name, kind, sel in router_rows(runs, scenario):
        m, h = stat(runs, "last_acc", **sel)
        rows.append({"method": name, "kind": kind, "A_B": m, "half": h})
    df = pd.DataFrame(rows).fillna({"half": 0})
    best = df[(df.kind == "TOSCA") & (df.method != "TOSCA (oracle)")].sort_values("A_B").iloc[-1]
    top = df[df.kind == "baseline"].sort_values("A_B").iloc[-1]
    fig = px.bar(df, x="method", y="A_B", color="kind", error_y="half", text_auto=".1f", range_y=(0, 100),
                 title=f"{scenario}: best router {best.method} {best.A_B:.1f}, best baseline {top.method} "
                       f"{top.A_B:.1f} (A_B %, ± 95 % interval)")
    fig.update_layout(height=420, yaxis_title="A_B (%)")
    return fig



# --- efficiency --------------------------------------------------------------------------------------
def efficiency_params_table(params: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([{
        "backbone": r.backbone, "d": r.feature_dim, "LuCA r": r.luca_r,
        "one LuCA (per task)": f"{r.luca_params_per_task:,}", "adapter blocks": r.adapter_blocks,
        "layer-wise adapters": f"{r.layerwise_adapter_params:,}",
        "adapters ÷ LuCA": f"{r.ratio_layerwise_to_luca:.2f}x",
        f"{r.tasks} LuCAs": f"{r.luca_params_all_tasks:,}",
        "backbone (frozen)": f"{r.backbone_params:,}"} for r in params.itertuples()]).fillna("")


def efficiency_time_table(time: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (bb, batch), g in time.groupby(["backbone", "batch"], sort=False):
        g = g.set_index("setting")
        base = g.loc["tosca_cached", "step_seconds"]
        for s, r in g.iterrows():
            rows.append({"backbone": bb, "weights": r.weights, "batch": batch, "setting": s,
                         "s / step": fmt(r.step_seconds, r.step_seconds_ci95, 4),
                         "ms / image": fmt(r.image_ms, r.image_ms_ci95, 2),
                         "÷ tosca_cached": f"{r.step_seconds / base:.0f}x"})
    return pd.DataFrame(rows)


def ratio_range(a: pd.Series, b: pd.Series) -> tuple[float, float, float]:
    """a/b for two timed settings: the ratio of the means and the range the two 95 % intervals
    allow (lower a / upper b .. upper a / lower b; conservative)."""
    lo_b = b.step_seconds - b.step_seconds_ci95
    lo = (a.step_seconds - a.step_seconds_ci95) / (b.step_seconds + b.step_seconds_ci95)
    hi = (a.step_seconds + a.step_seconds_ci95) / lo_b if lo_b > 0 else float("inf")
    return a.step_seconds / b.step_seconds, lo, hi


def _ratio(r: tuple[float, float, float]) -> str:
    d = 1 if r[0] < 20 else 0
    if r[2] == float("inf"):  # the denominator's interval reaches zero
        return f"{r[0]:.{d}f}x (at least {r[1]:.{d}f}x)"
    return f"{r[0]:.{d}f}x ({r[1]:.{d}f}–{r[2]:.{d}f}x)"


def efficiency_sentence(params: pd.DataFrame, time: pd.DataFrame | None) -> str:
    p = params.set_index("backbone")
    parts = []
    for bb, r in p.iterrows():
        ratio = r.ratio_layerwise_to_luca
        parts.append(f"on {bb} the layer-wise adapters train {ratio:.2f}x the parameters of one LuCA "
                     f"({int(r.layerwise_adapter_params):,} vs {int(r.luca_params_per_task):,})"
                     + (" — the paper's ~8x holds" if 7 <= ratio <= 9 else
                        (" — here one LuCA is the larger" if ratio < 1 else "")))
    s = "Parameters: " + "; ".join(parts) + "."
    for bb, r in p.iterrows():  # the ~8x is per task: TOSCA keeps one LuCA per task, the adapters are trained once
        tot = r.luca_params_all_tasks / r.layerwise_adapter_params
        s += (f" Over {int(r.tasks)} tasks on {bb}, the {int(r.tasks)} LuCAs hold {tot:.2f}x the layer-wise "
              f"adapters' parameters (trained once, on the first task, in APER).")
    if time is not None:
        for bb, g in time.groupby("backbone", sort=False):
            g = g.set_index("setting")
            lw, cached, aug = (g.loc[k] for k in ("layerwise_adapter", "tosca_cached", "tosca_augment"))
            s += (f" Time, {bb} ({g.weights.iloc[0]} weights, batch {int(lw.batch)}): a layer-wise step takes "
                  f"{_ratio(ratio_range(lw, aug))} TOSCA's step with the backbone's forward pass (the reference's "
                  f"augment setting) and {_ratio(ratio_range(lw, cached))} TOSCA's step on cached features "
                  f"(ratio of means; in brackets the range the two 95 % intervals allow).")
    return s


# --- the question of notebook 02, answered from the numbers ---------------------------------------
def answer(runs, scenario: str) -> str:
    """With which router, if any, does TOSCA beat SimpleCIL, RanPAC and FeCAM on ``scenario``?"""
    out = []
    for b in headline_baselines(runs):
        t = beats(runs, scenario, b)
        win = t[t.verdict == "TOSCA higher"].routing.tolist()
        tie = t[t.verdict == "no difference detected"].routing.tolist()
        if win:
            out.append(f"TOSCA beats {b} with {', '.join(win)} routing"
                       + (" (per-batch is the reference's protocol: it reads the class-ordered test stream, "
                          "which a deployed model does not see)" if "per-batch" in win else ""))
        elif tie:
            out.append(f"no router puts TOSCA above {b} (no difference detected with {', '.join(tie)}; below it with the others)")
        else:
            out.append(f"TOSCA is below {b} with every router")
    o = stat(runs, "last_acc", scenario=scenario, routing="oracle")
    out.append(f"with the true task's module (oracle) it reaches A_B {fmt(*o)}")
    if {"ridge", "per-sample"} <= set(routings(runs)):
        m, h, n = paired(runs, "last_acc", dict(scenario=scenario, routing="ridge"),
                         dict(scenario=scenario, routing="per-sample"))
        out.append(f"the ridge router ({RIDGE_SHORT}) against the paper's per-sample entropy: A_B "
                   + ("no difference detected" if spans_zero(m, h) else ("higher" if m > 0 else "lower"))
                   + f" ({fmt_diff(m, h).replace(' (no difference detected)', '')}, {n} seeds)")
    same = same_as_entropy(runs, scenario)
    if same:
        out.append(f"{', '.join(same)} gave exactly the per-sample entropy numbers on every seed (its "
                   f"fallback, gated by the winning module's entropy, changed no routing choice)")
    elif "entropy-ncm" in routings(runs) and "per-sample" in routings(runs):
        out.append(entropy_fallback(runs, scenario))
    return f"{scenario}: " + "; ".join(out) + "."


def entropy_fallback(runs, scenario: str, router: str = "entropy-ncm") -> str:
    """How often a router that falls back from entropy (``entropy-ncm``) gives per-sample entropy's A_B,
    seed by seed, and the paired A_B difference: whether its row is a router of its own."""
    a = _select(runs, scenario=scenario, routing=router)
    b = _select(runs, scenario=scenario, routing="per-sample")
    a, b = a.align(b, join="inner", axis=0)
    same_ab = int((a.last_acc == b.last_acc).sum())
    same_all = int((a[["avg_inc_acc", "last_acc"]] == b[["avg_inc_acc", "last_acc"]]).all(axis=1).sum())
    m, h, n = paired(runs, "last_acc", dict(scenario=scenario, routing=router), dict(scenario=scenario, routing="per-sample"))
    s = (f"{router} gave per-sample entropy's A_B on {same_ab} of {n} seeds (and its Ā too on {same_all}); A_B "
         f"{router} − per-sample {fmt_diff(m, h, 2)}")
    if spans_zero(m, h):
        s += " — no difference detected, so read its row as per-sample entropy's"
    return s


def same_as_entropy(runs, scenario: str) -> list[str]:
    """Routers with an entropy gate whose every number equals per-sample entropy routing's, seed by seed."""
    cols = ["avg_inc_acc", "last_acc", "routing_accuracy_last", "routing_accuracy_mean"]
    ref = _select(runs, scenario=scenario, routing="per-sample")[cols]
    return [r for r in routings(runs) if r.startswith("entropy-")
            and _select(runs, scenario=scenario, routing=r)[cols].equals(ref)]


def why(runs, scenario: str) -> pd.DataFrame:
    """Routing accuracy × within-task accuracy: per router, routing accuracy and A_B, beside the
    oracle's A_B (what the modules know when the routing is right)."""
    o = stat(runs, "last_acc", scenario=scenario, routing="oracle")[0]
    rows = []
    for r in routings(runs):
        ra = stat(runs, "routing_accuracy_last", scenario=scenario, routing=r)
        ab = stat(runs, "last_acc", scenario=scenario, routing=r)
        rows.append({"routing": r, "routing acc. (%)": fmt(*ra), "A_B": fmt(*ab),
                     "routing acc. × oracle A_B / 100": f"{ra[0] * o / 100:.1f}"})
    return pd.DataFrame(rows)


# --- the README section ---------------------------------------------------------------------------
def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


README_HEADING = "# The shipped TOSCA study"


def readme_section(shipped: Shipped) -> str:
    """``results/tosca/README.md``: the shipped study's tables and computed sentences."""
    runs, man = shipped.runs, shipped.manifest
    cfg = man["base_config"]
    first = shipped.scenarios[0]
    parts = [
        README_HEADING,
        "",
        "Generated by `python -m lab.experiments.tosca.results` from the tables in this folder (do not edit); "
        "notebook 02 renders the same tables with figures.",
        "",
        f"`{man['command']}` ({cfg['backbone']} cached features, B0 Inc{cfg['inc']}, {cfg['epochs']} epochs, "
        f"{seeds_phrase(runs)}, each seed its own class order; "
        f"{man['wall_seconds'] / 60:.0f} min on {man['machine'].get('cpus', '?')} CPU cores, "
        f"{man.get('executor', 'local')} executor). Mean ± 95 % t-interval over seeds; differences paired by seed; "
        f"a difference whose interval spans zero reads *no difference detected*.",
        "",
        half_width_sentence(runs),
        "",
        f"`TOSCA (ridge)` routes with {RIDGE_ORIGIN}. `TOSCA (per-sample)` and `TOSCA (per-batch)` are the paper's "
        "entropy routing.",
    ]
    if (shipped.folder / "mechanism" / "manifest.json").is_file():
        parts += ["", "TOSCA's mechanism — weight sparsity, gate openness and the tasks' active-dimension overlap "
                      "against chance, over L1 strength and training length — is measured in "
                      "[mechanism/README.md](mechanism/README.md)."]
    if (shipped.folder / "ventral" / "manifest.json").is_file():
        parts += ["", "Notebook 01's comparisons over seeds (linear probe by stage, what full fine-tuning does to the "
                      "other classes' read-out, its task accuracy against TOSCA's) are in `ventral/per_seed.csv`, "
                      "written by `python -m lab.experiments.tosca.ventral`."]
    for scn in shipped.scenarios:
        parts += ["", f"## {SCENARIO_NAMES.get(scn, scn)}", "",
                  "TOSCA (reference initialisation) under each router, and the baselines (accuracies in %):", "",
                  _md(router_table(runs, scn)), "", answer(runs, scn), "",
                  "Headline comparisons (A_B, paired by seed):", "", _md(comparisons_table(runs, scn))]
    parts += ["", "## Reference initialisation vs this library's former one", "",
              "The reference: zero head rows after task 0 and task 0's LuCA from nn.Linear's default; former: "
              "uniform rows and Xavier for every task; and each change alone. A_B differences, paired by seed:", "",
              _md(init_table(runs)),
              "", f"## The LuCA flow ablation on {first}", "", "Reference initialisation:", "",
              _md(flow_table(runs, first))]
    if shipped.efficiency_params is not None:
        em = shipped.efficiency_manifest
        load = em["machine"].get("loadavg_before")
        busy = f"; load average {load[1]:.1f} on {em['machine'].get('cpus', '?')} cores while timing, so " \
               "absolute times are slow and the ratios are what compare" if load else ""
        parts += ["", "## Efficiency", "", f"`{em['command']}`: parameters exact from the architectures built on "
                      f"the meta device, time per training step, mean ± 95 % t-interval over steps{busy}.", "",
                  _md(efficiency_params_table(shipped.efficiency_params)), "",
                  _md(efficiency_time_table(shipped.efficiency_time)), "",
                  efficiency_sentence(shipped.efficiency_params, shipped.efficiency_time)]
    return "\n".join(parts) + "\n"


def update_readme(folder=None, shipped: Shipped | None = None) -> Path:
    """Write ``<folder>/README.md`` (default ``results/tosca``) from the shipped tables, atomically."""
    from lab import _io

    shipped = shipped or load(folder)
    path = Path(shipped.folder) / "README.md"
    text = readme_section(shipped)
    _io.atomic_write(path, lambda p: p.write_text(text))
    return path


if __name__ == "__main__":
    import sys

    print("wrote", update_readme(sys.argv[1] if len(sys.argv) > 1 else None))


# --- a live run against the shipped intervals ---------------------------------------------------------
def live_check(shipped: Shipped, live_summary: pd.DataFrame, cfg) -> str:
    """Compare a live run (``live_summary``: rows of method, routing, last_acc; ``cfg``: its
    RunConfig) with the shipped study (:func:`_against_seeds`): the same seed's shipped A_B, or the
    spread of single seeds. A live value that differs is flagged loudly."""
    scn, base = "+".join(cfg.datasets), shipped.manifest["base_config"]
    same = {k: (getattr(cfg, k), base[k]) for k in ("epochs", "init", "inc", "backbone", "lr", "l1")
            if getattr(cfg, k) != base[k]}
    from lab.backbones import check_resolution

    px = check_resolution(cfg.backbone, cfg.resolution), check_resolution(base["backbone"], base.get("resolution"))
    if px[0] != px[1]:
        same["resolution"] = px
    if scn not in shipped.scenarios or same:
        why = f"scenario {scn} is not in it" if scn not in shipped.scenarios else \
            ", ".join(f"{k} {a} (study: {b})" for k, (a, b) in same.items())
        return f"live run not comparable with the shipped study: {why}"
    lines = []
    for method, routing in ((METHOD, "per-sample"), (METHOD, "oracle"), (HEADLINE_BASELINES[0], "single")):
        row = live_summary[(live_summary.method == method) & (live_summary.routing == routing)]
        if row.empty:
            continue
        live = float(row.last_acc.iloc[0])
        sel = dict(scenario=scn, method=method, routing=routing) if _info(method).get("routed") else dict(scenario=scn, method=method)
        rows = _select(shipped.runs, **sel)
        lines.append(f"{method} ({routing}): live A_B {live:.2f}; " + _against_seeds(live, rows.last_acc, cfg.seed))
    return "\n".join(lines)


def _against_seeds(live: float, shipped, seed: int) -> str:
    """A live run of one seed against the study: its own seed's shipped value when the study has it
    (the same code, settings and seed give the same number on the same machine; the CSV keeps two
    decimals), else the 95 % prediction interval for one more seed, mean ± t·sd·√(1 + 1/n) (the
    interval of the mean over seeds is narrower than the spread of single seeds)."""
    import numpy as np

    v = np.asarray(shipped, dtype=float)
    if seed in shipped.index:
        then = float(shipped.loc[seed])
        if abs(live - then) <= 0.005 + 1e-9:
            return f"shipped seed {seed}: {then:.2f} — reproduced"
        return f"shipped seed {seed}: {then:.2f} — !!! DIFFERS by {live - then:+.2f} points: check the setup !!!"
    if len(v) < 2:
        return f"the study has one seed ({v[0]:.2f}): no interval to compare with"
    half = float(_stats.t_quantile(len(v) - 1) * v.std(ddof=1) * np.sqrt(1 + 1 / len(v)))
    inside = abs(live - v.mean()) <= half
    return (f"a new seed would fall in {v.mean():.2f} ± {half:.2f} (95 % prediction interval over {len(v)} seeds) — "
            + ("inside" if inside else "!!! OUTSIDE: check the setup !!!"))


# --- notebook 02's "What we found", computed ---------------------------------------------------------
def entropy_vs_floor(runs, scenario: str) -> str:
    """TOSCA under the paper's per-sample entropy routing against SimpleCIL (prototypes, no training)."""
    m, h, n = paired(runs, "last_acc", dict(scenario=scenario, routing="per-sample"),
                     dict(scenario=scenario, method="simplecil"))
    where = _stats.direction(m - h, m + h)
    if where == "lower":
        return (f"under the paper's per-sample entropy routing TOSCA's A_B is {abs(m):.1f} points *below* "
                f"SimpleCIL's, the training-free floor ({fmt_diff(m, h)}, {n} seeds)")
    if where == "higher":
        return f"under per-sample entropy routing TOSCA's A_B is {m:.1f} points above SimpleCIL's ({fmt_diff(m, h)}, {n} seeds)"
    return f"under per-sample entropy routing TOSCA's A_B and SimpleCIL's differ by {fmt_diff(m, h)} ({n} seeds)"


def routing_gap(runs, scenario: str) -> str:
    """What the modules know (oracle) against what per-sample entropy delivers, paired by seed."""
    m, h, n = paired(runs, "last_acc", dict(scenario=scenario, routing="oracle"), dict(scenario=scenario, routing="per-sample"))
    ra = stat(runs, "routing_accuracy_last", scenario=scenario, routing="per-sample")
    return (f"with the true task's module TOSCA's A_B is {fmt(*stat(runs, 'last_acc', scenario=scenario, routing='oracle'))}, "
            f"{fmt_diff(m, h)} points above per-sample entropy routing, which sends {fmt(*ra)} % of the test images to "
            f"their own task's module")


def per_batch_sentence(runs, scenario: str) -> str:
    m, h, n = paired(runs, "last_acc", dict(scenario=scenario, routing="per-batch"), dict(scenario=scenario, routing="per-sample"))
    sd = {r: float(_select(runs, scenario=scenario, routing=r).last_acc.std(ddof=1)) for r in routings(runs)
          if r != "oracle"}
    rank = sorted(sd, key=sd.get, reverse=True).index("per-batch") + 1
    return (f"per-batch routing (the reference's protocol: one module per class-ordered batch of 48) gives A_B "
            f"{fmt(*stat(runs, 'last_acc', scenario=scenario, routing='per-batch'))} over {n} seeds, "
            f"{fmt_diff(m, h)} against per-sample; its A_B spreads {sd['per-batch']:.1f} points (sd) over seeds, "
            + ("the widest of the " if rank == 1 else f"rank {rank} of the ") + f"{len(sd)} routers (per-sample: "
            f"{sd['per-sample']:.1f})")


def what_we_found(shipped: Shipped, mech=None) -> str:
    """Markdown bullets for notebook 02's last section, every figure and verdict from the shipped tables."""
    runs = shipped.runs
    scns = shipped.scenarios
    out = ["* **Against the baselines** (" + seeds_phrase(runs) + "): " + "; ".join(
        f"on {s}, {entropy_vs_floor(runs, s)}" for s in scns) + ". " + " ".join(
        answer(runs, s).split("; with the true task's")[0] + "." for s in scns)]
    out.append("* **The gap is routing**: " + "; ".join(f"on {s}, {routing_gap(runs, s)}" for s in scns) + ".")
    out.append(f"* **Routers**: `ridge` is {RIDGE_ORIGIN}; " + "; ".join(
        f"on {s}, {entropy_fallback(runs, s)}" for s in scns if "entropy-ncm" in routings(runs)) + ".")
    out.append("* **Per-batch routing reports a protocol**: " + "; ".join(f"on {s}, {per_batch_sentence(runs, s)}"
                                                                      for s in scns) + ".")
    if mech is not None:
        from . import mechanism_views as MV

        out.append("* **Sparsity and orthogonality** (the mechanism study, sections 4–6): " + MV.headline(mech) + " "
                   + " ".join(MV.plainly(mech, s) for s in mech.scenarios))
    return "\n".join(out)
