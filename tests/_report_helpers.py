"""Shared by test_report, test_notebooks and test_browser: tiny notebooks and one smoke render
of each real notebook per test run (the browser test reuses what test_notebooks rendered, also
when pytest-xdist runs them in different workers: the renders sit in the folder all workers
share, behind a file lock)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from lab.report.notebook import find_browser

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb") if not p.name.startswith("."))
_found = find_browser()
BROWSER = Path(_found) if _found and Path(_found).is_file() else None  # what kaleido would start
CELL_TIMEOUT_S = 600  # a hung smoke cell fails its test instead of eating CI's time
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


def write_tiny_notebooks(folder: Path, *, good: bool = True, bad: bool = True) -> Path:
    """``a_good.ipynb`` (a plotly figure, a PNG, a widget, recorded metrics), ``b_bad.ipynb`` (raises)."""
    import nbformat as nbf

    folder.mkdir(parents=True, exist_ok=True)
    if good:
        nb = nbf.v4.new_notebook()
        nb.cells = [
            nbf.v4.new_markdown_cell("# Tiny good\n\nA tiny notebook that draws one figure, $y_i = i$."),
            nbf.v4.new_code_cell("n = 3", metadata={"tags": ["parameters"]}),
            nbf.v4.new_code_cell("import lab.report as report\nreport.setup_notebook()"),
            nbf.v4.new_code_cell("import plotly.graph_objects as go\n"
                                 "fig = go.Figure(go.Scatter(y=list(range(n))))\n"
                                 "fig.show()\nreport.save_png(fig, 'line')"),
            nbf.v4.new_code_cell("import ipywidgets\nipywidgets.IntSlider(value=n)"),  # live-only panel
            nbf.v4.new_code_cell("report.record(total=float(n), label='x')"),
        ]
        nb.metadata["continual-lab"] = {"params": {"report": {"n": 5}, "smoke": {"n": 2}}}
        nbf.write(nb, folder / "a_good.ipynb")
    if bad:
        nb = nbf.v4.new_notebook()
        nb.cells = [nbf.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                    nbf.v4.new_code_cell("print('before the failure')"),
                    nbf.v4.new_code_cell("raise ValueError('boom')")]
        nbf.write(nb, folder / "b_bad.ipynb")
    return folder


def run_cli(*argv: str) -> int:
    """``lab report ARGV...`` through this package's own ``register`` (what lab.cli calls)."""
    import argparse

    from lab.report import register

    parser = argparse.ArgumentParser(prog="lab")
    register(parser.add_subparsers())
    args = parser.parse_args(["report", *argv])
    return args.func(args)


def shared_base(tmp_path_factory) -> Path:
    """This run's temporary folder, the same for every pytest-xdist worker of the run."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _once(tmp_path_factory, name: str):
    """A lock around making ``name`` in :func:`shared_base` (one worker makes it, others wait)."""
    from filelock import FileLock

    return FileLock(str(shared_base(tmp_path_factory) / f"{name}.lock"), timeout=CELL_TIMEOUT_S * 3)


def tiny_reports(tmp_path_factory) -> tuple[Path, Path, int]:
    """Both tiny notebooks rendered once per test run through the CLI (report parameters, PNGs):
    (notebook folder, output folder, exit status)."""
    base = shared_base(tmp_path_factory)
    nbdir, out, rc_file = base / "tiny-nb", base / "tiny-reports", base / "tiny-rc.txt"
    with _once(tmp_path_factory, "tiny-reports"):
        if not rc_file.exists():
            write_tiny_notebooks(nbdir)
            rc_file.write_text(str(run_cli("--notebooks", str(nbdir), "--out", str(out))))
    return nbdir, out, int(rc_file.read_text())


def smoke_reports_dir(tmp_path_factory) -> Path:
    return shared_base(tmp_path_factory) / "smoke-reports"


def smoke_report(tmp_path_factory, notebook: Path) -> dict:
    """Render ``notebook`` once per test run with smoke parameters (no PNGs); its index card."""
    from lab.report.index import read_card
    from lab.report.pipeline import render_one

    out = smoke_reports_dir(tmp_path_factory)
    executed = out / f"{notebook.stem}.ipynb"
    with _once(tmp_path_factory, f"smoke-{notebook.stem}"):
        if not executed.exists():
            render_one(notebook, out, profile="smoke", png=False, timeout=CELL_TIMEOUT_S)
    return read_card(executed)


def load_index(out: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((out / "index.json").read_text())["notebooks"]}


# --- a machine without the optional extras, made real with a mount namespace ----------------

def browser_candidates() -> list[Path]:
    """Every file kaleido's browser discovery (choreographer) could pick on this machine."""
    from choreographer.browsers._chrome_constants import chromium_based_browsers
    from choreographer.cli._cli_utils import get_chrome_download_path, get_old_chrome_download_path

    found = [get_chrome_download_path(mkdir=False), get_old_chrome_download_path()]
    for info in chromium_based_browsers.values():
        found += [shutil.which(n) for n in info.exe_names] + list(info.typical_paths)
    out = []
    for p in found:
        if p and Path(p).is_file() and Path(p).resolve() not in out:
            out.append(Path(p).resolve())
    return out


def _unshare_prefix() -> list[str] | None:
    """``unshare`` arguments that give a private mount namespace here, or None (then skip)."""
    if not shutil.which("unshare"):
        return None
    for prefix in (["unshare", "-m"], ["unshare", "-r", "-m"]):
        try:
            ok = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs none /mnt 2>/dev/null || "
                                 "mount --bind /dev/null /dev/null"], capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok.returncode == 0:
            return prefix
    return None


UNSHARE = _unshare_prefix()
UNSHARE_REASON = "cannot make a private mount namespace here (needs root or unprivileged user namespaces)"
# Optional for the main job: a browser (PNGs), the full Fashion-MNIST (Debian package), playwright.
OPTIONAL_DIRS = [Path("/usr/share/datasets/fashion-mnist")]


def run_hidden(argv: list[str], *, hide_files: list[Path], hide_dirs: list[Path], timeout: float,
               cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` where ``hide_files`` are ``/dev/null`` (not executable, not a file) and
    ``hide_dirs`` are empty, in a private mount namespace: nothing changes outside it.

    The mounts happen in a shell inside the namespace, then ``argv`` replaces it; the whole
    process tree is killed after ``timeout`` seconds (``subprocess.TimeoutExpired``)."""
    import shlex

    script = ["set -e"]
    script += [f"mount --bind /dev/null {shlex.quote(str(f))}" for f in hide_files]
    script += [f"mount -t tmpfs none {shlex.quote(str(d))}" for d in hide_dirs if d.is_dir()]
    script.append("exec " + shlex.join(map(str, argv)))
    proc = subprocess.Popen([*UNSHARE, "sh", "-c", "\n".join(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd, start_new_session=True,
                            env={k: v for k, v in (env or os.environ).items() if k != "BROWSER_PATH"})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate(timeout=30)
        raise subprocess.TimeoutExpired(argv, timeout, output=out) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, None)


def python_package_dir(name: str) -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec(name)
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def hard_timeout(seconds: float):
    """pytest-timeout's mark (a dev dependency): the test fails after ``seconds`` instead of
    hanging; without the plugin, a no-op mark."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("pytest_timeout"):
        return pytest.mark.timeout(seconds)
    return pytest.mark.usefixtures()
