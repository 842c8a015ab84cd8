"""Atomic, verified file I/O: nothing is ever left half-written, and a corrupt file is detected.

Every writer goes through :func:`atomic_write` (temp file in the same folder, fsync, rename).
Tensor files are safetensors with a sha256 of the file stored in a ``.sha256`` sidecar, checked
on read; a mismatch raises :class:`CorruptFile` so callers can report it and rebuild. A disk (or
quota) that fills during a write raises :class:`DiskFull`: one line naming the file and the space
it needed, the partial file removed.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


class CorruptFile(RuntimeError):
    """A cached or saved file failed verification (checksum, format or metadata mismatch)."""


class DiskFull(OSError):
    """A write found the disk (or the user's quota) full. Its message is ONE line naming what was
    being written and the space it needed (:func:`disk_full`); the partial file is gone."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def is_disk_full(exc: BaseException) -> bool:
    """``exc`` says the disk or the quota is full (an OSError, or a library's own error, e.g.
    safetensors', that carries the system's message)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def size_text(n: float | None) -> str:
    """A byte count as people read it: '812 bytes', '3.4 kB', '120.5 MB', '1.2 GB'."""
    if n is None:
        return "?"
    for unit, step in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= step:
            return f"{n / step:.1f} {unit}"
    return f"{int(n)} bytes"


def free_space(path: str | os.PathLike) -> tuple[int | None, Path]:
    """(free bytes, mount point) of the file system that holds ``path`` (or its nearest existing
    parent); (None, path) where it cannot be read."""
    import shutil

    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return None, p
    mount = p
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return free, mount


def disk_full(path: str | os.PathLike, *, needed: int | None = None, written: int | None = None) -> DiskFull:
    """The :class:`DiskFull` of a write to ``path`` that needed ``needed`` bytes (or more than the
    ``written`` bytes it got to write)."""
    free, mount = free_space(path)
    if needed:
        need = f"it needs about {size_text(needed)}"
    elif written:
        need = f"it needs more than the {size_text(written)} written before the disk filled"
    else:
        need = "it needs more space"
    return DiskFull(f"{path}: no space left on the disk ({need}; {size_text(free)} free on {mount}); "
                    "nothing half-written was left")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], None], *, size: int | None = None) -> Path:
    """Call ``writer(tmp_path)`` and move the result to ``path`` atomically. ``size``: the bytes the
    write needs, when known (named if the disk fills: :class:`DiskFull`)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(path, needed=size) from exc
        raise
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        writer(tmp_path)
        os.chmod(tmp_path, 0o666 & ~_umask())   # mkstemp makes 0600; a results folder is shared to be read
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except BaseException as exc:
        try:
            written = tmp_path.stat().st_size
        except OSError:
            written = None
        tmp_path.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(path, needed=size, written=written) from exc
        raise
    return path


def replace_dir(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_dir)`` on a new folder beside ``path``, then swap it in for ``path`` (two
    renames, :func:`swap_dir`). A failing writer leaves ``path`` as it was."""
    import shutil

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        writer(tmp)
        os.chmod(tmp, 0o777 & ~_umask())        # mkdtemp makes 0700
    except BaseException as exc:
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc) and not isinstance(exc, DiskFull):
            raise disk_full(path, written=written) from exc
        raise
    return swap_dir(tmp, path)


def swap_dir(new: Path | None, dest: Path) -> Path:
    """Put the folder ``new`` where ``dest`` is (``None``: just take ``dest`` away): ``dest`` is renamed
    aside, ``new`` renamed in, and the old folder removed afterwards, so a reader sees the old folder or
    the new one, never a mix."""
    import shutil
    import time

    dest = Path(dest)
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        dest.rename(old)
    if new is not None:
        Path(new).rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_tensors(path: str | os.PathLike, tensors: dict, metadata: dict[str, str] | None = None) -> Path:
    """Save tensors as safetensors (atomically) plus a sha256 sidecar written after it."""
    from safetensors.torch import save_file

    path = Path(path)
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    if _same_as_stored(path, tensors, meta):   # keep the bytes (safetensors' metadata order varies per write)
        return path
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values()) + len(json.dumps(meta)) + 1024 * len(tensors)
    atomic_write(path, lambda p: save_file(tensors, str(p), metadata=meta), size=nbytes)
    digest = sha256_file(path)
    try:
        atomic_write(path.with_name(path.name + ".sha256"), lambda p: p.write_text(digest + "\n"), size=65)
    except DiskFull:      # a file without its checksum is half-written: it goes too
        path.unlink(missing_ok=True)
        raise
    return path


def _same_as_stored(path: Path, tensors: dict, meta: dict) -> bool:
    """True if ``path`` is a valid file of exactly these tensors (dtype, shape, values) and metadata."""
    import torch

    if not path.is_file():
        return False
    try:
        old, old_meta = load_tensors(path)
    except Exception:   # corrupt or unreadable: it gets rewritten
        return False
    return (old_meta == meta and old.keys() == tensors.keys()
            and all(old[k].dtype == v.dtype and torch.equal(old[k], v) for k, v in tensors.items()))


def load_tensors(path: str | os.PathLike) -> tuple[dict, dict[str, str]]:
    """Load a file written by :func:`save_tensors`; raise :class:`CorruptFile` if it fails its check."""
    from safetensors import safe_open

    path = Path(path)
    side = path.with_name(path.name + ".sha256")
    if not path.exists():
        raise FileNotFoundError(path)
    if not side.exists():
        raise CorruptFile(f"{path}: checksum sidecar {side.name} is missing (interrupted write?)")
    expected = side.read_text().strip()
    actual = sha256_file(path)
    if actual != expected:
        raise CorruptFile(f"{path}: sha256 {actual[:12]}… does not match the recorded {expected[:12]}…")
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = dict(fh.metadata() or {})
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # safetensors raises several types on bad headers
        raise CorruptFile(f"{path}: not a readable safetensors file ({exc})") from exc
    return tensors, meta


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(obj, indent=2, sort_keys=True, default=str)
    return atomic_write(path, lambda p: p.write_text(text + "\n"), size=len(text.encode()) + 1)


def read_json(path: str | os.PathLike) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise CorruptFile(f"{path}: invalid JSON ({exc})") from exc


def read_csv(path: str | os.PathLike, **kw):
    """``pandas.read_csv`` with every float read back exactly as written (pandas 3 does that by
    default; pandas 2's default parser may be off in the last bit, enough to flip a value that sits
    on a rounding boundary — a shipped interval bound of exactly -0.0625 printed as -6.2 or -6.3)."""
    import pandas as pd

    if int(pd.__version__.split(".")[0]) < 3:
        kw.setdefault("float_precision", "round_trip")
    return pd.read_csv(path, **kw)


def write_table(path: str | os.PathLike, df) -> Path:
    """Write a DataFrame as ``<path>.parquet`` (or ``.csv`` when pyarrow is missing); return the path."""
    path = Path(path)
    try:
        import pyarrow  # noqa: F401

        out = path.with_suffix(".parquet")
        return atomic_write(out, lambda p: df.to_parquet(p, index=False))
    except ImportError:
        out = path.with_suffix(".csv")
        return atomic_write(out, lambda p: df.to_csv(p, index=False))
