"""One place for the checks every command runs on its parameters before any work.

Each check raises :class:`BadInput` (a ``ValueError``) whose message is one line naming the
parameter, the value given and what is allowed, e.g.::

    --lr nan: must be a finite number > 0
    --runs-dir /etc/passwd: is a file, not a folder

The library's own validation uses the same functions (``TrainConfig`` and ``lab aware tune``'s
grids both call :func:`learning_rate`), so a value the command line accepts is never refused
later, and the reverse. Path checks look before they leap without leaving anything behind:
a folder that does not exist yet is not created, its nearest existing parent is probed with a
temporary file (``os.access`` is not enough: root passes it on ``/sys`` and read-only mounts), and its
filesystem must have ``$LAB_MIN_FREE_MB`` (default 100) MB free: a full disk is found before a run.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable


class BadInput(ValueError):
    """A parameter's value is not allowed; the message says which, the value and what is."""


def show(value: Any) -> str:
    """A value as the user typed it (strings quoted only when they need it)."""
    if isinstance(value, str):
        return repr(value) if (not value or any(c.isspace() for c in value) or "'" in value) else value
    if isinstance(value, float):
        return repr(value)
    return str(value)


def bad(param: str, value: Any, allowed: str) -> BadInput:
    return BadInput(f"{param} {show(value)}: {allowed}")


# --- numbers ---------------------------------------------------------------------------------
def number(param: str, value, *, gt=None, ge=None, lt=None, le=None, integer: bool = False):
    """A finite real (or integer) number within the given bounds; returns it unchanged."""
    kind = "an integer" if integer else "a finite number"
    bounds = [f"{op} {b if isinstance(b, int) else format(b, 'g')}"
              for op, b in ((">", gt), (">=", ge), ("<", lt), ("<=", le)) if b is not None]
    allowed = f"must be {kind}" + (f" {' and '.join(bounds)}" if bounds else "")
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(param, value, allowed)
    if integer and not isinstance(value, int):
        raise bad(param, value, allowed)
    if not math.isfinite(value):
        raise bad(param, value, allowed)
    if (gt is not None and not value > gt) or (ge is not None and not value >= ge) or \
            (lt is not None and not value < lt) or (le is not None and not value <= le):
        raise bad(param, value, allowed)
    return value


LR_MAX = 10.0          # no optimiser here trains at a larger rate; 1e30 overflows the first step
COUNT_MAX = 10 ** 9    # any count (steps, epochs, samples) beyond this is a typo, not a plan


def learning_rate(param: str, value) -> float:
    """A learning rate: a finite number > 0 and <= :data:`LR_MAX` (NaN, inf, 0 and negatives
    train nothing sensible; 1e30 overflows the first step)."""
    return float(number(param, value, gt=0, le=LR_MAX))


def count(param: str, value, *, minimum: int = 1, maximum: int | None = COUNT_MAX) -> int:
    """An integer in ``minimum..maximum`` (by default at most :data:`COUNT_MAX`: a count of
    99999999999999999999 steps would overflow or run forever)."""
    return number(param, value, ge=minimum, le=maximum, integer=True)


def threads(param: str, value) -> int:
    """A CPU thread count: 0 (the library's default) .. this machine's ``os.cpu_count()``
    (more threads than cores only slows down; 100000 crashed OpenMP)."""
    return count(param, value, minimum=0, maximum=os.cpu_count() or 1)


SEED_MAX = 2 ** 32 - 1  # numpy's RandomState accepts 0 .. 2**32 - 1


def seed(param: str, value) -> int:
    return number(param, value, ge=0, le=SEED_MAX, integer=True)


# --- patterns ----------------------------------------------------------------------------------
def regex(param: str, pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise bad(param, pattern, f"not a valid regular expression ({exc})") from None


def regexes(param: str, patterns: Iterable[str]) -> list[re.Pattern]:
    return [regex(param, p) for p in patterns]


# --- paths ---------------------------------------------------------------------------------------
MIN_FREE_ENV = "LAB_MIN_FREE_MB"
MIN_FREE_MB = 100     # an output folder's filesystem needs this much free space before a run starts


def min_free_mb() -> float:
    """``$LAB_MIN_FREE_MB`` (default :data:`MIN_FREE_MB`): the free space an output folder needs."""
    raw = os.environ.get(MIN_FREE_ENV)
    if raw is None or raw.strip() == "":
        return float(MIN_FREE_MB)
    try:
        value = float(raw)
    except ValueError:
        value = raw
    return float(number(f"${MIN_FREE_ENV}", value, ge=0))


def _probe(param: str, shown, folder: Path) -> None:
    """Create, write 4 KiB into and remove a temporary file in ``folder`` (the only honest
    writability test: an empty file needs no free block), then check the free space against
    :func:`min_free_mb` (a full filesystem is found before the run, not in its last write)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".lab-write-check-", dir=folder)
    except OSError as exc:
        raise bad(param, shown, f"cannot write into {folder} ({exc.strerror or exc})") from None
    try:
        os.write(fd, b"\0" * 4096)
    except OSError as exc:
        raise bad(param, shown, f"cannot write into {folder} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
        os.unlink(tmp)
    need = min_free_mb()
    try:
        free = shutil.disk_usage(folder).free
    except OSError:      # the write above went through: nothing better to say
        return
    if free < need * 2 ** 20:
        raise bad(param, shown, f"only {free / 2 ** 20:,.0f} MB free on the filesystem of {folder}; a run needs at "
                                f"least {need:,.0f} MB (${MIN_FREE_ENV}): free some space or choose another folder")


def _existing_parent(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return p
    return Path(path.anchor or ".")


def out_dir(param: str, path, *, shown=None) -> Path:
    """A folder we will write into: an existing writable folder, or one that can be created
    (nothing is created here)."""
    shown = path if shown is None else shown
    if path is None or str(path) == "":
        raise bad(param, "" if path is None else path, "must be a folder path")
    p = Path(path).expanduser()
    base = _existing_parent(p)
    if base.exists() and not base.is_dir():
        what = "is a file, not a folder" if base == p and str(shown) == str(path) else \
            f"{base} is a file, so the folder cannot be created"
        raise bad(param, shown, what)
    if not base.exists():  # a dangling symlink on the way
        raise bad(param, shown, f"{base} is a broken link")
    _probe(param, shown, base)
    return p


def out_file(param: str, path, *, shown=None) -> Path:
    """A file we will (over)write: not a folder, and its folder writable or creatable."""
    shown = path if shown is None else shown
    if path is None or str(path) == "" or str(path).endswith(os.sep):
        raise bad(param, "" if path is None else path, "must be a file path")
    p = Path(path).expanduser()
    if p.is_dir():
        raise bad(param, shown, "is a folder; give a file path")
    out_dir(param, p.parent, shown=shown)
    return p


def in_file(param: str, path, *, shown=None) -> Path:
    """An existing, readable regular file."""
    shown = path if shown is None else shown
    p = Path(path).expanduser()
    if not p.exists():
        raise bad(param, shown, "does not exist")
    if p.is_dir():
        raise bad(param, shown, "is a folder; give a file")
    try:
        with open(p, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise bad(param, shown, f"cannot be read ({exc.strerror or exc})") from None
    return p


def in_dir(param: str, path, *, shown=None) -> Path:
    """An existing folder."""
    shown = path if shown is None else shown
    p = Path(path).expanduser()
    if not p.exists():
        raise bad(param, shown, "does not exist")
    if not p.is_dir():
        raise bad(param, shown, "is a file, not a folder")
    return p


def env_dir(var: str, *, out: bool = True) -> Path | None:
    """``$VAR`` when set: checked as a folder we write into (``out``) or read from."""
    value = os.environ.get(var)
    if not value:
        return None
    return out_dir(f"${var}", value) if out else in_dir(f"${var}", value)


# --- devices --------------------------------------------------------------------------------------
def device(param: str, value: str | None) -> str | None:
    """``cpu``, ``cuda`` or ``cuda:N`` (N < the number of GPUs), ``mps`` where present."""
    if value is None or value == "cpu":    # the default: no torch import for it
        return value
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise bad(param, value, "must be cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return value
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise bad(param, value, "CUDA is not available on this machine; use cpu")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise bad(param, value, f"this machine has {n} CUDA device(s): cuda:0..cuda:{n - 1}")
        return value
    if dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise bad(param, value, "MPS is not available on this machine; use cpu")
        return value
    raise bad(param, value, "must be cpu, cuda or cuda:N")


# --- the cache root and error lines (every command) ------------------------------------------------
def _cache_dir_param(cache_dir) -> tuple[str, str | None]:
    """(parameter name, value) that chose the cache root (the flag, else $LAB_CACHE_DIR)."""
    if cache_dir:
        return "--cache-dir", cache_dir
    if os.environ.get("LAB_CACHE_DIR"):
        return "$LAB_CACHE_DIR", os.environ["LAB_CACHE_DIR"]
    return "--cache-dir", None


def check_cache_dir(cache_dir) -> None:
    """The cache root (flag, $LAB_CACHE_DIR or ~/.cache/continual-lab) must be a writable folder."""
    if cache_dir is not None and not str(cache_dir).strip():   # '' is refused, not read as "the default"
        raise bad("--cache-dir", cache_dir, "must be a folder path (leave the flag out for $LAB_CACHE_DIR "
                                            "or ~/.cache/continual-lab)")
    param, value = _cache_dir_param(cache_dir)
    target = value or os.path.join(os.path.expanduser("~"), ".cache", "continual-lab")
    out_dir(param, target, shown=value or target)


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message with line breaks folded (KeyError unquoted)."""
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    if isinstance(exc, OSError) and exc.strerror and not str(msg).startswith(type(exc).__name__):
        msg = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    text = " ".join(part.strip() for part in str(msg).splitlines() if part.strip())
    return text or type(exc).__name__
