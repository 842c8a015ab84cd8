"""The interactive lab in a real browser: JupyterLab (started as ``lab jupyter`` starts it) in
headless Chromium runs notebooks 01 to 05 with their smoke parameters through the page (Run All
Cells), then moves controls of each notebook's panel through the widget DOM and checks what a
student sees: the figure INSIDE the panel redraws (new title or data), nothing new appears
anywhere else in the notebook, no figure sits outside the panel in the panel's cell, the figure
being recomputed is dimmed in the page (its computed opacity), a control that does nothing for the
current choice is disabled with its reason, a slider's range follows what it indexes (notebook 03's
layer slider on the projector's two Linears), a rapid sequence of changes ends on the last one, and
the browser console stays free of errors. Also measures how long after the control change the panel's
figure changes (printed; ``-s`` shows it). The same check runs once in Notebook 7 (``lab jupyter
--ui notebook``) on a small notebook that shows notebook 04's two panels on the shipped AWARe study:
same server, kernels and widget manager, a different page around them (the panel's notebook itself
already ran in JupyterLab above).

Skipped with the reason when /usr/bin/chromium or playwright is missing. Every wait has a limit;
the server and every kernel it started are stopped by PID in the fixture's teardown.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from _report_helpers import CHROMIUM_ARGS, ROOT, hard_timeout

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [pytest.mark.browser, hard_timeout(420)]

if not CHROMIUM.is_file():
    pytest.skip(f"{CHROMIUM} not found (Debian: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
HAVE_NOTEBOOK7 = importlib.util.find_spec("notebook") is not None

SERVER_START_S = 90
RUN_ALL_S = 240           # one notebook's Run All Cells with smoke parameters
REDRAW_S = 60             # a control change until the panel's figure changes
PAGE_TIMEOUT_MS = 30_000
PANEL_NOTEBOOKS = ("01_ventral_vs_prefrontal", "02_tosca_sparsity_orthogonality", "04_aware_ablations",
                   "05_your_own_idea", "03_aware_saliency")
NOTEBOOK7_NOTEBOOK = "panel_only"  # notebook 04's panels alone (see _write_panel_notebook)
TOSCA_NOTEBOOK = "tosca_panel"     # notebook 02's panel alone on its smoke data (see _write_tosca_notebook)

# JupyterLab settings for the test: every cell stays in the DOM (no windowing) so the page can be
# inspected whole; no update or news checks (nothing leaves the machine).
SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return json.loads(r.read() or b"null")


def _write_panel_notebook(folder: Path) -> None:
    """``panel_only.ipynb``: notebook 04's two panels on the shipped AWARe study, nothing else."""
    import nbformat as nbf

    from lab.jupyter import DEFAULT_KERNEL

    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_markdown_cell("Notebook 04's panels on the shipped study."),
                nbf.v4.new_code_cell("from lab.experiments.aware.views import study as study_views\n"
                                     "from lab.widgets.aware import MaskPanel, RunsPanel\n"
                                     f"study = study_views.load_study({str(ROOT / 'results' / 'aware')!r})"),
                nbf.v4.new_code_cell("RunsPanel(study)"),
                nbf.v4.new_code_cell("MaskPanel.from_study(study)")]
    nb.metadata["kernelspec"] = {"name": DEFAULT_KERNEL, "display_name": DEFAULT_KERNEL, "language": "python"}
    nbf.write(nb, folder / f"{NOTEBOOK7_NOTEBOOK}.ipynb")


def _write_tosca_notebook(folder: Path) -> None:
    """``tosca_panel.ipynb``: notebook 02's TOSCA panel as it builds it, on its smoke data (mnist_5k,
    64 px, B0 Inc2, 2 epochs), without the rest of the notebook."""
    import nbformat as nbf

    from lab.jupyter import DEFAULT_KERNEL

    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_markdown_cell("Notebook 02's panel on its smoke data."),
                nbf.v4.new_code_cell("from lab import backbones, data, features\n"
                                     "from lab.experiments.tosca.methods import ScenarioData\n"
                                     "from lab.widgets import ToscaPanel\n"
                                     "scn = data.scenario(['mnist_5k'], init=0, inc=2, seed=1993)\n"
                                     "bb = backbones.load('efficientnet_lite0', resolution=64)\n"
                                     "sd = ScenarioData.from_scenario(scn, features.scenario_features(scn, bb), backbone=bb)"),
                nbf.v4.new_code_cell("ToscaPanel(sd, epochs=2, batch_size=48)")]
    nb.metadata["kernelspec"] = {"name": DEFAULT_KERNEL, "display_name": DEFAULT_KERNEL, "language": "python"}
    nbf.write(nb, folder / f"{TOSCA_NOTEBOOK}.ipynb")


def _prepare(folder: Path, names=PANEL_NOTEBOOKS) -> None:
    """Papermill-parameterised (smoke profile), unexecuted copies of the panel notebooks."""
    import papermill

    from lab.jupyter import DEFAULT_KERNEL
    from lab.report import params

    for name in names:
        if name == NOTEBOOK7_NOTEBOOK:
            _write_panel_notebook(folder)
            continue
        if name == TOSCA_NOTEBOOK:
            _write_tosca_notebook(folder)
            continue
        src = ROOT / "notebooks" / f"{name}.ipynb"
        papermill.execute_notebook(str(src), str(folder / src.name), parameters=params.resolve(src, "smoke"),
                                   prepare_only=True, kernel_name=DEFAULT_KERNEL, progress_bar=False,
                                   log_output=False, cwd=str(ROOT / "notebooks"))


def _stop(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _running(p)]
            time.sleep(0.2)
        if not alive:
            return


def _running(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:  # not our child (a kernel): ask the kernel
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def _serve(base: Path, ui: str, names=PANEL_NOTEBOOKS):
    """``lab jupyter --ui <ui>``'s command line on a free loopback port and a fresh token, rooted
    at a folder of smoke-parameterised notebooks; stopped (server and kernels, by PID)."""
    import psutil

    from lab import jupyter

    nbdir, settings, home = base / "notebooks", base / "settings", base / "jupyter"
    nbdir.mkdir()
    _prepare(nbdir, names)
    for rel, value in SETTINGS.items():
        ext, _, file = rel.rpartition("/")
        (settings / ext).mkdir(parents=True, exist_ok=True)
        (settings / ext / file).write_text(json.dumps(value))
    parser = argparse.ArgumentParser(prog="lab")
    jupyter.register(parser.add_subparsers())
    port = _free_port()
    args = parser.parse_args(["jupyter", "--ui", ui, "--root-dir", str(nbdir), "--port", str(port), "--",
                              "--ServerApp.log_level=WARN"])
    # the test's own JupyterLab settings and workspaces: where lab jupyter finds a user's (its
    # allow-list passes no folder on the command line); the news pop-up is off in lab jupyter itself
    from unittest import mock

    with mock.patch.dict(os.environ, {"JUPYTERLAB_SETTINGS_DIR": str(settings),
                                      "JUPYTERLAB_WORKSPACES_DIR": str(base / "ws")}):
        argv, env, url = jupyter.build_command(args)
    env = {**env, "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "PYTHONUNBUFFERED": "1"}
    log = (base / "server.log").open("w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(nbdir))
    token = env["JUPYTER_TOKEN"]
    api = f"http://127.0.0.1:{port}/api"
    pids: list[int] = [proc.pid]
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{ui} server exited ({proc.returncode}): {(base / 'server.log').read_text()[-2000:]}")
            try:
                _get(f"{api}/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{ui} server did not answer within {SERVER_START_S} s")
                time.sleep(0.3)
        yield {"url": f"http://127.0.0.1:{port}", "token": token, "api": api, "dir": nbdir, "proc": proc,
               "ui": ui, "page": url.split("?", 1)[0]}
    finally:
        try:  # every kernel the server started, by PID (children of the server process)
            pids += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            pass
        _stop(pids[1:] + pids[:1])
        log.close()


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    with _serve(tmp_path_factory.mktemp("lab-browser"), "lab", (*PANEL_NOTEBOOKS, TOSCA_NOTEBOOK)) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


# --- what the page shows -----------------------------------------------------------------------
_PROMPTS_DONE = """() => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
  return cells.length > 0 && cells.every(c => /\\[\\d+\\]/.test(c.querySelector('.jp-InputPrompt')?.textContent || ''));
}"""
# every figure in the panel's output area as drawn: its title, and its traces' decoded x/y/z
# (each snippet takes the panel's selector, by default every panel of the page: notebook 04 has two)
_PANEL_FIGURES = """(sel) => [...document.querySelectorAll((sel || '.lab-panel') + ' .lab-panel-output .js-plotly-plot')].map(d => ({
  title: d.querySelector('.gtitle')?.textContent || '',
  drawn: !!d.querySelector('.main-svg'),
  data: JSON.stringify((d._fullData || []).map(t => [t.x, t.y, t.z]),
                       (k, v) => ArrayBuffer.isView(v) ? Array.from(v) : v)}))"""
_ALL_DRAWN = f"() => {{ const f = ({_PANEL_FIGURES})(); return f.length > 0 && f.every(x => x.drawn); }}"
_OUTSIDE = """(sel) => {
  sel = sel || '.lab-panel';
  const outs = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')].filter(o => !o.closest('.lab-panel'));
  const cell = document.querySelector(sel)?.closest('.jp-CodeCell');
  return {n: outs.length, text: outs.map(o => o.textContent.slice(0, 80)).join('|'),
          strayInPanelCell: cell ? cell.querySelectorAll('.js-plotly-plot').length -
                            cell.querySelectorAll(sel + ' .js-plotly-plot').length : -1,
          errors: [...document.querySelectorAll('.jp-Notebook [data-mime-type="application/vnd.jupyter.stderr"]')]
                    .map(e => e.textContent).filter(t => /Traceback|Error/.test(t)).map(t => t.slice(0, 300))};
}"""


def _session(server, name: str, timeout: float) -> dict:
    """The notebook's session once its kernel is idle and the page is connected to it."""
    deadline = time.monotonic() + timeout
    while True:
        for s in _get(f"{server['api']}/sessions?token={server['token']}"):
            k = s.get("kernel") or {}
            if s.get("path", "").endswith(f"{name}.ipynb") and k.get("execution_state") == "idle" \
                    and k.get("connections", 0) >= 1:
                return s
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: no idle kernel connected to the page within {timeout:.0f} s")
        time.sleep(0.3)


def _run_all(page, server, name: str) -> dict:
    where = {"lab": f"lab/tree/{name}.ipynb?token={server['token']}&reset",  # reset: no saved workspace
             "notebook": f"notebooks/{name}.ipynb?token={server['token']}"}[server["ui"]]
    page.goto(f"{server['url']}/{where}", wait_until="domcontentloaded")
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=PAGE_TIMEOUT_MS)
    t0 = time.perf_counter()
    session = _session(server, name, SERVER_START_S)  # the kernel is up before anything runs
    t1 = time.perf_counter()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    try:
        page.wait_for_function(_PROMPTS_DONE, timeout=RUN_ALL_S * 1000, polling=500)
    finally:
        info = page.evaluate(_OUTSIDE)
        assert not info["errors"], f"{name}: a cell failed: {info['errors']}"
    page.wait_for_function(_ALL_DRAWN, timeout=PAGE_TIMEOUT_MS, polling=200)
    print(f"\n{name} ({server['ui']}): kernel ready {t1 - t0:.1f} s, Run All Cells {time.perf_counter() - t1:.1f} s")
    return session


_STATUS = "(sel) => document.querySelector((sel || '.lab-panel') + ' .lab-panel-status')?.textContent || ''"
# what the browser draws: the output area's computed opacity (1 = not dimmed)
_OPACITY = "(sel) => Number(getComputedStyle(document.querySelector((sel || '.lab-panel') + ' .lab-panel-output')).opacity)"
# watch the panel's output area from now on: whether it was ever marked busy (dimmed), and its computed
# opacity each time the mark arrives (a refresh of a few milliseconds is too short to poll)
_WATCH_DIM = """(sel) => {
  const o = document.querySelector(sel + ' .lab-panel-output');
  if (window.__labDimObs) window.__labDimObs.disconnect();
  const w = window.__labDim = {busy: false, min: 1};
  window.__labDimObs = new MutationObserver(records => {
    for (const r of records) if ((r.oldValue || '').split(' ').includes('lab-busy')) w.busy = true;
    if (o.classList.contains('lab-busy')) { w.busy = true; w.min = Math.min(w.min, Number(getComputedStyle(o).opacity)); }
  });
  window.__labDimObs.observe(o, {attributes: true, attributeFilter: ['class'], attributeOldValue: true});
}"""


def _change_and_wait(page, name: str, action, expect, *, busy: bool = False,
                     panel: str = ".lab-panel") -> tuple[list[dict], list[dict]]:
    """Do ``action`` on the page; wait until the figures of ``panel`` (a selector: one panel, or every
    panel of the page by default) differ and satisfy ``expect``. ``busy``: the panel must be seen
    dimmed meanwhile (its output area marked busy, drawn at under half opacity)."""
    before = page.evaluate(_PANEL_FIGURES, panel)
    outside = page.evaluate(_OUTSIDE, panel)
    assert before and outside["strayInPanelCell"] == 0, f"{name}: figures outside the panel: {outside}"
    page.wait_for_function(f"(sel) => ({_OPACITY})(sel) === 1", arg=panel, timeout=PAGE_TIMEOUT_MS)  # not dimmed at rest
    page.evaluate(_WATCH_DIM, panel)
    t0 = time.perf_counter()
    action()
    # Poll what is drawn until it differs from before and satisfies `expect` (a redraw passes
    # through transient states: the figures dim while the kernel computes, plotly re-lays out).
    after, deadline, seen_busy, dimmest = before, t0 + REDRAW_S, False, 1.0
    while not (after != before and len(after) == len(before) and all(f["drawn"] for f in after) and expect(after)):
        if time.perf_counter() > deadline:
            status = page.evaluate(_STATUS, panel)
            pytest.fail(f"{name}: the panel's figures did not change as expected within {REDRAW_S} s; "
                        f"status {status!r}; titles {[f['title'] for f in after]}")
        page.wait_for_timeout(100)
        seen_busy = seen_busy or "computing" in page.evaluate(_STATUS, panel)
        dimmest = min(dimmest, page.evaluate(_OPACITY, panel))
        after = page.evaluate(_PANEL_FIGURES, panel)
    seconds = time.perf_counter() - t0
    page.wait_for_function(f"(sel) => ({_OPACITY})(sel) === 1", arg=panel, timeout=PAGE_TIMEOUT_MS)  # and undimmed after
    watched = page.evaluate("() => window.__labDim")
    seen_busy, dimmest = seen_busy or watched["busy"], min(dimmest, watched["min"])
    status = page.evaluate(_STATUS, panel)
    assert "computing" not in status and "Error" not in status, status
    assert seen_busy or not busy, f"{name}: the panel was never marked 'computing…' while it recomputed"
    assert dimmest < 0.5 or not busy, f"{name}: the figures were never dimmed while it recomputed ({dimmest})"
    now = page.evaluate(_OUTSIDE, panel)
    assert now["n"] == outside["n"] and now["strayInPanelCell"] == 0, \
        f"{name}: output appeared outside the panel: {outside} -> {now}"
    print(f"\n{name}: the panel's figure changed {seconds:.2f} s after the control change")
    return before, after


def _type_readout(page, description: str, value: str, panel: str = ".lab-panel"):
    """Type a value into a slider's editable readout (what a student does for an exact value)."""
    def act():
        slider = page.locator(f"{panel} .widget-slider", has=page.locator(".widget-label", has_text=description))
        readout = slider.locator(".widget-readout")
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type(value)
        page.keyboard.press("Enter")
    return act


@contextlib.contextmanager
def _page(browser):
    """A fresh browser page and the list its console errors go to."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"page error: {e}"))
    try:
        yield page, console
    finally:
        context.close()


@pytest.fixture(scope="module")
def lab_page(lab_server, browser):
    with _page(browser) as pc:
        yield pc


@pytest.fixture
def notebook(lab_server, lab_page):
    """Open a notebook in the page and Run All Cells; afterwards its kernel is shut down."""
    page, console = lab_page
    console.clear()  # each test answers for the console errors of its own notebook
    opened = []

    def open_(name: str):
        opened.append(_run_all(page, lab_server, name))

    yield open_
    for s in opened:
        req = urllib.request.Request(f"{lab_server['api']}/sessions/{s['id']}?token={lab_server['token']}",
                                     method="DELETE")
        try:
            urllib.request.urlopen(req, timeout=10).close()  # noqa: S310 - loopback only
        except OSError:
            pass  # the module teardown stops every kernel by PID anyway


def test_stage_picker_redraws_inside_the_panel(notebook, lab_page):
    page, console = lab_page
    notebook(PANEL_NOTEBOOKS[0])
    before, after = _change_and_wait(
        page, "01 stage picker: projection -> t-SNE",
        lambda: page.locator(".lab-panel .widget-toggle-button", has_text="t-SNE").click(),
        lambda figs: "t-SNE" in figs[0]["title"] and "PCA" not in figs[0]["title"])
    assert "PCA" in before[0]["title"] and before[1] == after[1]  # the CKA bars are the same stage's
    assert not console, f"browser console errors: {console}"


def _control(page, kind: str, description: str, panel: str = ".lab-panel"):
    """The panel's control of a widget kind (``widget-slider``, ``widget-dropdown``...) by its label."""
    return page.locator(f"{panel} .{kind}", has=page.locator(".widget-label", has_text=description))


# a dropdown of a panel by its label: whether it is disabled, its tooltip (ipywidgets 8 shows one only on a
# dropdown without a label), its options and value
_DROPDOWN_STATE = """([sel, label]) => {
  const box = [...document.querySelectorAll(sel + ' .widget-dropdown')]
    .find(b => b.querySelector('.widget-label')?.textContent.trim() === label);
  const select = box.querySelector('select');
  return {disabled: select.disabled, tooltip: box.getAttribute('title') || box.querySelector('.widget-label')?.getAttribute('title') || '',
          options: [...select.options].map(o => o.textContent.trim()), value: select.selectedOptions[0]?.textContent.trim()};
}"""


_SLIDER_STATE = """(label) => {
  const box = [...document.querySelectorAll('.lab-panel .widget-slider')]
    .find(b => b.querySelector('.widget-label')?.textContent.trim() === label);
  const handle = box.querySelector('.noUi-handle');
  return {max: Number(handle.getAttribute('aria-valuemax')), value: Number(handle.getAttribute('aria-valuenow')),
          disabled: box.querySelector('.noUi-target').hasAttribute('disabled') || box.classList.contains('mod-disabled'),
          tooltip: box.getAttribute('title') || box.querySelector('.widget-label')?.getAttribute('title') || ''};
}"""


def test_tosca_panel_retrains_and_redraws_inside_the_panel(notebook, lab_page):
    page, console = lab_page
    notebook(PANEL_NOTEBOOKS[1])
    before, after = _change_and_wait(page, "02 TOSCA panel: L1 -> 1e-2 (re-trains every task)",
                                     _type_readout(page, "L1", "1e-2"),
                                     lambda figs: all("L1=1.0e-02" in f["title"] for f in figs), busy=True)
    assert all("L1=5.0e-04" in f["title"] for f in before)
    status = page.locator(".lab-panel .lab-panel-status").inner_text()
    assert "head scale σ" in status and "warning" not in status, status  # σ stays > 0 by default
    assert not console, f"browser console errors: {console}"


def test_tosca_panel_dims_and_explains_its_controls(notebook, lab_page):
    """Notebook 02's panel on its smoke data, alone (``tosca_panel``): while it re-trains the figures
    are dimmed in the page; the test batch slider is disabled with its reason for the routers that
    route each image alone, and the status line names a batch only for per-batch routing."""
    page, console = lab_page
    notebook(TOSCA_NOTEBOOK)
    status = page.evaluate(_STATUS)
    batch = page.evaluate(_SLIDER_STATE, "test batch")
    assert batch["disabled"] and "routes each image on its own" in batch["tooltip"], batch
    assert "batch 48" not in status and "test batch: not used by per-sample" in status, status
    _change_and_wait(page, "TOSCA panel: L1 -> 1e-2 (re-trains every task, dimmed meanwhile)",
                     _type_readout(page, "L1", "1e-2"),
                     lambda figs: all("L1=1.0e-02" in f["title"] for f in figs), busy=True)
    _change_and_wait(page, "TOSCA panel: routing -> energy",
                     lambda: _control(page, "widget-dropdown", "routing").locator("select").select_option("energy"),
                     lambda figs: "TOSCA (energy)" in figs[2]["data"])
    status = page.evaluate(_STATUS)
    assert "energy" in status and "energy, batch" not in status and page.evaluate(_SLIDER_STATE, "test batch")["disabled"]
    _change_and_wait(page, "TOSCA panel: routing -> per-batch (shuffled)",
                     lambda: _control(page, "widget-dropdown", "routing").locator("select")
                     .select_option("per-batch (shuffled)"),
                     lambda figs: "per-batch (shuffled)" in figs[2]["data"])
    assert not page.evaluate(_SLIDER_STATE, "test batch")["disabled"]
    assert "per-batch (shuffled), batch 48" in page.evaluate(_STATUS)
    assert not console, f"browser console errors: {console}"


def test_mask_panel_layer_slider_follows_the_target_shown(notebook, lab_page):
    """Notebook 03 (smoke: a tiny 2-layer model): the layer slider spans the layers of the target picked
    in `show`; on the projector (two Linears) its range is 0-1 and the layer profile is drawn, never
    dropped; after a rapid sequence of rho changes the figures show the value the slider shows."""
    page, console = lab_page
    notebook(PANEL_NOTEBOOKS[4])
    first = page.evaluate(_SLIDER_STATE, "layer")
    assert first["max"] >= 1 and not first["disabled"], first
    before, after = _change_and_wait(
        page, "03 mask panel: show -> projector",
        lambda: _control(page, "widget-dropdown", "show").locator("select").select_option("projector"),
        lambda figs: len(figs) == 3 and "projector, layer" in figs[2]["title"])
    state = page.evaluate(_SLIDER_STATE, "layer")
    assert state["max"] == 1 and state["value"] <= 1, state
    _change_and_wait(page, "03 mask panel: layer -> 0 on the projector", _type_readout(page, "layer", "0"),
                     lambda figs: "projector, layer 0" in figs[2]["title"])
    t0 = time.perf_counter()
    for rho in ("0.4", "0.5", "0.6", "0.7"):                      # a rapid sequence: no wait in between
        _type_readout(page, "rho", rho)()
    settled = f"() => !({_STATUS})().includes('computing') && ({_OPACITY})() === 1"
    page.wait_for_function(settled, timeout=REDRAW_S * 1000)
    page.wait_for_timeout(1500)                                    # nothing still on its way from the kernel
    page.wait_for_function(settled, timeout=REDRAW_S * 1000)
    rho = page.evaluate(_SLIDER_STATE, "rho")["value"]
    titles = [f["title"] for f in page.evaluate(_PANEL_FIGURES)]
    assert rho != 0.3 and f"rho={rho:g}" in titles[0], (rho, titles)   # the figure is the control's last value
    print(f"\n03 mask panel: four rho changes in a row settled on rho={rho:g} "
          f"{time.perf_counter() - t0:.2f} s after the first")
    assert "Error" not in page.evaluate(_STATUS) and len(page.evaluate(_PANEL_FIGURES)) == 3
    assert not console, f"browser console errors: {console}"


# Notebook 7.6 (with JupyterLab 4.6) throws this while its settings registry loads the page: the
# shortcuts plugin's listener runs before its own settings are in the registry, a race in the
# frontend (jupyter/notebook#7862, open), before any cell runs and independent of the notebook.
# Exactly this page error is tolerated in Notebook 7's page, nothing else.
NOTEBOOK7_KNOWN = ("page error: Cannot read properties of undefined (reading 'schema')",)


RUNS_PANEL, MASK_PANEL = ".lab-panel-runspanel", ".lab-panel-maskpanel"   # notebook 04's two panels


def _aware_panels(page, console, where: str) -> None:
    """Notebook 04's two panels, each in its own cell, each doing one job: the finished runs' browser
    (or its plain "no finished run yet"), and the frozen-row re-selection, which redraws only itself,
    dimmed while it recomputes, and greys out the calibration picker for a rule that does not read it."""
    cells = page.evaluate("""(sels) => sels.map(s => [...document.querySelectorAll(s)]
        .map(p => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].indexOf(p.closest('.jp-CodeCell'))))""",
                          [RUNS_PANEL, MASK_PANEL])
    assert [len(c) for c in cells] == [1, 1] and cells[0][0] != cells[1][0], f"{where}04: panels per cell {cells}"
    runs_status = page.evaluate(_STATUS, RUNS_PANEL)
    if "no finished run yet" in runs_status:                     # a study with nothing finished: said plainly
        assert page.evaluate(_PANEL_FIGURES, RUNS_PANEL) == []
        assert all(page.evaluate(_DROPDOWN_STATE, [RUNS_PANEL, d])["disabled"] for d in ("group", "measure"))
    else:
        assert re.search(r"\d+ finished runs? in methods", runs_status), runs_status
        precision = page.evaluate(_DROPDOWN_STATE, [RUNS_PANEL, "precision"])
        # a dropdown with a label shows no tooltip in ipywidgets 8: the reason is on the panel's status line
        assert precision["disabled"] and "precision: every finished run trained in" in runs_status, (precision, runs_status)
        mask_before = page.evaluate(_PANEL_FIGURES, MASK_PANEL)
        _, after = _change_and_wait(
            page, f"{where}04 runs panel: measure -> downstream accuracy",
            lambda: _control(page, "widget-dropdown", "measure", RUNS_PANEL).locator("select")
            .select_option(label="downstream accuracy"),
            lambda figs: "downstream accuracy" in figs[0]["title"], busy=True, panel=RUNS_PANEL)
        assert "AWARe (rho 0.3)" in after[0]["data"] or "methods/aware" not in after[0]["data"]
        assert "highest downstream accuracy" in page.evaluate(_STATUS, RUNS_PANEL)
        assert page.evaluate(_PANEL_FIGURES, MASK_PANEL) == mask_before     # the other panel did not move
    runs_before = page.evaluate(_PANEL_FIGURES, RUNS_PANEL)
    before, after = _change_and_wait(page, f"{where}04 mask panel: rho -> 0.5 (masks re-selected on stored saliency)",
                                     _type_readout(page, "rho", "0.5", MASK_PANEL),
                                     lambda figs: "rho=0.5" in figs[0]["title"] and len(figs) == 3,
                                     busy=True, panel=MASK_PANEL)
    assert "rho=0.3" in before[0]["title"] and "frozen rows" in after[1]["title"]
    assert before[1]["data"] != after[1]["data"]                        # the frozen map redrawn
    assert page.evaluate(_PANEL_FIGURES, RUNS_PANEL) == runs_before     # the runs' browser did not move
    calib = page.evaluate(_DROPDOWN_STATE, [MASK_PANEL, "calibration"])
    assert not calib["disabled"] and len(calib["options"]) > 1, calib
    _change_and_wait(page, f"{where}04 mask panel: rule -> random",
                     lambda: _control(page, "widget-dropdown", "rule", MASK_PANEL).locator("select")
                     .select_option("random"),
                     lambda figs: "random, rho=0.5" in figs[0]["title"], busy=True, panel=MASK_PANEL)
    calib = page.evaluate(_DROPDOWN_STATE, [MASK_PANEL, "calibration"])
    assert calib["disabled"] and "calibration: the random rule does not read the calibration saliency" \
        in page.evaluate(_STATUS, MASK_PANEL), calib
    assert not console, f"browser console errors: {console}"


def test_aware_panels_browse_runs_and_reselect_masks_each_in_its_own_panel(notebook, lab_page):
    page, console = lab_page
    notebook(PANEL_NOTEBOOKS[2])
    _aware_panels(page, console, "")


# the text each figure in the panel's output area draws (axis ticks, table cells), whitespace removed:
# plotly wraps a long cell into <tspan> lines, whose textContent joins them without a space
_PANEL_TEXT = """() => [...document.querySelectorAll('.lab-panel .lab-panel-output .js-plotly-plot')]
  .map(d => [...d.querySelectorAll('.main-svg text')].map(t => t.textContent.replace(/\\s+/g, '')).join('|'))"""


def test_router_panel_adds_a_builtin_inside_the_panel(notebook, lab_page):
    """Notebook 05: ctrl+click a built-in in the "against" list (smoke: per-sample and ncm picked of
    per-sample, energy, ncm, oracle); the paired differences, the means and the table in the panel
    gain it, from the per-seed results already computed (nothing re-trained)."""
    page, console = lab_page
    notebook(PANEL_NOTEBOOKS[3])
    picked = page.locator(".lab-panel .widget-select-multiple select")
    assert [o.strip() for o in picked.locator("option").all_inner_texts()] == ["per-sample", "energy", "ncm", "oracle"]
    assert "Ctrl-click" in page.locator(".lab-panel .lab-panel-hint").inner_text()   # how to pick several
    text_before = page.evaluate(_PANEL_TEXT)
    status_before = page.evaluate(_STATUS)
    before, after = _change_and_wait(
        page, "05 router panel: against += energy",
        lambda: picked.locator("option", has_text=re.compile(r"^energy$")).click(modifiers=["Control"]),
        lambda figs: '"energy"' in figs[0]["data"] and '"energy"' in figs[1]["data"])
    assert all('"energy"' not in f["data"] for f in before) and "energy" not in status_before
    assert "energy" in after[0]["title"] and "energy" in page.evaluate(_STATUS)  # the headline names it
    text_after = page.evaluate(_PANEL_TEXT)
    # every row of the table is drawn (plotly draws only the rows its height leaves room for)
    assert all(f"prototype-check−{b}" in text_before[2] for b in ("per-sample", "ncm")), text_before[2]
    assert "prototype-check−energy" not in text_before[2]
    assert all(f"prototype-check−{b}" in text_after[2] for b in ("per-sample", "energy", "ncm")), text_after[2]
    assert "oracle" not in " ".join(text_after)  # only the built-in toggled was added
    assert page.evaluate("() => [...document.querySelectorAll('.lab-panel .widget-select-multiple option')]"
                         ".filter(o => o.selected).map(o => o.textContent.trim())") == ["per-sample", "energy", "ncm"]
    assert not console, f"browser console errors: {console}"


@pytest.mark.skipif(not HAVE_NOTEBOOK7, reason="the notebook package (Notebook 7) is not installed")
def test_notebook7_panel_redraws_inside_the_panel(browser, tmp_path):
    """``lab jupyter --ui notebook``: the same checks in Notebook 7's page on one panel notebook."""
    t0 = time.perf_counter()
    with _serve(tmp_path, "notebook", [NOTEBOOK7_NOTEBOOK]) as server, _page(browser) as (page, console):
        _run_all(page, server, NOTEBOOK7_NOTEBOOK)
        assert page.locator("#main-panel .jp-Notebook").count() == 1, "not Notebook 7's one-notebook page"
        console[:] = [c for c in console if c not in NOTEBOOK7_KNOWN]
        _aware_panels(page, console, "Notebook 7: ")
    print(f"\nNotebook 7 test: {time.perf_counter() - t0:.1f} s (server start to server stop)")

