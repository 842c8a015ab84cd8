"""The report pipeline (lab.report) on tiny throwaway notebooks: offline HTML, index, failures."""
from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys

import nbformat
import pytest

from _report_helpers import BROWSER, load_index, run_cli, tiny_reports, write_tiny_notebooks
from lab.report import _widgets, index, notebook, params, pipeline


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Both tiny notebooks rendered once (shared with test_browser), report parameters, PNGs."""
    return tiny_reports(tmp_path_factory)


# --- the pipeline, end to end (two kernels) -------------------------------------------------

@pytest.mark.notebook
def test_failing_notebook_exits_nonzero_and_others_still_render(rendered):
    nbdir, out, rc = rendered
    assert rc == 1
    for name in ("a_good", "b_bad"):
        assert (out / f"{name}.ipynb").stat().st_size > 0
        assert (out / f"{name}.html").stat().st_size > 0
    cards = load_index(out)
    assert cards["a_good"]["ok"] and not cards["b_bad"]["ok"]
    bad = cards["b_bad"]
    assert bad["error"] == "ValueError: boom" and bad["failed_cell"] == 3
    assert "raise ValueError('boom')" in bad["failed_source"]
    assert "An Exception was encountered" in (out / "b_bad.html").read_text()


@pytest.mark.notebook
def test_html_is_offline_with_plotly_loaded_once_from_beside_the_reports(rendered):
    _, out, _ = rendered
    page = (out / "a_good.html").read_text()
    assert "plotly-graph-div" in page
    assert "plotly.js v" not in page, "plotly.js must not be inlined: it is written once beside the reports"
    name = pipeline.plotlyjs_name()
    assert page.count(f'src="{name}"') == 1 and (out / name).read_text().count("plotly.js v") == 1
    assert page.index(f'src="{name}"') < page.index("Plotly.newPlot")   # loaded before any figure draws
    executed = (out / "a_good.ipynb").read_text()
    assert "plotly.js v" not in executed and len(executed) < 200_000   # the executed notebook neither
    for needle in ('<script src="http', "<script src='http", 'src="//', "require.js", "mathjax/"):
        assert needle not in page.lower(), needle
    for name in ("a_good", "b_bad"):
        _, external = pipeline.export_html(nbformat.read(out / f"{name}.ipynb", as_version=4))
        assert external == []
    # the widget shows a note, and no widget manager is fetched
    assert "Interactive panel: it runs live in JupyterLab" in page
    assert "html-manager" not in page and "widget-state+json" not in page


@pytest.mark.notebook
def test_index_links_reports_with_headline_numbers_and_wall_time(rendered):
    _, out, _ = rendered
    page = (out / "index.html").read_text()
    for name in ("a_good", "b_bad"):
        assert f"href='./{name}.html'" in page and f"href='./{name}.ipynb'" in page
    assert "Tiny good" in page and "wall time" in page and "Failed in cell In [3]" in page
    good = load_index(out)["a_good"]
    assert good["metrics"] == {"total": 5.0, "label": "x"}  # report profile: n=5, in call order
    assert good["params"] == {"n": 5} and good["profile"] == "report"
    assert good["seconds"] > 0
    assert "<script src=" not in page


@pytest.mark.notebook
def test_png_written_next_to_report_or_skipped_with_a_note(rendered):
    _, out, _ = rendered
    card = load_index(out)["a_good"]
    if BROWSER:
        png = out / "a_good_figures" / "line.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert card["figures"] == ["line.png"]
        assert "./a_good_figures/line.png" in (out / "index.html").read_text()
    else:  # render found no browser up front: one note for the run, at the top of the index
        assert any("no Chrome/Chromium" in n for n in card["run_notes"])
        assert "run-note'>Note: PNG export skipped" in (out / "index.html").read_text()


@pytest.mark.notebook
def test_outputs_are_complete_files_with_normal_modes(rendered):
    _, out, _ = rendered
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "temp files left behind"
    for p in out.glob("*.*"):
        assert p.stat().st_mode & stat.S_IRGRP, f"{p.name} is not group-readable"
    executed = nbformat.read(out / "a_good.ipynb", as_version=4)
    assert executed.metadata["papermill"]["output_path"].endswith("a_good.ipynb")
    assert executed.metadata["continual-lab"]["report"]["ok"] is True


@pytest.mark.notebook
def _own_copy(rendered, tmp_path):
    """The shared tiny render copied for a test that writes into it (other workers read it)."""
    import shutil

    nbdir, out, _ = rendered
    shutil.copytree(nbdir, tmp_path / "nb")
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "nb", tmp_path / "out"


def test_only_rerenders_one_and_keeps_the_other_cards(rendered, tmp_path):
    nbdir, out = _own_copy(rendered, tmp_path)
    before = (out / "a_good.html").read_bytes()
    assert run_cli("--notebooks", str(nbdir), "--out", str(out), "--only", "b_bad.ipynb") == 1
    cards = load_index(out)
    assert cards["a_good"]["metrics"]["total"] == 5.0  # still there, untouched
    assert (out / "a_good.html").read_bytes() == before


@pytest.mark.notebook
def test_smoke_profile_and_overrides(tmp_path, capsys):
    nbdir = write_tiny_notebooks(tmp_path / "nb", bad=False)
    out = tmp_path / "out"
    assert run_cli("--notebooks", str(nbdir), "--out", str(out), "--params", "smoke", "--no-png") == 0
    printed = capsys.readouterr().out
    assert "cell 1/" in printed and "Tiny good" in printed  # where it is: the section reached
    rows = [ln.split() for ln in printed.splitlines()]
    assert ["a_good", "ok"] in [r[:2] for r in rows] and "total" in [r[0] for r in rows if r]  # the table
    assert load_index(out)["a_good"]["metrics"]["total"] == 2.0
    assert not (out / "a_good_figures").exists()  # --no-png: nothing written
    assert params.resolve(nbdir / "a_good.ipynb", "smoke", {"n": 4}) == {"n": 4}  # -p n=4 wins


@pytest.mark.notebook
def test_failed_export_leaves_previous_outputs_intact(rendered, tmp_path, monkeypatch):
    nbdir, out = _own_copy(rendered, tmp_path)
    before = {p.name: p.read_bytes() for p in out.glob("b_bad.*")}

    def broken(nb, **kw):
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(pipeline, "export_html", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        pipeline.render_one(nbdir / "b_bad.ipynb", out)
    assert {p.name: p.read_bytes() for p in out.glob("b_bad.*")} == before
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


# --- bad input fails before any kernel starts -----------------------------------------------

def test_unknown_only_name_lists_the_notebooks(tmp_path, capsys):
    nbdir = write_tiny_notebooks(tmp_path / "nb")
    assert run_cli("--notebooks", str(nbdir), "--out", str(tmp_path / "out"), "--only", "nope") == 2
    err = capsys.readouterr().err
    assert "nope" in err and "a_good" in err and "b_bad" in err
    assert not (tmp_path / "out").exists()


def test_unknown_parameter_fails_before_work(tmp_path, capsys):
    nbdir = write_tiny_notebooks(tmp_path / "nb", bad=False)
    assert run_cli("--notebooks", str(nbdir), "--out", str(tmp_path / "out"), "-p", "nn=1") == 2
    assert "unknown parameter(s) ['nn']" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_declared_params_are_validated(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["continual-lab"] = {"params": {"full": {}}}
    with pytest.raises(params.ParamsError, match="unknown parameter profile"):
        params.declared(nb)
    nb.metadata["continual-lab"] = {"params": {"smoke": {"n": 1}}}
    nb.cells = [nbformat.v4.new_code_cell("n = 3")]  # not tagged
    nbformat.write(nb, tmp_path / "x.ipynb")
    with pytest.raises(params.ParamsError, match="no cell tagged 'parameters'"):
        params.resolve(tmp_path / "x.ipynb", "smoke")
    assert params.resolve(tmp_path / "x.ipynb", "report") == {}  # nothing to inject


def test_declare_writes_the_profiles_into_the_notebook(tmp_path):
    write_tiny_notebooks(tmp_path, bad=False)
    params.declare(tmp_path / "a_good.ipynb", report={"n": 7}, smoke={"n": 1})
    assert params.resolve(tmp_path / "a_good.ipynb", "report") == {"n": 7}
    assert params.resolve(tmp_path / "a_good.ipynb", "smoke") == {"n": 1}
    with pytest.raises(params.ParamsError, match="unknown parameter"):
        params.declare(tmp_path / "a_good.ipynb", smoke={"typo": 1})
    assert params.resolve(tmp_path / "a_good.ipynb", "smoke") == {"n": 1}  # file unchanged


def test_parse_override():
    assert params.parse_override("n=3") == ("n", 3)
    assert params.parse_override("lr=1e-3") == ("lr", 0.001)
    assert params.parse_override("name=vit") == ("name", "vit")
    assert params.parse_override('xs=[1, 2]') == ("xs", [1, 2])
    with pytest.raises(params.ParamsError):
        params.parse_override("3=n")


def test_discover_is_sorted_and_skips_hidden(tmp_path):
    write_tiny_notebooks(tmp_path)
    (tmp_path / ".hidden.ipynb").write_text("{}")
    assert [p.name for p in pipeline.discover(tmp_path)] == ["a_good.ipynb", "b_bad.ipynb"]
    assert [p.name for p in pipeline.discover(tmp_path, ["b_bad"])] == ["b_bad.ipynb"]


# --- notebook-side helpers, in this process -------------------------------------------------

def test_record_rejects_what_is_not_a_finite_number_or_string():
    for bad in ({"a": math.nan}, {"a": math.inf}, {"a": True}, {"a": [1, 2]}):
        with pytest.raises((ValueError, TypeError)):
            notebook.record(**bad)
    with pytest.raises(ValueError):
        notebook.record()


def test_record_outside_ipython_prints_a_marked_line(capsys):
    import numpy as np

    notebook.record({"acc": np.float32(0.5)}, n=np.int64(3), what="x")
    line = capsys.readouterr().out.strip()
    mime, payload = line.split(" ", 1)
    assert mime == notebook.METRICS_MIME
    assert json.loads(payload) == [["acc", 0.5], ["n", 3], ["what", "x"]]


def test_read_metrics_merges_outputs_in_order():
    nb = nbformat.v4.new_notebook()
    first = nbformat.v4.new_code_cell("")
    first.outputs = [nbformat.v4.new_output("display_data", data={notebook.METRICS_MIME: [["a", 1], ["b", 2]]})]
    second = nbformat.v4.new_code_cell("")
    second.outputs = [nbformat.v4.new_output("display_data", data={notebook.METRICS_MIME: {"b": 3.5}})]
    nb.cells = [first, second]
    assert index.read_metrics(nb) == {"a": 1, "b": 3.5}


def test_save_png_does_nothing_outside_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.delenv(notebook.FIGURES_ENV, raising=False)
    assert notebook.save_png({"data": []}, "fig") is None
    monkeypatch.setenv(notebook.FIGURES_ENV, str(tmp_path))
    monkeypatch.setenv(notebook.PNG_ENV, "0")
    assert notebook.save_png({"data": []}, "fig") is None
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="no folders"):
        notebook.save_png({"data": []}, "../escape")


def test_math_becomes_mathml_outside_code():
    pytest.importorskip("latex2mathml")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "## Gates $g_t$\n\n$\\rho = 0.3$, $$\\bar{A} = \\frac{1}{T}\\sum_t A_t$$, costs $5 and $6, `$x$`\n\n"
        "```\n$not_math$\n```")]
    page, warnings = pipeline.export_html(nb)
    assert warnings == []
    assert page.count("<math") == 3 and 'display="block"' in page
    assert "$x$" in page and "$not_math$" in page and "costs $5 and $6" in page
    assert 'id="Gates-g_t"' in page  # the heading anchor stays a plain id


def test_png_export_that_takes_too_long_is_abandoned_with_a_note(tmp_path):
    """A real kaleido + browser given 0.3 s (the browser alone takes longer to start): the call
    returns, the notebook's later PNGs are skipped, and the note says why. In a subprocess with a
    hard timeout, so a regression to an unbounded wait fails instead of hanging."""
    if not BROWSER:
        pytest.skip("no Chrome/Chromium for kaleido here (see test_no_chromium for that case)")
    script = ("import plotly.graph_objects as go, time\nfrom lab.report import save_png\n"
              "t = time.perf_counter()\nsave_png(go.Figure(go.Bar(y=[1, 2])), 'a')\n"
              "save_png(go.Figure(go.Bar(y=[2, 1])), 'b')\nprint('SECONDS', time.perf_counter() - t)")
    env = {**os.environ, notebook.FIGURES_ENV: str(tmp_path), notebook.PNG_ENV: "1",
           notebook.PNG_TIMEOUT_ENV: "0.3"}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert float(res.stdout.split("SECONDS")[1]) < 10
    notes = (tmp_path / notebook.NOTES_FILE).read_text().splitlines()
    assert notes == ["PNG export of 'a' abandoned: no answer from kaleido/Chromium within 0.3 s; "
                     "this notebook's later PNGs are skipped"]
    assert not list(tmp_path.glob("*.png"))


def test_progress_lines_for_sections_and_slow_cells():
    lines: list[str] = []
    progress = pipeline.Progress("nb", lines.append, slow=0.2, every=0.5)
    progress.n_cells = 3
    progress.cell_start(nbformat.v4.new_markdown_cell("intro\n## <b>Fit</b> the model"), 0)
    progress.cell_start(nbformat.v4.new_code_cell("\nmodel.fit(x)  # slow"), 1)
    import time

    time.sleep(2.3)
    progress.cell_complete(1)
    progress.cell_start(nbformat.v4.new_code_cell("quick()"), 2)
    progress.cell_complete(2)
    progress.close()
    assert "cell 1/3  Fit the model" in lines[0]
    beats = [ln for ln in lines if "running for" in ln]
    assert beats and all("cell 2/3" in ln and "model.fit(x)" in ln for ln in beats)
    assert "cell 2/3 done in 2." in lines[-1]  # the quick cell adds nothing


def test_wall_time_table_lists_every_notebook_and_the_total():
    table = pipeline.wall_time_table([pipeline.Result("00_a", True, 12.34), pipeline.Result("01_bb", False, 1.0)])
    rows = table.strip().splitlines()
    assert rows[0].split() == ["notebook", "status", "wall", "time"]
    assert rows[2].split() == ["00_a", "ok", "12.3", "s"] and rows[3].split() == ["01_bb", "FAILED", "1.0", "s"]
    assert rows[4].split() == ["total", "13.3", "s"] and len(rows) == 5
    side = pipeline.wall_time_table([pipeline.Result("00_a", True, 12.34)], wall=7.0).strip().splitlines()
    assert side[-1].split() == ["elapsed", "(side", "by", "side)", "7.0", "s"]


def test_run_note_shows_once_at_the_top_of_the_index(rendered, tmp_path):
    import shutil

    _, out, _ = rendered
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    nb = nbformat.read(copy / "a_good.ipynb", as_version=4)
    nb.metadata["continual-lab"]["report"]["notes"] = ["PNG export skipped: test"]
    nbformat.write(nb, copy / "a_good.ipynb")
    page = index.write_index(copy).read_text()
    assert page.count("PNG export skipped: test") == 1 and "(for a_good)" in page


def test_progress_bar_widget_becomes_its_final_text():
    view = {"model_id": "bar", "version_major": 2, "version_minor": 0}
    state = {"bar": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]}},
             "l": {"model_name": "HTMLModel", "state": {"value": "train:\u2007100%"}},
             "p": {"model_name": "FloatProgressModel", "state": {"value": 47.0, "max": 47.0}},
             "r": {"model_name": "HTMLModel", "state": {"value": "47/47 [00:09&lt;00:00]"}},
             "s": {"model_name": "IntSliderModel", "state": {"value": 3}}}
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("display_data", data={_widgets.WIDGET_MIME: view, "text/plain": "0%"}),
                    nbformat.v4.new_output("display_data", data={_widgets.WIDGET_MIME: {**view, "model_id": "s"}})]
    nb.cells = [cell]
    page, _ = pipeline.export_html(nb)
    assert "train: 100% |██████████| 47/47 [00:09&lt;00:00]" in page
    assert page.count("Interactive panel") == 1  # the slider


def test_strip_plotly_mathjax():
    html = ('<div><script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/3.2.2/es5/tex-svg.min.js">'
            '</script><div class="plotly-graph-div"></div></div>')
    assert "mathjax" not in notebook.strip_plotly_mathjax(html)


def test_index_shows_placeholder_for_a_notebook_not_rendered_yet(tmp_path):
    write_tiny_notebooks(tmp_path / "nb")
    index.write_index(tmp_path / "out", tmp_path / "nb")
    page = (tmp_path / "out" / "index.html").read_text()
    assert page.count("not rendered") == 2 and "lab report --only a_good" in page


def test_help_documents_the_options(capsys):
    with pytest.raises(SystemExit):
        run_cli("--help")
    out = capsys.readouterr().out
    for opt in ("--only", "--out", "--params", "--no-png", "smoke", "--solutions", "solutions/"):
        assert opt in out


def test_a_panel_shows_its_default_figures_offline():
    """A panel's own output area (plotly JSON, as lab.widgets writes it) is drawn in the report."""
    fig = {"data": [{"type": "bar", "x": ["a", "b"], "y": [1, 2]}], "layout": {"title": {"text": "L1=5.0e-04"}}}
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    state = {"box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_t", "IPY_MODEL_o"]}},
             "t": {"model_name": "HTMLModel", "state": {"value": "accuracy 81.2 %"}},
             "o": {"model_name": "OutputModel", "state": {"outputs": [
                 {"output_type": "display_data", "data": {_widgets.PLOTLY_MIME: fig, "text/plain": "fig"},
                  "metadata": {}}]}}}
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("display_data", data={_widgets.WIDGET_MIME: view})]
    nb.cells = [cell]
    page, _ = pipeline.export_html(nb)
    assert "Interactive panel" in page and "accuracy 81.2 %" in page
    assert "L1=5.0e-04" in page and page.count("plotly-graph-div") >= 1


def test_clean_stale_removes_only_what_dead_runs_left(tmp_path):
    dead = 2 ** 22 + 12345  # above the default pid_max: no such process
    left = [tmp_path / f".a_good.running-{dead}-x1.ipynb", tmp_path / f".a_good{pipeline.FIGURES_SUFFIX}.{dead}-y2"]
    live = [tmp_path / f".a_good.running-{os.getpid()}-x3.ipynb", tmp_path / f".b_bad{pipeline.FIGURES_SUFFIX}.{os.getpid()}-z"]
    for p in (left[0], live[0]):
        p.write_text("{}")
    for p in (left[1], live[1]):
        p.mkdir()
        (p / "f.png").write_bytes(b"x")
    (tmp_path / ".keep-me").write_text("not ours")
    assert sorted(pipeline.clean_stale(tmp_path)) == sorted(left)
    assert all(p.exists() for p in live) and (tmp_path / ".keep-me").exists()


@pytest.mark.parametrize("names,jobs", [(["slow"], "1"), (["slow", "slow2"], "2")])
def test_killed_report_leaves_no_staging(tmp_path, names, jobs):
    """SIGTERM while a notebook runs (alone, or beside another): the process unwinds at once and
    removes its hidden staging."""
    import signal
    import time

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("import time\ntime.sleep(60)")]
    (tmp_path / "nb").mkdir()
    for name in names:
        nbformat.write(nb, tmp_path / "nb" / f"{name}.ipynb")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "lab", "report", "--notebooks", str(tmp_path / "nb"),
                             "--out", str(out), "--no-png", "--jobs", jobs], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(list(out.glob(".slow*.running-*.ipynb"))) < len(names) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(list(out.glob(".slow*.running-*.ipynb"))) == len(names), "the runs never started"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)           # well before the notebooks' 60 s cell ends
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


# --- readable index cards: labels and units, whole-sentence summaries, no progress bars ------------

def _recorded_keys(source: str) -> set[str]:
    """The metric keys a cell's ``record(...)`` calls name: keywords, literal dict keys (also after
    ``**``) and ``{f"prefix_{k}": ... for k, v in D.items()}`` over a dict literal ``D`` of the cell."""
    import ast

    tree = ast.parse("\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))))
    dicts = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
             for t in node.targets if isinstance(t, ast.Name)}

    def literal_keys(d):
        return {k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}

    keys = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "record"):
            continue
        keys |= {kw.arg for kw in node.keywords if kw.arg}
        for value in [*node.args, *(kw.value for kw in node.keywords if kw.arg is None)]:
            if isinstance(value, ast.Dict):
                keys |= literal_keys(value)
            elif isinstance(value, ast.DictComp) and isinstance(value.key, ast.JoinedStr):
                prefix = "".join(p.value for p in value.key.values if isinstance(p, ast.Constant))
                it = value.generators[0].iter
                name = getattr(getattr(getattr(it, "func", None), "value", None), "id", None)
                keys |= {prefix + k for k in literal_keys(dicts[name])} if name in dicts else set()
    return keys


def test_every_key_the_notebooks_record_has_a_label_and_unit():
    """The index shows a reader's label for each headline number, not the key it was recorded as
    (the smoke renders in test_notebooks check every key a notebook actually records)."""
    from _report_helpers import NOTEBOOKS
    from lab.report import labels

    found = {}
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and "record(" in cell.source:
                found.update({k: path.name for k in _recorded_keys(cell.source)})
    assert "live_tosca_per_batch_last_acc" in found and "q_half_mass_neurons_pct" in found   # the parser works
    missing = {k: nb for k, nb in found.items() if k in labels.unlabelled([k])}
    assert not missing, f"keys without a line in lab/report/labels.py LABELS: {missing}"
    for key, (label, unit) in labels.LABELS.items():
        assert label and "_" not in label.replace("A_B", ""), (key, label)
        assert len(unit) <= labels.UNIT_CHARS, f"{key}: unit {unit!r} is longer than one line of a card"


def test_headline_numbers_are_rounded_to_three_significant_digits():
    assert [notebook._format(v) for v in (0.6147, 0.001143, 41.532, 1234.5, 7, "x")] == \
        ["0.615", "0.00114", "41.5", "1,234", "7", "x"]


def test_a_card_shows_label_value_and_unit_with_the_key_as_tooltip():
    row = index.metrics_rows({"live_tosca_per_batch_last_acc": "76.1 [73.4, 78.6]", "AWARe: H": "12.5 [1.0, 20.0]",
                              "some_new_key": 3})
    assert "<th title='live_tosca_per_batch_last_acc'>TOSCA A_B, per-batch routing" in row
    assert ("<span class='value nowrap'>76.1 [73.4, 78.6]</span> <span class='unit' title='% correct, with its 95 % Wilson interval over "
            "the test images'>%, 95 % Wilson</span>") in row            # a short unit, the whole of it as tooltip
    assert "<th title='AWARe: H'>AWARe: H</th>" in row                  # words: their own label
    assert ">some new key</th>" in row and ">live_tosca" not in row      # never a raw key as the label


@pytest.mark.parametrize("text,limit,expected", [
    ("One. Two is here. Three.", 12, "One."),
    ("One. Two is here. Three.", 100, "One. Two is here. Three."),
    ('He said "stop." Then went on, e.g. to Rome. Last.', 20, 'He said "stop."'),
    ("A first sentence that is longer than the limit, alone.", 10, "A first sentence that is longer than the limit, alone."),
])
def test_summary_sentences_never_stop_mid_sentence(text, limit, expected):
    assert index._sentences(text, limit) == expected


def test_summaries_of_the_notebooks_end_on_a_sentence():
    import re

    from _report_helpers import NOTEBOOKS

    for path in NOTEBOOKS:
        _, summary = index._title_and_summary(nbformat.read(path, as_version=4), path.stem)
        assert summary and re.search(r"[.!?][\"')\]]*$", summary), (path.name, summary)
        assert "**" not in summary and "$" not in summary, summary


def test_summary_prefers_the_question_and_skips_lists_and_labels():
    md = ("# T\n\n**What you will learn.**\n1. A list item.\n2. Another.\n\n**The question.** Does it work? "
          "It should.\n\nMore prose.")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(md)])
    assert index._title_and_summary(nb, "x") == ("T", "Does it work? It should.")
    nb.cells[0].source = "# T\n\n**Note.** First prose [with a link](http://x) and `code`. Second one.\n"
    assert index._title_and_summary(nb, "x")[1] == "First prose with a link and code. Second one."


def test_progress_bars_are_off_in_a_report_kernel_even_when_asked_for():
    """lab report's kernels get $TQDM_DISABLE; setup_notebook() then turns off every tqdm.auto bar,
    also those created with disable=False (tqdm's variable alone only changes the default)."""
    code = ("from lab.report import notebook\nassert notebook.quiet_progress_bars()\n"
            "from tqdm.auto import tqdm\nbar = tqdm(range(3), disable=False)\nassert bar.disable\n"
            "assert notebook.quiet_progress_bars()   # twice: no second wrapper\n"
            "import tqdm.auto as a\nassert a.tqdm.__mro__[1].__name__ != 'QuietTqdm'\nprint('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TQDM_DISABLE": "1"})
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    p = subprocess.run([sys.executable, "-c", "from lab.report import notebook; print(notebook.quiet_progress_bars())"],
                       capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                                         if k != "TQDM_DISABLE"})
    assert p.stdout.strip() == "False", p.stderr      # outside lab report: bars as asked


def test_report_kernels_encrypt_their_transport():
    """The kernels lab report starts use CurveZMQ where the kernelspec declares it (no 'Kernel is
    running over TCP without encryption' warning), set through jupyter_client's public
    ``transport_encryption`` config trait that papermill hands to its kernel manager."""
    from jupyter_client import AsyncKernelManager

    from lab.report import _execute

    cfg = _execute.kernel_config()
    if "transport_encryption" not in cfg.get("KernelManager", {}):
        pytest.skip("jupyter_client or pyzmq here cannot encrypt the kernel transport")
    assert AsyncKernelManager(config=cfg).transport_encryption == "auto"


@pytest.mark.notebook
def test_ctrl_c_shuts_every_kernel_down_and_says_how_to_render_the_rest(tmp_path):
    """Ctrl-C (SIGINT to the terminal's whole process group) while two notebooks run and one waits:
    exit 130, one stderr line naming the `lab report --only ...` command for the three, no
    traceback, no staging, no kernel left running."""
    import signal
    import time

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("import time\ntime.sleep(600)")]
    (tmp_path / "nb").mkdir()
    for name in ("s1", "s2", "s3"):
        nbformat.write(nb, tmp_path / "nb" / f"{name}.ipynb")
    out, runtime = tmp_path / "out", tmp_path / "tmp"     # the kernels' connection files: temporary files
    runtime.mkdir()
    # SIGINT at its default in the child, as a terminal leaves it: a test runner's worker (pytest-xdist)
    # may ignore SIGINT, and an ignored signal stays ignored across exec
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen([sys.executable, "-m", "lab", "report", "--notebooks", str(tmp_path / "nb"), "--out",
                                 str(out), "--no-png", "--jobs", "2"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(runtime)})
    finally:
        signal.signal(signal.SIGINT, old_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        deadline = time.monotonic() + 90
        while len(list(runtime.glob("*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(list(runtime.glob("*.json"))) == 2, "the kernels never started"
        time.sleep(2.0)
        os.killpg(proc.pid, signal.SIGINT)          # as a terminal's Ctrl-C
        err = proc.communicate(timeout=90)[1]       # long before the notebooks' 600 s cell ends (each notebook
        # process gets 20 s to shut its kernel down, then is killed: a loaded machine needs the margin)
    finally:
        proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 130, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("lab report: interrupted; 0 of 3 notebooks rendered") and \
        lines[0].endswith("--only s1 --only s2 --only s3"), lines[0]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    assert not list(runtime.glob("*.json"))         # jupyter_client removes it when its kernel is shut down
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(runtime) not in ps, "a kernel is still running"


def test_index_links_are_relative_files_and_names_escaped(tmp_path):
    """A notebook's name is a file name, not markup or a URL: every link is ./<percent-encoded
    file>, so javascript:alert(1).ipynb links to that file, and a name with markup is escaped."""
    import re

    import nbformat

    from lab.report.index import write_index

    names = ["javascript:alert(1)", "<img src=x onerror=alert(2)>", "a'b\"c", "?q=1#frag", "data:text,x"]
    for n in names:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell(f"# {n}\n\nA notebook named {n}.")]
        nbformat.write(nb, str(tmp_path / f"{n}.ipynb"))
    page = write_index(tmp_path).read_text()
    links = re.findall(r"(?:href|src)='([^']*)'", page)
    assert len(links) == 3 * len(names), links      # title, report, executed notebook
    for link in links:
        assert link.startswith("./") and ":" not in link and "#" not in link and "?" not in link, link
    assert "./javascript%3Aalert%281%29.html" in links and "./data%3Atext%2Cx.ipynb" in links
    assert "<img src=x" not in page and "onerror=alert(2)>" not in page
    assert "&lt;img src=x onerror=alert(2)&gt;.ipynb" in page     # shown as its name, escaped


# --- notebooks side by side -----------------------------------------------------------------------

def _with_after(folder, name, after=None):
    import nbformat as nbf

    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})]
    if after is not None:
        nb.metadata["continual-lab"] = {"after": after}
    nbf.write(nb, folder / f"{name}.ipynb")
    return folder / f"{name}.ipynb"


def test_schedule_runs_at_most_jobs_at_once_and_after_what_a_notebook_names(tmp_path):
    import threading
    import time as _time

    srcs = [_with_after(tmp_path, "00_fill"), _with_after(tmp_path, "01_free"),
            _with_after(tmp_path, "02_reads", ["00_fill"]), _with_after(tmp_path, "03_free"),
            _with_after(tmp_path, "04_reads", ["00_fill.ipynb", "not_here"])]
    lock, events, live = threading.Lock(), [], [0]
    cost = {"00_fill": 0.3, "01_free": 0.05, "02_reads": 0.05, "03_free": 0.05, "04_reads": 0.05}

    def start(src):
        with lock:
            live[0] += 1
            events.append(("start", src.stem, live[0]))
        _time.sleep(cost[src.stem])
        with lock:
            live[0] -= 1
            events.append(("end", src.stem, live[0]))
        return src.stem

    got = []
    pipeline._schedule(srcs, 2, start, lambda src, res: got.append(res))
    starts = [e[1] for e in events if e[0] == "start"]
    assert max(e[2] for e in events) == 2 and sorted(got) == sorted(cost)
    end_00 = events.index(("end", "00_fill", next(e[2] for e in events if e[:2] == ("end", "00_fill"))))
    for reader in ("02_reads", "04_reads"):   # 'not_here' is not rendered: it holds nothing back
        assert events.index(next(e for e in events if e[:2] == ("start", reader))) > end_00
    assert starts[:3] == ["00_fill", "01_free", "03_free"]   # the free ones fill the second slot meanwhile
    got.clear()
    pipeline._schedule(srcs, 1, start, lambda src, res: got.append(res))
    assert got == [s.stem for s in srcs]                      # one at a time: the given order


def test_a_bad_after_list_fails_before_any_kernel(tmp_path, capsys):
    (tmp_path / "nb").mkdir()                                 # --out may not sit inside the notebooks' folder
    _with_after(tmp_path / "nb", "a", "00_quickstart")       # a string, not a list
    assert run_cli("--notebooks", str(tmp_path / "nb"), "--out", str(tmp_path / "out")) == 2
    assert "after must be a list of notebook names" in capsys.readouterr().err
    assert not (tmp_path / "out" / "a.ipynb").exists()


@pytest.mark.notebook
def test_side_by_side_kernels_each_get_their_own_environment(tmp_path, monkeypatch):
    """Two notebooks at once: each kernel sees its own figures folder and half the cores' threads,
    and nothing is written into this process's environment."""
    import nbformat as nbf

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(pipeline.os, "cpu_count", lambda: 4)
    for name in ("a", "b"):
        nb = nbf.v4.new_notebook()
        nb.cells = [nbf.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                    nbf.v4.new_code_cell("import os, lab.report as report\n"
                                         f"report.record(label='{name}', threads=os.environ['OMP_NUM_THREADS'], "
                                         f"figures=os.environ['{notebook.FIGURES_ENV}'])")]
        nbf.write(nb, tmp_path / f"{name}.ipynb")
    results = pipeline.render(tmp_path, tmp_path / "out", png=False, jobs=2, log=lambda _: None)
    assert [r.name for r in results] == ["a", "b"] and all(r.ok for r in results)
    a, b = (r.metrics for r in results)
    assert a["threads"] == b["threads"] == "2"
    assert f".a{pipeline.FIGURES_SUFFIX}." in a["figures"] and f".b{pipeline.FIGURES_SUFFIX}." in b["figures"]
    assert notebook.FIGURES_ENV not in os.environ
