"""Widget outputs in offline HTML: widgets need a live kernel (or a CDN manager), so each one is
replaced by static HTML — a progress bar by its final text; a panel by its status line and the
figures its output area held when the notebook finished (its defaults), under a short note."""
from __future__ import annotations

import html
import re

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
STATE_MIME = "application/vnd.jupyter.widget-state+json"
NOTE = ("<div class='lab-widget-note' style='border:1px dashed #8c959f;padding:.4em .8em;color:#57606a'>"
        "Interactive panel: it runs live in JupyterLab (<code>lab jupyter</code>), not in this page.</div>")
_TAG = re.compile(r"<[^>]+>")


def _progress_text(model: dict, states: dict) -> str | None:
    """tqdm.notebook draws HBox(HTML, FloatProgress, HTML): return its last text, or None."""
    parts, bar = [], None
    for ref in model.get("state", {}).get("children", []):
        child = states.get(str(ref).removeprefix("IPY_MODEL_"), {})
        name, st = child.get("model_name", ""), child.get("state", {})
        if name.endswith("ProgressModel"):
            frac = (st.get("value") or 0) / (st.get("max") or 1)
            bar = "█" * round(10 * frac) + "·" * (10 - round(10 * frac))
            parts.append(f"|{bar}|")
        elif name == "HTMLModel":
            parts.append(html.unescape(_TAG.sub("", st.get("value", ""))).replace("\u2007", " ").strip())
    return " ".join(p for p in parts if p) if bar is not None else None


PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _descendants(model_id: str, states: dict, seen: set | None = None):
    """Every widget model reachable from ``model_id`` through ``children`` (depth first)."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in states:
        return
    seen.add(model_id)
    model = states[model_id]
    yield model
    for ref in model.get("state", {}).get("children", []) or []:
        yield from _descendants(str(ref).removeprefix("IPY_MODEL_"), states, seen)


def _figure_html(fig: dict) -> str:
    import plotly.io as pio

    # plotly.js is loaded once per page (lab.report.setup_notebook(), the pipeline); figures only reference it.
    return pio.to_html(fig, include_plotlyjs=False, full_html=False)


def _panel_html(model_id: str, states: dict) -> str | None:
    """The status line and the figures of a panel (a box holding an Output widget), or None."""
    texts, figures = [], []
    for m in _descendants(model_id, states):
        name, st = m.get("model_name", ""), m.get("state", {})
        if name == "HTMLModel" and st.get("value"):
            texts.append(st["value"])
        elif name == "OutputModel":
            for out in st.get("outputs", []) or []:
                data = out.get("data", {})
                if PLOTLY_MIME in data:
                    figures.append(_figure_html(data[PLOTLY_MIME]))
    if not figures:
        return None
    status = "".join(f"<div>{t}</div>" for t in texts)
    return NOTE.replace("</div>", " Shown: its figures at the notebook's parameters.</div>", 1) + status + "".join(figures)


def static_html(view: dict, nb_metadata: dict) -> str:
    """Static replacement for one widget-view output (``view`` is its JSON payload)."""
    states = nb_metadata.get("widgets", {}).get(STATE_MIME, {}).get("state", {})
    model = states.get(view.get("model_id"), {})
    text = _progress_text(model, states) if model.get("model_name") == "HBoxModel" else None
    if text is not None:
        return f"<pre class='lab-progress'>{html.escape(text)}</pre>"
    return _panel_html(view.get("model_id"), states) or NOTE
