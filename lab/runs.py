"""Run directories: every run writes into its own, never-shared folder.

``new_run_dir`` creates ``<root>/<kind>/<UTC timestamp>-<name>-<pid>-<random>`` with
``mkdir(exist_ok=False)``, so two runs started in the same second (or in two processes) can never
write into the same place. ``root`` defaults to ``$LAB_RUNS_DIR``, else ``runs/`` at the top of the
project checkout the current folder is in (notebooks run from ``notebooks/``), else ``./runs``.

:func:`check_root` tells, before any work, whether a run folder could be created there (nothing is
created). :func:`lock` marks a run folder as in use by this process (``.lock`` holds the PID and is
created with its content in one step); a lock whose process is gone, or whose PID now belongs to a
process younger than the lock, is stale and replaced; an unreadable one is reported with the
command that clears it. :func:`active` is the run folder this process is writing (the command
line prints it, with how to resume, on Ctrl-C).
"""
from __future__ import annotations

import contextlib
import os
import platform
import re
import secrets
import sys
import tempfile
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


_ACTIVE: Path | None = None


def active() -> Path | None:
    """The run folder this process created or locked last (``None`` before any)."""
    return _ACTIVE


def set_active(path: str | os.PathLike | None) -> None:
    global _ACTIVE
    _ACTIVE = Path(path) if path is not None else None


def check_root(kind: str, root: str | os.PathLike | None = None, param: str = "--runs-dir") -> Path:
    """Fail (one line, :class:`lab._validate.BadInput`) unless a run folder can be created under
    ``runs_root(root)/kind``; creates nothing. ``param`` names the flag (``$LAB_RUNS_DIR`` when the
    environment chose the root)."""
    from lab import _validate

    if not root and os.environ.get("LAB_RUNS_DIR"):
        param, shown = "$LAB_RUNS_DIR", os.environ["LAB_RUNS_DIR"]
    else:
        shown = root if root else runs_root(root)
    return _validate.out_dir(param, runs_root(root) / kind, shown=shown)


def new_run_dir(kind: str, name: str, root: str | os.PathLike | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    base = runs_root(root) / kind
    base.mkdir(parents=True, exist_ok=True)
    while True:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = base / f"{stamp}-{safe}-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            path.mkdir(exist_ok=False)
        except FileExistsError:  # astronomically unlikely; draw again
            continue
        global _ACTIVE
        _ACTIVE = path
        return path


class RunLocked(RuntimeError):
    """The run folder is in use, or its lock cannot be read; the message says how to clear it."""


def _start_time(pid: int) -> float | None:
    """Wall-clock start of process ``pid`` (Linux /proc), else ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        boot = next(float(l.split()[1]) for l in Path("/proc/stat").read_text().splitlines() if l.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (``pid`` > 0; 0 would signal our own group)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, belongs to someone else
        return True
    return True


def lock_holder(lock: Path) -> tuple[str, int | None]:
    """(state, pid) of an existing lock file: ``'alive'``, ``'stale'`` (process gone, PID reused
    by a younger process, or this very process), ``'unreadable'`` (empty or not a PID) or
    ``'not a file'`` (a FIFO, link, folder or device: never opened, so a FIFO cannot hang us)."""
    import stat

    try:
        mode = lock.lstat().st_mode
    except FileNotFoundError:
        return "stale", None
    except OSError:
        return "unreadable", None
    if not stat.S_ISREG(mode):
        return "not a file", None
    try:
        text = lock.read_text().strip()
        mtime = lock.stat().st_mtime
    except FileNotFoundError:
        return "stale", None
    except OSError:
        return "unreadable", None
    first = text.split()[0] if text else ""
    if not first.isdigit() or int(first) <= 0:
        return "unreadable", None
    pid = int(first)
    if pid == os.getpid() or not pid_alive(pid):
        return "stale", pid
    started = _start_time(pid)
    if started is not None and started > mtime + 2:  # the PID was reused after the lock was written
        return "stale", pid
    return "alive", pid


def check_unlocked(run_dir: str | os.PathLike) -> None:
    """Raise :class:`RunLocked` (saying how to clear it) unless ``run_dir`` has no lock or a stale one."""
    path = Path(run_dir) / ".lock"
    if not (path.exists() or path.is_symlink()):
        return
    state, pid = lock_holder(path)
    if state == "alive":
        raise RunLocked(f"{run_dir} is in use by process {pid}; wait for it to finish or stop it (kill {pid}); "
                        f"if that process is not a lab run, remove the lock: rm {path}")
    if state == "not a file":
        import stat

        mode = path.lstat().st_mode
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a symbolic link" if stat.S_ISLNK(mode) else
                "a folder" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device")
        raise RunLocked(f"{run_dir} has a lock {path} that is {kind}, not a regular file (lab writes its process id "
                        f"into a plain file); if no lab process is using this folder, remove it: rm "
                        f"{'-r ' if stat.S_ISDIR(mode) else ''}{path}")
    if state == "unreadable":
        raise RunLocked(f"{run_dir} has an unreadable lock {path} (empty or not a process id; left by a crash?); "
                        f"if no lab process is using this folder, remove it: rm {path}")


def lock(run_dir: str | os.PathLike) -> Path:
    """Mark ``run_dir`` as used by this process; returns the lock file (unlink it when done)."""
    global _ACTIVE
    run_dir = Path(run_dir)
    path = run_dir / ".lock"
    fd, tmp = tempfile.mkstemp(prefix=".lock.", dir=run_dir)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        for _ in range(3):
            try:
                os.link(tmp, path)  # atomic: the lock never exists without its PID
                _ACTIVE = run_dir
                return path
            except FileExistsError:
                check_unlocked(run_dir)
                path.unlink(missing_ok=True)  # stale: its process is gone
        raise RunLocked(f"could not lock {run_dir}: {path} keeps reappearing; another process is using it")
    finally:
        Path(tmp).unlink(missing_ok=True)


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


@contextlib.contextmanager
def terminated_as_interrupted():
    """SIGTERM (``kill``, a scheduler stopping the job) ends a long command as Ctrl-C does: the
    finished work is kept and the command prints the line that resumes it (``lab.cli.main``)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
