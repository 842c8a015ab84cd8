"""Reading a shipped study's manifest and the tables it names, verified: one line naming the file.

A study folder (``results/tosca``, ``results/aware``) holds a ``manifest.json`` that records the
sha256 of every table it ships (``"sha256": {"runs.csv": "<hex>", ...}``). A reader goes through
:func:`read`, :func:`verify` and :func:`read_csv_table`, so that

* random bytes or a truncated ``manifest.json`` (not UTF-8, invalid JSON, not a JSON object),
* a manifest naming a file outside its own folder (an absolute path, ``..``, a link leading out),
* a table missing, changed or truncated since the study wrote it (its sha256 differs), or a
  manifest that records no sha256 for it,
* a table that is not CSV, lacks a column the views read, or has no rows where rows are required

each end in one :class:`BadShipped` line naming the file (never a half-rendered study).
"""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Iterable, Mapping

from lab._io import CorruptFile, sha256_file


class BadShipped(CorruptFile):
    """A shipped study's manifest or one of its tables fails its check; the message names the file."""


def read(path, *, fix: str = "") -> dict:
    """The manifest at ``path`` as a dict (one line naming the file when it is not one)."""
    path = Path(path)
    hint = f"; {fix}" if fix else ""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BadShipped(f"{path}: missing{hint}") from None
    except OSError as exc:
        raise BadShipped(f"{path}: cannot be read ({exc.strerror or exc}){hint}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadShipped(f"{path}: not a JSON manifest (not UTF-8 text: random bytes?){hint}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadShipped(f"{path}: not a JSON manifest (invalid JSON at line {exc.lineno} column {exc.colno}: "
                         f"{exc.msg}; truncated?){hint}") from None
    if not isinstance(obj, dict):
        kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(obj), "null")
        raise BadShipped(f"{path}: not a manifest (a JSON {kind}, not an object){hint}")
    return obj


def member(folder, name, manifest_path) -> Path:
    """``folder/name`` for a file name a manifest lists: a relative path inside ``folder`` only
    (absolute paths, ``..`` and links that lead out of the folder are refused)."""
    folder = Path(folder)
    if not isinstance(name, str) or not name or "\x00" in name:
        raise BadShipped(f"{manifest_path}: lists {name!r}, which is not a file name")
    parts = PurePosixPath(name).parts
    if (PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive
            or ".." in parts or ".." in PureWindowsPath(name).parts or "\\" in name):
        raise BadShipped(f"{manifest_path}: lists {name!r}, which is not a file inside {folder} "
                         f"(a manifest names its own folder's files only: no absolute path, no '..')")
    path = folder / name
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):   # a link loop
        inside = False
    if not inside:
        raise BadShipped(f"{manifest_path}: lists {name!r}, which leads out of {folder} (a link?); "
                         f"a manifest names its own folder's files only")
    return path


def names(manifest: Mapping, key: str, manifest_path) -> list[str]:
    """``manifest[key]``: a list of file names (one line when it is missing or not one)."""
    value = manifest.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadShipped(f"{manifest_path}: its {key!r} must be a list of file names (got {type(value).__name__})")
    return value


def verify(folder, manifest: Mapping, manifest_path, files: Iterable[str], *, fix: str = "") -> dict[str, Path]:
    """Every file in ``files`` (and every one ``manifest['sha256']`` names) is inside ``folder``,
    present and has the sha256 the manifest records; returns name -> path."""
    hint = f"; {fix}" if fix else ""
    digests = manifest.get("sha256")
    if not isinstance(digests, dict):
        raise BadShipped(f"{manifest_path}: records no sha256 of its tables (written by an older version?){hint}")
    out = {}
    for name in dict.fromkeys([*files, *digests]):
        path = member(folder, name, manifest_path)
        want = digests.get(name)
        if not isinstance(want, str) or len(want) != 64:
            raise BadShipped(f"{manifest_path}: records no sha256 for {name}{hint}")
        if not path.is_file():
            raise BadShipped(f"{path}: missing (its manifest {manifest_path} lists it){hint}")
        try:
            got = sha256_file(path)
        except OSError as exc:
            raise BadShipped(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if got != want.lower():
            raise BadShipped(f"{path}: sha256 {got[:12]}… differs from the {want[:12]}… its manifest records "
                             f"(changed or truncated since the study wrote it){hint}")
        out[name] = path
    return out


def digests(folder, files: Iterable[str]) -> dict[str, str]:
    """name -> sha256 of each file in ``folder`` (what a writer records in its manifest)."""
    return {name: sha256_file(member(folder, name, Path(folder) / "manifest.json")) for name in files}


def read_csv_table(path, *, columns: Iterable[str] = (), rows: bool = False, **kw):
    """A CSV table (exact floats, :func:`lab._io.read_csv`) with at least ``columns`` and, with
    ``rows``, at least one row; otherwise one line naming the file."""
    import pandas as pd

    from lab._io import read_csv

    path = Path(path)
    try:
        df = read_csv(path, **kw)
    except pd.errors.EmptyDataError:
        raise BadShipped(f"{path}: empty (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadShipped(f"{path}: not a readable CSV table ({first})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise BadShipped(f"{path}: lacks the column(s) {', '.join(missing)}")
    if rows and df.empty:
        raise BadShipped(f"{path}: has no rows")
    return df
