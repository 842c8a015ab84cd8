"""Atomic writes with the usual file modes (mkstemp makes 0600 files; reports are for reading), and
the checkout the reports are built from."""
from __future__ import annotations

import os
from pathlib import Path


def readable(path: Path) -> Path:
    """Give ``path`` the mode a plain ``open()``/``mkdir()`` would have given it under the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temp file + rename, via :func:`lab._io.atomic_write`)."""
    from lab._io import atomic_write

    return atomic_write(path, lambda p: readable(p).write_text(text, encoding="utf-8"))


def repo_root() -> Path:
    """The checkout ``lab`` was installed from when it has ``notebooks/``, else the working dir."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "notebooks").is_dir() else Path.cwd()
