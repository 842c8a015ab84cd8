"""Notebook 05's panel: your router against the built-ins you pick, from results already computed."""
from __future__ import annotations

from lab.widgets import Panel


class RouterComparePanel(Panel):
    """Pick one of your routers, the built-ins to compare it against and a metric: the paired
    differences (yours − built-in, 95 % t over seeds, coloured by verdict), the means of every router
    picked, and the table of both — recomputed from ``comparison``'s per-seed rows (a
    :class:`lab.experiments.tosca.compare.Comparison`): no training, milliseconds per change."""

    title = "Compare your router with the built-ins you pick (per-seed results already computed)"
    hint = ("<b>against</b>: Ctrl-click (⌘-click on a Mac) to add or remove one built-in, Shift-click to pick "
            "a range; a plain click keeps only the one clicked.")

    def __init__(self, comparison, *, candidate: str | None = None, against=None, metric: str = "last_acc"):
        import ipywidgets as w

        from lab.experiments.tosca.compare import METRICS

        self.comparison = comparison
        candidate = candidate or comparison.candidates[0]
        against = tuple(comparison.builtins if against is None else against)
        for name, pool in ((candidate, comparison.candidates), *((b, comparison.builtins) for b in against)):
            if name not in pool:
                raise ValueError(f"{name!r} was not evaluated as {'yours' if pool is comparison.candidates else 'a built-in'}; "
                                 f"valid: {', '.join(pool)}")
        super().__init__({
            "candidate": w.Dropdown(options=comparison.candidates, value=candidate, description="yours"),
            "against": w.SelectMultiple(options=comparison.builtins, value=against, description="against",
                                        rows=min(len(comparison.builtins), 8),
                                        tooltip="Ctrl-click (⌘-click) to pick several"),
            "metric": w.Dropdown(options=[(label, k) for k, label in METRICS.items()], value=metric,
                                 description="metric"),
        })

    def _chance(self, metric: str) -> float:
        """What guessing reaches (%): a class among every class (A_B, Ā), a task among the tasks (routing)."""
        cfg = getattr(self.comparison, "config", None)
        if cfg is None:            # results made by hand (no scenario to count classes in): no chance line
            return float("nan")
        if not hasattr(self, "_classes"):
            from lab import data

            self._classes = sum(data.load_dataset(d).num_classes for d in cfg.datasets)
            first = cfg.init or cfg.inc
            self._tasks = 1 + max(0, -(-(self._classes - first) // cfg.inc))
        return 100 / (self._tasks if metric == "routing_accuracy_last" else self._classes)

    def compute(self, candidate, against, metric):
        import plotly.graph_objects as go

        from lab.experiments.tosca import compare as C
        from lab.report.readable import chance_line

        against = list(against)
        diffs = C.differences(self.comparison, candidate, against)
        table = C.difference_table(diffs)
        figs = [C.difference_figure(diffs, metric) if against else
                go.Figure().update_layout(title="pick at least one built-in to compare against", height=200),
                chance_line(C.means_figure(self.comparison, [candidate, *against], metric), self._chance(metric),
                            "chance" if metric != "routing_accuracy_last" else "chance (a task at random)")]
        if len(table):
            figs.append(go.Figure(go.Table(header=dict(values=list(table.columns), align="left"),
                                           cells=dict(values=[table[c] for c in table.columns], align="left")))
                        # plotly's default margins (100 px top, 80 bottom) would take the whole height
                        # and clip every row: small margins, room for a wrapped header and wrapped cells
                        .update_layout(title=f"{candidate} − built-in, paired by seed (95 % t-interval, verdict)",
                                       height=110 + 45 * len(table), margin=dict(t=50, b=10, l=10, r=10)))
        d = diffs[diffs.metric == metric]
        result = {"candidate": candidate, "against": against, "metric": metric, "differences": diffs,
                  "table": table, "verdicts": dict(zip(d.against, d.verdict))}
        return result, figs

    def describe(self, r) -> str:
        import html

        from lab.experiments.tosca.compare import headline

        if not r["against"]:
            return "pick at least one built-in router to compare against"
        return html.escape(headline(r["differences"], r["metric"]))
