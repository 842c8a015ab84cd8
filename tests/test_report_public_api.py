"""The report (lab/report/) uses papermill, nbclient, nbconvert and jupyter_client through their public
API only: no private name of theirs (``_``-prefixed, not ``__dunder__``) read, imported, called or
overridden, and no attribute of theirs assigned (monkey-patching). Parsed with ``ast``; a finding
names file:line."""
from __future__ import annotations

import ast
from pathlib import Path

REPORT = Path(__file__).resolve().parents[1] / "lab" / "report"
PACKAGES = ("papermill", "nbclient", "nbconvert", "jupyter_client", "nbformat")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def findings(source: str, filename: str) -> list[str]:
    """``file:line: what`` for every private use or monkey-patch of the packages' objects in ``source``."""
    tree = ast.parse(source, filename)
    foreign: set[str] = set()          # names bound to one of the packages' modules or objects
    out = []

    def ours(mod: str | None) -> bool:
        return bool(mod) and mod.split(".")[0] in PACKAGES

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if ours(a.name):
                    foreign.add((a.asname or a.name).split(".")[0])
                    if any(_private(p) for p in a.name.split(".")):
                        out.append(f"{filename}:{node.lineno}: imports the private module {a.name}")
        elif isinstance(node, ast.ImportFrom) and ours(node.module):
            for a in node.names:
                foreign.add(a.asname or a.name)
                if _private(a.name) or any(_private(p) for p in node.module.split(".")):
                    out.append(f"{filename}:{node.lineno}: imports the private {node.module}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(isinstance(r := _root(b), ast.Name) and r.id in foreign
                                                  for b in node.bases):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    out.append(f"{filename}:{item.lineno}: overrides the private method {item.name} of a "
                               f"{', '.join(ast.unparse(b) for b in node.bases)} subclass")
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and _private(sub.attr) and isinstance(sub.value, ast.Call) \
                        and getattr(sub.value.func, "id", None) == "super":
                    out.append(f"{filename}:{sub.lineno}: calls the private super().{sub.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(r := _root(node), ast.Name) and r.id in foreign:
            if _private(node.attr):
                out.append(f"{filename}:{node.lineno}: reads the private {ast.unparse(node)}")
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                out.append(f"{filename}:{node.lineno}: assigns {ast.unparse(node)} (monkey-patching)")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr") and node.args \
                and isinstance(r := _root(node.args[0]), ast.Name) and r.id in foreign:
            out.append(f"{filename}:{node.lineno}: {node.func.id} on {ast.unparse(node.args[0])} (monkey-patching)")
    return sorted(set(out))


def test_the_report_uses_only_the_public_api_of_papermill_nbconvert_and_jupyter_client():
    bad = []
    for path in sorted(REPORT.rglob("*.py")):
        bad += findings(path.read_text(encoding="utf-8"), str(path.relative_to(REPORT.parents[1])))
    assert not bad, "private API or monkey-patching in lab/report:\n" + "\n".join(bad)


def test_the_check_finds_what_the_report_once_did():
    """The patterns the report used before it moved to the public API, each named with its line."""
    planted = '''
from jupyter_client import AsyncKernelManager
from papermill.engines import NBClientEngine, papermill_engines
import papermill
from nbconvert.exporters import _private_thing


class Quiet(AsyncKernelManager):
    async def _async_interrupt_kernel(self):
        return await super()._async_interrupt_kernel()


def run(nb_man):
    papermill.engines.NBClientEngine.execute_managed_notebook = None
    setattr(NBClientEngine, "execute_managed_notebook", None)
    return papermill._version
'''
    found = findings(planted, "x.py")
    for line, what in ((5, "imports the private nbconvert.exporters._private_thing"),
                       (9, "overrides the private method _async_interrupt_kernel"),
                       (10, "calls the private super()._async_interrupt_kernel"),
                       (14, "assigns papermill.engines.NBClientEngine.execute_managed_notebook"),
                       (15, "setattr on NBClientEngine"), (16, "reads the private papermill._version")):
        assert any(f.startswith(f"x.py:{line}: {what}") for f in found), (line, what, found)
    assert findings("import papermill\npapermill.execute_notebook('a', 'b')\nx = papermill.__version__\n", "y.py") == []
