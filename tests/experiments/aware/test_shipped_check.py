"""Does this code, on this machine, still give the shipped AWARe study's answers? `lab aware check`
re-runs the first finished full fine-tuning run of results/aware from a fresh cache (the shipped
projector seeds it) and compares every answer with the stored run's (at least 99 % the same in every set). Minutes on one core: the one
long test in `make test`, because a study whose numbers the code no longer gives is not a result."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STUDY = ROOT / "results" / "aware"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not any(STUDY.glob("runs/full-full-*.json")), reason="no finished full fine-tuning run")]


def test_the_code_still_gives_the_shipped_answers(tmp_path):
    env = {**os.environ, "LAB_CACHE_DIR": str(tmp_path / "cache"), "LAB_RUNS_DIR": str(tmp_path / "runs")}
    p = subprocess.run([sys.executable, "-m", "lab", "aware", "check", "--out", str(STUDY), "--quiet",
                        "--device", "cpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    out = p.stdout + p.stderr
    import re

    sets = re.findall(r"^\s+(\S+)\s+(\d+)/(\d+) answers the same", p.stdout, flags=re.M)
    assert sets and p.returncode in (0, 1), out[-3000:]
    # Bit-identical is the aim (exit 0). Measured: a re-run of the seed-0 full fine-tuning run agreed on
    # 1,618 of 1,620 answers (easy-VQA 598/600, near-ties flipped; the cause is not found yet), so the
    # test asks for at least 99 % of every set's answers: a code change that alters training or scoring
    # flips far more than that.
    for name, same, n in sets:
        assert int(same) >= 0.99 * int(n), f"{name}: only {same}/{n} answers the same\n" + out[-3000:]
