import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lab import _io, _validate, runs


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def boom(p):
        p.write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        _io.atomic_write(target, boom)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temp file left behind


def test_tensors_round_trip_and_truncation_detected(tmp_path):
    path = tmp_path / "t.safetensors"
    _io.save_tensors(path, {"a": torch.arange(6.0).view(2, 3)}, {"k": "v"})
    tensors, meta = _io.load_tensors(path)
    assert torch.equal(tensors["a"], torch.arange(6.0).view(2, 3)) and meta == {"k": "v"}
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(_io.CorruptFile, match="sha256"):
        _io.load_tensors(path)
    (tmp_path / "t.safetensors.sha256").unlink()
    with pytest.raises(_io.CorruptFile, match="sidecar"):
        _io.load_tensors(path)


def _mk(root):
    return str(runs.new_run_dir("tosca", "same name", root))


def test_run_dirs_never_collide_across_processes(tmp_path):
    with mp.get_context("spawn").Pool(2) as pool:
        dirs = pool.map(_mk, [tmp_path] * 8)
    dirs += [_mk(tmp_path) for _ in range(8)]
    assert len(set(dirs)) == 16


def test_versions_record_the_stack():
    v = runs.versions()
    assert {"python", "torch", "timm"} <= set(v)


# --- run locks: stale, empty and garbage locks ------------------------------------------------------
def _folder(tmp_path, lock_text=None):
    folder = tmp_path / "run"
    folder.mkdir()
    if lock_text is not None:
        (folder / ".lock").write_text(lock_text)
    return folder


def test_lock_holds_the_pid_and_blocks_a_live_holder(tmp_path):
    folder = _folder(tmp_path)
    lock = runs.lock(folder)
    assert lock.read_text().strip() == str(os.getpid()) and runs.active() == folder
    assert [p.name for p in folder.iterdir()] == [".lock"]  # no temp file left
    lock.write_text(f"{os.getppid()}\n")  # a live process that started before the lock
    with pytest.raises(runs.RunLocked, match=rf"in use by process {os.getppid()}.*rm {folder}/.lock"):
        runs.lock(folder)


@pytest.mark.parametrize("text", ["", "\n", "garbage", "-5", "0"])
def test_empty_or_garbage_lock_is_reported_with_how_to_clear_it(tmp_path, text):
    folder = _folder(tmp_path, text)
    with pytest.raises(runs.RunLocked, match=rf"unreadable lock .*rm {folder}/.lock"):
        runs.check_unlocked(folder)
    with pytest.raises(runs.RunLocked, match="unreadable lock"):
        runs.lock(folder)
    (folder / ".lock").unlink()  # what the message says to do
    assert runs.lock(folder).read_text().strip() == str(os.getpid())


def test_stale_locks_are_replaced(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = _folder(tmp_path, f"{dead.pid}\n")  # process gone
    assert runs.lock_holder(folder / ".lock") == ("stale", dead.pid)
    assert runs.lock(folder).read_text().strip() == str(os.getpid())


def test_a_reused_pid_younger_than_the_lock_is_stale(tmp_path):
    if not Path("/proc/self/stat").exists():
        pytest.skip("process start times come from /proc")
    young = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        folder = _folder(tmp_path, f"{young.pid}\n")
        old = time.time() - 3600
        os.utime(folder / ".lock", (old, old))  # the lock predates the process now holding that PID
        assert runs.lock_holder(folder / ".lock") == ("stale", young.pid)
        os.utime(folder / ".lock")  # written after the process started: it is the holder
        assert runs.lock_holder(folder / ".lock") == ("alive", young.pid)
    finally:
        young.kill()
        young.wait()


def test_check_root_creates_nothing(tmp_path):
    root = tmp_path / "not" / "yet"
    assert runs.check_root("tosca", root) == root / "tosca"
    assert not (tmp_path / "not").exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, so the folder cannot be created"):
        runs.check_root("tosca", tmp_path / "f")


# --- the checks themselves ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.0, -1e-9, True, None, "1e-3", 1e30, 10.5])
def test_learning_rate_accepts_only_finite_positive_bounded_numbers(value):
    with pytest.raises(_validate.BadInput, match=r"^--lr .*: must be a finite number > 0 and <= 10$"):
        _validate.learning_rate("--lr", value)


def test_a_lock_that_is_not_a_regular_file_is_an_error_not_a_hang(tmp_path):
    """A FIFO named .lock would block a read forever: it is never opened, and named with how to clear it."""
    fifo = tmp_path / "fifo_run"
    fifo.mkdir()
    os.mkfifo(fifo / ".lock")
    link = tmp_path / "link_run"
    link.mkdir()
    (link / ".lock").symlink_to("/dev/zero")
    for folder, kind in ((fifo, "a FIFO"), (link, "a symbolic link")):
        assert runs.lock_holder(folder / ".lock") == ("not a file", None)
        with pytest.raises(runs.RunLocked, match=f"is {kind}, not a regular file.*rm {folder}/.lock"):
            runs.check_unlocked(folder)
        with pytest.raises(runs.RunLocked, match="not a regular file"):
            runs.lock(folder)
        assert not [p for p in folder.iterdir() if p.name != ".lock"]   # lock() left no temporary file


def test_learning_rate_is_one_check_for_trainconfig_and_tune_grids():
    from lab.experiments.aware.run.finetune import TrainConfig
    from lab.experiments.aware.run.tune import check_grids

    for bad in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            TrainConfig(lr_aware=bad)
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            check_grids({"full": (bad,)})
    assert TrainConfig(lr=3e-5).lr == 3e-5


def test_number_bounds_and_integers():
    assert _validate.count("--n", 3) == 3
    for bad in (0, 2.0, True):
        with pytest.raises(_validate.BadInput, match="must be an integer >= 1"):
            _validate.count("--n", bad)
    with pytest.raises(_validate.BadInput, match=r"--seed 4294967296: must be an integer >= 0 and <= 4294967295"):
        _validate.seed("--seed", 2 ** 32)


def test_path_checks_probe_without_leaving_anything(tmp_path):
    target = tmp_path / "a" / "b"
    assert _validate.out_dir("--out", target) == target
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(_validate.BadInput, match="is a file, not a folder"):
        _validate.out_dir("--out", tmp_path / "f")
    with pytest.raises(_validate.BadInput, match="is a folder; give a file path"):
        _validate.out_file("--out", tmp_path)
    with pytest.raises(_validate.BadInput, match="does not exist"):
        _validate.in_file("--weights", tmp_path / "nope")
    with pytest.raises(_validate.BadInput, match=r"--targets \[bad\(: not a valid regular expression"):
        _validate.regex("--targets", "[bad(")
    if os.geteuid() == 0 and Path("/sys").is_dir():
        with pytest.raises(_validate.BadInput, match="cannot write into /sys"):
            _validate.out_dir("--out", "/sys/lab")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_damaged_decoded_dataset_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch):
    import numpy as np

    from lab.data import datasets

    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        return {"images": np.arange(64, dtype=np.uint8).reshape(4, 4, 4), "labels": np.arange(4)}

    first = datasets._cached_arrays("toy", build)
    path = next(tmp_path.rglob("toy.npz"))
    again = datasets._cached_arrays("toy", build)
    assert len(calls) == 1 and np.array_equal(first["images"], again["images"])  # verified cache hit
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match=r"toy.npz rejected, rebuilding: its sha256 does not match"):
        rebuilt = datasets._cached_arrays("toy", build)
    assert len(calls) == 2 and np.array_equal(rebuilt["images"], first["images"])


def test_atomic_writes_get_the_usual_file_mode_not_mkstemps_0600(tmp_path):
    import os

    from lab._io import write_json

    old = os.umask(0o022)
    try:
        p = write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    assert (p.stat().st_mode & 0o777) == 0o644


def test_a_full_filesystem_is_found_before_the_run(tmp_path, monkeypatch):
    """No tmpfs without root: the free-space floor is forced up ($LAB_MIN_FREE_MB), and a write
    that fails with ENOSPC is simulated; both are one line naming the folder, nothing left behind."""
    import errno

    monkeypatch.setenv("LAB_MIN_FREE_MB", "1e12")
    with pytest.raises(_validate.BadInput, match=r"^--out .*: only [\d,]+ MB free on the filesystem of .*; a run "
                                                 r"needs at least 1,000,000,000,000 MB \(\$LAB_MIN_FREE_MB\)"):
        _validate.out_dir("--out", tmp_path / "new")
    monkeypatch.setenv("LAB_MIN_FREE_MB", "0")
    assert _validate.out_dir("--out", tmp_path / "new") == tmp_path / "new"

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_validate.os, "write", full)
    with pytest.raises(_validate.BadInput, match=r"cannot write into .* \(No space left on device\)"):
        runs.check_root("tosca", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_replace_dir_swaps_a_whole_folder_and_keeps_the_old_one_on_failure(tmp_path):
    from lab._io import replace_dir

    dest = tmp_path / "ckpt"
    dest.mkdir()
    (dest / "old.bin").write_text("old")

    def broken(tmp):
        (tmp / "half.bin").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        replace_dir(dest, broken)
    assert sorted(p.name for p in dest.iterdir()) == ["old.bin"]          # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]         # no temporary left behind
    replace_dir(dest, lambda tmp: (tmp / "new.bin").write_text("new"))
    assert sorted(p.name for p in dest.iterdir()) == ["new.bin"]          # replaced as a whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert oct(dest.stat().st_mode & 0o777) == oct(0o777 & ~_umask_now())


def _umask_now():
    import os

    m = os.umask(0)
    os.umask(m)
    return m
