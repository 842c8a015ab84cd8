"""Shared by test_report, test_notebooks and test_browser: tiny notebooks and one smoke render
of each real notebook per session (the browser test reuses what test_notebooks rendered)."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb") if not p.name.startswith("."))
CHROMIUM = Path("/usr/bin/chromium")
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


def tiny_reports(tmp_path_factory) -> tuple[Path, Path, int]:
    """Both tiny notebooks rendered once per session through the CLI (report parameters, PNGs):
    (notebook folder, output folder, exit status)."""
    base = tmp_path_factory.getbasetemp()
    nbdir, out, rc_file = base / "tiny-nb", base / "tiny-reports", base / "tiny-rc.txt"
    if not rc_file.exists():
        write_tiny_notebooks(nbdir)
        rc_file.write_text(str(run_cli("--notebooks", str(nbdir), "--out", str(out))))
    return nbdir, out, int(rc_file.read_text())


def smoke_report(tmp_path_factory, notebook: Path) -> dict:
    """Render ``notebook`` once per session with smoke parameters (no PNGs); its index card."""
    from lab.report.index import read_card
    from lab.report.pipeline import render_one

    out = tmp_path_factory.getbasetemp() / "smoke-reports"
    executed = out / f"{notebook.stem}.ipynb"
    if not executed.exists():
        render_one(notebook, out, profile="smoke", png=False, timeout=CELL_TIMEOUT_S)
    return read_card(executed)


def load_index(out: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((out / "index.json").read_text())["notebooks"]}
