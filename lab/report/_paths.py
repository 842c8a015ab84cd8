"""No path of the build machine in a report: folders a notebook printed become what a reader can use.

A notebook's outputs name files where they are on the machine that ran it (a dataset's source, a run
folder, the template plugin's folder). A report is read elsewhere, so each such folder is written
relative to something the reader has: the checkout (``lab/data/...``), ``~``, the cache root, the
runs root, the report folder itself, the temporary folder.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path


def _real(p) -> list[str]:
    """``p`` as given and resolved (a symlinked home or temp folder prints either way)."""
    p = Path(p)
    out = {str(p)}
    try:
        out.add(str(p.resolve()))
    except OSError:
        pass
    return [s.rstrip("/") for s in out if len(s.rstrip("/")) > 1]


def replacements(out_dir: Path | None = None) -> list[tuple[str, str]]:
    """``(folder, what a report shows instead)``, the longest folder first."""
    from lab._cache import cache_root
    from lab.report._fs import repo_root
    from lab.runs import runs_root

    pairs: list[tuple[str, str]] = []
    named = [(out_dir, "<reports>"), (repo_root(), "."), (Path.home(), "~"),
             (tempfile.gettempdir(), "<tmp>"), (sys.prefix, "<python>"), (sys.base_prefix, "<python>")]
    if os.environ.get("LAB_CACHE_DIR"):
        named.append((cache_root(), "<cache>"))
    if os.environ.get("LAB_RUNS_DIR"):
        named.append((runs_root(), "<runs>"))
    for path, shown in named:
        if path:
            pairs += [(p, shown) for p in _real(path)]
    pairs.sort(key=lambda kv: -len(kv[0]))
    return pairs


def scrub(text: str, pairs: list[tuple[str, str]]) -> str:
    """``text`` with every folder of ``pairs`` replaced (``/work/x/lab/a.npz`` -> ``lab/a.npz`` when
    the checkout is ``/work/x``; a folder alone -> its replacement)."""
    for path, shown in pairs:
        if path not in text:
            continue
        pat = re.compile(re.escape(path) + r"(/|(?![\w.-]))")
        text = pat.sub(lambda m, s=shown: ("" if s == "." else s + "/") if m.group(1) == "/" else s, text)
    return text
