"""Does this code, on this machine, still give the shipped AWARe study's numbers? `lab aware check
--steps 4` re-runs the first 4 training steps of the first finished full fine-tuning run of
results/aware from a fresh cache (the shipped projector seeds it) and compares each step's loss with
the stored run's. The whole run, answers and all (2-6 minutes), is `lab aware check` without --steps."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STUDY = ROOT / "results" / "aware"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not any(STUDY.glob("runs/full-full-*.json")), reason="no finished full fine-tuning run")]


def test_the_code_still_gives_the_shipped_losses(tmp_path):
    env = {**os.environ, "LAB_CACHE_DIR": str(tmp_path / "cache"), "LAB_RUNS_DIR": str(tmp_path / "runs")}
    p = subprocess.run([sys.executable, "-m", "lab", "aware", "check", "--out", str(STUDY), "--quiet",
                        "--device", "cpu", "--steps", "4"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=1800)
    out = p.stdout + p.stderr
    steps = re.findall(r"^\s+step\s+(\d+): stored loss (\S+), live (\S+)", p.stdout, flags=re.M)
    assert len(steps) == 4, out[-3000:]
    assert p.returncode == 0 and "identical" in p.stdout, out[-3000:]
