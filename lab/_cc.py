"""Build a C source of this package once per machine and load it with ctypes.

``load(source, symbols)`` compiles ``source`` with the system C compiler (``$CC``, a command line
such as ``gcc`` or ``"ccache gcc -O2"``, else ``cc``) into ``<cache root>/kernels/<name>-<key>.so``
and returns the ``ctypes.CDLL``; the key hashes the source, the compiler command and its version,
the flags and the CPU (``-march=native`` code must not run on another CPU), so an edited source or
a new machine builds afresh and everything else loads the file already built, once its sha256
matches the one recorded beside it at build time. The build goes to a temporary name first, is
loaded and checked from there (every name in ``symbols`` exported), and only then renamed into
place, so two processes building at once (Ray workers) never load half a file, and a file that
is not this source's build is never loaded as it. Flags: ``-O3 -march=native -ffp-contract=off
-fno-math-errno`` (every rounding the one the source writes), plus ``-fopenmp`` where the compiler
has it; without ``-march=native`` where the compiler rejects it.

What is never loaded: a cached file whose sha256 does not match its record (it is rebuilt; if the
rebuild fails, nothing is loaded), a cached file that lacks one of ``symbols`` (a foreign library:
rebuilt), a library the loader refuses (another architecture). The compiler runs within
``$LAB_CC_TIMEOUT`` seconds (default 30) for the whole build, its process group killed after.

Nothing here raises for a missing, failing or hanging compiler: ``load`` returns ``None`` and
:func:`why_not` says why in one line, so a caller can take its pure-torch path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from . import _io
from ._cache import cache_root

FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
TIMEOUT_ENV = "LAB_CC_TIMEOUT"
TIMEOUT = 30.0          # seconds for one whole build (a healthy one: ~1-4 s on a busy 2-core machine)
VERSION_TIMEOUT = 5.0   # seconds for `$CC --version`
_loaded: dict[str, ctypes.CDLL | None] = {}
_why: dict[str, str] = {}


class _NotBuilt(Exception):
    """Why the library cannot be had (one line)."""


def _cpu() -> str:
    """What -march=native compiles for: the CPU model and its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines) or platform.processor()
    except OSError:
        return platform.machine() + platform.processor()


def timeout() -> float:
    """The bound on one build: ``$LAB_CC_TIMEOUT`` seconds, else :data:`TIMEOUT`."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, "") or TIMEOUT)
    except ValueError:
        return TIMEOUT
    return value if value > 0 else TIMEOUT


def _run(argv: list[str], seconds: float) -> subprocess.CompletedProcess:
    """``argv`` in its own process group, killed as a whole after ``seconds`` (a compiler script's
    children too: they would hold the output pipes open). Raises subprocess.TimeoutExpired."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=seconds)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _compiler() -> tuple[list[str], str]:
    """(the compiler's command line, its version line); raises _NotBuilt naming what is wrong."""
    given = os.environ.get("CC")
    if given is not None and not given.strip():
        given = None
    try:
        cc = shlex.split(given) if given else ["cc"]
    except ValueError as exc:
        raise _NotBuilt(f"$CC {given!r} is not a command line ({exc})") from None
    if not cc or not shutil.which(cc[0]):
        if given:
            raise _NotBuilt(f"$CC {given!r}: {cc[0] if cc else given!r} is not a program on PATH")
        raise _NotBuilt("no C compiler (set $CC, or install gcc or clang)")
    try:
        out = _run([*cc, "--version"], VERSION_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise _NotBuilt(f"{shlex.join(cc)} --version did not answer within {VERSION_TIMEOUT:g} s") from None
    except OSError as exc:
        raise _NotBuilt(f"{shlex.join(cc)} does not run ({exc.strerror or exc})") from None
    return cc, (out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else "")


def _build(cc: list[str], src: Path, out: Path) -> str:
    """Compile ``src`` to ``out``: with OpenMP if the compiler has it, and without ``-march=native``
    if the compiler rejects it (an older clang on arm64); '' or the compiler's first complaint.
    Every attempt shares one time budget (:func:`timeout`): a compiler that hangs is stopped."""
    first, bound = "", timeout()
    deadline = time.monotonic() + bound
    for flags in (FLAGS + ("-fopenmp",), FLAGS, tuple(f for f in FLAGS if f != "-march=native")):
        try:
            r = _run([*cc, *flags, str(src), "-o", str(out), "-lm"], max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            return f"it did not finish within {bound:g} s (${TIMEOUT_ENV}) and was stopped"
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


def _open(path: Path, symbols) -> ctypes.CDLL:
    """``path`` loaded, every name in ``symbols`` present; raises _NotBuilt (a library the loader
    refuses, or a foreign one)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise _NotBuilt(f"{path} does not load ({' '.join(str(exc).split())})") from None
    missing = [s for s in symbols if not hasattr(lib, s)]
    if missing:
        raise _NotBuilt(f"{path} is not a build of this source (it lacks {missing[0]})")
    return lib


def _fresh(cc: list[str], src: Path, path: Path, symbols, before: str) -> ctypes.CDLL:
    """Build ``src`` under a temporary name, load and check it from there, then record its sha256
    and rename it to ``path``. ``before``: why the cached file is not used ('' when there is none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent, prefix=f".{src.stem}-")
    os.close(fd)
    try:
        err = _build(cc, src, Path(tmp))
        if err:
            raise _NotBuilt(f"{before}; " * bool(before) + f"{shlex.join(cc)} could not build {src.name}: {err}")
        lib = _open(Path(tmp), symbols)       # loaded under its own name: the path's handle may be a foreign file's
        digest = _io.sha256_file(tmp)
        _io.atomic_write(path.with_name(path.name + ".sha256"), lambda p: p.write_text(digest + "\n"))
        os.replace(tmp, path)
        return lib
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(source: str | os.PathLike, symbols=()) -> ctypes.CDLL | None:
    """The compiled ``source`` exporting ``symbols`` (built on first use, cached), or None when it
    cannot be had (:func:`why_not`)."""
    src = Path(source)
    name = str(src.resolve())
    if name in _loaded:
        return _loaded[name]
    lib = None
    try:
        cc, version = _compiler()
        key = hashlib.sha256("\0".join([src.read_text(), shlex.join(cc), version, *FLAGS, _cpu()]).encode()
                             ).hexdigest()[:16]
        path = cache_root() / "kernels" / f"{src.stem}-{key}.so"
        side = path.with_name(path.name + ".sha256")
        before = ""
        if path.exists():
            if _verified(path, side):
                try:
                    lib = _open(path, symbols)
                except _NotBuilt as exc:
                    before = str(exc)
            else:
                before = f"the cached {path} fails its sha256 check"
        if lib is None:
            lib = _fresh(cc, src, path, symbols, before)
    except _NotBuilt as exc:
        _why[name] = str(exc)
        lib = None
    except (OSError, subprocess.SubprocessError) as exc:
        _why[name] = f"could not build or load {src.name}: {' '.join(str(exc).split())}"
        lib = None
    _loaded[name] = lib
    return lib


def why_not(source: str | os.PathLike) -> str:
    """Why :func:`load` returned None for ``source`` ('' if it did not)."""
    return _why.get(str(Path(source).resolve()), "")
