"""Panels for the AWARe notebooks: re-select masks from saved saliency, browse finished runs.

Each panel does one job:

* :class:`MaskPanel` (notebooks 03 and 04) — rho slider, selection-rule picker, calibration-set and
  target pickers, layer picker: re-runs the masking rule on the stored saliency (milliseconds, no
  model pass) and shows the frozen fraction per target, which layers are frozen, the chosen target's
  frozen map and one layer's sorted saliency with its frozen neurons. Built on a study folder
  (:meth:`MaskPanel.from_study`) it also says what the study measured for that exact selection.
* :class:`RunsPanel` (notebook 04) — browse a study's finished runs: a group of variants and one
  measure per learning-rate scale, mean over seeds; says "no finished run yet" when there is none.
* :class:`AblationPanel` — pick an ablation group and a metric from a ``lab aware ablate`` results table.
"""
from __future__ import annotations

from lab.widgets import Panel

TARGET_SETS = ("qkv+projector", "qkv", "qkv+projector+mlp")


class MaskPanel(Panel):
    """``study``: a :class:`lab.experiments.aware.study.profiles.Study`. The reference selection (for the overlap read-out)
    is the paper's setting: rho=0.3, activation-global, q/k/v+projector, first calibration profile."""

    title = "Re-select AWARe's frozen rows: rho, rule, calibration set, targets"

    def __init__(self, study, *, rho: float = 0.3, rule: str = "activation-global", profile: str | None = None,
                 targets: str = "qkv+projector", show: str = "q_proj", layer: int = 0, seed: int = 0, runs=None):
        import ipywidgets as w

        from lab.experiments.aware.study.profile_tables import layer_table

        self.study, self.seed, self.runs = study, seed, runs
        profile = profile or study.labels[0]
        self.reference = study.select(profile, 0.3, "activation-global", "qkv+projector")
        sets = [t for t in TARGET_SETS if study.layers(t)]
        self._layers = layer_table(study.norms)
        shows = list(dict.fromkeys(self._layers.target))
        n_layers = self._last_layer(show) if show in shows else 0
        super().__init__({
            "rho": w.FloatSlider(value=rho, min=0.0, max=1.0, step=0.05, description="rho", continuous_update=False),
            "rule": w.Dropdown(options=_rules(study), value=rule, description="rule"),
            "profile": w.Dropdown(options=study.labels, value=profile, description="calibration"),
            "targets": w.Dropdown(options=sets, value=targets, description="targets"),
            "show": w.Dropdown(options=shows, value=show, description="show"),
            "layer": w.IntSlider(value=layer, min=0, max=n_layers, description="layer", continuous_update=False),
        })

    @classmethod
    def from_study(cls, study: dict, **kw) -> "MaskPanel":
        """The panel on a ``lab aware study`` folder (:func:`lab.experiments.aware.views.study.load_study`):
        its stored saliency profiles and row norms, and its finished runs (``runs.csv``), so the status
        line says what the study measured for the selection shown."""
        from lab.experiments.aware.study.profiles import Study

        return cls(Study.load(study["path"]), runs=study.get("runs"), **kw)

    def _last_layer(self, show: str) -> int:
        """The last layer index of target ``show`` (the projector has two Linears: 1)."""
        rows = self._layers[self._layers.target == show]
        return int(rows.layer.max()) if len(rows) else 0

    def sync_controls(self) -> None:
        """The layer slider spans the layers of the target shown (a value past the end moves to the last)."""
        layer = self.controls["layer"]
        last = self._last_layer(self.controls["show"].value)
        if layer.value > last:
            layer.value = last
        layer.max = last
        self.inactive = {"layer": "the target shown has one layer"} if last == 0 else {}
        self.inactive.update(_calibration_unused(self.controls["rule"].value, len(self.study.labels)))

    def compute(self, rho, rule, profile, targets, show, layer):
        from lab.aware.masking import frozen_fraction
        from lab.experiments.aware.views import figures
        from lab.experiments.aware.study import profile_tables as tables
        from lab.aware.metrics import mask_overlap

        masks = self.study.select(profile, rho, rule, targets, seed=self.seed)
        by_target = tables.frozen_by_target({"frozen": masks})["frozen"]
        common = {n: m for n, m in masks.items() if n in self.reference}
        result = {"rho": float(rho), "rule": rule, "profile": profile, "targets": targets, "show": show,
                  "layer": int(layer), "masks": masks, "frozen_fraction": frozen_fraction(masks),
                  "by_target": by_target.to_dict(),
                  "overlap_with_reference": mask_overlap(self.reference, common)["jaccard"] if common else float("nan")}
        figs = [figures.frozen_by_layer({f"{rule}, rho={rho:g}": masks},
                                      targets=[t for t in tables.MAIN_TARGETS + ("gate_proj", "up_proj", "down_proj")],
                                      title=f"% of every layer's rows frozen ({rule}, rho={rho:g}, {targets}, {profile})")]
        rows = self._layers[(self._layers.target == show) & (self._layers.layer == layer)]
        if show in tables.layer_table(masks).target.values:
            figs.append(figures.mask_image(masks, show, title=f"{show}: frozen rows (red), layer x neuron"))
        if len(rows):
            name = rows.name.iloc[0]
            scores = self.study.profiles[profile]
            figs.append(figures.layer_profile(scores, name, masks.get(name),
                                            title=f"{show}, layer {layer}: neurons by saliency"
                                                  + (" (red = frozen)" if name in masks else " (not a target here)")))
            result["layer_frozen"] = float(masks[name].float().mean()) if name in masks else 0.0
        if self.runs is not None:
            result["measured"] = _measured(self.runs, rule, rho, targets, profile)
        return result, figs

    def describe(self, r) -> str:
        per = ", ".join(f"{k} {v * 100:.1f}%" for k, v in r["by_target"].items() if k != "all targets")
        line = (f"<b>{r['frozen_fraction'] * 100:.1f}%</b> of target rows frozen ({per}); Jaccard with "
                f"rho=0.3/global/{self.study.labels[0]}: {r['overlap_with_reference']:.2f}")
        if "measured" in r:
            m = r["measured"]
            line += ("<br>the study fine-tuned this selection: "
                     + ", ".join(f"{k} {v:.3f}" if k == "downstream" else f"{k} {v:.1f}" for k, v in m.items())
                     + " (mean over its finished runs)" if m else "<br>the study has no finished run with this selection")
        return line


def _rules(study) -> list[str]:
    """The selection rules a study can re-run: ``weight-norm`` only with the model's row norms stored."""
    import torch

    from lab.aware.masking import rule_names

    has_norms = not any(bool(torch.isnan(v).any()) for v in study.norms.values())
    return [r for r in rule_names() if r != "weight-norm" or has_norms]


def _calibration_unused(rule: str, n_profiles: int) -> dict[str, str]:
    """``{"profile": why}`` when the calibration picker changes nothing for ``rule``."""
    from lab.aware.masking import needs_saliency

    if not needs_saliency(rule):
        return {"profile": f"the {rule} rule does not read the calibration saliency"}
    if n_profiles < 2:
        return {"profile": "the study saved one calibration set"}
    return {}


def _measured(runs, rule, rho, targets, profile) -> dict | None:
    """The mean R/E/H (or downstream/R) of the finished runs with this exact selection (rule, rho,
    targets, calibration set ``kind-n``), when there are any (else ``None``)."""
    r = runs
    if r is None or not len(r) or "rule" not in r or "rho" not in r:
        return None
    rows = r[(r.rule == rule) & ((r.rho - float(rho)).abs() < 1e-9)]
    if "targets" in r:
        rows = rows[rows.targets == targets]
    kind, _, n = str(profile).rpartition("-")
    if "calib" in r and kind:
        rows = rows[rows.calib == kind]
    if "calib_n" in r and n.isdigit():
        rows = rows[rows.calib_n == int(n)]
    if not len(rows):
        return None
    import math

    means = {k: float(rows[k].mean()) for k in ("downstream", "R", "E", "H") if k in rows}
    return {k: v for k, v in means.items() if math.isfinite(v)} or None


class RunsPanel(Panel):
    """Browse a study's finished runs (``runs.csv`` of ``lab aware study``; ``study``: the dict of
    :func:`lab.experiments.aware.views.study.load_study`, or the runs table itself): pick a group of
    variants and a measure; one line per variant over the learning-rate scales, the mean over the
    finished seeds (hover: how many). With no finished run the panel says so and its pickers are off."""

    title = "Browse the study's finished runs: one measure per variant and learning-rate scale"
    METRICS = {"R": "R, multimodal retention (%)", "downstream": "downstream accuracy",
               "R_probe": "R, text probe (%)", "easy_vqa": "easy-VQA accuracy", "trainable_frac": "trainable (%)"}
    EMPTY = "no finished run yet"

    def __init__(self, study, *, group: str = "methods", metric: str = "R", precision: str | None = None):
        import ipywidgets as w
        import pandas as pd

        runs = study.get("runs") if isinstance(study, dict) else study
        self.runs = runs if runs is not None else pd.DataFrame(columns=["group", "variant", "scale", "seed"])
        self.empty = not len(self.runs)
        groups = list(dict.fromkeys(self.runs.group)) if not self.empty else [group]
        metrics = {k: v for k, v in self.METRICS.items() if k in self.runs.columns} or {metric: metric}
        precisions = (sorted(set(self.runs.precision.astype(str))) if "precision" in self.runs and not self.empty
                      else [precision or "bf16"])
        super().__init__({
            "group": w.Dropdown(options=groups, value=group if group in groups else groups[0], description="group"),
            "metric": w.Dropdown(options=[(v, k) for k, v in metrics.items()],
                                 value=metric if metric in metrics else next(iter(metrics)), description="measure"),
            "precision": w.Dropdown(options=precisions, value=precision if precision in precisions else precisions[0],
                                    description="precision"),
        })

    def sync_controls(self) -> None:
        if self.empty:
            self.inactive = {k: self.EMPTY for k in self.controls}
            return
        self.inactive = {}
        if len(self.controls["group"].options) < 2:
            self.inactive["group"] = "the finished runs are all of one group so far"
        if len(self.controls["precision"].options) < 2:
            self.inactive["precision"] = f"every finished run trained in {self.controls['precision'].value}"

    def compute(self, group, metric, precision):
        import plotly.graph_objects as go

        from lab.experiments.aware.views import study as V

        label = self.METRICS.get(metric, metric)
        result = {"group": group, "metric": metric, "precision": precision, "runs": 0, "variants": 0,
                  "best": None, "best_value": float("nan"), "table": None}
        if self.empty:              # nothing to draw: the status line says so
            return result, []
        r = self.runs[self.runs.group == group]
        if "precision" in r:
            r = r[r.precision.astype(str) == precision]
        if not len(r):              # e.g. a group re-run in one precision only: the status line says so
            return result, []
        frac = metric == "trainable_frac"
        t = (r.assign(_y=r[metric] * (100 if frac else 1))
             .groupby(["variant", "scale"], sort=False).agg(y=("_y", "mean"), seeds=("seed", "nunique"))
             .reset_index().sort_values(["variant", "scale"], kind="stable"))
        fig = go.Figure()
        order = list(dict.fromkeys(r.variant))
        scales = sorted(set(t.scale))
        for v in order:
            g = t[t.variant == v]
            fig.add_trace(go.Scatter(
                x=[V.scale_str(x) for x in g.scale], y=g.y.tolist(), mode="lines+markers", name=V.name(v),
                line=dict(color=V.COLORS.get(v)), customdata=g.seeds.tolist(),
                hovertemplate=f"{V.name(v)}, scale %{{x}}: %{{y:.3g}} (%{{customdata}} seed(s))<extra></extra>"))
        fig.update_layout(title=f"{V.GROUP_TITLES.get(group, group)}: {label}, mean over finished seeds ({precision})",
                          xaxis_title="learning-rate scale", yaxis_title=label, height=420,
                          legend=dict(orientation="h", y=-0.25))
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=[V.scale_str(x) for x in scales])
        ok = t.y.notna()
        if ok.any():
            best = t[ok].loc[t[ok].y.idxmax()]
            result.update(best=f"{V.name(best.variant)} at scale {V.scale_str(best.scale)}", best_value=float(best.y))
        result.update(runs=len(r), variants=len(order), table=t)
        return result, [fig]

    def describe(self, r) -> str:
        if self.empty:
            return f"<b>{self.EMPTY}</b>: `lab aware study` writes each run to the study's runs/ folder as it finishes"
        if not r["runs"]:
            return f"{r['group']}: no finished {r['precision']} run"
        m = r["metric"]
        v = r["best_value"]
        head = (f"<b>{r['runs']}</b> finished run{'s' if r['runs'] != 1 else ''} in {r['group']} "
                f"({r['variants']} variant{'s' if r['variants'] != 1 else ''}); ")
        if r["best"] is None:       # e.g. R of a model that answered nothing upstream before fine-tuning
            return head + f"{self.METRICS.get(m, m)}: no finite value in these runs"
        shown = f"{v:.1f}%" if m in ("R", "R_probe", "trainable_frac") else f"{v:.3f}"
        return head + f"highest {self.METRICS.get(m, m)}: <b>{r['best']}</b> ({shown})"


class AblationPanel(Panel):
    """``results``: the tidy table of :func:`lab.experiments.aware.run.ablate.sweep` (or a saved run's):
    pick an ablation group and a metric; one bar per variant, the mean over seeds. (Re-selecting the
    frozen rows on a run's saliency is :class:`MaskPanel`'s job.)"""

    title = "Browse the ablation: one metric per variant of a group"
    METRICS = ("H", "R", "E", "downstream", "up_easy_vqa", "up_probe", "trainable_frac")
    EMPTY = "no finished run yet"

    def __init__(self, results, *, group: str = "methods", metric: str = "H"):
        import ipywidgets as w

        self.results = results
        self.empty = not len(results)
        groups = list(dict.fromkeys(results.group)) or [group]
        metrics = [m for m in self.METRICS if m in results.columns] or [metric]
        super().__init__({
            "group": w.Dropdown(options=groups, value=group if group in groups else groups[0], description="group"),
            "metric": w.Dropdown(options=metrics, value=metric if metric in metrics else metrics[0],
                                 description="metric"),
        })

    @classmethod
    def from_run(cls, run: dict, **kw) -> "AblationPanel":
        """The panel for a run of :func:`lab.experiments.aware.views.ablation.run_sweep` / ``load_run``: its
        results table (its stored saliency: ``MaskPanel(Study.load(run["run_dir"]))``)."""
        return cls(run["results"], **kw)

    def sync_controls(self) -> None:
        self.inactive = {k: self.EMPTY for k in self.controls} if self.empty else {}

    def compute(self, group, metric):
        from lab import plots
        from lab.experiments.aware.views.ablation import summary

        pct = metric in ("R", "E", "H")
        if self.empty:              # nothing to draw: the status line says so
            return {"group": group, "metric": metric, "table": self.results, "best": None,
                    "best_value": float("nan")}, []
        s = summary(self.results, group)
        frac = metric == "trainable_frac"       # a fraction, shown as a percentage
        fig = plots.bar(s.assign(**{metric: 100 * s[metric]}) if frac else s, x="variant", y=metric, range_y=None,
                        title=f"{group}: {metric}" + (" (%)" if pct or frac else "") + " per variant, mean over seeds")
        if pct or frac:                         # percentages with one decimal
            fig.update_traces(texttemplate="%{y:.1f}%", hovertemplate="%{x}: %{y:.1f}%<extra></extra>")
        if pct:
            fig.add_hline(y=100, line_dash="dot", line_color="grey")
        ok = s[metric].notna()
        best = s[ok].loc[s[ok][metric].idxmax()] if ok.any() else None
        return {"group": group, "metric": metric, "table": s, "best": None if best is None else best.variant,
                "best_value": float("nan") if best is None else float(best[metric])}, [fig]

    def describe(self, r) -> str:
        if self.empty:
            return f"<b>{self.EMPTY}</b>"
        if not r["best"]:
            return f"{r['group']}: no finished test run with {r['metric']} yet"
        m, v = r["metric"], r["best_value"]
        shown = (f"{v:.1f}%" if m in ("R", "E") else f"{v:.1f}" if m == "H" else f"{100 * v:.1f}%"
                 if m == "trainable_frac" else f"{v:.3f}")
        return f"{r['group']}: highest {m} is <b>{r['best']}</b> ({shown})"
