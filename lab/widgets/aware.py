"""Panels for the AWARe notebooks: re-select masks from saved saliency, browse ablation results.

* :class:`MaskPanel` (notebook 03) — rho slider, selection-rule picker, calibration-set and target
  pickers, layer picker: re-runs the masking rule on the stored saliency (milliseconds, no model
  pass) and shows the frozen fraction per target, which layers are frozen, the chosen target's
  frozen map and one layer's sorted saliency with its frozen neurons.
* :class:`AblationPanel` (notebook 04) — pick an ablation group and a metric from a results table.
"""
from __future__ import annotations

from lab.widgets import Panel

TARGET_SETS = ("qkv+projector", "qkv", "qkv+projector+mlp")


class MaskPanel(Panel):
    """``study``: a :class:`lab.experiments.aware.study.Study`. The reference selection (for the overlap read-out)
    is the paper's setting: rho=0.3, activation-global, q/k/v+projector, first calibration profile."""

    title = "Re-select AWARe's frozen rows: rho, rule, calibration set, targets"

    def __init__(self, study, *, rho: float = 0.3, rule: str = "activation-global", profile: str | None = None,
                 targets: str = "qkv+projector", show: str = "q_proj", layer: int = 0, seed: int = 0):
        import ipywidgets as w

        from lab.aware.masking import rule_names
        from lab.experiments.aware.tables import layer_table

        self.study, self.seed = study, seed
        profile = profile or study.labels[0]
        self.reference = study.select(profile, 0.3, "activation-global", "qkv+projector")
        sets = [t for t in TARGET_SETS if study.layers(t)]
        self._layers = layer_table(study.norms)
        shows = list(dict.fromkeys(self._layers.target))
        n_layers = self._last_layer(show) if show in shows else 0
        super().__init__({
            "rho": w.FloatSlider(value=rho, min=0.0, max=1.0, step=0.05, description="rho", continuous_update=False),
            "rule": w.Dropdown(options=rule_names(), value=rule, description="rule"),
            "profile": w.Dropdown(options=study.labels, value=profile, description="calibration"),
            "targets": w.Dropdown(options=sets, value=targets, description="targets"),
            "show": w.Dropdown(options=shows, value=show, description="show"),
            "layer": w.IntSlider(value=layer, min=0, max=n_layers, description="layer", continuous_update=False),
        })

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

    def compute(self, rho, rule, profile, targets, show, layer):
        from lab.aware.masking import frozen_fraction
        from lab.experiments.aware import figures, tables
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
        return result, figs

    def describe(self, r) -> str:
        per = ", ".join(f"{k} {v * 100:.1f}%" for k, v in r["by_target"].items() if k != "all targets")
        return (f"<b>{r['frozen_fraction'] * 100:.1f}%</b> of target rows frozen ({per}); Jaccard with "
                f"rho=0.3/global/{self.study.labels[0]}: {r['overlap_with_reference']:.2f}")


class AblationPanel(Panel):
    """``results``: the tidy table of :func:`lab.experiments.aware.ablate.sweep` (or a saved run's).

    With ``study`` (a :class:`lab.experiments.aware.study.Study`, e.g. the run's stored saliency via
    :meth:`from_run`) the panel also re-selects AWARe's frozen rows live — selection rule, rho,
    targets and calibration set — on that saliency (milliseconds, no model pass, no fine-tuning):
    what each setting would freeze, layer by layer, next to what the run measured for it.
    """

    title = "Browse the ablation (group, metric) and re-select the frozen rows on the run's saliency"
    METRICS = ("H", "R", "E", "downstream", "up_easy_vqa", "up_probe", "trainable_frac")

    def __init__(self, results, *, group: str = "methods", metric: str = "H", study=None, rule: str = "activation-global",
                 rho: float = 0.3, targets: str = "qkv+projector", profile: str | None = None, seed: int = 0):
        import ipywidgets as w

        self.results, self.study, self.seed = results, study, seed
        groups = list(dict.fromkeys(results.group)) or [group]   # a study with no finished test run yet: masks only
        controls = {
            "group": w.Dropdown(options=groups, value=group if group in groups else groups[0], description="group"),
            "metric": w.Dropdown(options=[m for m in self.METRICS if m in results.columns], value=metric,
                                 description="metric"),
        }
        if study is not None:
            import torch

            from lab.aware.masking import rule_names

            has_norms = not any(bool(torch.isnan(v).any()) for v in study.norms.values())
            rules = [r for r in rule_names() if r != "weight-norm" or has_norms]  # weight norms need the model's rows
            sets = [t for t in TARGET_SETS if study.layers(t)]
            controls.update({
                "rule": w.Dropdown(options=rules, value=rule, description="rule"),
                "rho": w.FloatSlider(value=rho, min=0.0, max=1.0, step=0.05, description="rho",
                                     continuous_update=False),
                "targets": w.Dropdown(options=sets, value=targets if targets in sets else sets[0], description="targets"),
                "profile": w.Dropdown(options=study.labels, value=profile or study.labels[0], description="calibration"),
            })
        super().__init__(controls)

    @classmethod
    def from_run(cls, run: dict, **kw) -> "AblationPanel":
        """The panel for a run of :func:`lab.experiments.aware.ablation_views.run_sweep` / ``load_run``: its results
        table and, when the run folder holds saliency profiles, live mask re-selection on them."""
        from pathlib import Path

        from lab.experiments.aware.study import Study

        folder = Path(run.get("run_dir") or "")
        study = Study.load(folder) if folder.is_dir() and any(folder.glob("saliency_*.safetensors")) else None
        return cls(run["results"], study=study, **kw)

    def compute(self, group, metric, rule=None, rho=None, targets=None, profile=None):
        from lab import plots
        from lab.experiments.aware.ablation_views import summary

        pct = metric in ("R", "E", "H")
        if not len(self.results):
            import plotly.graph_objects as go

            s = self.results
            fig = go.Figure().update_layout(title="no finished test run yet: only the mask re-selection below", height=200)
            result = {"group": group, "metric": metric, "table": s, "best": None, "best_value": float("nan")}
        else:
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
            result = {"group": group, "metric": metric, "table": s, "best": None if best is None else best.variant,
                      "best_value": float("nan") if best is None else float(best[metric])}
        figs = [fig]
        if self.study is not None:
            from lab.aware.masking import frozen_fraction
            from lab.experiments.aware import figures, tables

            masks = self.study.select(profile, rho, rule, targets, seed=self.seed)
            by_target = tables.frozen_by_target({"frozen": masks})["frozen"]
            result.update({"rule": rule, "rho": float(rho), "targets": targets, "profile": profile, "masks": masks,
                           "frozen_fraction": frozen_fraction(masks), "by_target": by_target.to_dict(),
                           "measured": self._measured(rule, rho, targets, profile)})
            figs.append(figures.frozen_by_layer({f"{rule}, rho={rho:g}": masks}, targets=list(tables.ALL_TARGETS),
                                              title=f"% of each layer's rows frozen: {rule}, rho={rho:g}, {targets}, "
                                                    f"calibration {profile}"))
        return result, figs

    def _measured(self, rule, rho, targets, profile) -> dict | None:
        """The run's mean R/E/H for this exact selection (rule, rho, targets, calibration set ``kind-n``),
        when it fine-tuned one (else ``None``)."""
        r = self.results
        if "rule" not in r or "rho" not in r:
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
        return {k: float(rows[k].mean()) for k in ("R", "E", "H") if k in rows}

    def describe(self, r) -> str:
        if r["best"]:
            m, v = r["metric"], r["best_value"]
            shown = (f"{v:.1f}%" if m in ("R", "E") else f"{v:.1f}" if m == "H" else f"{100 * v:.1f}%"
                     if m == "trainable_frac" else f"{v:.3f}")
            line = f"{r['group']}: highest {m} is <b>{r['best']}</b> ({shown})"
        else:
            line = f"{r['group']}: no finished test run with {r['metric']} yet"
        if "frozen_fraction" in r:
            per = ", ".join(f"{k} {v * 100:.1f}%" for k, v in r["by_target"].items() if k != "all targets")
            m = r["measured"]
            seen = (" — the run measured " + ", ".join(f"{k} {v:.1f}" for k, v in m.items()) if m
                    else " — not fine-tuned in this run")
            line += (f"<br>{r['rule']}, rho={r['rho']:g}, {r['targets']}: <b>{r['frozen_fraction'] * 100:.1f}%</b> "
                     f"of target rows frozen ({per}){seen}")
        return line
