"""A long sweep stopped by Ctrl-C or SIGTERM (``lab tosca --seeds ... [--executor ray]``, a tiny smoke
configuration: MNIST-5k at 64 px on cached features, one epoch, three seeds) prints the one line that
resumes it and no traceback (exit status 130), leaves no half-written file, no lock and no scratch run
folder behind, and the printed command resumes it: the variants that had finished are kept as they
were and the sweep ends with every seed.

Each command runs as a subprocess with a hard timeout and is signalled once its first variant's result
has landed. Ctrl-C goes to the command's whole process group, as a terminal sends it; SIGTERM to the
command alone, as ``kill`` does. Under Ray the command starts its own local Ray in a private temporary
folder (``RAY_TMPDIR``), never another one running on the machine; where that Ray cannot start (a
machine too busy for its startup limit) the Ray cases skip with the reason, and the local executor's
cases check the same path through lab.executors and lab.cli.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from _report_helpers import hard_timeout

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))
ARGV = ["tosca", "--dataset", "mnist_5k", "--resolution", "64", "--inc", "5", "--epochs", "1",
        "--routings", "per-sample", "oracle", "--quiet", "--seeds", "1", "2", "3"]
FIRST_RESULT_S = 420       # until the first variant lands (Ray's startup on a busy machine included)
AFTER_SIGNAL_S = 180       # from the signal until the command has exited


def _has_ray() -> bool:
    from lab import executors

    return executors.has_ray()


@pytest.fixture
def ray_tmp():
    """A private, short Ray temporary folder (Ray's socket paths must stay under 108 characters)."""
    d = tempfile.mkdtemp(prefix="lr", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _start(argv, env) -> subprocess.Popen:
    """``lab argv`` in a session of its own (its process group is only what it starts), SIGINT at its
    default as a terminal's Ctrl-C finds it (a test runner started in the background ignores it)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        return subprocess.Popen([LAB, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=ROOT, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, old)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _left(marker: str) -> list[str]:
    """Processes whose command line names ``marker`` (the private Ray folder): what Ray left running."""
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ln.strip() and "pgrep" not in ln]


@pytest.mark.slow
@hard_timeout(FIRST_RESULT_S + 2 * AFTER_SIGNAL_S + 300)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_stopped_sweep_prints_its_resume_line_and_resumes(executor, sig, tmp_path, ray_tmp):
    if executor == "ray" and not _has_ray():
        pytest.skip("Ray is not installed (the scale extra: pip install -e '.[scale]')")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "LAB_TRACK", "MLFLOW_TRACKING_URI")}
    env.update(LAB_RUNS_DIR=str(tmp_path / "runs"), RAY_TMPDIR=ray_tmp, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    argv = [*ARGV, "--executor", executor]
    p = _start(argv, env)
    try:
        deadline = time.monotonic() + FIRST_RESULT_S
        while p.poll() is None and time.monotonic() < deadline \
                and not list((tmp_path / "runs").glob("tosca-sweep/*/variants/*.json")):
            time.sleep(0.2)
        if p.poll() is not None:
            out, err = p.communicate()
            if executor == "ray" and "did not start" in err:
                pytest.skip(f"a local Ray could not start on this machine: {err.strip().splitlines()[-1][:300]}")
            pytest.fail(f"the sweep ended (status {p.returncode}) before it was stopped:\n{out[-2000:]}{err[-3000:]}")
        assert time.monotonic() < deadline, f"no variant finished within {FIRST_RESULT_S} s"
        (folder,) = (tmp_path / "runs" / "tosca-sweep").iterdir()
        if sig == signal.SIGINT:
            os.killpg(p.pid, signal.SIGINT)       # Ctrl-C: the terminal signals the whole foreground group
        else:
            p.send_signal(signal.SIGTERM)         # kill PID
        out, err = p.communicate(timeout=AFTER_SIGNAL_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()

    # one line that resumes it, no traceback
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130 and "Traceback" not in err, f"status {p.returncode}:\n{err[-3000:]}"
    resume = (f"lab tosca: interrupted; finished tasks are saved in {folder}; resume with: "
              f"{shlex.join(['lab', *argv, '--resume', str(folder)])}")
    assert lines[-1] == resume, lines[-1]
    if executor == "local":
        assert lines == [resume], lines
    # nothing half-written: the manifest and whole variant files only (no lock, no scratch run folder)
    files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
    done = sorted(f for f in files if f.startswith("variants/"))
    assert files == ["sweep.json", *done] and 1 <= len(done) < 3, files
    for f in done:
        rows = json.loads((folder / f).read_text())
        assert isinstance(rows, list) and len(rows) == 2 and {r["routing"] for r in rows} == {"per-sample", "oracle"}
    if executor == "ray":                         # Ray's processes went with the command
        deadline = time.monotonic() + 30
        while _left(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _left(ray_tmp), _left(ray_tmp)

    # the printed command resumes it: the finished variants kept as they were, every seed at the end
    kept = {f: (folder / f).read_bytes() for f in done}
    command = shlex.split(lines[-1].split("resume with: ", 1)[1])
    assert command[0] == "lab"
    again = subprocess.run([LAB, *command[1:]], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=FIRST_RESULT_S)
    if executor == "ray" and again.returncode == 2 and "did not start" in again.stderr:
        pytest.skip("the stop was checked; the resumed sweep's local Ray could not start on this machine: "
                    f"{again.stderr.strip().splitlines()[-1][:300]}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert {f: (folder / f).read_bytes() for f in done} == kept
    import pandas as pd

    runs = pd.read_parquet(folder / "runs.parquet")
    assert sorted(runs.seed.unique()) == [1, 2, 3] and len(runs) == 3 * 2
    assert len(list((folder / "variants").glob("*.json"))) == 3 and not (folder / ".lock").exists()
