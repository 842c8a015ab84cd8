"""Reports: every notebook rendered offline, plus an index of headline numbers.

Notebook side (cheap imports)::

    import lab.report as report
    report.setup_notebook()              # first code cell
    report.save_png(fig, "name")         # optional static PNG (only under `lab report`)
    report.record(accuracy=acc, ...)     # last cell: headline numbers for the index
    report.accuracy_with_interval(76.1, 1000)   # '76.1 [73.4, 78.6]': one run's accuracy, 95 % Wilson
    report.chance_line(fig, 0.1)         # a dotted line at the accuracy a guess reaches

Every figure a notebook shows is laid out to fit a report page (:mod:`lab.report.readable`).

Pipeline side: :func:`render` (``lab report``), :func:`write_index`; parameters are declared
in each notebook's metadata (:mod:`lab.report.params`).
"""
from __future__ import annotations

from lab.report.cli import register
from lab.report.notebook import (METRICS_MIME, accuracy_with_interval, record, save_png, setup_notebook,
                                 with_interval)
from lab.report.readable import chance_line


def render(*args, **kwargs):
    """Render notebooks into offline reports; see :func:`lab.report.pipeline.render`."""
    from lab.report.pipeline import render as _render

    return _render(*args, **kwargs)


def write_index(*args, **kwargs):
    """Rebuild ``index.html``; see :func:`lab.report.index.write_index`."""
    from lab.report.index import write_index as _write_index

    return _write_index(*args, **kwargs)


__all__ = ["METRICS_MIME", "accuracy_with_interval", "chance_line", "record", "register", "render", "save_png",
           "setup_notebook", "with_interval", "write_index"]
