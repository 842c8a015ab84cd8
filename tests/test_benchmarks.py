"""The benchmark scripts run (tiny, on the CPU): benchmarks/gpu_check.sh (its AWARe-on-LLaVA part
with a tiny random LLaVA in bf16) and benchmarks/bench_tosca.py.
Their numbers are only meaningful on the machines they are written for; here they must execute,
print what they promise and exit with the right status."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(argv, tmp_path, timeout=240):
    env = {**os.environ, "PYTHON": sys.executable, "LAB_RUNS_DIR": str(tmp_path / "runs"),
           "LAB_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_gpu_check_runs_tiny_on_the_cpu(tmp_path):
    p = _run(["bash", "benchmarks/gpu_check.sh", "--device", "cpu", "--tiny", "--target", "1e9"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert any(l.startswith("[1] vit_tiny_patch16_224 @ 32px") and "images/s" in l and "% of 989 TFLOP/s" in l
               for l in lines), p.stdout
    assert any(l.startswith("[2] TOSCA (eager)") and "2 tasks x 1 epochs" in l for l in lines), p.stdout
    assert any(l.startswith("[3] AWARe on tiny") and "bfloat16, 16 image tokens" in l and "10 AWARe steps" in l
               and "retained rows bit-identical" in l for l in lines), p.stdout
    assert "end-to-end / feature pass" in p.stdout and lines[-1].startswith("PASS")


def test_gpu_check_fails_when_the_ratio_misses_the_target(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert gpu_check.main(["--device", "cpu", "--tiny", "--target", "1.0", "--llava-steps", "1"]) == 1   # TOSCA never costs nothing
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("FAIL")
    assert gpu_check.flops_per_image(gpu_check.random_vit("vit_tiny_patch16_224", 32, "cpu")) > 0


@pytest.mark.slow
def test_bench_tosca_runs_tiny_on_the_cpu(tmp_path):
    p = _run([sys.executable, "benchmarks/bench_tosca.py", "--synthetic", "--gpu-train", "200", "--gpu-test", "100",
              "--vit", "vit_tiny_patch16_224", "--res", "32", "--epochs", "1"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "end-to-end / feature pass" in p.stdout and "speed-up" in p.stdout
    assert "ratio adapters / LuCA per task:" in p.stdout


@pytest.mark.slow
def test_bench_tosca_engines_prints_a_ratio_with_its_interval():
    # the user's feature cache (the offline default's features, shared with the notebooks' tests)
    p = subprocess.run([sys.executable, "benchmarks/bench_tosca_engines.py", "--seeds", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert sum(line.startswith("seed ") for line in lines) == 4, p.stdout
    assert "eager / fused" in lines[-1] and "[" in lines[-1] and lines[-1].endswith("over 2 seeds"), p.stdout
