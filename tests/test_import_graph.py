"""Layers that only point down: every import in lab/ (top of file and inside functions), parsed
with ``ast``, goes to the same layer or a lower one, and the units never import each other in a
circle. The layers are the ones docs/architecture.md describes; LAYERS below is that definition.

No arrow runs up: UPWARD_ALLOWED is empty, and may only shrink (a new upward arrow fails, and so
does an entry whose arrow is gone). test_the_check_can_fail plants an upward arrow and sees it caught.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

LAB = Path(__file__).resolve().parents[1] / "lab"

# lowest first; a unit is a module of lab/ or one of its packages (lab/experiments/<name> each its
# own unit); every unit is in exactly one layer, and a unit may import only its own layer or lower
LAYERS = {
    0: ("core: the registry and its plugin loader, files, caches, checks, run folders, executors, "
        "statistics and continual metrics",
        {"lab", "lab._alloc", "lab._cache", "lab._cc", "lab._io", "lab._manifest", "lab._names", "lab._registry",
         "lab._validate", "lab._vit_weights", "lab.plugins", "lab.stats", "lab.metrics", "lab.runs",
         "lab.executors"}),
    1: ("methods: TOSCA and AWARe alone, probes",
        {"lab.tosca", "lab.aware", "lab.probes"}),
    2: ("inputs and shared measures: datasets, backbones, the feature cache, analyses, plots",
        {"lab.data", "lab.backbones", "lab.features", "lab.analysis", "lab.plots"}),
    3: ("services a command calls: tracking, the report (notebooks -> pages)",
        {"lab.tracking", "lab.report"}),
    4: ("experiments: each method's harness, studies and its command",
        {"lab.experiments", "lab.experiments.tosca", "lab.experiments.aware"}),
    5: ("views: notebook widgets, exercises, diagrams, the Jupyter launcher",
        {"lab.widgets", "lab.exercises", "lab.diagrams", "lab.jupyter"}),
    6: ("the command line", {"lab.cli", "lab.__main__"}),
}
LAYER_OF = {unit: n for n, (_, units) in LAYERS.items() for unit in units}

# (importing file, imported module): upward arrows not removed yet. Shrink, never grow: it is empty,
# and an arrow added to it needs a reason written beside it (docs/architecture.md, "Layers")
UPWARD_ALLOWED: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(LAB.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The unit a module belongs to (``lab.X``, or ``lab.experiments.X``); ``lab`` itself for a
    name of the package (``from lab import __version__``)."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "experiments":
        return ".".join(parts[:3])
    if len(parts) >= 2 and not ((LAB / parts[1]).is_dir() or (LAB / f"{parts[1]}.py").is_file()):
        return "lab"
    return ".".join(parts[:2])


def imports(path: Path) -> set[str]:
    """Every ``lab`` module ``path`` imports, anywhere in the file (absolute names)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names if (LAB.parent / mod.replace(".", "/") / a.name).exists()
                    or (LAB.parent / mod.replace(".", "/") / f"{a.name}.py").exists()}
    return {m for m in out if m == "lab" or m.startswith("lab.")}


def arrows() -> list[tuple[str, str, str, str]]:
    """(file, imported module, its unit, the imported unit) for every import between two units."""
    out = []
    for path in sorted(LAB.rglob("*.py")):
        src = unit_of(module_name(path))
        for mod in sorted(imports(path)):
            dst = unit_of(mod)
            if dst != src:
                out.append((path.relative_to(LAB.parent).as_posix(), mod, src, dst))
    return out


def test_every_unit_has_a_layer():
    units = {unit_of(module_name(p)) for p in LAB.rglob("*.py")}
    assert not units - set(LAYER_OF), f"units without a layer (add them to LAYERS): {sorted(units - set(LAYER_OF))}"


def test_no_arrow_runs_up_but_the_named_ones():
    up = {(f, m): (s, d) for f, m, s, d in arrows() if LAYER_OF[d] > LAYER_OF[s]}
    allowed = {(f, m) for f, m in UPWARD_ALLOWED}
    new = {k: v for k, v in up.items() if (k[0], ".".join(k[1].split(".")[:4])) not in allowed and k not in allowed}
    assert not new, "imports from a lower layer to a higher one: " + "; ".join(
        f"{f} imports {m} ({s}, layer {LAYER_OF[s]} -> {d}, layer {LAYER_OF[d]})" for (f, m), (s, d) in sorted(new.items()))
    gone = {a for a in UPWARD_ALLOWED if not any(f == a[0] and (m == a[1] or m.startswith(a[1] + ".")) for f, m in up)}
    assert not gone, f"these allowed upward arrows are gone: remove them from UPWARD_ALLOWED: {sorted(gone)}"


def test_no_import_circle_between_units():
    graph = defaultdict(set)
    for f, m, s, d in arrows():
        if (f, ".".join(m.split(".")[:4])) not in UPWARD_ALLOWED and (f, m) not in UPWARD_ALLOWED:
            graph[s].add(d)
    state: dict[str, int] = {}   # 1: on the path, 2: done
    circles = []

    def visit(u, path):
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                circles.append(path[path.index(v):] + [v])
            elif v not in state:
                visit(v, path + [v])
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [u])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_experiments_do_not_import_the_command_line():
    bad = [(f, m) for f, m, s, d in arrows() if s.startswith("lab.experiments") and d == "lab.cli"]
    assert not bad, bad


def test_the_check_can_fail(tmp_path, monkeypatch):
    """The check is live: a module of a low layer that imports a higher one is named (here a planted
    copy of the tree in which lab/tracking.py imports an experiment)."""
    import shutil
    import sys

    g = sys.modules[__name__]

    tree = tmp_path / "lab"
    shutil.copytree(LAB, tree, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    (tree / "tracking.py").write_text((tree / "tracking.py").read_text()
                                      + "\n\ndef _up():\n    from lab.experiments.aware.run.ablate import summary\n")
    monkeypatch.setattr(g, "LAB", tree)
    try:
        g.test_no_arrow_runs_up_but_the_named_ones()
    except AssertionError as exc:
        assert "lab/tracking.py imports lab.experiments.aware.run.ablate" in str(exc), exc
    else:
        raise AssertionError("an upward arrow went unnoticed")
