"""Every notebook in notebooks/: committed clean, and runs under papermill with smoke parameters.

The smoke renders are shared with test_browser (one execution per notebook per session).
"""
from __future__ import annotations

import math
import warnings

import nbformat
import pytest

from _report_helpers import NOTEBOOKS, smoke_report
from lab.report import labels, params

if not NOTEBOOKS:
    pytest.skip("no notebooks in notebooks/ yet", allow_module_level=True)

IDS = [p.stem for p in NOTEBOOKS]
SMOKE_BUDGET_S = 60  # each notebook well under a minute with smoke parameters


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs_and_with_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"
    assert "widgets" not in nb.metadata, f"{path.name}: saved widget state in metadata; clear it"
    assert params.parameters_cell(nb) is not None, f"{path.name}: no cell tagged 'parameters'"
    for profile in params.PROFILES:  # declared names exist in the parameters cell
        params.resolve(path, profile)


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_with_smoke_parameters_and_records_finite_metrics(path, tmp_path_factory):
    card = smoke_report(tmp_path_factory, path)
    if not card["ok"]:
        pytest.fail(f"{path.name} failed at In [{card['failed_cell']}]: {card['error']}\n"
                    f"{card['failed_source'] or ''}", pytrace=False)
    metrics = card["metrics"]
    assert metrics, f"{path.name}: no headline numbers; call lab.report.record(...) in the last cell"
    numbers = {k: v for k, v in metrics.items() if not isinstance(v, str)}
    assert numbers, f"{path.name}: recorded only strings {metrics}"
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers.values()), numbers
    unlabelled = labels.unlabelled(metrics)     # the index would show these keys as they are
    assert not unlabelled, f"{path.name}: add a label and unit to lab/report/labels.py for {unlabelled}"
    if card["seconds"] > SMOKE_BUDGET_S:
        warnings.warn(f"{path.name}: smoke run took {card['seconds']:.0f} s (budget {SMOKE_BUDGET_S} s)",
                      stacklevel=1)
