"""An installed package is whole: the wheel built from this checkout, installed into a fresh
venv outside it, finds every data file it reads and runs `lab datasets` and a small TOSCA
scenario from a folder that is not the checkout.

The fresh venv gets its other dependencies (torch, timm, ...) from the project venv's
site-packages through a ``.pth`` line that names that folder: a plain path entry does not run
the ``.pth`` files in it, so the project's editable install of ``lab`` stays invisible and
``lab`` can only come from the wheel. Every subprocess has a hard timeout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from _report_helpers import ROOT, hard_timeout

pytestmark = [pytest.mark.slow, hard_timeout(300)]

STEP_TIMEOUT_S = 120


def _run(argv, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                         timeout=STEP_TIMEOUT_S, **kw)
    assert res.returncode == 0, f"{argv}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _data_files() -> set[str]:
    """Every file under lab/ that is not Python source: what the package reads at run time."""
    try:
        tracked = subprocess.run(["git", "ls-files", "lab"], cwd=ROOT, capture_output=True, text=True,
                                 timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        tracked = [str(p.relative_to(ROOT)) for p in (ROOT / "lab").rglob("*") if p.is_file()]
    return {f for f in tracked if not f.endswith((".py", ".pyc")) and "__pycache__" not in f}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Build the wheel from a copy of the checkout's sources, install it into a fresh venv."""
    base = tmp_path_factory.mktemp("packaging")
    src = base / "src"
    shutil.copytree(ROOT / "lab", src / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    dist = base / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src])
    wheel = next(dist.glob("continual_lab-*.whl"))
    venv = base / "venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel])
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (Path(purelib) / "continual_lab_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = base / "work"  # not the checkout: nothing there to fall back on
    work.mkdir()
    env = {**os.environ, "LAB_RUNS_DIR": str(base / "runs"), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    return {"wheel": wheel, "venv": venv, "python": python, "work": work, "env": env}


def test_wheel_holds_every_data_file(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    missing = sorted(_data_files() - names)
    assert not missing, f"not in the wheel (declare them in [tool.setuptools.package-data]): {missing}"


def test_installed_lab_comes_from_the_wheel_and_reads_its_data(installed):
    probe = ("import json, lab\n"
             "from lab.data.datasets import load_dataset\n"
             "from lab.experiments.aware.run.tasks import probe\n"
             "from lab.report.pipeline import TEMPLATES, TEMPLATE\n"
             "ds = load_dataset('fashion_mnist_mini')\n"  # checks the packaged file's sha256
             "print(json.dumps({'lab': lab.__file__, 'mini': [len(ds.train), len(ds.test)],\n"
             "                  'probe': len(probe().test.questions),\n"
             "                  'template': (TEMPLATES / TEMPLATE / 'index.html.j2').is_file()}))")
    res = _run([installed["python"], "-c", probe], cwd=installed["work"], env=installed["env"])
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(seen["lab"]).is_relative_to(installed["venv"]), seen["lab"]
    assert seen["mini"] == [6000, 1000] and seen["probe"] > 0 and seen["template"]


def test_installed_cli_lists_datasets_and_runs_a_small_tosca_scenario(installed):
    lab = installed["venv"] / "bin" / "lab"
    res = _run([lab, "datasets"], cwd=installed["work"], env=installed["env"])
    row = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("fashion_mnist_mini"))
    assert " yes " in row and str(installed["venv"]) in row
    # 32 px: the first pass over the 7,000 images stays seconds long on a cold cache and one thread
    res = _run([lab, "tosca", "--dataset", "fashion_mnist_mini", "--init", "5", "--inc", "5", "--resolution", "32",
                "--epochs", "1", "--quiet"], cwd=installed["work"], env=installed["env"])
    assert "tosca per-sample" in " ".join(res.stdout.split()), res.stdout
    assert not (installed["work"] / "runs").exists()  # runs went to $LAB_RUNS_DIR
