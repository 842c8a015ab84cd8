"""Where a notebook's report and smoke parameters live, and their validation.

A notebook declares its parameter profiles in its own metadata, so the notebook is the one
source of truth and moves as one file::

    "metadata": {"continual-lab": {"params": {
        "report": {"resolution": 224, "n_tasks": 5},   # `lab report`        (full size)
        "smoke":  {"resolution": 64,  "n_tasks": 2}    # tests, `--params smoke` (well under a minute)
    }}}

Values override the defaults of the cell tagged ``parameters``; a profile left out, or empty,
means "the cell's defaults". :func:`declare` writes this block into a notebook file. Names AND
types are checked against that cell before anything runs (papermill itself only warns about a
parameter the notebook does not have, and injects a wrong type that fails cells later): a value
must have the type of the cell's default (an int where it says ``seed = 0``, a list of numbers
where it says ``l1_values = [0.0, 5e-4]``; floats accept ints; a ``None`` default accepts anything),
and numbers must be finite.

Ranges and choices sit beside the profiles, under ``"checks"``, and are checked on the profiles'
values and on every ``-p`` override before any kernel starts (a list is checked element by
element)::

    "continual-lab": {"params": {...}, "checks": {
        "resolution": {"min": 32, "max": 512},       # numbers: inclusive bounds
        "rho": {"min": 0, "max": 1},
        "projection": {"choices": ["pca", "tsne"]},  # a fixed list ...
        "dataset": {"choices": "datasets"}           # ... or a registry: see REGISTRIES
    }}
"""
from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

PROFILES = ("report", "smoke")
METADATA_KEY = "continual-lab"


class ParamsError(ValueError):
    """A notebook's parameters are declared wrongly or do not match its ``parameters`` cell."""


def _aware_sizes() -> list[str]:
    from lab._names import AWARE_SIZES   # the names only (lab.experiments.aware.run.context.SIZES holds the sizes)

    return list(AWARE_SIZES)


def _aware_presets() -> list[str]:
    from lab._names import AWARE_PRESETS   # the names only (lab.experiments.aware.study.plan.PRESETS holds the configs)

    return list(AWARE_PRESETS)


def _datasets() -> list[str]:
    from lab.data import list_datasets

    return list(list_datasets())


def _backbones() -> list[str]:
    from lab.backbones import list_backbones

    return list(list_backbones())


# the registries a check's "choices" may name (read only when a value needs checking)
REGISTRIES = {"datasets": _datasets, "backbones": _backbones, "aware_sizes": _aware_sizes,
              "aware_presets": _aware_presets}
CHECK_KEYS = ("min", "max", "choices")


def declared_checks(nb) -> dict[str, dict[str, Any]]:
    """The ranges and choices a notebook declares for its parameters (``metadata.continual-lab.checks``)."""
    section = nb.metadata.get(METADATA_KEY, {}) or {}
    checks = section.get("checks", {}) or {}
    if not isinstance(checks, dict):
        raise ParamsError(f"metadata.{METADATA_KEY}.checks must be an object, got {type(checks).__name__}")
    for name, c in checks.items():
        if not isinstance(c, dict) or set(c) - set(CHECK_KEYS):
            raise ParamsError(f"metadata.{METADATA_KEY}.checks.{name} must be an object with {list(CHECK_KEYS)}")
        for k in ("min", "max"):
            if k in c and (isinstance(c[k], bool) or not isinstance(c[k], (int, float)) or not math.isfinite(c[k])):
                raise ParamsError(f"metadata.{METADATA_KEY}.checks.{name}.{k} must be a finite number")
        ch = c.get("choices")
        if ch is not None and not ((isinstance(ch, str) and ch in REGISTRIES) or (isinstance(ch, list) and ch)):
            raise ParamsError(f"metadata.{METADATA_KEY}.checks.{name}.choices must be a non-empty list or one "
                              f"of {sorted(REGISTRIES)}")
    return checks


def check_error(check: dict[str, Any], value) -> str | None:
    """Why ``value`` is outside a declared range or choice (``None``: it is inside); a list is
    checked element by element."""
    if isinstance(value, (list, tuple)):
        return next((why for v in value if (why := check_error(check, v))), None)
    lo, hi = check.get("min"), check.get("max")
    if (lo is not None or hi is not None) and isinstance(value, (int, float)) and not isinstance(value, bool):
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"{_num(lo)}..{_num(hi)}" if lo is not None and hi is not None else \
                (f">= {_num(lo)}" if lo is not None else f"<= {_num(hi)}")
            return f"must be in {bounds}" if lo is not None and hi is not None else f"must be {bounds}"
    ch = check.get("choices")
    if ch is not None:
        valid = REGISTRIES[ch]() if isinstance(ch, str) else ch
        if value not in valid:
            return f"must be one of {', '.join(map(str, valid))}"
    return None


def _num(x) -> str:
    return format(x, "g") if isinstance(x, float) else str(x)


def declared(nb) -> dict[str, dict[str, Any]]:
    """The profiles declared in a notebook node's metadata (missing profiles are ``{}``)."""
    section = nb.metadata.get(METADATA_KEY, {}) or {}
    params = section.get("params", {}) or {}
    if not isinstance(params, dict):
        raise ParamsError(f"metadata.{METADATA_KEY}.params must be an object, got {type(params).__name__}")
    unknown = set(params) - set(PROFILES)
    if unknown:
        raise ParamsError(f"unknown parameter profile(s) {sorted(unknown)}; valid: {list(PROFILES)}")
    out = {}
    for profile in PROFILES:
        values = params.get(profile, {}) or {}
        if not isinstance(values, dict):
            raise ParamsError(f"metadata.{METADATA_KEY}.params.{profile} must be an object")
        out[profile] = dict(values)
    return out


def parameters_cell(nb) -> int | None:
    """Index of the cell tagged ``parameters``, or ``None``."""
    for i, cell in enumerate(nb.cells):
        if "parameters" in (cell.get("metadata", {}).get("tags") or []):
            return i
    return None


_NO_DEFAULT = object()  # a default that is not a literal (an expression): any value accepted


def cell_defaults(source: str) -> dict[str, Any]:
    """``{name: default}`` of a parameters cell's top-level assignments (``a, b = 0, 2`` included);
    defaults that are not literals map to a marker that accepts any value."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParamsError(f"the parameters cell is not valid Python ({exc})") from None
    out: dict[str, Any] = {}

    def literal(node):
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return _NO_DEFAULT

    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = literal(node.value) if node.value is not None else _NO_DEFAULT
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = literal(node.value)
                elif isinstance(target, (ast.Tuple, ast.List)):
                    values = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) and \
                        len(node.value.elts) == len(target.elts) else [None] * len(target.elts)
                    for t, v in zip(target.elts, values):
                        if isinstance(t, ast.Name):
                            out[t.id] = literal(v) if v is not None else _NO_DEFAULT
    return out


_KINDS = ((bool, "a bool (true/false)", "bools"), (int, "an integer", "integers"), (float, "a number", "numbers"),
          (str, "a string", "strings"), (dict, "an object", "objects"), ((list, tuple), "a list", "lists"))


def _kind(value, plural: bool = False) -> str:
    for types, one, many in _KINDS:
        if isinstance(value, types):
            if one == "a list" and value and len({_kind(v) for v in value}) == 1:
                return f"a list of {_kind(value[0], plural=True)}"
            return many if plural else one
    return type(value).__name__


def type_error(default, value) -> str | None:
    """Why ``value`` cannot stand where the parameters cell has ``default`` (``None``: it can)."""
    if default is _NO_DEFAULT or default is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
        if ok and default and len({_kind(d) for d in default}) == 1:  # homogeneous: check the elements too
            ok = not any(type_error(default[0], v) for v in value)
    else:
        ok = True
    return None if ok else f"must be {_kind(default)}"


def parse_override(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` from the command line; VALUE is read as JSON when it parses, else a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name.isidentifier():
        raise ParamsError(f"-p {text!r}: expected NAME=VALUE with NAME a Python identifier")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


def resolve(path: str | Path, profile: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parameters to inject into notebook ``path`` for ``profile``, validated against its cell."""
    import nbformat

    if profile not in PROFILES:
        raise ParamsError(f"unknown profile {profile!r}; valid: {list(PROFILES)}")
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    _check(nb, path.name, profile, declared(nb)[profile])
    _check(nb, path.name, profile, dict(overrides or {}), source="-p")
    return {**declared(nb)[profile], **(overrides or {})}


def _check(nb, name: str, profile: str, values: dict[str, Any], source: str | None = None) -> None:
    """Names and types of ``values`` against the parameters cell (``source``: '-p' for command-line
    overrides, else the notebook's ``profile``)."""
    from papermill.translators import PythonTranslator  # the notebooks are Python

    if not values:
        return
    where = f"{profile} parameters" if source is None else "parameter(s)"
    if parameters_cell(nb) is None:
        raise ParamsError(f"{name}: has {where} {sorted(values)} but no cell tagged 'parameters'")
    cell = nb.cells[parameters_cell(nb)]
    defaults = cell_defaults(cell.source)
    known = {p.name for p in PythonTranslator.inspect(cell)} | set(defaults)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParamsError(f"{name}: unknown parameter(s) {unknown}; its parameters cell defines {sorted(known)}")
    checks = declared_checks(nb)
    for key, value in values.items():
        why = type_error(defaults.get(key, _NO_DEFAULT), value) or \
            (check_error(checks[key], value) if key in checks else None)
        if why:
            shown = f"-p {key}={json.dumps(value)}" if source == "-p" else f"{profile} parameter {key}={json.dumps(value)}"
            raise ParamsError(f"{shown}: {why} in {name} (its parameters cell has {key} = "
                              f"{json.dumps(defaults[key])})")


def declare(path: str | Path, *, report: dict[str, Any] | None = None,
            smoke: dict[str, Any] | None = None) -> None:
    """Store the ``report``/``smoke`` profiles in notebook ``path``'s metadata (checked, atomic)."""
    import nbformat

    from lab._io import atomic_write
    from lab.report._fs import readable

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    section = nb.metadata.setdefault(METADATA_KEY, {})
    section["params"] = {k: dict(v) for k, v in (("report", report), ("smoke", smoke)) if v is not None}
    for profile, values in declared(nb).items():  # check before writing anything
        _check(nb, path.name, profile, values)
    atomic_write(path, lambda p: nbformat.write(nb, str(readable(p))))
