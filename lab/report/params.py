"""Where a notebook's report and smoke parameters live, and their validation.

A notebook declares its parameter profiles in its own metadata, so the notebook is the one
source of truth and moves as one file::

    "metadata": {"continual-lab": {"params": {
        "report": {"resolution": 224, "n_tasks": 5},   # `lab report`        (full size)
        "smoke":  {"resolution": 64,  "n_tasks": 2}    # tests, `--params smoke` (well under a minute)
    }}}

Values override the defaults of the cell tagged ``parameters``; a profile left out, or empty,
means "the cell's defaults". :func:`declare` writes this block into a notebook file. Names are
checked against that cell before anything runs, since papermill itself only warns about a
parameter the notebook does not have.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROFILES = ("report", "smoke")
METADATA_KEY = "continual-lab"


class ParamsError(ValueError):
    """A notebook's parameters are declared wrongly or do not match its ``parameters`` cell."""


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


def parse_override(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` from the command line; VALUE is read as JSON when it parses, else a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name.isidentifier():
        raise ParamsError(f"expected NAME=VALUE, got {text!r}")
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
    values = {**declared(nb)[profile], **(overrides or {})}
    _check(nb, path.name, profile, values)
    return values


def _check(nb, name: str, profile: str, values: dict[str, Any]) -> None:
    from papermill.translators import PythonTranslator  # the notebooks are Python

    if not values:
        return
    if parameters_cell(nb) is None:
        raise ParamsError(f"{name}: has {profile} parameters {sorted(values)} but no cell tagged 'parameters'")
    known = {p.name for p in PythonTranslator.inspect(nb.cells[parameters_cell(nb)])}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParamsError(f"{name}: unknown parameter(s) {unknown}; its parameters cell defines {sorted(known)}")


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
