"""The main job on a machine without its optional extras: no Chrome/Chromium, no Debian
Fashion-MNIST, no playwright. Nothing is mocked: each run happens in a private mount namespace
where those files really are gone (``/dev/null`` over each browser kaleido could find, an empty
folder over the others), so kaleido's own browser discovery genuinely fails. Every run has a
hard timeout: a hang fails the test instead of eating CI's time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _report_helpers import (OPTIONAL_DIRS, ROOT, UNSHARE, UNSHARE_REASON, browser_candidates,
                             load_index, python_package_dir, run_hidden,
                             write_tiny_notebooks)
from lab.report import notebook

pytestmark = [pytest.mark.notebook,
              pytest.mark.skipif(UNSHARE is None, reason=UNSHARE_REASON)]

LAB = Path(sys.executable).with_name("lab")
HARD_TIMEOUT_S = 300  # each run takes seconds; a hang is what this catches


def _hidden_dirs() -> list[Path]:
    dirs = [d for d in OPTIONAL_DIRS if d.is_dir()]
    playwright = python_package_dir("playwright")
    return dirs + ([playwright] if playwright else [])


def _run(argv, **kw) -> subprocess.CompletedProcess:
    return run_hidden(argv, hide_files=browser_candidates(), hide_dirs=_hidden_dirs(),
                      timeout=HARD_TIMEOUT_S, **kw)


def test_the_namespace_really_hides_the_extras():
    """The premise of the other tests: in there kaleido's discovery finds nothing."""
    probe = textwrap.dedent("""
        import json
        try:
            import playwright.sync_api
            playwright = True
        except ImportError:
            playwright = False
        from choreographer.browsers.chromium import Chromium
        from lab.data.datasets import DEBIAN_FASHION
        print(json.dumps({"browser": Chromium.find_browser(skip_local=False),
                          "playwright": playwright,
                          "fashion": (DEBIAN_FASHION / "train-images-idx3-ubyte.gz").exists()}))""")
    res = _run([sys.executable, "-c", probe])
    assert res.returncode == 0, res.stdout
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen == {"browser": None, "playwright": False, "fashion": False}


def test_report_without_a_browser_finishes_with_one_line_and_a_note(tmp_path):
    """`lab report` where no browser exists, on a notebook that draws a plotly figure and asks
    for its PNG (the smallest real report; `lab report --params smoke --only 00_quickstart` is
    the same path with a longer notebook)."""
    nbdir = write_tiny_notebooks(tmp_path / "nb", bad=False)
    out = tmp_path / "reports"
    res = _run([LAB, "report", "--notebooks", nbdir, "--out", out], cwd=tmp_path)
    assert res.returncode == 0, res.stdout
    skipped = [ln for ln in res.stdout.splitlines() if ln.startswith("PNG export skipped")]
    assert len(skipped) == 1, res.stdout  # one line, before the first notebook
    assert res.stdout.index(skipped[0]) < res.stdout.index("[1/1] a_good.ipynb")
    assert "chromium" in skipped[0]  # says how to get one
    page = (out / "index.html").read_text()
    assert "run-note'>Note: PNG export skipped" in page
    card = load_index(out)["a_good"]
    assert card["ok"] and card["figures"] == [] and card["metrics"] == {"total": 5.0, "label": "x"}
    assert not (out / "a_good_figures").exists()
    assert "plotly-graph-div" in (out / "a_good.html").read_text()  # the report is whole


def test_save_png_without_a_browser_notes_it_and_goes_on(tmp_path):
    """The call that used to hang: save_png asks kaleido for a PNG and there is no browser (as in
    a notebook run by render_one with PNGs on, where the up-front check is not there to save it).
    """
    script = ("import plotly.graph_objects as go\nfrom lab.report import save_png\n"
              "save_png(go.Figure(go.Bar(y=[1, 2])), 'a')\nsave_png(go.Figure(go.Bar(y=[2, 1])), 'b')\n"
              "print('RETURNED')")
    env = {**os.environ, notebook.FIGURES_ENV: str(tmp_path), notebook.PNG_ENV: "1"}
    res = _run([sys.executable, "-c", script], cwd=ROOT, env=env)
    assert res.returncode == 0 and "RETURNED" in res.stdout, res.stdout
    notes = (tmp_path / notebook.NOTES_FILE).read_text()
    assert notes.startswith("PNG export skipped: kaleido finds no Chrome/Chromium")
    assert len(notes.splitlines()) == 1  # noted once, for both figures
    assert not list(tmp_path.glob("*.png"))
