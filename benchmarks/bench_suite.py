"""Is the test suite slower than at an earlier commit? The same tests, timed there and here in one run.

A suite grows: comparing two `make test` wall times mixes "the code got slower" with "there are more
tests". This benchmark times only the tests that exist in both trees (same file-relative name and
parameters; a test that moved to another file counts as the same test):

1. the tests at ``--base`` (a git worktree of that commit in a temporary folder, imported through
   ``PYTHONPATH`` with this checkout's environment), run in one process — how ``make test`` ran them
   when it was serial;
2. the same tests in this checkout, in one process;
3. the same tests in this checkout with ``make test``'s own command (pytest-xdist over the cores),

and prints the wall times and the ratios 2/1 and 3/1, plus how many tests each tree has in all. Run
it with nothing else on the machine (the tests themselves start kernels, browsers and subprocesses).

    python benchmarks/bench_suite.py --base 3e6a1bb
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _short(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _collect(cwd: Path, env: dict) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        raise SystemExit(f"no tests collected in {cwd}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return ids


def _name(node_id: str) -> str:
    """The test's name within its file (``test_x[param]``), the key that survives moving files."""
    return node_id.split("::", 1)[1]


def _timed(argv: list[str], cwd: Path, env: dict, ids: list[str], log: Path) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(ids) + "\n")
    t0 = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv, f"@{f.name}"],
                            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - t0
    os.unlink(f.name)
    last = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
    print(f"  {last[0]}  (exit {rc}; log {log})")
    if rc != 0:
        raise SystemExit(f"pytest failed (exit {rc}); see {log}")
    return seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="the earlier commit (anything git rev-parse takes)")
    p.add_argument("--workers", default="auto", help="pytest-xdist workers for step 3 (default: auto, as make test)")
    p.add_argument("--logs", default=None, help="folder for the three pytest logs (default: a temporary folder)")
    args = p.parse_args(argv)

    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench-suite-"))
    logs.mkdir(parents=True, exist_ok=True)
    base, head = _short(args.base), _short("HEAD")
    with tempfile.TemporaryDirectory(prefix="bench-suite-base-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), base], cwd=ROOT, check=True)
        try:
            old_env = {**os.environ, "PYTHONPATH": str(old)}          # its lab/ before this checkout's
            new_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            old_ids, new_ids = _collect(old, old_env), _collect(ROOT, new_env)
            by_name: dict[str, list[str]] = {}
            for i in new_ids:
                by_name.setdefault(_name(i), []).append(i)
            common_old = [i for i in old_ids if len(by_name.get(_name(i), [])) == 1]
            common_new = [by_name[_name(i)][0] for i in common_old]
            print(f"tests at {base}: {len(old_ids)}; at {head}: {len(new_ids)}; in both: {len(common_old)} "
                  f"(the {len(old_ids) - len(common_old)} others were renamed or removed)")
            print(f"1. {len(common_old)} tests at {base}, one process")
            t_old = _timed([], old, old_env, common_old, logs / "base_serial.log")
            print(f"2. the same tests at {head}, one process")
            t_new = _timed([], ROOT, new_env, common_new, logs / "head_serial.log")
            print(f"3. the same tests at {head}, make test's command (-n {args.workers})")
            t_xdist = _timed(["-n", args.workers, "--maxprocesses", "4"], ROOT, new_env, common_new,
                             logs / "head_xdist.log")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    print(f"\n{base}, one process         {t_old:7.1f} s")
    print(f"{head}, one process         {t_new:7.1f} s   ratio {t_new / t_old:.2f} (< 1: faster)")
    print(f"{head}, make test's command {t_xdist:7.1f} s   ratio {t_xdist / t_old:.2f}")
    print(f"{os.cpu_count()} cores; load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
