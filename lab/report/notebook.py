"""Helpers a notebook calls so that `lab report` can render it offline and index it.

Three calls, all cheap to import (plotly and kaleido load only when used)::

    import lab.report as report
    report.setup_notebook()                 # first code cell: offline plotly renderer
    ...
    report.save_png(fig, "accuracy_matrix") # optional: static PNG next to the rendered report
    ...
    report.record(avg_accuracy=acc, forgetting=fgt)   # last cell: the headline numbers

``record`` displays an output with the MIME type :data:`METRICS_MIME` (a JSON list of
``[name, value]`` pairs, in call order); the report index reads it back from the executed
notebook with :func:`lab.report.index.read_metrics` (no scrapbook, no side files). ``save_png`` writes only while
`lab report` (or the test suite) runs the notebook: the pipeline tells the kernel where through
environment variables, and in a live JupyterLab session it does nothing.
"""
from __future__ import annotations

import html
import json
import math
import numbers
import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from lab.report.params import METADATA_KEY

METRICS_MIME = "application/vnd.continual-lab.metrics+json"
# Set by the pipeline in the kernel's environment (see lab.report.pipeline).
FIGURES_ENV = "LAB_REPORT_FIGURES_DIR"  # folder the PNGs go to; unset = not under `lab report`
PNG_ENV = "LAB_REPORT_PNG"  # "0" turns PNG export off (the smoke runs of the test suite)
PROFILE_ENV = "LAB_REPORT_PROFILE"  # "report" or "smoke"
NOTES_FILE = "_notes.txt"  # in the figures folder: why PNGs were skipped, shown in the index
PNG_TIMEOUT_ENV = "LAB_REPORT_PNG_TIMEOUT"  # seconds one figure export may take (default below)
PNG_TIMEOUT_S = 60.0  # a figure export (browser start included) taking longer is abandoned
# plotly.js as a file beside the reports (set by the pipeline): the kernel writes a <script src> to it
# instead of inlining the 4.8 MB library into every notebook (the value: its path from a report page)
PLOTLYJS_ENV = "LAB_REPORT_PLOTLYJS"
PLOTLYJS_KEY = "plotlyjs"      # output metadata under "continual-lab": the script tag to point elsewhere
SOLUTIONS_ENV = "LAB_REPORT_SOLUTIONS"  # "1": exercises show their solutions (`lab report --solutions`)
RENDERER = "lab_mimetype+lab_offline"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_png_state: dict[str, Any] = {"disabled_reason": None, "exporter": None}


def plotlyjs_tag(src: str) -> str:
    """The ``<script>`` tags that load plotly.js from ``src`` (a path relative to the page) before
    any figure of the page draws (a plain script blocks parsing until it has run)."""
    return ("<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>"
            f"<script src=\"{html.escape(src)}\" charset=\"utf-8\"></script>")


def setup_notebook() -> None:
    """Make plotly figures survive the HTML export with no network, laid out to fit a report page.

    Sets the default renderer to plotly's ``plotly_mimetype`` (JupyterLab's own renderer) plus a
    copy of plotly's ``notebook`` renderer that does not ask a CDN for MathJax, both laying every
    figure out with :func:`lab.report.readable.fit` first (titles wrapped, legends that fit), and
    shows tables with human column headers (:func:`lab.report.readable.humanize_frame`). plotly.js
    is loaded in this cell's output, once, so every later figure in the exported HTML finds it:
    under ``lab report`` as a ``<script src>`` to the copy written beside the reports
    (``$LAB_REPORT_PLOTLYJS``), elsewhere inlined. Under ``lab report``, progress bars are off in
    the kernel (:func:`quiet_progress_bars`).
    """
    import plotly.io as pio
    from plotly.io._base_renderers import NotebookRenderer, PlotlyRenderer

    from lab.report.readable import fit

    class _OfflineNotebookRenderer(NotebookRenderer):
        # plotly's HTML renderers hard-code include_mathjax="cdn": one external <script> per figure.
        def to_mimebundle(self, fig_dict):
            bundle = super().to_mimebundle(fit(fig_dict))
            bundle["text/html"] = strip_plotly_mathjax(bundle["text/html"])
            return bundle

        def activate(self):
            src = os.environ.get(PLOTLYJS_ENV)
            if not src:
                return super().activate()
            from IPython.display import display

            display({"text/html": plotlyjs_tag(src)}, raw=True,
                    metadata={METADATA_KEY: {PLOTLYJS_KEY: src}})

    class _FittedMimetypeRenderer(PlotlyRenderer):
        def to_mimebundle(self, fig_dict):
            return super().to_mimebundle(fit(fig_dict))

    pio.renderers["lab_offline"] = _OfflineNotebookRenderer()
    pio.renderers["lab_mimetype"] = _FittedMimetypeRenderer()
    pio.renderers.default = RENDERER
    pio.renderers._activate_pending_renderers()  # load plotly.js here, not in a widget's output
    human_tables()
    quiet_progress_bars()
    if os.environ.get(FIGURES_ENV):
        import atexit

        atexit.register(_exit_now)   # runs after every exit handler registered later (kaleido's)


def _exit_now() -> None:
    """The last exit step of a kernel that `lab report` ran: its outputs are in the executed
    notebook already, so the interpreter's teardown of torch, transformers and the rest (1.5-3 s a
    notebook, during which papermill waits) is skipped."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - exiting
            pass
    os._exit(0)


def human_tables() -> bool:
    """Tables (pandas DataFrames) shown in this IPython session get human column headers
    (:func:`lab.report.readable.humanize_frame`); the data is unchanged. Returns whether it could."""
    try:
        import pandas as pd
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    from lab.report.readable import humanize_frame

    def html_table(df):
        try:
            return humanize_frame(df)._repr_html_()
        except Exception:  # noqa: BLE001 - a table the renaming cannot take: pandas' own HTML
            return df._repr_html_()

    ip.display_formatter.formatters["text/html"].for_type(pd.DataFrame, html_table)
    return True


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def quiet_progress_bars() -> bool:
    """Where ``$TQDM_DISABLE`` is set (``lab report`` sets it for its kernels), no tqdm progress bar
    in this process, even one a call asks for (``tqdm(..., disable=False)``: tqdm's own variable
    only changes the default): a report page shows results, not the bars' last state. The
    terminal still shows progress: ``lab report`` prints each section and every slow cell.
    Patches ``tqdm.auto.tqdm``, what the lab imports (at call time); returns whether it did."""
    if not _env_true("TQDM_DISABLE"):
        return False
    try:
        import tqdm.auto
        import tqdm.autonotebook
    except ImportError:
        return False
    base = tqdm.auto.tqdm
    if getattr(base, "_lab_quiet", False):
        return True

    class QuietTqdm(base):
        _lab_quiet = True

        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    tqdm.auto.tqdm = tqdm.autonotebook.tqdm = QuietTqdm
    return True


_MATHJAX_TAG = re.compile(r'<script src="https?://[^"]*mathjax[^"]*"></script>', re.IGNORECASE)


def strip_plotly_mathjax(text: str) -> str:
    """Remove the MathJax CDN ``<script>`` plotly puts before each figure (only for LaTeX labels)."""
    return _MATHJAX_TAG.sub("", text)


def _coerce(key: str, value: Any) -> float | int | str:
    if isinstance(value, bool):
        raise TypeError(f"record({key}=...): a bool is not a headline number; pass 0/1 or a string")
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:  # numpy / torch scalars
        value = value.item()
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"record({key}={value}): headline numbers must be finite")
        return value
    if isinstance(value, str):
        return value
    raise TypeError(f"record({key}=...): expected a number or a string, got {type(value).__name__}")


def _format(value: float | int | str) -> str:
    """A headline number as a reader sees it: three significant digits (0.615, 41.5, 0.0178), whole
    numbers from 100 on (1234); integers and strings as they are."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def with_interval(estimate: float, lo: float, hi: float, digits: int = 1) -> str:
    """``'76.1 [73.4, 78.6]'``: an estimate with its 95 % interval, as the report index and the
    study tables show one; ``'76.1 [no interval]'`` when there is none (e.g. one seed); ``'n/a'``
    without an estimate."""
    if not math.isfinite(float(estimate)):
        return "n/a"
    if not all(math.isfinite(float(v)) for v in (lo, hi)):
        return f"{estimate:.{digits}f} [no interval]"
    return f"{estimate:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def accuracy_with_interval(accuracy: float, n: int, *, percent: bool = True, digits: int = 1) -> str:
    """One run's accuracy on ``n`` test items with its 95 % Wilson interval over those items
    (:func:`lab.metrics.wilson_interval`), e.g. for :func:`record`."""
    from lab.metrics import wilson_interval

    return with_interval(accuracy, *wilson_interval(accuracy, n, percent=percent), digits=digits)


def record(metrics: Mapping[str, Any] | None = None, /, **more: Any) -> None:
    """Record headline numbers (finite numbers, or short strings for context) for the report index.

    Call it in the notebook's last cell, e.g. ``record(avg_accuracy=0.83, seconds=t)``; several
    calls are merged, a later value wins. Raises on NaN/inf so a broken metric fails the run.
    The index shows each key's label and unit from :mod:`lab.report.labels` (add a line there for a
    new key; a key written as words, e.g. ``"AWARe: H"``, is its own label).
    """
    data = {**(metrics or {}), **more}
    if not data:
        raise ValueError("record() needs at least one metric")
    clean = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"record(): metric names must be non-empty strings, got {key!r}")
        clean[key] = _coerce(key, value)
    from lab.report.labels import label, unit_note

    rows = "".join(  # the reader's label and unit (lab.report.labels); the key as the label's tooltip
        f"<tr><th style='text-align:left' title='{html.escape(k)}'>{html.escape(label(k)[0])}</th>"
        f"<td>{html.escape(_format(v))}</td><td style='color:#57606a;white-space:nowrap' "
        f"title='{html.escape(unit_note(label(k)[1]))}'>{html.escape(label(k)[1])}</td></tr>"
        for k, v in clean.items()
    )
    bundle = {
        METRICS_MIME: [[k, v] for k, v in clean.items()],  # pairs: nbformat sorts object keys
        "text/html": f"<table class='lab-metrics'>{rows}</table>",
        "text/plain": "\n".join(f"{k}: {_format(v)}" for k, v in clean.items()),
    }
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # plain Python: a marked line is the next best thing
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(bundle, raw=True)
    else:
        print(f"{METRICS_MIME} {json.dumps(bundle[METRICS_MIME])}")


def _note(folder: Path, text: str) -> None:
    print(f"[lab.report] {text}", file=sys.stderr)
    with open(folder / NOTES_FILE, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")


# --- the browser kaleido drives --------------------------------------------------------------

def find_browser() -> str | None:
    """The Chrome/Chromium kaleido would start, or None when it would find none.

    Asks choreographer (kaleido's browser driver) itself, so the answer matches what kaleido
    does: its own downloaded copy (``kaleido_get_chrome``), then ``$BROWSER_PATH`` or the
    executables named chrome/chromium/google-chrome/msedge/brave/vivaldi on ``PATH``, then
    their usual install paths (``/usr/bin/chromium``...). Like kaleido, a path that is not a
    file counts as not found. Only looks at the file system: starts nothing.
    """
    try:
        from choreographer.browsers.chromium import Chromium

        path = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - a choreographer without this helper: let kaleido try
        return "(not known: kaleido will look)"
    return str(path) if path and Path(path).is_file() else None


def enable_png_command() -> str:
    """The one command that gives kaleido a browser on this machine."""
    import shutil

    if shutil.which("apt-get"):
        root = hasattr(os, "geteuid") and os.geteuid() == 0
        return f"{'' if root else 'sudo '}apt-get install chromium"
    return f"{Path(sys.executable).parent / 'kaleido_get_chrome'}   (downloads Chrome for Testing)"


def no_browser_note() -> str:
    """One line: PNGs are skipped for want of a browser, and how to get one."""
    where = os.environ.get("BROWSER_PATH")
    looked = f"BROWSER_PATH={where!r} is not a file" if where else "none on PATH, none installed"
    return (f"PNG export skipped: kaleido finds no Chrome/Chromium ({looked}); "
            f"the HTML reports are complete. Enable PNGs with: {enable_png_command()}")


class _Exporter:
    """kaleido on a private event loop in a daemon thread, so every wait on it has a limit.

    kaleido's own ``start_sync_server``/``calc_fig_sync`` wait on a queue with no timeout, and
    when the browser fails to start (e.g. none is installed) the error stays in kaleido's thread
    and the caller waits forever. Here each call is a future awaited with ``timeout``; an error
    raised in the thread (``ChromeNotFoundError``...) reaches the caller. One browser serves the
    kernel's lifetime (~3 s to start, then ~0.5 s per figure) and is closed at exit.
    """

    def __init__(self) -> None:
        import asyncio
        import atexit
        import threading

        self._asyncio = asyncio
        self._loop = asyncio.new_event_loop()
        # An abandoned (timed-out) call ends in the thread later; nobody is left to tell.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._thread = threading.Thread(target=self._loop.run_forever, name="lab-report-kaleido",
                                        daemon=True)
        self._thread.start()
        self._kaleido = None
        atexit.register(self.close)

    def _wait(self, coro, timeout: float):
        import concurrent.futures

        future = self._asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from kaleido/Chromium within {timeout:g} s") from None

    def png(self, fig_dict: dict, opts: dict, timeout: float) -> bytes:
        import kaleido

        async def run():
            if self._kaleido is None:
                k = kaleido.Kaleido(mathjax=False, timeout=timeout)
                await k.open()
                self._kaleido = k
            return await self._kaleido.calc_fig(fig_dict, opts=opts)

        return self._wait(run(), timeout)

    def close(self, timeout: float = 10.0) -> None:
        if self._kaleido is not None:
            k, self._kaleido = self._kaleido, None
            try:
                self._wait(k.close(), timeout)
            except Exception:  # noqa: BLE001 - exiting anyway; the browser dies with its pipe
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)


def save_png(fig, name: str, *, width: int | None = None, height: int | None = None,
             scale: float = 2.0) -> None:
    """Write ``fig`` as ``<name>.png`` beside the rendered report (kaleido 1.x + Chrome/Chromium).

    Only acts while `lab report` runs the notebook; does nothing when not under the pipeline
    (a live JupyterLab session) or when PNGs are turned off (`lab report` turns them off when
    :func:`find_browser` finds no browser, and says so once). When the export fails or takes
    longer than :data:`PNG_TIMEOUT_S`, a note is printed and shown in the report index instead
    of failing the notebook, and the notebook's later PNGs are skipped. Returns nothing, so it
    can end a cell without an ``Out[]``.
    """
    if not _NAME_RE.match(name.removesuffix(".png")):
        raise ValueError(f"save_png: name {name!r} must be letters, digits, '_', '-', '.' (no folders)")
    folder = os.environ.get(FIGURES_ENV)
    if not folder or os.environ.get(PNG_ENV, "1") == "0":
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if _png_state["disabled_reason"]:
        return
    from kaleido.errors import ChromeNotFoundError

    from lab.report.readable import fit

    fig_dict = fig.to_dict() if hasattr(fig, "to_dict") else dict(fig)
    w = width or fig_dict.get("layout", {}).get("width") or 900
    fig_dict = fit(fig_dict, width=w)         # titles and legends laid out for the PNG's width
    layout = fig_dict.get("layout", {})
    opts = dict(format="png", width=w, height=height or layout.get("height") or 540, scale=scale)
    timeout = float(os.environ.get(PNG_TIMEOUT_ENV) or PNG_TIMEOUT_S)
    try:
        if _png_state["exporter"] is None:
            _png_state["exporter"] = _Exporter()
        data = _png_state["exporter"].png(fig_dict, opts, timeout)
    except ChromeNotFoundError:
        _png_state["disabled_reason"] = "no browser"
        _note(folder, no_browser_note())
        return
    except TimeoutError as exc:
        _png_state["disabled_reason"] = "timeout"
        _note(folder, f"PNG export of {name!r} abandoned: {exc}; this notebook's later PNGs are skipped")
        return
    except Exception as exc:  # noqa: BLE001 - a PNG is a by-product; the HTML report still renders
        _note(folder, f"PNG export of {name!r} failed: {type(exc).__name__}: {exc}")
        return
    from lab._io import atomic_write

    atomic_write(folder / (name.removesuffix(".png") + ".png"), lambda p: p.write_bytes(data))
