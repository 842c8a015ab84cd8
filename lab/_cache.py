"""The cache root, in one place: ``$LAB_CACHE_DIR``, else ``~/.cache/continual-lab``.

Under it: ``datasets/`` (decoded datasets), ``features/`` (the feature cache, :mod:`lab.features`)
and ``aware/`` (the language model's plain copy, visual tokens, aligned projectors). Nothing is
created here; writers create their own sub-folders atomically.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root(path: str | os.PathLike | None = None) -> Path:
    """``path`` if given, else ``$LAB_CACHE_DIR``, else ``~/.cache/continual-lab``."""
    return Path(path or os.environ.get("LAB_CACHE_DIR") or Path.home() / ".cache" / "continual-lab")
