"""Widget outputs in offline HTML: widgets need a live kernel (or a CDN manager), so each one is
replaced by static HTML — a progress bar by its final text, any other panel by a short note."""
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


def static_html(view: dict, nb_metadata: dict) -> str:
    """Static replacement for one widget-view output (``view`` is its JSON payload)."""
    states = nb_metadata.get("widgets", {}).get(STATE_MIME, {}).get("state", {})
    model = states.get(view.get("model_id"), {})
    text = _progress_text(model, states) if model.get("model_name") == "HBoxModel" else None
    if text is not None:
        return f"<pre class='lab-progress'>{html.escape(text)}</pre>"
    return NOTE
