"""lab/experiments/aware is laid out by concept: run/ (what determines a run's numbers) <- study/
(plan -> runner -> tables, provenance) <- views/ (compute nothing). Checked on the source with
``ast``: run/ imports neither the study nor the views, and views/ import from run/ only names that
neither train nor score."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[3] / "lab" / "experiments" / "aware"
P = "lab.experiments.aware"
# what views may read from run/: presets, task data and the cache folder (nothing that trains or
# scores); ``ablate`` is the one launcher, ``views.ablation.run_sweep`` handing a sweep to it
VIEWS_FROM_RUN = {f"{P}.run.context": {"SIZES"}, f"{P}.run.tasks": {"TEMPLATES", "downstream"},
                  f"{P}.run.minillava": {"cache_root"}, f"{P}.run": {"ablate"}}


def _imports(path: Path):
    """(module, names) of every ``lab`` import in ``path``, anywhere in the file."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lab"):
            yield node.module, {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            yield from ((a.name, set()) for a in node.names if a.name.startswith("lab"))


def test_the_package_has_three_parts_and_a_command():
    assert sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()) == \
        ["run", "study", "views"]
    assert sorted(p.name for p in PKG.glob("*.py")) == ["__init__.py", "cli.py"]
    init = (PKG / "__init__.py").read_text()
    assert "import" not in init.split('"""')[2]     # nothing heavy at import: a docstring only


def test_run_imports_neither_the_study_nor_the_views():
    bad = [f"{f.relative_to(PKG)}: {mod}" for f in sorted((PKG / "run").rglob("*.py")) for mod, names in _imports(f)
           if mod.startswith((f"{P}.study", f"{P}.views", f"{P}.cli"))
           or (mod in (P, f"{P}.run") and names & {"study", "views", "cli"})]
    assert not bad, "\n".join(bad)


def test_views_import_nothing_that_trains_or_scores():
    bad = []
    for f in sorted((PKG / "views").rglob("*.py")):
        for mod, names in _imports(f):
            if mod.startswith(f"{P}.run") and not names <= VIEWS_FROM_RUN.get(mod, set()):
                bad.append(f"{f.relative_to(PKG)}: from {mod} import {sorted(names)}")
            if mod == f"{P}.study.runner" or (mod == f"{P}.study" and "runner" in names):
                bad.append(f"{f.relative_to(PKG)}: {mod} (runner)")
    assert not bad, "\n".join(bad)
