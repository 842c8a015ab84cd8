"""A method's identity lives in its registry entry: no code outside the file that registers a method
compares a value with its name or lists it beside another method's name; the harness asks the
entry's info instead (TOSCA: ``role``, ``routed``, ``luca``, ``cosine_head``, ... in
:func:`lab.experiments.tosca._base.register`; AWARe: ``role``, ``lr_field``, ... on
:class:`lab.aware.methods.Method`, with :func:`~lab.aware.methods.reference_method` and
:func:`~lab.aware.methods.main_method`).

The scan reads every file of ``lab/`` with :mod:`ast` and reports, as ``file:line``, every
comparison (``==``, ``!=``, ``in``, ``not in``) with a method's name and every tuple, list or set
literal holding two or more method names. Method names are the built-in entries of the TOSCA and
AWARe method registries and the AWARe study's variant ids of them (``methods/<name>``).
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "lab"

# files and folders that may name methods, and why
EXEMPT = {
    "lab/_names.py": "static copies of the registries for the torch-free command line; "
                     "tests/test_cli.py holds them equal to the registries",
    "lab/exercises/": "exercise answers: the code a notebook's reader writes, filtering a table by the name it shows",
}
# names (a file's and the method names it may list) that are a user-facing choice, not an identity check
CHOICES = {
    "lab/widgets/tosca.py": ({"simplecil", "finetune", "joint"},
                             "the panel's baseline dropdown: the three it offers live, one of each kind"),
}
# a comparison with one of these is about the command line's words (`lab tosca`, `lab aware`,
# `lab aware finetune`), which share a few methods' names
COMMAND_WORDS = {"command", "action", "argv"}


def method_owners() -> dict[str, set[str]]:
    """Every registered method name (and AWARe variant id) -> the files that register it (relative)."""
    from lab.aware import methods as aware
    from lab.experiments.tosca import methods as tosca

    root = LAB.parent
    owners: dict[str, set[str]] = {}
    for reg in (tosca.METHODS, aware.METHODS):
        for name in reg.builtin_names():
            where = Path(inspect.getsourcefile(reg.get(name))).resolve().relative_to(root).as_posix()
            owners.setdefault(name, set()).add(where)
    for name in aware.METHODS.builtin_names():
        owners[aware.method_variant(name)] = owners[name]
    return owners


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
           {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def violations(source: str, path: str, owners: dict[str, set[str]]) -> list[str]:
    """``path:line: ...`` for every method-name comparison or list of method names in ``source`` that
    ``path`` does not own (``path`` relative to the repository, e.g. ``lab/experiments/x.py``)."""
    if any(path == e or (e.endswith("/") and path.startswith(e)) for e in EXEMPT):
        return []
    allowed = CHOICES.get(path, (set(), ""))[0]

    def method(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in owners:
            return node.value if path not in owners[node.value] and node.value not in allowed else None
        return None

    out = []
    for node in ast.walk(ast.parse(source)):
        hits: list[str] = []
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            operands = [node.left, *node.comparators]
            if any(_names_in(x) & COMMAND_WORDS for x in operands):
                continue
            for x in operands:
                items = x.elts if isinstance(x, (ast.Tuple, ast.List, ast.Set)) else [x]
                hits += [m for m in map(method, items) if m]
            what = "compares with"
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [m for m in map(method, node.elts) if m]
            hits = names if len(names) >= 2 else []
            what = "lists"
        if hits:
            out.append((node.lineno, f"{path}:{node.lineno}: {what} method name(s) {', '.join(map(repr, hits))} "
                       f"(registered in {', '.join(sorted(set().union(*(owners[h] for h in hits))))}): "
                       "ask the registry's info instead"))
    return [v for _, v in sorted(out, key=lambda x: x[0])]


@pytest.fixture(scope="module")
def owners():
    return method_owners()


def test_no_code_outside_a_registry_entry_names_a_method(owners):
    root = LAB.parent
    bad = [v for f in sorted(LAB.rglob("*.py"))
           for v in violations(f.read_text(encoding="utf-8"), f.relative_to(root).as_posix(), owners)]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_a_literal_comparison_and_a_list_of_names(owners):
    """The scan can fail: a snippet that compares with a method's name, or lists two, is reported
    with its file and line; the same code in the file that registers the method is not."""
    snippet = ("def f(runs, m):\n"
               "    x = runs[runs.method == 'tosca']\n"
               "    if m not in ('full', 'lora'):\n"
               "        return [\"methods/aware\", \"methods/full\"]\n"
               "    return m != 'simplecil' or m in {'ncm'}\n")
    got = violations(snippet, "lab/experiments/somewhere.py", owners)
    lines = sorted(int(v.split(":")[1]) for v in got)
    assert lines == [2, 3, 3, 4, 5, 5], got      # line 3: the comparison and its tuple
    assert all(v.startswith("lab/experiments/somewhere.py:") for v in got)
    assert "'tosca'" in got[0] and "lab/experiments/tosca/methods.py" in got[0]
    # the registering file may name its own methods; one name alone in a tuple is not a list
    assert violations("ok = m == 'tosca'\n", "lab/experiments/tosca/methods.py", owners) == []
    assert violations("spec = ('full', 3)\n", "lab/experiments/x.py", owners) == []
    # a command-line word that coincides with a method's name is not a method
    assert violations("if args.command == 'aware': pass\n", "lab/cli.py", owners) == []


def test_every_method_name_is_known_to_the_scan(owners):
    """The scan knows every built-in method of both registries and where each is registered."""
    from lab.aware.methods import method_names
    from lab.experiments.tosca.methods import list_methods

    assert {"tosca", "simplecil", "layerwise_adapter", "full", "aware", "methods/full"} <= set(owners)
    assert set(list_methods()) <= set(owners) and set(method_names()) <= set(owners)
    assert owners["tosca"] == {"lab/experiments/tosca/methods.py"}
    assert owners["layerwise_adapter"] == {"lab/experiments/tosca/layerwise.py"}
    assert owners["methods/aware"] == {"lab/aware/methods.py"}


def test_flows_are_named_constants_and_the_static_copy_matches():
    """A LuCA flow named like the method it comes from ('tosca') is a flow: code compares with
    :data:`lab.tosca.luca.REFERENCE_FLOW`, copied for the torch-free tables in :mod:`lab._names`."""
    from lab import _names
    from lab.tosca import luca

    assert luca.FLOWS[0] == luca.REFERENCE_FLOW == _names.REFERENCE_FLOW
    assert tuple(luca.FLOWS) == (luca.REFERENCE_FLOW, luca.ADAPTER, luca.CALIBRATOR, luca.TOSCA_R)
