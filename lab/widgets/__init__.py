"""ipywidgets panels for exploratory ablations in the notebooks.

Every panel is a :class:`Panel`: named controls, a reset button, a status line and an output area
that holds the panel's figures. Changing a control calls :meth:`Panel.refresh`, which recomputes
``panel.result`` (plain numbers / tables) and ``panel.figures`` (plotly) from cached features —
never from new backbone passes — and writes the new figures into the panel's own output area. The
logic is plain Python, so tests drive a panel without a browser::

    panel = ToscaPanel(data)
    panel.controls["l1"].value = 1e-2      # the callback retrains and refreshes synchronously
    panel.result["accuracy"], panel.output.outputs   # the numbers, and what the reader sees

How the figures reach the page: each figure is written into the ``Output`` widget as its plotly
JSON under ``application/vnd.plotly.v1+json`` (:func:`figure_output`), which JupyterLab 4 and
Notebook 7 draw with plotly's own renderer extension (``jupyterlab-plotly``, installed with
plotly). Going through IPython's display machinery instead (``append_display_data(fig)``,
``display(fig)``) does not work for plotly figures: they implement ``_ipython_display_``, which
*shows* the figure as a side effect and returns nothing to the output widget — during the cell's
first run that side effect lands in the cell's own output (a stray copy above the panel), and from
a browser-triggered callback it lands nowhere, so the panel never redraws. (plotly's
``FigureWidget`` would update in place, but needs the ``anywidget`` package; replacing the JSON
costs a few milliseconds and needs nothing extra.)

While a refresh runs, the status line says "computing…", the figures are dimmed and the controls
are disabled; the status line ends with the seconds the refresh took. The dimming is a CSS class on
the output area (``lab-busy``, added and removed through ipywidgets' synced ``_dom_classes``) and a
style the panel carries with it (:data:`STYLE`), so the browser really shows it: the figures dim at
once (no transition on the way down, so even a refresh of a few milliseconds shows), stay dimmed
until the new figures are in the output area, and fade back in. A control that does
nothing for the current choice of the others is disabled, its tooltip and the status line say why
(:meth:`Panel.sync_controls` sets :attr:`Panel.inactive`), and a slider's range follows what it
indexes (e.g. notebook 03's layer slider spans the layers of the target shown).

Under papermill a panel executes once with its defaults (the offline HTML shows a static note).

* :class:`~lab.widgets.ventral.StagePanel` — pick a stage of the frozen backbone: decodability,
  projection, CKA with the other stages (notebook 01).
* :class:`~lab.widgets.tosca.ToscaPanel` — L1 slider / epochs / σ parametrisation / routing /
  baseline pickers re-training TOSCA on cached features: accuracy, gate sparsity, task overlap,
  a baseline for comparison (notebook 02).
* :class:`~lab.widgets.aware.MaskPanel` — rho / rule / calibration set / target pickers re-running
  AWARe's masking rule on stored saliency (notebooks 03 and 04; on a study folder it also says what
  the study measured for the selection).
* :class:`~lab.widgets.aware.RunsPanel` — browse a study's finished runs, one measure per variant
  and learning-rate scale (notebook 04); "no finished run yet" when there is none.
* :class:`~lab.widgets.aware.AblationPanel` — browse a ``lab aware ablate`` results table.
* :class:`~lab.widgets.compare.RouterComparePanel` — pick your router, the built-in routers and a
  metric: paired differences over seeds with verdicts, from results already computed (notebook 05).
"""
from __future__ import annotations

import html
import time
from importlib import import_module
from typing import Any

_LAZY = {"StagePanel": "ventral", "ToscaPanel": "tosca", "MaskPanel": "aware", "AblationPanel": "aware",
         "RunsPanel": "aware", "RouterComparePanel": "compare"}
__all__ = ["Panel", "figure_output", "PLOTLY_MIME", *_LAZY]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
BUSY = "computing…"
BUSY_CLASS = "lab-busy"
# what the browser shows while a panel computes: its figures dimmed (the class is set from the kernel)
STYLE = ("<style>.lab-panel-output{transition:opacity .3s}"
         f".lab-panel-output.{BUSY_CLASS}{{opacity:.35;transition:none}}"
         ".lab-panel .widget-inline-hbox .widget-label{min-width:5em}"
         ".lab-panel-hint{color:#57606a;font-size:.9em}</style>")


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f"lab.widgets.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lab.widgets' has no attribute {name!r}")


def figure_title(fig) -> str:
    t = fig.layout.title.text if fig.layout.title is not None else None
    return t or ""


def figure_output(fig) -> dict:
    """One output-area entry (nbformat ``display_data``) for a plotly figure: its JSON under
    plotly's mimetype, as plotly's ``plotly_mimetype`` renderer writes it, plus a text fallback.
    Built directly from the figure — never through IPython's display formatter (see module doc)."""
    import plotly.io as pio

    from lab.report.readable import fit

    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fit(fig.to_dict()))  # titles/legends that fit
    bundle["text/plain"] = f"<plotly figure: {figure_title(fig) or 'untitled'}>"
    return {"output_type": "display_data", "data": bundle, "metadata": {}}


class Panel:
    """Base class: subclasses build ``controls`` and implement ``compute(**values) -> (result, figures)``
    and optionally ``describe(result) -> str`` (the status line, HTML) and ``sync_controls()`` (ranges
    and :attr:`inactive` controls for the current values, before each compute)."""

    title = ""
    hint = ""    # one line under the controls: how to use one that is not obvious

    def __init__(self, controls: dict[str, Any]):
        import ipywidgets as w

        self.controls = controls
        self.initial = {k: c.value for k, c in controls.items()}  # the notebook's parameters
        self.output = w.Output()
        self.output.add_class("lab-panel-output")
        self.status = w.HTML()
        self.status.add_class("lab-panel-status")
        self.reset_button = w.Button(description="reset", icon="undo",
                                     tooltip="reset every control to the notebook's parameters")
        self.reset_button.add_class("lab-panel-reset")
        self.reset_button.on_click(lambda _b: self.reset())
        self.result: Any = None
        self.figures: list = []
        self.error: str | None = None
        self.seconds = 0.0
        self.refreshes = 0
        self.inactive: dict[str, str] = {}   # control -> why it does nothing for the current choice
        self._hold = False
        self._widget = None
        for c in controls.values():
            c.observe(self._on_change, names="value")
        self.refresh()  # the defaults: errors here propagate (a notebook run must fail loudly)

    def values(self) -> dict[str, Any]:
        return {k: c.value for k, c in self.controls.items()}

    def compute(self, **values) -> tuple[Any, list]:
        raise NotImplementedError

    def describe(self, result) -> str:
        return ""

    def sync_controls(self) -> None:
        """Adjust controls to the current values before a compute (no refresh fires meanwhile): a
        slider's range, :attr:`inactive` (name -> why it does nothing now). Default: nothing."""

    def _sync(self) -> None:
        held, self._hold = self._hold, True
        try:
            self.sync_controls()
        finally:
            self._hold = held
        for name, c in self.controls.items():
            why = self.inactive.get(name, "")
            if hasattr(c, "tooltip"):
                c.tooltip = why or None

    def _busy(self, on: bool) -> None:
        """The "computing…" state: a status line, dimmed figures (the CSS class :data:`BUSY_CLASS`),
        disabled controls; afterwards only the :attr:`inactive` controls stay disabled."""
        for name, c in self.controls.items():
            c.disabled = on or name in self.inactive
        self.reset_button.disabled = on
        if on:
            self.output.add_class(BUSY_CLASS)
            self.status.value = f"<i>{BUSY}</i>"
        else:
            self.output.remove_class(BUSY_CLASS)

    def _inactive_note(self) -> str:
        return "".join(f"<br><small>{html.escape(self.controls[k].description or k)}: {html.escape(why)}</small>"
                       for k, why in self.inactive.items() if k in self.controls)

    def refresh(self) -> None:
        t0 = time.perf_counter()
        self._sync()
        self._busy(True)
        try:
            self.result, self.figures = self.compute(**self.values())
            self.seconds, self.error = time.perf_counter() - t0, None
            self.refreshes += 1
            self.status.value = (f"{self.describe(self.result)} <small>({self.seconds:.1f} s)</small>"
                                 f"{self._inactive_note()}")
            # Set the Output widget's contents directly (not `with self.output: display(...)`, which can
            # stall nbclient/papermill on the executing cell, and not `append_display_data(fig)`, which
            # shows plotly figures outside the panel — see the module docstring). Still dimmed: the old
            # figures stay dim until the new ones replace them.
            self.output.outputs = tuple(figure_output(f) for f in self.figures)
        finally:
            self._busy(False)

    def reset(self) -> None:
        """Every control back to the notebook's parameters; one refresh."""
        self._hold = True
        try:
            for k, v in self.initial.items():
                self.controls[k].value = v
        finally:
            self._hold = False
        self._on_change(None)

    def _on_change(self, _change) -> None:
        if self._hold:
            return
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001 - keep the panel alive; show what went wrong
            self.error = f"{type(exc).__name__}: {exc}"
            self.status.value = f"<b style='color:#b00'>{html.escape(self.error)}</b>"

    @property
    def widget(self):
        import ipywidgets as w

        if self._widget is None:
            head = [w.HTML(STYLE + (f"<b>{self.title}</b>" if self.title else ""))]
            hint = [w.HTML(f"<span class='lab-panel-hint'>{self.hint}</span>")] if self.hint else []
            self._widget = w.VBox([*head, w.HBox([*self.controls.values(), self.reset_button],
                                                 layout=w.Layout(flex_flow="row wrap")),
                                   *hint, self.status, self.output])
            self._widget.add_class("lab-panel")
            self._widget.add_class(f"lab-panel-{type(self).__name__.lower()}")   # which panel, for the page
        return self._widget

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
