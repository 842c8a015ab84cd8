"""Notebook 01's comparisons over seeds (lab.experiments.tosca.ventral): paired differences with the
lab's interval, and the shipped table at the notebook's report settings."""
from __future__ import annotations

import ast
import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from lab.experiments.tosca import ventral as V

ROOT = Path(__file__).resolve().parents[3]


def test_comparisons_are_paired_by_seed():
    per_seed = pd.DataFrame({"seed": [1, 2, 3], "probe stage5": [0.80, 0.70, 0.90], "probe head": [0.79, 0.69, 0.89],
                             "other_ft": [0.5, 0.6, 0.7], "other_frozen": [0.5, 0.6, 0.7],
                             "ft_task": [0.6, 0.9, 0.7], "tosca_task": [0.8, 0.7, 0.8]})
    c = V.comparisons(per_seed, "stage5").set_index("comparison")
    probe = c.loc["linear probe, stage5 − head"]
    assert probe.difference == pytest.approx(0.01) and probe.lo == pytest.approx(0.01) and probe.verdict == "higher"
    assert c.loc["other classes' prototype accuracy, after full fine-tuning − before"].verdict == "no difference detected"
    assert "over 3 seeds" in V.sentence(next(V.comparisons(per_seed, "stage5").itertuples())) and V.interval(0.01, 0.0, 0.02, sign=True) == "+0.010 [+0.000, +0.020]"
    missing = V.comparisons(per_seed, "block9").set_index("comparison").loc["linear probe, block9 − head"]
    assert missing.verdict == "not in the table"


def _notebook_defaults() -> dict:
    nb = json.loads((ROOT / "notebooks" / "01_ventral_vs_prefrontal.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    return {t.targets[0].id: ast.literal_eval(t.value) for t in tree.body if isinstance(t, ast.Assign)}


def test_the_table_settings_are_the_notebooks_report_parameters():
    nb = _notebook_defaults()
    assert {k: nb[k] for k in asdict(V.Settings())} == asdict(V.Settings())


def test_the_shipped_table_covers_ten_seeds_at_those_settings():
    if not (V.FOLDER / "manifest.json").is_file():
        pytest.skip("no shipped table")
    per_seed, manifest = V.load()
    assert manifest["command"].startswith("python -m lab.experiments.tosca.ventral") and manifest["wall_seconds"] > 0
    assert manifest["settings"] == asdict(V.Settings()) and len(per_seed) >= 5
    assert 0 not in per_seed.seed.tolist()          # notebook 01's own seed picks the stage; the table tests it
    assert {"probe head", "ft_task", "tosca_task", "other_ft", "other_frozen"} <= set(per_seed.columns)
