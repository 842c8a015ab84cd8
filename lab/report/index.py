"""``reports/index.html``: one card per notebook, read back from the executed notebooks.

Everything on a card comes from ``reports/NAME.ipynb`` (and its ``NAME_figures/``), so the
index can be rebuilt at any time and `lab report --only NAME` keeps the other cards.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import re
from pathlib import Path
from typing import Any

from lab.report.notebook import METRICS_MIME, NOTES_FILE, _format
from lab.report.params import METADATA_KEY

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def read_metrics(nb) -> dict[str, Any]:
    """Headline numbers recorded with :func:`lab.report.record`, merged in cell order."""
    metrics: dict[str, Any] = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []) or []:
            data = out.get("data") or {}
            if METRICS_MIME in data:
                value = data[METRICS_MIME]
                value = json.loads(value) if isinstance(value, str) else value
                metrics.update(value.items() if isinstance(value, dict) else map(tuple, value))
    return metrics


_PAPERMILL_TAGS = {"papermill-error-cell-tag", "injected-parameters"}
_TAG_RE = re.compile(r"<[^>]+>")


SUMMARY_CHARS = 300    # a summary grows sentence by sentence up to this length (one sentence at least)
_LABEL_RE = re.compile(r"^\*\*([^*]+?)\*\*\s*")          # a paragraph's bold lead-in, "**The question.**"
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[A-Z0-9\"'(])")   # ". Next", '." Next'


def _plain(text: str) -> str:
    """Markdown to plain text for a summary: links to their text, emphasis, code and math marks dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return " ".join(re.sub(r"[*_`$\\]", "", text).split())


def _sentences(text: str, limit: int = SUMMARY_CHARS) -> str:
    """Whole sentences from the start of ``text``, as many as fit in ``limit`` characters (the
    first one always, however long): a summary never stops mid-sentence."""
    parts = [p for p in _SENTENCE_END.split(text) if p]
    out = parts[0] if parts else ""
    for p in parts[1:]:
        if len(out) + 1 + len(p) > limit:
            break
        out += " " + p
    return out


def _summary(lines: list[str]) -> str:
    """The notebook's question (its ``**The question.**`` paragraph) or else its first paragraph
    of prose (not a list, not a heading), in whole sentences."""
    paragraphs, cur = [], []
    for ln in lines + [""]:
        if ln.strip() and not ln.lstrip().startswith("#"):
            cur.append(ln.strip())
        elif cur:
            paragraphs.append(cur)
            cur = []
    prose = []
    for para in paragraphs:
        if re.match(r"^([-*+]|\d+\.)\s", para[0]):
            continue    # a list
        text = " ".join(para)
        m = _LABEL_RE.match(text)
        label = m.group(1).strip().rstrip(".:").lower() if m else None
        body = _plain(text[m.end():] if m else text)
        if body:
            prose.append((label, body))
    chosen = next((b for lab, b in prose if lab == "the question"), None) or next(
        (b for lab, b in prose if lab is None), None) or (prose[0][1] if prose else "")
    return _sentences(chosen)


def _title_and_summary(nb, fallback: str) -> tuple[str, str]:
    """The first markdown cell's ``# `` heading and its summary (:func:`_summary`; papermill's cells skipped)."""
    for cell in nb.cells:
        if cell.cell_type != "markdown" or _PAPERMILL_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            continue
        lines = _TAG_RE.sub("", cell.source).splitlines()
        title = next((ln.lstrip("#").strip() for ln in lines if ln.startswith("# ")), None)
        return title or fallback, _summary(lines)
    return fallback, ""


def read_card(ipynb: Path) -> dict[str, Any]:
    """Card data for one executed notebook."""
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    name = ipynb.stem
    meta = nb.metadata.get(METADATA_KEY, {}).get("report", {})
    pm = nb.metadata.get("papermill", {})
    title, summary = _title_and_summary(nb, name)
    figures_dir = ipynb.with_name(f"{name}_figures")
    notes = figures_dir / NOTES_FILE
    return {
        "name": name, "title": title, "summary": summary,
        "ok": bool(meta.get("ok", not pm.get("exception", False))),
        "seconds": meta.get("seconds", pm.get("duration")),
        "profile": meta.get("profile"), "params": meta.get("params", pm.get("parameters", {})),
        "rendered_at": meta.get("rendered_at", pm.get("end_time")),
        "error": meta.get("error"), "failed_cell": meta.get("failed_cell"),
        "failed_source": meta.get("failed_source"), "warnings": meta.get("warnings", []),
        "metrics": read_metrics(nb),
        "figures": sorted(p.name for p in figures_dir.glob("*.png")) if figures_dir.is_dir() else [],
        "notes": notes.read_text(encoding="utf-8").splitlines() if notes.exists() else [],
        "run_notes": list(meta.get("notes") or []),  # about the whole run (no browser...): page top
        "html": f"{name}.html", "ipynb": f"{name}.ipynb",
    }


_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:72rem;
padding:0 1rem;color:#1f2328;background:#f6f8fa}h1{margin-bottom:.2rem}.sub{color:#57606a;margin-top:0}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(22rem,1fr));gap:1rem}
.card{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:1rem 1.2rem}
.card h2{font-size:1.15rem;margin:.1rem 0 .3rem}.card h2 a{color:inherit}.name{font-family:monospace;color:#57606a}
.badge{display:inline-block;border-radius:1rem;padding:0 .6rem;font-size:.8rem;font-weight:600;margin-right:.4rem}
.ok{background:#dafbe1;color:#116329}.failed{background:#ffebe9;color:#a40e26}.missing{background:#eaeef2;color:#57606a}
table{border-collapse:collapse;margin:.6rem 0}td,th{padding:.15rem .8rem .15rem 0;text-align:left}
td{font-variant-numeric:tabular-nums;padding-left:.8rem}.nowrap{white-space:nowrap}
.unit{color:#57606a;font-size:.8rem;white-space:nowrap;margin-left:.4rem}
th{font-weight:500;padding-top:.35rem}.top a{margin-right:1rem}pre{background:#f6f8fa;padding:.5rem;overflow:auto;font-size:.8rem}
.err{color:#a40e26;font-weight:600}.figs img{max-width:48%;border:1px solid #d0d7de;margin:.2rem .2rem 0 0}
.links a{margin-right:.8rem}.meta{color:#57606a;font-size:.85rem}
.run-note{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:.5rem .8rem}
"""


def metrics_rows(metrics: dict[str, Any]) -> str:
    """Table rows of headline numbers: the label on a line of its own, then the value and its unit
    (:mod:`lab.report.labels`: a unit is one short line, never wrapped, its whole explanation the
    tooltip; it moves under the value when both do not fit); the recorded key is the label's tooltip."""
    from lab.report.labels import label, unit_note

    e, rows = html.escape, []
    for k, v in metrics.items():
        name, unit = label(k)
        shown = _format(v)   # a number (with its interval) stays on one line; a longer text may wrap
        rows.append(f"<tr><th title='{e(k)}'>{e(name)}</th></tr>"
                    f"<tr><td><span class='value{' nowrap' if len(shown) <= 24 else ''}'>{e(shown)}</span> "
                    f"<span class='unit' title='{e(unit_note(unit))}'>{e(unit)}</span></td></tr>")
    return "".join(rows)


def _href(*parts: str) -> str:
    """A link to a file beside the index: ``./`` and every path part percent-encoded, so that a
    notebook named ``javascript:alert(1).ipynb`` (or ``//host/x``, ``?q``, ``#id``) links to its own
    file and never to a scheme, a host or another page."""
    from urllib.parse import quote

    return "./" + "/".join(quote(p, safe="") for p in parts)


def _card_html(c: dict[str, Any]) -> str:
    e = html.escape
    if c.get("missing"):
        return (f"<div class='card'><h2>{e(c['name'])}</h2><span class='badge missing'>not rendered</span>"
                f"<p class='meta'>Run <code>lab report --only {e(c['name'])}</code>.</p></div>")
    badge = "<span class='badge ok'>ok</span>" if c["ok"] else "<span class='badge failed'>failed</span>"
    secs = f"{c['seconds']:.1f} s" if isinstance(c.get("seconds"), (int, float)) else "?"
    parts = [f"<div class='card' id='{e(c['name'])}'>",
             f"<h2><a href='{_href(c['html'])}'>{e(c['title'])}</a></h2>",
             f"<div class='name'>{e(c['name'])}.ipynb</div>",
             f"<p>{badge}<span class='meta'>wall time {secs} · {e(str(c.get('profile') or '?'))} parameters"
             f" · {e(str(c.get('rendered_at') or ''))}</span></p>"]
    if c["summary"]:
        parts.append(f"<p>{e(c['summary'])}</p>")
    for k, v in (c["metrics"] or {}).items():   # a notebook's own alarm (e.g. code changed since a shipped study)
        if isinstance(v, str) and v.startswith(("CHANGED", "DISAGREES")):
            parts.append(f"<p class='err'>⚠ {e(k)}: {e(v)}</p>")
    if c["metrics"]:
        parts.append(f"<table class='metrics'>{metrics_rows(c['metrics'])}</table>")
    elif c["ok"]:
        parts.append("<p class='meta'>No headline numbers recorded.</p>")
    if not c["ok"]:
        where = f" in cell In [{c['failed_cell']}]" if c.get("failed_cell") is not None else ""
        parts.append(f"<p class='err'>Failed{e(where)}: {e(_ANSI.sub('', c.get('error') or 'unknown error'))}</p>")
        if c.get("failed_source"):
            parts.append(f"<pre class='failed-source'>{e(c['failed_source'])}</pre>")
    for note in list(c["notes"]) + list(c["warnings"]):
        parts.append(f"<p class='meta'>Note: {e(note)}</p>")
    if c["figures"]:
        folder = f"{c['name']}_figures"
        figs = "".join(f"<a href='{_href(folder, f)}'><img alt='{e(f)}' src='{_href(folder, f)}'></a>"
                       for f in c["figures"])
        parts.append(f"<div class='figs'>{figs}</div>")
    if c["params"]:
        parts.append(f"<p class='meta'>parameters: <code>{e(json.dumps(c['params']))}</code></p>")
    parts.append(f"<p class='links'><a href='{_href(c['html'])}'>report (HTML)</a>"
                 f"<a href='{_href(c['ipynb'])}'>executed notebook</a></p></div>")
    return "\n".join(parts)


def _top_links(out_dir: Path) -> str:
    """Links beside the title: the glossary (every term the reports use), when it was written."""
    from lab.report.glossary import PAGE

    return (f"<p class='top'><a href='{_href(PAGE)}'>glossary: every term the reports use</a></p>"
            if (Path(out_dir) / PAGE).is_file() else "")


def write_index(out_dir: str | Path, notebooks_dir: str | Path | None = None) -> Path:
    """Rebuild ``index.html`` and ``index.json`` in ``out_dir`` (atomically).

    Cards follow the notebooks in ``notebooks_dir`` (sorted; a notebook not rendered yet gets a
    placeholder) or, without it, the executed notebooks found in ``out_dir``.
    """
    from lab import __version__
    from lab.report._fs import write_text

    out_dir = Path(out_dir)
    src = Path(notebooks_dir) if notebooks_dir else out_dir
    names = sorted(p.stem for p in src.glob("*.ipynb") if not p.name.startswith("."))
    cards = []
    for name in names:
        ipynb = out_dir / f"{name}.ipynb"
        cards.append(read_card(ipynb) if ipynb.exists() else {"name": name, "missing": True})
    n_ok = sum(1 for c in cards if c.get("ok"))
    rendered = [c for c in cards if not c.get("missing")]
    run_notes: dict[str, list[str]] = {}
    for c in rendered:
        for note in c.get("run_notes", []):
            run_notes.setdefault(note, []).append(c["name"])
    banner = "".join(
        f"<p class='run-note'>Note: {html.escape(note)}"
        + ("" if len(names) == len(rendered) else f" (for {html.escape(', '.join(names))})") + "</p>"
        for note, names in run_notes.items())
    total = sum(c.get("seconds") or 0 for c in cards if not c.get("missing"))
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>continual-lab reports</title><style>{_CSS}</style></head><body>"
            f"<h1>continual-lab reports</h1>{_top_links(out_dir)}<p class='sub'>{n_ok} of {len(cards)} notebooks rendered without error"
            f" · notebook wall time {total:.0f} s in all · index built {now} · lab {html.escape(__version__)}</p>"
            f"{banner}<div class='grid'>{''.join(_card_html(c) for c in cards)}</div></body></html>")
    write_text(out_dir / "index.json", json.dumps({"built_at": now, "notebooks": cards}, indent=1, default=str))
    return write_text(out_dir / "index.html", page)
