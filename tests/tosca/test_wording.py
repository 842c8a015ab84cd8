"""The ridge router's origin, stated exactly wherever it is named: a RanPAC-style global ridge router
from a follow-up method (PRISM) developed in the repository that first published TOSCA's code —
never the TOSCA authors' own routing (the paper routes by entropy)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# spelled in two pieces so that this file does not hold the phrase it looks for
BANNED = ("the authors" + "' current", "the authors" + "’ current")


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        head = path.open("rb").read(8192)
        if b"\0" not in head:           # text, not a binary file
            files.append(path)
    return files


def test_no_tracked_file_calls_the_ridge_router_the_authors_current_routing():
    hits = []
    for path in _tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace").lower()
        hits += [f"{path.relative_to(ROOT)}: {phrase!r}" for phrase in BANNED if phrase in text]
    assert not hits, "the ridge router is PRISM's, not the TOSCA authors' current routing:\n" + "\n".join(hits)


def test_one_wording_of_the_ridge_routers_origin():
    from lab.experiments.tosca import results
    from lab.tosca import ridge

    assert results.RIDGE_ORIGIN == ridge.ORIGIN
    assert "PRISM" in ridge.ORIGIN and "the TOSCA paper's own routing is entropy" in ridge.ORIGIN
    for name in ("README.md", "docs/tosca.md", "lab/tosca/routing.py", "lab/tosca/ridge.py",
                 "lab/experiments/tosca/cli.py", "results/tosca/README.md"):
        text = " ".join((ROOT / name).read_text(encoding="utf-8").split())
        assert "follow-up method (PRISM)" in text or "PRISM's RanPAC-style" in text, name
