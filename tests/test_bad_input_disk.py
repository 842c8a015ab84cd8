"""A full disk, a broken tracker store, damaged study files and a stopped command each cost ONE line
that says what happened and how to go on, with nothing half-written (lab/_io.py, lab/tracking.py,
lab/experiments/tosca/{cli,study}.py).

The faults are real: a tmpfs of a few megabytes mounted for the test (root only; the tests that
need one skip with the reason where mounting is refused) fills during `lab tosca`, the feature
cache, the tracker's logging and `lab tosca study`; tracker stores and study variant files are
damaged on disk; SIGINT and SIGTERM reach a real `lab` process. Every command runs as a subprocess
with a timeout.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from _report_helpers import hard_timeout

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))
TOSCA = ["tosca", "--resolution", "32", "--epochs", "1", "--quiet"]   # features cached after the first run
STUDY = ["tosca", "study", "--scenarios", "fashion_mnist_mini", "--seeds", "1993", "--baselines", "ncm",
         "--flow-scenarios", "--epochs", "1", "--resolution", "32", "--executor", "local"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_TRACK", "MLFLOW_TRACKING_URI", "LAB_RUNS_DIR")}
    return {**env, "PYTHONWARNINGS": "ignore", **extra}


def _lab(argv, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([LAB, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def _one_line(p: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    return lines[0]


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(size) -> folder``: a tmpfs of ``size`` (e.g. '20m'), unmounted afterwards."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                           text=True, timeout=30)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here to fill ({(p.stderr or p.stdout).strip() or p.returncode})")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _resize(where: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True, timeout=30)


def _no_partial_files(folder: Path) -> None:
    """Nothing half-written: no temporary file, every tensor file with its checksum."""
    assert not [p for p in folder.rglob("*") if p.name.startswith(".") and p.name.endswith(".tmp")]
    for f in folder.rglob("*.safetensors"):
        from lab import _io

        assert (f.parent / (f.name + ".sha256")).read_text().strip() == _io.sha256_file(f), f


# --- a full disk -------------------------------------------------------------------------------------
@pytest.mark.slow
@hard_timeout(900)
def test_a_full_disk_during_lab_tosca_is_one_line_and_the_run_resumes(tmpfs, tmp_path):
    disk = tmpfs("20m")                  # the config and task 0's module (~15 MB) fit; task 1's does not
    env = _env(LAB_RUNS_DIR=str(disk), LAB_MIN_FREE_MB="1")    # past the start-up check: the disk fills later
    line = _one_line(_lab(TOSCA, env))
    (folder,) = (disk / "tosca").iterdir()
    assert line.startswith(f"lab tosca: error: {folder}/modules/task001.safetensors: no space left on the disk "
                           f"(it needs about "), line
    assert "free on " in line and f"resume with: lab tosca --resume {folder}" in line
    _no_partial_files(folder)
    assert not (folder / "stages" / "stage001.json").exists() and not (folder / ".lock").exists()
    _resize(disk, "300m")
    p = _lab([*TOSCA, "--resume", str(folder)], env)
    assert p.returncode == 0, p.stderr[-3000:]
    whole = _lab(TOSCA, _env(LAB_RUNS_DIR=str(tmp_path / "runs")))
    assert whole.returncode == 0, whole.stderr[-3000:]
    table = lambda out: [ln for ln in out.splitlines() if ln.lstrip().startswith("tosca ")]  # noqa: E731
    assert table(p.stdout) == table(whole.stdout) and table(whole.stdout)   # the same numbers as a whole run


@pytest.mark.slow
@hard_timeout(600)
def test_a_full_feature_cache_is_one_line(tmpfs, tmp_path):
    cache = tmpfs("2m")                  # the test split's features at 1280 floats each: ~5 MB
    p = _lab(["features", "--resolution", "36", "--splits", "test", "--quiet", "--cache-dir", str(cache)],
             _env(LAB_MIN_FREE_MB="1", LAB_RUNS_DIR=str(tmp_path / "runs")))
    line = _one_line(p)
    assert line.startswith(f"lab features: error: {cache}/") and ": no space left on the disk (it needs about" in line
    _no_partial_files(cache)
    assert not list(cache.rglob("*.safetensors"))


@pytest.mark.slow
@hard_timeout(600)
def test_a_full_tracker_store_is_one_line_and_the_store_still_reads(tmpfs, tmp_path):
    store = tmpfs("256k") / "mlruns"     # the experiment fits; a run's metrics, one file each, do not
    env = _env(LAB_RUNS_DIR=str(tmp_path / "runs"), MLFLOW_TRACKING_URI=store.as_uri())
    line = _one_line(_lab([*TOSCA, "--track", "mlflow"], env))
    (folder,) = (tmp_path / "runs" / "tosca").iterdir()
    assert (f"lab tosca: error: --track mlflow: the run finished (results in {folder}), but the tracking store "
            f"{store} filled up while logging it: it needs about") in line
    assert "the partly logged run was removed" in line and (folder / "summary.json").is_file()
    from lab import tracking

    tracking.check_store(store)          # reads back: no half-logged run
    code = ("import mlflow; c = mlflow.MlflowClient(tracking_uri=%r); e = c.get_experiment_by_name('lab tosca'); "
            "print(len(c.search_runs([e.experiment_id])))" % store.as_uri())
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=_env(MLFLOW_ALLOW_FILE_STORE="true"))
    assert p.stdout.strip() == "0", p.stderr[-2000:]


@pytest.mark.slow
@hard_timeout(900)
def test_a_full_disk_during_lab_tosca_study_names_the_resume_command(tmpfs):
    disk = tmpfs("12k")                  # a variant file or two, then full
    out = disk / "study"
    env = _env(LAB_MIN_FREE_MB="0")
    line = _one_line(_lab([*STUDY, "--out", str(out)], env))
    assert line.startswith(f"lab tosca study: error: {out}/variants/") and "no space left on the disk" in line
    resume = line.split("resume with: ", 1)[1]
    assert resume == f"lab tosca study {' '.join(STUDY[2:])} --out {out}", resume
    _no_partial_files(disk)
    finished = len(list(out.glob("variants/*/*.json")))
    _resize(disk, "50m")
    p = _lab(resume.split()[1:], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("done earlier, skipped") == finished and (out / "summary.csv").is_file()


# --- the tracker store, read before any work ---------------------------------------------------------
def _store(folder: Path) -> tuple[Path, Path]:
    """A small MLflow folder store: experiment 'lab tosca' with one finished run (a metric, a param)."""
    code = f"""
import mlflow
from mlflow.entities import Metric
c = mlflow.MlflowClient(tracking_uri={folder.as_uri()!r})
e = c.create_experiment("lab tosca")
r = c.create_run(e, run_name="earlier").info.run_id
c.log_batch(r, metrics=[Metric("A_b", 91.5, 1, 0), Metric("A_b", 92.5, 2, 1)])
c.log_param(r, "seed", "1993")
c.set_terminated(r, "FINISHED")
print(e, r)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=_env(MLFLOW_ALLOW_FILE_STORE="true"))
    exp, run = p.stdout.split()
    return folder / exp, folder / exp / run


def _write(path: Path, text: str | None) -> Path:
    """``path`` rewritten with ``text`` (None: removed); returns it."""
    path.unlink() if text is None else path.write_text(text)
    return path


BROKEN_STORES = [  # (what, how the store is damaged: f(experiment folder, run folder) -> the file named)
    ("run meta.yaml empty", lambda e, r: _write(r / "meta.yaml", "")),
    ("run meta.yaml cut short", lambda e, r: _write(r / "meta.yaml", "artifact_uri: fi")),
    ("run meta.yaml missing", lambda e, r: _write(r / "meta.yaml", None)),
    ("metric history cut short", lambda e, r: _write(r / "metrics" / "A_b", "1 91.5 0\n17")),
    ("experiment meta.yaml empty", lambda e, r: _write(e / "meta.yaml", "")),
]


@hard_timeout(600)
@pytest.mark.parametrize("what,damage", BROKEN_STORES, ids=[w for w, _ in BROKEN_STORES])
def test_an_unreadable_tracker_store_is_named_before_any_run(what, damage, tmp_path):
    store = tmp_path / "mlruns"
    exp, run = _store(store)
    named = damage(exp, run)
    runs = tmp_path / "runs"
    line = _one_line(_lab([*TOSCA, "--track", "mlflow"], _env(LAB_RUNS_DIR=str(runs), MLFLOW_TRACKING_URI=str(store))))
    assert line.startswith(f"lab tosca: error: --track mlflow: the tracking store {store} does not read back: {named} is")
    assert f"rm -r {exp if named == exp / 'meta.yaml' else run}" in line, line
    assert not runs.exists() or not any(runs.rglob("config.json"))      # no run started


# --- lab tosca study reads its variant files back verified --------------------------------------------
@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A small study (one seed, TOSCA's four initialisations and NCM), finished."""
    out = tmp_path_factory.mktemp("study") / "study"
    p = _lab([*STUDY, "--out", str(out)], _env(), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def _edit_number(text: str) -> str:
    rec = json.loads(text)
    rec["rows"][0]["avg_inc_acc"] += 1.0
    return json.dumps(rec)


VARIANT_DAMAGE = [  # (what, the new text of one TOSCA variant's file from (its text, the NCM variant's text))
    ("empty list", lambda own, other: "[]"),
    ("an edited number", lambda own, other: _edit_number(own)),
    ("another variant's file", lambda own, other: other),
    ("truncated", lambda own, other: own[: len(own) // 2]),
    ("rows alone (no record)", lambda own, other: json.dumps(json.loads(own)["rows"])),
    ("random bytes", lambda own, other: random.Random(0).randbytes(300).decode("latin-1")),
    ("a JSON null", lambda own, other: "null"),
]


@pytest.mark.slow
@hard_timeout(900)
def test_damaged_study_variant_files_are_refused_by_name(study, tmp_path):
    jobs = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        for i, (what, damage) in enumerate(VARIANT_DAMAGE):
            out = tmp_path / f"copy{i}"
            shutil.copytree(study, out)
            (own,) = out.glob("variants/*/tosca-*-reference-reference-*.json")
            (other,) = out.glob("variants/*/ncm-*.json")
            own.write_bytes(damage(own.read_text(), other.read_text()).encode("latin-1"))
            before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
            t0 = time.perf_counter()
            jobs[what] = (own, out, before, t0, pool.submit(_lab, [*STUDY, "--out", str(out)], _env(), 300))
        for what, (own, out, before, t0, job) in jobs.items():
            p = job.result()
            line = _one_line(p)
            assert line.startswith(f"lab tosca study: error: {own}: ") and line.endswith(
                "remove it and the variant runs again"), (what, line)
            assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before, what   # nothing ran


def test_the_study_names_what_is_wrong_with_a_variant_file():
    """The checks themselves, on hand-made records (no run): each refusal says what it found."""
    from lab.experiments.tosca import study as S
    from lab.experiments.tosca.run import RunConfig

    cfg = RunConfig(method="ncm", seed=1993, epochs=1)
    rows = [{"scenario": "fashion_mnist_mini", "seed": 1993, "method": "ncm", "routing": "single", "avg_inc_acc": 90.0}]
    good = {"config": json.loads(json.dumps(cfg.to_dict())), "rows": rows}
    good["sha256"] = S._variant_digest(good)
    assert S.check_variant(good, cfg, "f.json") == rows
    cases = [([], "not a variant result of this study (a JSON array"),
             ({**good, "rows": [{**rows[0], "avg_inc_acc": 91.0}]}, "differ from the sha256 recorded"),
             ({**good, "config": {**good["config"], "seed": 1994}}, "differ from the sha256 recorded")]
    other = {**good, "config": {**good["config"], "seed": 1994}}
    other["sha256"] = S._variant_digest(other)
    cases.append((other, "holds another variant's result: seed 1994 (this variant: 1993)"))
    empty = {**good, "rows": []}
    empty["sha256"] = S._variant_digest(empty)
    cases.append((empty, "its rows are not one per routing (single) of ncm on fashion_mnist_mini, seed 1993"))
    for record, fragment in cases:
        with pytest.raises(ValueError, match="^f.json: ") as info:
            S.check_variant(record, cfg, "f.json")
        assert fragment in str(info.value), str(info.value)


# --- a stopped command says how to resume it ------------------------------------------------------------
def _stop(argv: list[str], env: dict, ready, sig: int, timeout: float = 120) -> subprocess.CompletedProcess:
    """Start `lab argv` (SIGINT at its default, as a terminal's Ctrl-C finds it), send ``sig`` once
    ``ready()`` holds (and a moment more), return what it printed."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        p = subprocess.Popen([LAB, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=ROOT)
    finally:
        signal.signal(signal.SIGINT, old)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        deadline = time.monotonic() + timeout
        while not ready() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)
        p.send_signal(sig)
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.slow
@hard_timeout(300)
def test_sigterm_during_lab_tosca_prints_the_resume_command(tmp_path):
    env = _env(LAB_RUNS_DIR=str(tmp_path))
    p = _stop(["tosca", "--resolution", "32", "--epochs", "100000", "--quiet"], env,
              lambda: bool(list(tmp_path.glob("tosca/*/config.json"))), signal.SIGTERM)
    (folder,) = tmp_path.glob("tosca/*")
    line = _one_line(p, 130)
    assert line == (f"lab tosca: interrupted; finished tasks are saved in {folder}; resume with: lab tosca "
                    f"--resolution 32 --epochs 100000 --quiet --resume {folder}"), line
    assert not (folder / ".lock").exists()


@pytest.mark.slow
@hard_timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_study_prints_the_resume_command(sig, tmp_path):
    out = tmp_path / "study"
    argv = [*STUDY[:-6], "--epochs", "100000", "--resolution", "32", "--executor", "local", "--out", str(out)]
    p = _stop(argv, _env(), lambda: bool(list(out.glob("variants/*"))), sig)
    line = _one_line(p, 130)
    assert line == (f"lab tosca study: interrupted; finished variants are kept in {out}/variants/ and skipped: resume "
                    f"with: lab tosca study {' '.join(argv[2:-2])} --out {out}"), line


@pytest.mark.slow
@hard_timeout(900)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_aware_study_prints_the_resume_command_and_resumes(sig, tmp_path):
    """The AWARe study stopped once its first run file landed: one line naming where the finished
    runs are and the command that resumes it (without --replace); the rerun skips what was kept."""
    out = tmp_path / "aware"
    argv = ["aware", "study", "--preset", "smoke", "--executor", "local", "--quiet", "--replace",
            "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]
    p = _stop(argv, _env(), lambda: bool(list(out.glob("runs/*.json"))), sig, timeout=600)
    line = _one_line(p, 130)
    assert line == (f"lab aware study: interrupted; finished runs are kept in {out}/runs/ and skipped: resume with: "
                    f"lab aware study --preset smoke --executor local --quiet --cache-dir {tmp_path / 'cache'} "
                    f"--out {out}"), line
    kept = {f.name: f.read_bytes() for f in out.glob("runs/*.json")}
    assert kept and not list(out.glob("runs/.*"))   # no half-written run file
    status = _lab(line.split("resume with: ", 1)[1].split()[1:] + ["--status"], _env())
    assert status.returncode == 0, status.stderr[-2000:]
    assert all(f.read_bytes() == b for f in out.glob("runs/*.json") if (b := kept.get(f.name)) is not None)


# --- weights files that are pickles ---------------------------------------------------------------------
@hard_timeout(600)
@pytest.mark.parametrize("command", [["tosca", "--epochs", "1"], ["features", "--splits", "test"]], ids=["tosca", "features"])
@pytest.mark.parametrize("content", ["plain", "code"])
def test_a_pickle_given_as_weights_is_one_line(command, content, tmp_path):
    f = tmp_path / "weights.pkl"
    obj = {"w": [1.0, 2.0]} if content == "plain" else {"w": os.getcwd, "x": slice(1)}   # a pickle carrying code
    f.write_bytes(pickle.dumps(obj))
    line = _one_line(_lab([*command, "--weights", str(f)], _env(LAB_RUNS_DIR=str(tmp_path / "runs")), timeout=300))
    assert f"{f} is not a loadable weights file" in line and "lab never runs" in line, line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("config.json"))
