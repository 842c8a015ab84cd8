"""Build a C source of this package once per machine and load it with ctypes.

``load(source)`` compiles ``source`` with the system C compiler (``$CC``, else ``cc``) into
``<cache root>/kernels/<name>-<key>.so`` and returns the ``ctypes.CDLL``; the key hashes the source,
the compiler's version, the flags and the CPU (``-march=native`` code must not run on another CPU),
so an edited source or a new machine builds afresh and everything else loads the file already
built, once its sha256 matches the one recorded beside it at build time (else it is rebuilt). The
build goes to a temporary name first and is renamed into place, so two processes building at once
(Ray workers) never load half a file. Flags: ``-O3 -march=native
-ffp-contract=off -fno-math-errno`` (every rounding the one the source writes), plus ``-fopenmp``
where the compiler has it; without ``-march=native`` where the compiler rejects it.

Nothing here raises for a missing or failing compiler: ``load`` returns ``None`` and
:func:`why_not` says why, so a caller can take its pure-torch path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import _io
from ._cache import cache_root

FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
_loaded: dict[str, ctypes.CDLL | None] = {}
_why: dict[str, str] = {}


def _cpu() -> str:
    """What -march=native compiles for: the CPU model and its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines) or platform.processor()
    except OSError:
        return platform.machine() + platform.processor()


def _compiler() -> tuple[str, str] | None:
    """(compiler, its version line), or None."""
    cc = os.environ.get("CC") or "cc"
    if not shutil.which(cc):
        return None
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (cc, out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else "")


def _build(cc: str, src: Path, out: Path) -> str:
    """Compile ``src`` to ``out``: with OpenMP if the compiler has it, and without ``-march=native``
    if the compiler rejects it (an older clang on arm64); '' or the compiler's first complaint."""
    first = ""
    for flags in (FLAGS + ("-fopenmp",), FLAGS, tuple(f for f in FLAGS if f != "-march=native")):
        r = subprocess.run([cc, *flags, str(src), "-o", str(out), "-lm"], capture_output=True, text=True,
                           timeout=300)
        if r.returncode == 0:
            return ""
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        first = first or (lines[-1] if lines else f"exit status {r.returncode}")
    return first


def _verified(path: Path, side: Path) -> bool:
    """Whether ``path`` is the file its build recorded (sha256 in ``side``)."""
    try:
        return side.read_text().strip() == _io.sha256_file(path)
    except OSError:
        return False


def load(source: str | os.PathLike) -> ctypes.CDLL | None:
    """The compiled ``source`` (built on first use, cached), or None when it cannot be built."""
    src = Path(source)
    name = str(src.resolve())
    if name in _loaded:
        return _loaded[name]
    lib = None
    found = _compiler()
    if found is None:
        _why[name] = "no C compiler (set $CC, or install gcc or clang)"
    else:
        cc, version = found
        key = hashlib.sha256("\0".join([src.read_text(), version, *FLAGS, _cpu()]).encode()).hexdigest()[:16]
        path = cache_root() / "kernels" / f"{src.stem}-{key}.so"
        side = path.with_name(path.name + ".sha256")
        try:
            if not (path.exists() and _verified(path, side)):   # absent, or not the file once built: rebuild
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent, prefix=f".{src.stem}-")
                os.close(fd)
                try:
                    err = _build(cc, src, Path(tmp))
                    if err:
                        _why[name] = f"{cc} could not build {src.name}: {err}"
                    else:
                        _io.atomic_write(side, lambda p: p.write_text(_io.sha256_file(tmp) + "\n"))
                        os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            if path.exists():
                lib = ctypes.CDLL(str(path))
        except (OSError, subprocess.SubprocessError) as e:
            _why[name] = f"could not build or load {src.name}: {e}"
            lib = None
    _loaded[name] = lib
    return lib


def why_not(source: str | os.PathLike) -> str:
    """Why :func:`load` returned None for ``source`` ('' if it did not)."""
    return _why.get(str(Path(source).resolve()), "")
