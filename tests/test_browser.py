"""A real browser (Playwright + the Chrome/Chromium kaleido finds, e.g. Debian's) opens the rendered
reports: every plotly figure draws, and no page asks for anything off this machine. Skipped with
the reason when there is no browser or no playwright; every wait has a limit."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from _report_helpers import (BROWSER, CHROMIUM_ARGS, NOTEBOOKS, hard_timeout, smoke_report, smoke_reports_dir,
                             tiny_reports)
from lab.report.notebook import enable_png_command

pytestmark = [pytest.mark.browser, hard_timeout(900)]  # a notebook's smoke render included

if not BROWSER:
    pytest.skip(f"no Chrome/Chromium found (enable with: {enable_png_command()})", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
LAUNCH_TIMEOUT_MS = 60_000
PAGE_TIMEOUT_MS = 30_000

_LOCAL = re.compile(r"^(file:|data:|blob:|about:|https?://(127\.0\.0\.1|localhost)[:/])")
_ALL_DRAWN = "() => [...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('.main-svg'))"


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(BROWSER), args=CHROMIUM_ARGS, headless=True,
                              timeout=LAUNCH_TIMEOUT_MS)
        yield b
        b.close()


def open_page(browser, path: Path) -> dict:
    """Load ``path``; wait for plotly; return what the page drew and every URL it asked for."""
    context = browser.new_context()
    # Nothing may leave the machine: record every request, and refuse non-local ones at once.
    context.route(re.compile(r"^https?://"), lambda route: route.continue_()
                  if _LOCAL.match(route.request.url) else route.abort())
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri(), wait_until="load", timeout=PAGE_TIMEOUT_MS)
        n_divs = page.locator(".plotly-graph-div").count()
        if n_divs:
            page.wait_for_function(_ALL_DRAWN, timeout=PAGE_TIMEOUT_MS)
        drawn = page.eval_on_selector_all(
            ".plotly-graph-div", "ds => ds.filter(d => d.querySelector('.main-svg')).length")
        broken_imgs = page.eval_on_selector_all(
            "img", "is => is.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
        links = page.eval_on_selector_all("a[href]", "as => as.map(a => a.getAttribute('href'))")
        math_widths = page.eval_on_selector_all("math", "ms => ms.map(m => m.getBoundingClientRect().width)")
    finally:
        context.close()
    return {"divs": n_divs, "drawn": drawn, "off_machine": [u for u in requests if not _LOCAL.match(u)],
            "errors": errors, "broken_imgs": broken_imgs, "links": links, "math_widths": math_widths}


def check_report(seen: dict, name: str) -> None:
    assert seen["off_machine"] == [], f"{name} asked the network for {seen['off_machine']}"
    assert seen["errors"] == [], f"{name}: JavaScript errors {seen['errors']}"
    assert seen["drawn"] == seen["divs"], f"{name}: only {seen['drawn']} of {seen['divs']} plotly figures drew"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny notebooks' reports (shared with test_report), so this runs with no notebooks too."""
    return tiny_reports(tmp_path_factory)[1]


def test_tiny_report_draws_offline(browser, tiny):
    seen = open_page(browser, tiny / "a_good.html")
    assert seen["divs"] == 1
    check_report(seen, "a_good.html")
    if importlib.util.find_spec("latex2mathml"):
        assert seen["math_widths"] and all(w > 0 for w in seen["math_widths"]), "MathML did not lay out"
    check_report(open_page(browser, tiny / "b_bad.html"), "b_bad.html")


def test_tiny_index_links_every_report_and_its_images_load(browser, tiny):
    seen = open_page(browser, tiny / "index.html")
    check_report(seen, "index.html")
    assert {"./a_good.html", "./b_bad.html", "./a_good.ipynb"} <= set(seen["links"])
    assert seen["broken_imgs"] == []


@pytest.mark.notebook
@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks in notebooks/ yet")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_report_draws_offline(browser, path, tmp_path_factory):
    smoke_report(tmp_path_factory, path)
    html = smoke_reports_dir(tmp_path_factory) / f"{path.stem}.html"
    seen = open_page(browser, html)
    check_report(seen, html.name)


@pytest.mark.notebook
@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks in notebooks/ yet")
def test_notebook_index_opens_offline(browser, tmp_path_factory):
    from lab.report import write_index

    for path in NOTEBOOKS:
        smoke_report(tmp_path_factory, path)
    out = smoke_reports_dir(tmp_path_factory)
    write_index(out, NOTEBOOKS[0].parent)
    seen = open_page(browser, out / "index.html")
    check_report(seen, "index.html")
    assert {f"./{p.stem}.html" for p in NOTEBOOKS} <= set(seen["links"])
