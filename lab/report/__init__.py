"""Reports: every notebook rendered offline, plus an index of headline numbers.

Notebook side (cheap imports)::

    import lab.report as report
    report.setup_notebook()              # first code cell
    report.save_png(fig, "name")         # optional static PNG (only under `lab report`)
    report.record(accuracy=acc, ...)     # last cell: headline numbers for the index

Pipeline side: :func:`render` (``lab report``), :func:`write_index`; parameters are declared
in each notebook's metadata (:mod:`lab.report.params`).
"""
from __future__ import annotations

from lab.report.cli import register
from lab.report.notebook import METRICS_MIME, record, save_png, setup_notebook


def render(*args, **kwargs):
    """Render notebooks into offline reports; see :func:`lab.report.pipeline.render`."""
    from lab.report.pipeline import render as _render

    return _render(*args, **kwargs)


def write_index(*args, **kwargs):
    """Rebuild ``index.html``; see :func:`lab.report.index.write_index`."""
    from lab.report.index import write_index as _write_index

    return _write_index(*args, **kwargs)


__all__ = ["METRICS_MIME", "record", "register", "render", "save_png", "setup_notebook", "write_index"]
