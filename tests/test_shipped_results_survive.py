"""The shipped studies survive every command run with its defaults, in a copy of the checkout.

Each command below once overwrote ``results/`` (or its own input) when run as a new user would:
``lab aware study --preset smoke`` (its old default ``--out`` was ``results/aware``), the TOSCA
study's ``python -m`` entry point and ``lab tosca study`` (default ``results/tosca``), and
``lab aware finetune --save`` (onto an existing folder, the input checkpoint included). Here every
one runs in a copy of the tracked files with no ``$LAB_RUNS_DIR``, so the defaults are the user's;
afterwards every file under ``results/`` has the same sha256 as before, and ``--save`` refused
what it must refuse with one line, within a time bound, writing nothing.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout (git ls-files)")


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The tracked files of this checkout as they are on disk (uncommitted edits included)."""
    dest = tmp_path_factory.mktemp("clone")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())
    return dest


def _run(clone: Path, args: list[str], bound: float, cache: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_RUNS_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(clone), LAB_CACHE_DIR=str(cache), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=bound)
    return p, time.perf_counter() - t0


COMMANDS = [   # (what a new user types, with its defaults; its time bound in seconds)
    (["-m", "lab", "aware", "study", "--preset", "smoke", "--quiet"], 600),
    (["-m", "lab.experiments.tosca.study", "--scenarios", "fashion_mnist_mini", "--seeds", "1993", "--epochs", "1",
      "--resolution", "32", "--baselines", "--flow-scenarios"], 900),
    (["-m", "lab", "tosca", "study", "--scenarios", "fashion_mnist_mini", "--seeds", "1993", "--epochs", "1",
      "--resolution", "32", "--baselines", "--flow-scenarios"], 900),
]


def test_commands_with_their_defaults_leave_results_unchanged(clone, tmp_path):
    before = _digests(clone / "results")
    assert any(k.startswith("aware/") for k in before) and any(k.startswith("tosca/") for k in before)
    for args, bound in COMMANDS:
        p, _ = _run(clone, args, bound, tmp_path / "cache")
        assert p.returncode == 0, f"{' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}"
        assert _digests(clone / "results") == before, f"{' '.join(args)} changed results/"
    made = sorted(p.name for p in (clone / "runs").glob("*/*study*") if p.is_dir())
    assert len(made) >= 3, f"each study got its own new runs/ folder: {made}"


def test_save_refuses_an_existing_folder_and_its_own_input(clone, tmp_path):
    cache = tmp_path / "cache"
    base = ["-m", "lab", "aware", "finetune", "--size", "smoke", "--steps", "1", "--quiet"]
    first = tmp_path / "ckpt"
    p, _ = _run(clone, [*base, "--save", str(first)], 600, cache)
    assert p.returncode == 0, p.stderr[-2000:]
    saved = _digests(first)
    assert any(k.endswith(".safetensors") for k in saved)
    for args, says in (([*base, "--save", str(first)], "--replace"),
                       ([*base, "--model", str(first), "--save", str(first), "--replace"], "--model")):
        p, seconds = _run(clone, args, 120, cache)
        last = [ln for ln in p.stderr.strip().splitlines() if ln.strip()][-1:]
        assert p.returncode == 2 and last and says in last[0], f"{args}: exit {p.returncode}\n{p.stderr[-1500:]}"
        assert seconds < 60, f"{args}: refused only after {seconds:.0f} s"
        assert _digests(first) == saved, f"{args} changed the saved checkpoint"
