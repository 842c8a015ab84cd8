"""Figures and tables a reader can read: titles and legends that fit, chance lines, human headers.

plotly never wraps a title and never shrinks a legend: a long title runs off the figure's right edge,
a wide legend squeezes the plot, a tall one scrolls its last entries out of sight (and out of the
PNG). :func:`fit` lays a figure out for :data:`REPORT_WIDTH` — the narrowest width a figure without
a width of its own gets in a report page (a browser window of ~900 px) — from plotly's own layout,
with text widths estimated from the characters (:func:`text_width`); :func:`problems` says what
still does not fit. ``lab.report.setup_notebook`` makes every figure a notebook shows go through
:func:`fit` (and the panels of :mod:`lab.widgets` do the same), so a notebook needs no call of its own.

:func:`human` turns a column name written for code (``global_threshold_s``) into a header written
for a reader (:data:`lab.report.labels.COLUMNS`, else words); :func:`chance_line` marks the accuracy
a guess would reach on an accuracy axis.
"""
from __future__ import annotations

import copy
import re
from typing import Any

REPORT_WIDTH = 760          # px: a figure without its own width, in a report read at ~900 px
FONT_SIZE = 12              # plotly's default font size (layout.font.size)
TITLE_SCALE = 1.4           # plotly.js: the title's default size is 1.4 x the layout font
LEGEND_MAX_SHARE = 0.35     # a vertical legend wider than this share of the figure squeezes the plot
LEGEND_ROW_PX = 20          # one legend entry (12 px text)
LEGEND_SYMBOL_PX = 44       # the symbol and the gaps around an entry's text
_TAG = re.compile(r"<[^>]*>")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
# relative widths of characters in plotly's default sans-serif (Open Sans / Arial), in em
_NARROW, _WIDE = set("iljtf.,:;'|!()[]{} ’`"), set("mwMW@%—")


def text_width(text: str, size: float = FONT_SIZE) -> float:
    """Estimated width in px of one line of ``text`` (HTML tags dropped) at font ``size``: narrow
    characters 0.34 em, wide ones 0.95, capitals and digits 0.68, the rest 0.61. Measured against
    Chromium drawing plotly's font list ("Open Sans", verdana, arial) where only DejaVu Sans is
    installed — the widest of them — the estimate is 1-10 % above the drawn width for titles of the
    notebooks, so a title it lets through fits wherever the figure is drawn."""
    import html

    em = 0.0
    for ch in html.unescape(_TAG.sub("", text)):
        em += (0.34 if ch in _NARROW else 0.95 if ch in _WIDE else 0.68 if ch.isupper() or ch.isdigit()
               else 0.61)
    return em * size


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in _BR.split(text or "")]


def wrap(text: str, width_px: float, size: float) -> list[str]:
    """``text``'s lines (``<br>`` kept) re-wrapped at spaces so that each fits ``width_px``."""
    out: list[str] = []
    for line in _lines(text):
        cur = ""
        for word in line.split(" "):
            trial = f"{cur} {word}".strip()
            if cur and text_width(trial, size) > width_px:
                out.append(cur)
                cur = word
            else:
                cur = trial
        out.append(cur)
    return out


def _get(d: dict, *keys, default=None):
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return default
        d = d[k]
    return d


def _title(layout: dict) -> tuple[str, float]:
    title = layout.get("title")
    text = title if isinstance(title, str) else _get(layout, "title", "text", default="") or ""
    font = _get(layout, "font", "size", default=FONT_SIZE)
    return text, float(_get(layout, "title", "font", "size", default=font * TITLE_SCALE))


def _width(layout: dict, width: float | None) -> float:
    return float(layout.get("width") or width or REPORT_WIDTH)


def _legend_entries(fig: dict) -> list[str]:
    """The names the legend shows: traces with a name that are not hidden from it (plotly shows a
    lone trace's name only when ``showlegend`` is set)."""
    traces = fig.get("data") or []
    shown = [t for t in traces if t.get("name") and t.get("showlegend", True) is not False
             and t.get("type", "scatter") not in ("heatmap", "table", "image", "pie", "parcoords")]
    if len(shown) == 1 and shown[0].get("showlegend") is not True:
        return []
    if _get(fig, "layout", "showlegend") is False:
        return []
    seen, names = set(), []
    for t in shown:
        key = (t.get("legendgroup"), t["name"]) if t.get("legendgroup") else (None, t["name"])
        if key not in seen:
            seen.add(key)
            names.append(str(t["name"]))
    return names


def _legend_size(fig: dict) -> float:
    return float(_get(fig, "layout", "legend", "font", "size",
                      default=_get(fig, "layout", "font", "size", default=FONT_SIZE)))


def _horizontal(fig: dict) -> bool:
    return _get(fig, "layout", "legend", "orientation") == "h"


def _legend_title(fig: dict) -> str:
    t = _get(fig, "layout", "legend", "title")
    return (t if isinstance(t, str) else _get(t or {}, "text", default="")) or ""


def problems(fig, width: float | None = None) -> list[str]:
    """What would be cut off or squeezed when ``fig`` (a Figure or its dict) is drawn ``width`` px
    wide (its own width when it has one, else :data:`REPORT_WIDTH`): a title line wider than the
    figure, a vertical legend wider than :data:`LEGEND_MAX_SHARE` of it or taller than its plot area,
    a legend entry wider than the figure. Empty: it fits."""
    fig = fig.to_dict() if hasattr(fig, "to_dict") else fig
    layout = fig.get("layout") or {}
    w = _width(layout, width)
    h = float(layout.get("height") or 450)
    out = []
    text, size = _title(layout)
    room = w * (1 - float(_get(layout, "title", "x", default=0.05) or 0)) - 10
    for line in _lines(text):
        if line and text_width(line, size) > room:
            out.append(f"title line {line!r} is {text_width(line, size):.0f} px wide; {room:.0f} px fit")
    names = _legend_entries(fig)
    if names:
        lsize = _legend_size(fig)
        widest = max(max(text_width(ln, lsize) for ln in _lines(n)) for n in names) + LEGEND_SYMBOL_PX
        if widest > w - 20:
            out.append(f"legend entry {max(names, key=len)!r} is wider than the figure")
        if not _horizontal(fig):
            lt = _legend_title(fig)
            legend_w = max(widest, text_width(lt, lsize) + 10 if lt else 0)
            if legend_w > LEGEND_MAX_SHARE * w:
                out.append(f"vertical legend {legend_w:.0f} px wide: more than {LEGEND_MAX_SHARE:.0%} of {w:.0f} px")
            margin = layout.get("margin") or {}
            plot_h = h - float(margin.get("t", 100)) - float(margin.get("b", 80))
            rows = sum(len(_lines(n)) for n in names) + (1 if lt else 0)
            if rows * LEGEND_ROW_PX > max(plot_h, 0) + 40:
                out.append(f"vertical legend of {rows} rows does not fit the {plot_h:.0f} px plot area")
    return out


def _pack(names: list[str], size: float, room: float) -> int:
    """Rows a horizontal legend of ``names`` takes in ``room`` px."""
    rows, x = 1, 0.0
    for n in names:
        ew = max(text_width(ln, size) for ln in _lines(n)) + LEGEND_SYMBOL_PX
        if x and x + ew > room:
            rows, x = rows + 1, 0.0
        x += ew
    return rows


def fit(fig, width: float | None = None):
    """``fig`` laid out to fit ``width`` px (its own width, else :data:`REPORT_WIDTH`): the title
    wrapped onto as many lines as it needs (the top margin grows with them); a legend that is too wide
    or too tall for the right-hand side moved under the plot, horizontal, its entries wrapped to the
    figure's width (the figure grows by the rows it takes). A figure that fits already comes back
    unchanged. Takes and returns a Figure or a figure dict (a dict is copied, not changed)."""
    is_fig = hasattr(fig, "to_dict")
    d = fig.to_dict() if is_fig else copy.deepcopy(fig)
    layout = d.setdefault("layout", {})
    if not problems(d, width):
        return fig if is_fig else d
    w = _width(layout, width)
    text, size = _title(layout)
    room = w * (1 - float(_get(layout, "title", "x", default=0.05) or 0)) - 10
    margin = layout.setdefault("margin", {})
    grow = 0.0
    if text and any(text_width(ln, size) > room for ln in _lines(text)):
        lines = wrap(text, room, size)
        title = layout["title"] if isinstance(layout.get("title"), dict) else {}
        layout["title"] = {**title, "text": "<br>".join(lines)}
        need = 24 + round(size * 1.35) * len(lines)
        old_t = float(margin.get("t", 100))
        if need > old_t:
            margin["t"] = need
            grow += need - old_t
    names = _legend_entries(d)
    if names and [p for p in problems(d, width) if "legend" in p]:
        lsize = _legend_size(d)
        # entries wider than the figure: wrap them (their hover label wraps the same way)
        for t in d.get("data") or []:
            n = t.get("name")
            if n and text_width(str(n), lsize) + LEGEND_SYMBOL_PX > w - 20:
                t["name"] = "<br>".join(wrap(str(n), w - 20 - LEGEND_SYMBOL_PX, lsize))
        names = _legend_entries(d)
        rows = _pack(names, lsize, w - 20)
        line_rows = max(len(_lines(n)) for n in names)
        legend_h = rows * LEGEND_ROW_PX * line_rows + (LEGEND_ROW_PX if _legend_title(d) else 0) + 10
        old_b = float(margin.get("b", 80))
        layout["legend"] = {**(layout.get("legend") or {}), "orientation": "h", "x": 0, "xanchor": "left",
                            "y": 0, "yanchor": "bottom", "yref": "container", "xref": "container"}
        need = 70 + legend_h   # the x axis' ticks and title, then the legend
        if need > old_b:
            margin["b"] = need
            grow += need - old_b
    if grow and layout.get("height"):
        layout["height"] = float(layout["height"]) + grow
    elif grow:
        layout["height"] = 450 + grow
    if is_fig:
        import plotly.graph_objects as go

        return go.Figure(d)
    return d


def chance_line(fig, level: float, text: str = "chance", *, axis: str = "y"):
    """A dotted line at the accuracy a guess reaches (``level``, in the axis' units), labelled;
    returns ``fig`` (unchanged when ``level`` is unknown: None or NaN)."""
    import math

    if level is None or not math.isfinite(float(level)):
        return fig
    add = fig.add_hline if axis == "y" else fig.add_vline
    add(level, line_dash="dot", line_color="#6e7781", annotation_text=text,
        annotation_position="top left" if axis == "y" else "top right", annotation_font_color="#57606a")
    return fig


# --- table headers ------------------------------------------------------------------------------
SNAKE = re.compile(r"^[a-z][a-z0-9%]*(?:_[a-z0-9%]+)+$")
_TOKENS = {"acc": "accuracy", "frac": "fraction", "pct": "%", "avg": "average", "inc": "incremental",
           "dim": "dimensions", "s": "(s)", "ms": "(ms)", "%": "(%)", "num": "number of",
           "lr": "learning rate", "offdiag": "off-diagonal", "std": "standard deviation", "val": "validation",
           "up": "upstream", "vqa": "VQA", "ci95": "95 % half-width", "ft": "fine-tuning"}


def human(name: Any) -> Any:
    """A header for a reader: :data:`lab.report.labels.COLUMNS` when it names ``name``, else the
    words of a ``snake_case`` name (``share_of_model_%`` -> ``share of model (%)``); anything else
    (numbers, names with capitals or spaces) as it is."""
    from lab.report.labels import COLUMNS

    if not isinstance(name, str):
        return name
    if name in COLUMNS:
        return COLUMNS[name]
    if not SNAKE.match(name):
        return name
    return " ".join(_TOKENS.get(w, w) for w in name.split("_"))


def humanize_frame(df):
    """``df`` with human column and index names (:func:`human`), for display only."""
    out = df.rename(columns=human)
    if getattr(out.columns, "names", None):
        out.columns = out.columns.set_names([human(n) for n in out.columns.names])
    if getattr(out.index, "names", None):
        out.index = out.index.set_names([human(n) for n in out.index.names])
    return out


_TH = re.compile(r"(<th\b[^>]*>)(\s*)([^<]*?)(\s*)(</th>)")
_THEAD = re.compile(r"<thead\b.*?</thead>", re.S | re.I)


def humanize_html_headers(page: str) -> str:
    """Every column header (``<th>`` in a ``<thead>``) whose text is one ``snake_case`` name, given
    its :func:`human` header; row labels (names of things, e.g. ``k_proj``) stay as they are."""
    import html

    def one(m: re.Match) -> str:
        text = html.unescape(m.group(3))
        return m.group(0) if not SNAKE.match(text) else (
            f"{m.group(1)}{m.group(2)}{html.escape(human(text))}{m.group(4)}{m.group(5)}")

    return _THEAD.sub(lambda t: _TH.sub(one, t.group(0)), page)


def header_cells(page: str) -> list[str]:
    """The text of every column header (``<th>`` in a ``<thead>``) of an HTML page."""
    import html

    return [html.unescape(re.sub(r"<[^>]+>", "", m.group(3))).strip()
            for t in _THEAD.finditer(page) for m in _TH.finditer(t.group(0))]
