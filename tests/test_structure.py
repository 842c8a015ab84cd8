"""The shape of the repository: no import cycles among lab's modules, and self-contained words.

The import graph is built from the source (``import`` / ``from`` statements anywhere in a module,
top level and inside functions), so a cycle hidden behind a function-level import counts too.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "lab"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = LAB) -> dict[str, set[str]]:
    """``{module: modules of lab it imports}`` (a package import counts as its ``__init__``)."""
    modules = {module_name(p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                # ``from pkg import mod`` imports the submodule when there is one
                names = [f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in modules:  # lab.x.y.attr -> the module that holds it
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), as sorted lists."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_sees_function_level_and_relative_imports():
    g = import_graph()
    assert "lab.experiments.tosca.methods" in g["lab.experiments.tosca.run"]  # relative, top level
    assert "lab.data" in g["lab.features"]                      # absolute, inside a function


def test_no_import_cycles_among_lab_modules():
    found = cycles(import_graph())
    assert not found, "import cycles among lab's modules: " + "; ".join(" <-> ".join(c) for c in found)


def _module_names(stmts, modules: set[str]) -> set[str]:
    """Names bound to modules by the import statements directly in ``stmts`` (not nested scopes)."""
    out = set()
    todo = list(stmts)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in modules}
        todo.extend(ast.iter_child_nodes(node))
    return out


def _other_bindings(fn) -> set[str]:
    """Parameters and plain assignments of a function: they shadow a module-level import."""
    a = fn.args
    names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


_INTROSPECTION = {"getattr", "hasattr", "setattr", "isinstance", "vars", "dir", "id", "type", "repr", "callable"}


def modules_passed_as_arguments(root: Path = LAB) -> list[str]:
    """Calls that pass a module (a name bound by ``import m [as n]``, or by ``from lab.x import mod``
    naming a lab module, in the call's scope) as an argument: a function imports what it needs."""
    modules = {module_name(p) for p in root.rglob("*.py")}
    hits = []

    def visit(node, bound, path):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = (bound - _other_bindings(child)) | _module_names(child.body, modules)
                visit(child, inner, path)
                continue
            introspection = isinstance(getattr(child, "func", None), ast.Name) and child.func.id in _INTROSPECTION
            if isinstance(child, ast.Call) and not introspection:
                for arg in (*child.args, *(k.value for k in child.keywords)):
                    if isinstance(arg, ast.Name) and arg.id in bound:
                        hits.append(f"{path.relative_to(ROOT)}:{child.lineno}: passes module {arg.id!r}")
            visit(child, bound, path)

    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        visit(tree, _module_names(tree.body, modules), path)
    return hits


def test_the_module_argument_check_sees_a_module_passed_in_a_function(tmp_path):
    pkg = tmp_path / "lab"
    pkg.mkdir()
    (pkg / "m.py").write_text("import pandas as pd\n\n\ndef f(x, pd2):\n    return x\n\n\n"
                              "def g(pd):\n    return f(1, pd)\n\n\n"        # a parameter named pd: fine
                              "def h():\n    from lab import m\n    return f(1, m), f(2, pd), getattr(pd, 'x')\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        hits = modules_passed_as_arguments(pkg)
    finally:
        ROOT = old
    assert [h.split(": ", 1)[1] for h in hits] == ["passes module 'm'", "passes module 'pd'"]


def test_no_module_is_passed_as_an_argument():
    hits = modules_passed_as_arguments()
    assert not hits, "\n".join(hits)


# ---- self-contained words ----------------------------------------------------------------------
FORBIDDEN = re.compile(r"\.\./shared|shared/spec|spec:? ?(aware|tosca)\.md|\bissues? #?\d", re.IGNORECASE)


def _text_files():
    for base in ("lab", "notebooks", "docs"):
        for p in sorted((ROOT / base).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".json", ".txt", ".toml", ".cfg"):
                yield p
    yield ROOT / "README.md"


def test_forbidden_pattern_catches_what_it_should():
    for bad in ("see ../shared/x", "shared/spec/tosca.md", "(spec aware.md)", "(spec: tosca.md, ...)",
                "issue 3", "Issue #12", "issues 2 and 5"):
        assert FORBIDDEN.search(bad), bad
    for ok in ("docs/tosca.md", "a known issue", "MethodSpec(...)", "kernelspec"):
        assert not FORBIDDEN.search(ok), ok


def test_repository_words_are_self_contained():
    """No reference to files outside the repository, to a spec file, or to an issue number."""
    hits = []
    for p in _text_files():
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_the_readme_quick_start_is_short_and_has_the_two_commands():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("\n## ", text.index("## Quick start") + 1)]
    assert len(section.strip().splitlines()) <= 30, "the Quick start is read in a minute: 30 lines at most"
    block = section[section.index("```bash") + 7:section.index("```", section.index("```bash") + 7)]
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make report", "make test"]
