"""Run directories: every run writes into its own, never-shared folder.

``new_run_dir`` creates ``<root>/<kind>/<UTC timestamp>-<name>-<pid>-<random>`` with
``mkdir(exist_ok=False)``, so two runs started in the same second (or in two processes) can never
write into the same place. ``root`` defaults to ``$LAB_RUNS_DIR``, else ``runs/`` at the top of the
project checkout the current folder is in (notebooks run from ``notebooks/``), else ``./runs``.
"""
from __future__ import annotations

import os
import platform
import re
import secrets
import sys
import time
from pathlib import Path


def runs_root(root: str | os.PathLike | None = None) -> Path:
    if root or os.environ.get("LAB_RUNS_DIR"):
        return Path(root or os.environ["LAB_RUNS_DIR"])
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").exists() and (folder / "lab" / "__init__.py").exists():
            return folder / "runs"
    return here / "runs"


def new_run_dir(kind: str, name: str, root: str | os.PathLike | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    base = runs_root(root) / kind
    base.mkdir(parents=True, exist_ok=True)
    while True:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = base / f"{stamp}-{safe}-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            path.mkdir(exist_ok=False)
            return path
        except FileExistsError:  # astronomically unlikely; draw again
            continue


def versions() -> dict[str, str]:
    """Versions of everything that can change a number, saved with every result."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine()}
    for pkg in ("continual-lab", "torch", "torchvision", "timm", "transformers", "peft", "numpy", "pandas"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    try:
        import torch

        out["torch_threads"] = str(torch.get_num_threads())
        out["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        pass
    return out
