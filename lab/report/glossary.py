"""``docs/glossary.md`` as a page beside the reports, and the links that reach it.

The glossary is one markdown file: a ``### Term`` heading per term and at most three sentences
under it. A notebook links the first use of a term as ``[term](../docs/glossary.md#anchor)``
(GitHub and JupyterLab open the markdown file); ``lab report`` writes ``glossary.html`` beside the
reports and points those links at it (:func:`relink`). :func:`anchor` is the heading's id, GitHub's
rule (lower case, punctuation other than ``-`` and ``_`` dropped, spaces to hyphens), so the same
link works on GitHub and in the rendered page.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

PAGE = "glossary.html"
SOURCE = Path("docs") / "glossary.md"
_HEADING = re.compile(r"^(#{2,4})\s+(.+?)\s*$", re.M)
_LINK = re.compile(r"""href=(["'])(?:\.\./)?docs/glossary\.md(#[^"']*)?\1""")
CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:52rem;
padding:0 1rem;color:#1f2328;background:#fff}h1{margin-bottom:.2rem}h2{margin-top:2rem;border-bottom:1px solid #d0d7de}
h3{margin:1.4rem 0 .3rem}h3:target{background:#fff8c5}code{background:#f6f8fa;padding:0 .2rem}
.nav a{margin-right:1rem}table{border-collapse:collapse}td,th{padding:.2rem .6rem;border:1px solid #d0d7de}
"""


def anchor(heading: str) -> str:
    """The id GitHub gives a markdown heading: ``"A_B and Ā"`` -> ``"a_b-and-ā"``."""
    text = re.sub(r"<[^>]+>|[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def source(root: Path | None = None) -> Path | None:
    """``docs/glossary.md`` of the checkout the reports are built from, when there is one."""
    from lab.report._fs import repo_root

    path = (root or repo_root()) / SOURCE
    return path if path.is_file() else None


def terms(text: str) -> dict[str, str]:
    """``{anchor: heading}`` of every term (``###`` headings) in the glossary's markdown."""
    return {anchor(m.group(2)): m.group(2) for m in _HEADING.finditer(text) if len(m.group(1)) == 3}


def entries(text: str) -> dict[str, str]:
    """``{heading: the text under it}`` for every term (``###`` heading) of the glossary."""
    out, cur, body = {}, None, []
    for line in text.splitlines() + ["## end"]:
        m = _HEADING.match(line)
        if m:
            if cur is not None:
                out[cur] = "\n".join(body).strip()
            cur, body = (m.group(2) if len(m.group(1)) == 3 else None), []
        elif cur is not None:
            body.append(line)
    return out


def to_html(text: str, *, index_href: str = "index.html") -> str:
    """The glossary's markdown as a standalone offline page (formulas as MathML, headings with
    :func:`anchor` ids, a link back to the index)."""
    from nbconvert.filters import markdown2html

    from lab.report._math import MathToMathML

    math = MathToMathML()
    body = math.restore(markdown2html(math.protect(text)))

    def heading(m: re.Match) -> str:
        inner = re.sub(r"<a class=\"anchor-link\".*?</a>", "", m.group(3))
        ident = anchor(html.unescape(re.sub(r"<[^>]+>", "", inner)))
        return f"<h{m.group(1)} id=\"{html.escape(ident)}\">{inner}</h{m.group(1)}>"

    body = re.sub(r"<h([1-6])( id=\"[^\"]*\")?>(.*?)</h\1>", heading, body, flags=re.S)
    body = re.sub(r"""href=(["'])(?:\.\./)?(?:docs/)?glossary\.md(#[^"']*)?\1""",
                  lambda m: f"href={m.group(1)}{m.group(2) or '#'}{m.group(1)}", body)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>continual-lab glossary</title><style>{CSS}</style></head><body>"
            f"<p class='nav'><a href='{html.escape(index_href)}'>← all reports</a></p>{body}</body></html>")


def write(out_dir: Path, root: Path | None = None) -> Path | None:
    """``glossary.html`` in ``out_dir`` from the checkout's ``docs/glossary.md`` (None: there is none)."""
    from lab.report._fs import write_text

    src = source(root)
    if src is None:
        return None
    return write_text(Path(out_dir) / PAGE, to_html(src.read_text(encoding="utf-8")))


def relink(page: str, prefix: str = "") -> str:
    """Links to ``docs/glossary.md`` (from a notebook, relative to ``notebooks/``) pointed at the
    rendered page beside the reports (``prefix``: the way from the page to the reports folder)."""
    return _LINK.sub(lambda m: f"href={m.group(1)}{prefix}{PAGE}{m.group(2) or ''}{m.group(1)}", page)
