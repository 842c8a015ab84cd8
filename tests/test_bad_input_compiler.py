"""The compiled TOSCA engine is contained (lab/_cc.py, lab/tosca/engines/_fused.py): a compiler that hangs,
fails or is given with flags, and a kernel cache holding a damaged, foreign or unloadable library
each cost at most one line, and training goes on (the 'eager' engine where the kernels cannot be
had, with its exact numbers).

Each row of ``CASES`` prepares a fresh kernel cache and a compiler (real scripts on disk: one that
hangs, one that builds with gcc until it is told to fail), then trains small TOSCA models with the
'fused' engine in a fresh interpreter, with a hard timeout: which engine ran, whether the numbers
are the eager engine's, the one note line, how long it took.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from _report_helpers import hard_timeout

ROOT = Path(__file__).resolve().parents[1]
GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None, reason="needs gcc to build the kernels and the foreign library")

TRAIN = textwrap.dedent("""
    from lab import _cc
    from lab.experiments.tosca._synthetic import synthetic_data
    from lab.tosca.engines import _fused
    from lab.tosca.learner import Tosca, ToscaConfig
    data = synthetic_data(num_tasks=2, dim=32, noise=2.0, n_train=20)
    out = {}
    for engine in ("fused", "eager"):
        m = Tosca(32, ToscaConfig(epochs=2, engine=engine, threads=1))
        for t, cs in enumerate(data.task_classes):
            k = data.train_task == t
            m.learn_task(cs, data.train_x[k], data.train_y[k])
        out[engine] = ([r["loss"] for r in m.log], {r["engine"] for r in m.log})
    print("RAN", sorted(out["fused"][1]))
    print("SAME", out["fused"][0] == out["eager"][0])
""")
NOTE = "note: TOSCA trains with the 'eager' engine here, not 'fused': "

# a compiler that answers --version and builds with gcc, until the file "refuse" beside it exists
WRAPPED = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "wrapped-cc 1.0"; exit 0; fi
if [ -e "$(dirname "$0")/refuse" ]; then echo "wrapped-cc: refusing to build today" >&2; exit 1; fi
exec {gcc} "$@"
"""
# a compiler whose build never ends: a child that holds the output pipes, its pid written down
HANGS = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "hang-cc 1.0"; exit 0; fi
sleep 600 &
echo $! >> "$(dirname "$0")/children"
wait
"""
HANGS_AT_VERSION = """#!/bin/sh
sleep 600 &
echo $! >> "$(dirname "$0")/children"
wait
"""


@dataclass(frozen=True)
class Case:
    what: str
    cc: str                   # $CC; {wrapped} {hangs} {hangs_version} are the scripts above
    cache: str = ""           # what the kernel cache holds before the run: "", damaged, foreign, garbage
    refuse: bool = False      # the wrapped compiler fails during the run
    ran: str = "fused"        # the engine that trained
    note: tuple[str, ...] = ()   # fragments of the one note line (none: no line at all)
    env: dict = field(default_factory=dict)
    bound: float = 120.0


CASES = [
    Case("compiler hangs building", "{hangs}", ran="eager", env={"LAB_CC_TIMEOUT": "3"},
         note=("hangs-cc", "could not build _fused.c: it did not finish within 3 s ($LAB_CC_TIMEOUT) and was stopped")),
    Case("compiler hangs at --version", "{hangs_version}", ran="eager", note=("--version did not answer within 5 s",)),
    Case("CC with flags", f"{GCC} -O2", ran="fused"),
    Case("CC with flags, not on PATH", "no-such-cc -O2", ran="eager",
         note=("$CC 'no-such-cc -O2': 'no-such-cc' is not a program on PATH",)),
    Case("CC not a command line", 'gcc "-O2', ran="eager", note=("$CC 'gcc \"-O2' is not a command line",)),
    Case("damaged kernel, rebuilt", "{wrapped}", cache="damaged", ran="fused"),
    Case("damaged kernel, rebuild fails", "{wrapped}", cache="damaged", refuse=True, ran="eager",
         note=("fails its sha256 check;", "could not build _fused.c: wrapped-cc: refusing to build today")),
    Case("foreign library, rebuilt", "{wrapped}", cache="foreign", ran="fused"),
    Case("foreign library, rebuild fails", "{wrapped}", cache="foreign", refuse=True, ran="eager",
         note=("is not a build of this source (it lacks gelu_fwd);", "refusing to build today")),
    Case("unloadable library, rebuilt", "{wrapped}", cache="garbage", ran="fused"),
    Case("unloadable library, rebuild fails", "{wrapped}", cache="garbage", refuse=True, ran="eager",
         note=("does not load", "refusing to build today")),
]


def _scripts(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True)
    out = {}
    for key, name, text in (("wrapped", "wrapped-cc", WRAPPED.format(gcc=GCC)), ("hangs", "hangs-cc", HANGS),
                            ("hangs_version", "hangs-version-cc", HANGS_AT_VERSION)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
        out[key] = str(folder / name)
    return out


def _python(code: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def _prepare_cache(case: Case, env: dict, tmp: Path) -> None:
    """Build the kernels once with the compiler, then spoil the cached library as the case says
    (its sha256 record rewritten to match for 'foreign' and 'garbage': only the load can tell)."""
    p = _python("from lab.tosca.engines import _fused; print(_fused.kernels() is not None, _fused.why_not_built())", env, 120)
    assert p.stdout.startswith("True"), p.stdout + p.stderr[-2000:]
    (lib,) = (Path(env["LAB_CACHE_DIR"]) / "kernels").glob("_fused-*.so")
    if case.cache == "damaged":
        lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
        return
    if case.cache == "foreign":
        src = tmp / "other.c"
        src.write_text("int other(void) { return 1; }\n")
        subprocess.run([GCC, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, timeout=120)
    elif case.cache == "garbage":
        lib.write_bytes(b"\x7fELF" + os.urandom(4000))
    from lab import _io

    lib.with_name(lib.name + ".sha256").write_text(_io.sha256_file(lib) + "\n")


def _run(case: Case, tmp: Path) -> tuple[subprocess.CompletedProcess, float, Path]:
    scripts = _scripts(tmp / "bin")
    env = {**{k: v for k, v in os.environ.items() if k not in ("CC", "LAB_CC_TIMEOUT")},
           "LAB_CACHE_DIR": str(tmp / "cache"), "OMP_NUM_THREADS": "1", "HOME": str(tmp),
           "CC": case.cc.format(**scripts), **case.env}
    if case.cache:
        _prepare_cache(case, env, tmp)
    if case.refuse:
        (tmp / "bin" / "refuse").write_text("")
    t0 = time.perf_counter()
    p = _python(TRAIN, env, case.bound + 120)
    return p, time.perf_counter() - t0, tmp / "bin"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("outside-cc")
    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = {c.what: pool.submit(_run, c, base / f"case{i}") for i, c in enumerate(CASES)}
        return {k: f.result() for k, f in jobs.items()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")   # a zombie is gone


@hard_timeout(900)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.what)
def test_the_compiled_engine_costs_at_most_one_line(case, results):
    p, seconds, bin_dir = results[case.what]
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert f"RAN ['{case.ran}']" in p.stdout, p.stdout + p.stderr[-2000:]
    if case.ran == "eager":
        assert "SAME True" in p.stdout           # exactly the eager step's numbers
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    if case.note:
        assert len(lines) == 1 and lines[0].startswith(NOTE), p.stderr[-3000:]
        assert all(f in lines[0] for f in case.note), lines[0]
    else:
        assert not lines, p.stderr[-3000:]
    assert seconds < case.bound, f"{seconds:.0f} s"
    children = bin_dir / "children"      # a hanging compiler's children are stopped with it
    if children.exists():
        pids = [int(x) for x in children.read_text().split()]
        deadline = time.monotonic() + 10
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(map(_alive, pids)), pids
    kernels = list((bin_dir.parent / "cache" / "kernels").glob("*"))
    assert not [k for k in kernels if k.name.startswith(".")], kernels   # no temporary build left behind
