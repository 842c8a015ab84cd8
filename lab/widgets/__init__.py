"""ipywidgets panels for exploratory ablations in the notebooks (issue 5, "Widgets").

Every panel is a :class:`Panel`: named controls, a status line and an output area. Changing a
control calls :meth:`Panel.refresh`, which recomputes ``panel.result`` (plain numbers / tables) and
``panel.figures`` (plotly) from cached features — never from new backbone passes — so the panel
feels live. The logic is plain Python, so tests drive a panel without a browser::

    panel = ToscaPanel(data)
    panel.controls["l1"].value = 1e-2      # the callback retrains and refreshes synchronously
    panel.result["accuracy"]

Under papermill a panel executes once with its defaults (the offline HTML shows a static note).

* :class:`~lab.widgets.ventral.StagePanel` — pick a stage of the frozen backbone: decodability,
  projection, CKA with the other stages (notebook 01).
* :class:`~lab.widgets.tosca.ToscaPanel` — L1 slider / epochs / routing picker re-training TOSCA
  on cached features: accuracy, gate sparsity, task overlap (notebook 02).
* :class:`~lab.widgets.aware.MaskPanel` — rho / rule / calibration set / target pickers re-running
  AWARe's masking rule on stored saliency (notebook 03).
* :class:`~lab.widgets.aware.AblationPanel` — browse an ablation results table (notebook 04).
"""
from __future__ import annotations

import time
from importlib import import_module
from typing import Any

_LAZY = {"StagePanel": "ventral", "ToscaPanel": "tosca", "MaskPanel": "aware", "AblationPanel": "aware"}
__all__ = ["Panel", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f"lab.widgets.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lab.widgets' has no attribute {name!r}")


class Panel:
    """Base class: subclasses build ``controls`` and implement ``compute(**values) -> (result, figures)``
    and optionally ``describe(result) -> str`` (the status line)."""

    title = ""

    def __init__(self, controls: dict[str, Any]):
        import ipywidgets as w

        self.controls = controls
        self.output = w.Output()
        self.status = w.HTML()
        self.result: Any = None
        self.figures: list = []
        self.error: str | None = None
        self.seconds = 0.0
        self.refreshes = 0
        for c in controls.values():
            c.observe(self._on_change, names="value")
        self.refresh()  # the defaults: errors here propagate (a notebook run must fail loudly)

    def values(self) -> dict[str, Any]:
        return {k: c.value for k, c in self.controls.items()}

    def compute(self, **values) -> tuple[Any, list]:
        raise NotImplementedError

    def describe(self, result) -> str:
        return ""

    def refresh(self) -> None:
        t0 = time.perf_counter()
        self.result, self.figures = self.compute(**self.values())
        self.seconds, self.error = time.perf_counter() - t0, None
        self.refreshes += 1
        self.status.value = f"{self.describe(self.result)} <small>({self.seconds:.1f} s)</small>"
        # Set the Output widget's contents directly rather than `with self.output: display(...)`:
        # capturing through the context manager can stall nbclient/papermill on the executing
        # cell (seen with ipykernel 7 / nbclient 0.11) until its timeout.
        self.output.outputs = ()
        for fig in self.figures:
            self.output.append_display_data(fig)

    def _on_change(self, _change) -> None:
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001 - keep the panel alive; show what went wrong
            self.error = f"{type(exc).__name__}: {exc}"
            self.status.value = f"<b style='color:#b00'>{self.error}</b>"

    @property
    def widget(self):
        import ipywidgets as w

        head = [w.HTML(f"<b>{self.title}</b>")] if self.title else []
        return w.VBox([*head, w.HBox(list(self.controls.values()), layout=w.Layout(flex_flow="row wrap")),
                       self.status, self.output])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
