"""Reports a student can read and a teacher can hand out: figures whose titles and legends fit
(lab.report.readable), human column headers, the glossary page and its links, no path of the build
machine, plotly.js once beside the reports, solutions in their own folder, no ERROR line from a
kernel that finished. The unit tests use hand-made figures and pages; the last tests render notebooks
00, 03 and 05 with the smoke parameters and ``--solutions`` and read every page."""
from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import pytest

from _report_helpers import CELL_TIMEOUT_S, ROOT, hard_timeout
from lab.report import _paths, glossary, pipeline, readable

TEACHING = ("00_quickstart", "03_aware_saliency", "05_your_own_idea")   # the notebooks with exercise cells
MAX_REPORT_BYTES = 1_500_000


# --- figures: titles and legends that fit -----------------------------------------------------------
def test_a_long_title_is_wrapped_and_the_figure_grows_to_hold_it():
    title = "final accuracy (%): TOSCA, 3 epochs, L1=5.0e-04, σ positive vs simplecil, on the cached features of " \
            "every task"
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]), layout=dict(title=title, height=380))
    assert readable.problems(fig) and "title line" in readable.problems(fig)[0]
    fitted = readable.fit(fig)
    lines = fitted.layout.title.text.split("<br>")
    assert len(lines) == 2 and " ".join(lines) == title and not readable.problems(fitted)
    assert (fitted.layout.margin.t or 100) >= 24 + 2 * 23                # room for both lines (plotly's default: 100)
    three = readable.fit(go.Figure(layout=dict(title=" ".join([title] * 2), height=380, margin=dict(t=40))))
    assert three.layout.title.text.count("<br>") >= 2 and three.layout.margin.t > 40 and three.layout.height > 380
    assert readable.fit(fitted).to_dict() == fitted.to_dict()             # fitting twice changes nothing


def test_a_legend_too_wide_or_too_tall_moves_under_the_plot():
    wide = go.Figure([go.Scatter(y=[1, 2], name=f"qkv+projector+mlp, rho=0.{i}, calibration upstream-200")
                      for i in range(3)])
    tall = go.Figure([go.Scatter(y=[1, 2], name=f"variant {i}") for i in range(30)], layout=dict(height=400))
    for fig in (wide, tall):
        assert any("legend" in p for p in readable.problems(fig))
        fitted = readable.fit(fig)
        assert fitted.layout.legend.orientation == "h" and not readable.problems(fitted)
        assert fitted.layout.margin.b > 80


def test_an_entry_wider_than_the_figure_is_wrapped():
    fig = go.Figure([go.Scatter(y=[1], name="a legend entry " * 12), go.Scatter(y=[2], name="b")])
    fitted = readable.fit(fig)
    assert "<br>" in fitted.data[0].name and not readable.problems(fitted)


def test_a_figure_that_fits_is_left_alone():
    fig = go.Figure(go.Bar(x=["a"], y=[1], name="one"), layout=dict(title="short"))
    assert readable.fit(fig) is fig and readable.fit(fig.to_dict()) == fig.to_dict()


def test_a_grid_of_photos_stays_light_and_small_images_stay_exact():
    """Notebook 01 shows 12 packaged photographs of 224 px: as PNG they alone weighed 1.2 MB and pushed
    its report past the size limit; as JPEG they are a fraction of it. 28-px images stay PNG."""
    import numpy as np

    from lab import analysis, plots

    imgs, _ = analysis.photos(size=224)
    fig = plots.image_grid(imgs, [str(i) for i in range(len(imgs))], cols=6)
    assert all(t.source.startswith("data:image/jpeg") for t in fig.data)
    assert len(fig.to_json()) < MAX_REPORT_BYTES / 5
    small = plots.image_grid(np.zeros((2, 28, 28), np.uint8), ["a", "b"])
    assert all(t.source.startswith("data:image/png") for t in small.data)


def test_category_labels_that_would_collide_are_wrapped_in_the_continual_figure():
    """Notebook 04's continual figure at the report's width: with five stages of long task names the
    plain ``stage k: task`` labels would run into each other (plotly would then slant them into the
    legend); the figure wraps them to the room of their stage and keeps them level, and still fits."""
    import pandas as pd

    from lab.experiments.aware.views import study as study_views
    from lab.experiments.aware.views.study import category_tick_problems

    tasks = ["fashion-mnist questions", "handwritten digits", "even or odd digit", "shapes in colour",
             "letters of the alphabet"]
    rows = [dict(protocol=p, stage=s, task=k, acc=0.5, lo=0.4, hi=0.6, floor=0.1, learned=True)
            for p in ("full", "aware (paper: upstream saliency)", "aware + replay saliency (extension)")
            for s, k in enumerate(tasks)]
    fig = study_views.continual_figure({"continual_learned": pd.DataFrame(rows)})
    plain = go.Figure(fig).update_traces(x=[f"stage {s + 1}: {k}" for s, k in enumerate(tasks)])
    assert len(category_tick_problems(plain)) >= len(tasks)        # the case: plain labels collide
    assert not category_tick_problems(fig) and not readable.problems(fig)
    assert fig.layout.xaxis.tickangle == 0 and all("<br>" in x for x in fig.data[0].x[:2])
    assert [x.replace("<br>", " ") for x in fig.data[0].x] == [f"stage {s + 1}: {k}" for s, k in enumerate(tasks)]
    assert fig.layout.legend.yref == "container" and fig.layout.margin.b >= 24 + 16 * 3 + 22   # labels, then legend
    assert category_tick_problems(study_views.continual_figure(          # narrower: wrapped tighter
        {"continual_learned": pd.DataFrame(rows)}, width=600), 600) == []
    assert "'fashion-mnist' is" not in " ".join(category_tick_problems(fig))


def test_text_width_errs_wide_of_the_drawn_text():
    """Measured in Chromium with DejaVu Sans (plotly's fonts' widest fallback): 544 px for this title
    at 12 px, 760 at 16.8 px; the estimate must not fall short of them."""
    t = "LuCA: an adapter, then a calibrating gate, on the frozen backbone's decision-point feature"
    assert readable.text_width(t, 12) >= 543 and readable.text_width(t, 16.8) >= 760
    assert readable.text_width("<b>ab</b>", 12) == readable.text_width("ab", 12)


def test_chance_line_marks_the_guess_level():
    fig = readable.chance_line(go.Figure(go.Bar(x=["a"], y=[0.5])), 0.1)
    assert fig.layout.shapes[0].y0 == 0.1 and fig.layout.annotations[0].text == "chance"


def test_the_notebook_renderers_fit_every_figure(monkeypatch):
    import plotly.io as pio

    from lab.report import notebook

    monkeypatch.setenv(notebook.PLOTLYJS_ENV, "assets/plotly.min.js")   # no 4.8 MB script printed here
    notebook.setup_notebook()
    fig = go.Figure(go.Bar(x=["a"], y=[1]), layout=dict(title="word " * 40))
    bundle = pio.renderers._build_mime_bundle(fig.to_dict())
    drawn = bundle["application/vnd.plotly.v1+json"]
    assert not readable.problems(drawn) and "<br>" in drawn["layout"]["title"]["text"]
    assert "&lt;br&gt;" not in bundle["text/html"] and "word word" in bundle["text/html"]


# --- tables ----------------------------------------------------------------------------------------
def test_snake_case_headers_become_words_and_row_labels_stay():
    assert readable.human("global_threshold_s") == "global threshold (smallest frozen s)"
    assert readable.human("share_of_model_%") == "share of the model (%)"
    assert readable.human("some_new_rate_s") == "some new rate (s)"
    assert readable.human("A_B") == "A_B" and readable.human(3) == 3 and readable.human("seconds") == "seconds"
    page = ("<table><thead><tr><th>target</th><th>global_threshold_s</th></tr></thead>"
            "<tbody><tr><th>k_proj</th><td>1</td></tr></tbody></table>")
    out = readable.humanize_html_headers(page)
    assert readable.header_cells(out) == ["target", "global threshold (smallest frozen s)"]
    assert "<th>k_proj</th>" in out


def test_dataframes_show_human_headers_in_a_notebook():
    import pandas as pd

    df = pd.DataFrame({"share_of_model_%": [1.0], "d_out": [4]}).set_index(pd.Index(["q_proj"], name="layer_name"))
    shown = readable.humanize_frame(df)
    assert list(shown.columns) == ["share of the model (%)", "output neurons"] and shown.index.name == "layer name"
    assert list(df.columns) == ["share_of_model_%", "d_out"]            # the data itself is untouched


# --- the glossary --------------------------------------------------------------------------------
ISSUE_TERMS = ["RanPAC", "FeCAM", "LoRA", "DoRA", "The reference", "PILOT", "APER", "B0 Inc2", "Wilson interval",
               "Energy router", "CKA", "A_B and Ā", "BWT", "R", "E", "H", "Retention at matched downstream accuracy",
               "Learning-rate front", "t-interval", "Permutation null", "LuCA", "TOSCA", "AWARe", "SimpleCIL"]


def _glossary() -> str:
    return (ROOT / glossary.SOURCE).read_text(encoding="utf-8")


def test_the_glossary_defines_every_term_in_three_sentences_at_most():
    entries = glossary.entries(_glossary())
    assert set(ISSUE_TERMS) <= set(entries), set(ISSUE_TERMS) - set(entries)
    for term, text in entries.items():
        plain = re.sub(r"\$[^$]+\$", "F", text)                          # a formula is not a sentence end
        plain = re.sub(r"\b(e\.g|i\.e|et al|vs)\.", r"\1", plain)
        sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\"'])", plain.strip()) if s]
        assert text and len(sentences) <= 3, (term, sentences)


def test_the_glossary_page_has_an_anchor_per_term_and_links_back():
    page = glossary.to_html(_glossary())
    for anchor in glossary.terms(_glossary()):
        assert f'id="{html.escape(anchor)}"' in page, anchor
    assert "href='index.html'" in page and "<script" not in page
    assert glossary.anchor("A_B and Ā") == "a_b-and-ā" and glossary.anchor("B0 Inc2") == "b0-inc2"


@pytest.mark.parametrize("name", TEACHING)
def test_the_notebooks_link_their_terms_to_the_glossary(name):
    anchors = set(glossary.terms(_glossary()))
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    links = re.findall(r"\]\(\.\./docs/glossary\.md#([^)]+)\)",
                       "\n".join(c.source for c in nb.cells if c.cell_type == "markdown"))
    assert len(links) >= 5, f"{name}: few terms linked"
    assert set(links) <= anchors, set(links) - anchors
    assert len(links) == len(set(links)), "a term is linked at its first use only"


def test_links_to_the_glossary_point_at_the_rendered_page():
    page = '<a href="../docs/glossary.md#wilson-interval">x</a> <a href="../docs/tosca.md">y</a>'
    assert glossary.relink(page) == '<a href="glossary.html#wilson-interval">x</a> <a href="../docs/tosca.md">y</a>'
    assert 'href="../glossary.html#cka"' in glossary.relink('<a href="../docs/glossary.md#cka">', "../")


# --- paths and the kernel's output -------------------------------------------------------------------
def test_folders_of_the_build_machine_are_replaced(tmp_path):
    pairs = _paths.replacements(tmp_path / "reports")
    text = (f"source {ROOT}/lab/data/assets/x.npz; saved to {tmp_path}/reports/a.html; {Path.home()}/.cache; "
            f"{ROOT}")
    out = _paths.scrub(text, pairs)
    assert out == "source lab/data/assets/x.npz; saved to <reports>/a.html; ~/.cache; ."
    alike = _paths.scrub(f"{ROOT}x/a", pairs)                             # another folder that starts alike:
    assert alike.endswith(f"{ROOT.name}x/a") and not alike.startswith(".")  # not taken for the repository


def test_the_kernel_speaks_to_its_log_file_not_to_the_terminal(tmp_path):
    """A notebook runs in a process of its own (lab.report._execute) whose stdout and stderr, and so
    its kernel's (jupyter_client's shutdown interrupts an idle kernel, which logs "KeyboardInterrupt
    caught in kernel"), go to a log file; what comes back is the progress lines and the result."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Setup"),
                nbformat.v4.new_code_cell("import sys\nprint('to the notebook')\nsys.__stderr__.write('kernel noise\\n')")]
    nbformat.write(nb, tmp_path / "k.ipynb")
    lines: list[str] = []
    spec = {"name": "k", "input": str(tmp_path / "k.ipynb"), "output": str(tmp_path / "k.out.ipynb"), "parameters": {},
            "kernel": pipeline.kernel_name(), "cwd": str(tmp_path), "log": str(tmp_path / "k.log"),
            "start_timeout": 120, "timeout": 120}
    assert pipeline.execute(spec, {}, lines.append) == {"ok": True}
    assert len(lines) == 1 and lines[0].endswith("cell 1/2  Setup"), lines
    assert "kernel noise" in (tmp_path / "k.log").read_text()
    out = nbformat.read(tmp_path / "k.out.ipynb", as_version=4)
    assert out.cells[1].outputs[0]["text"] == "to the notebook\n"


# --- the three teaching notebooks, rendered -------------------------------------------------------
@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    """00, 03 and 05 rendered once with the smoke parameters and ``--solutions`` (what `lab report
    --solutions` does), with what the run printed on stderr."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("taught")
    argv = [sys.executable, "-m", "lab", "report", "--params", "smoke", "--no-png", "--solutions", "--out", str(out),
            "--timeout", str(CELL_TIMEOUT_S), *[a for n in TEACHING for a in ("--only", n)]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3 * CELL_TIMEOUT_S, cwd=ROOT)
    return out, proc


@pytest.mark.notebook
@hard_timeout(3 * CELL_TIMEOUT_S)
def test_a_successful_report_prints_no_error_line(taught):
    out, proc = taught
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln]


@pytest.mark.notebook
@hard_timeout(3 * CELL_TIMEOUT_S)
def test_reports_are_light_and_name_no_folder_of_the_build_machine(taught):
    out, _ = taught
    js = out / pipeline.plotlyjs_name()
    assert js.is_file() and len(list((out / pipeline.ASSETS).iterdir())) == 1
    folders = {str(ROOT), str(Path.home()), str(out), str(Path(sys_prefix()).resolve())}
    pages = [p for p in out.rglob("*") if p.suffix in (".html", ".ipynb", ".json")]
    assert len(pages) >= 2 * len(TEACHING) + 3
    for p in pages:
        text = p.read_text(encoding="utf-8")
        assert not [f for f in folders if f in text], f"{p.relative_to(out)} names {[f for f in folders if f in text]}"
        if p.suffix == ".html":
            assert p.stat().st_size <= MAX_REPORT_BYTES, f"{p.name}: {p.stat().st_size:,} bytes"
            assert "plotly.js v" not in text


def sys_prefix() -> str:
    import sys

    return sys.prefix


@pytest.mark.notebook
@hard_timeout(3 * CELL_TIMEOUT_S)
@pytest.mark.parametrize("name", TEACHING)
def test_a_taught_report_reads_well_and_holds_no_solution(taught, name):
    from lab import exercises

    out, _ = taught
    page = (out / f"{name}.html").read_text(encoding="utf-8")
    snake = [h for h in readable.header_cells(page) if readable.SNAKE.match(h)]
    assert not snake, f"{name}: snake_case column headers {snake}"
    assert "href='glossary.html'" in page and 'href="glossary.html#' in page and "href='index.html'" in page
    assert "Solution " not in page and "Solution " not in (out / f"{name}.ipynb").read_text(encoding="utf-8")
    nb = nbformat.read(out / "solutions" / f"{name}.ipynb", as_version=4)
    bad = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            fig = o.get("data", {}).get("application/vnd.plotly.v1+json")
            if fig and readable.problems(fig):
                bad.append(readable.problems(fig))
    assert not bad, f"{name}: figures that do not fit {readable.REPORT_WIDTH} px: {bad}"
    solved = (out / "solutions" / f"{name}.html").read_text(encoding="utf-8")
    for id in exercises.list_exercises(name[:2]):
        assert f"Solution {id}:" in solved and f"Exercise {id}" in page
    assert "href='../glossary.html'" in solved and (out / "solutions" / "index.html").is_file()
