"""Is `make report` faster than at an earlier commit? Both trees' notebooks, side by side in one run.

For every notebook that exists in both trees, in the report's order, this runs ``lab report --only
NOTEBOOK`` at ``--base`` (a git worktree of that commit in a temporary folder, imported through
``PYTHONPATH`` with this checkout's environment: the kernel inherits it) and then here, each tree
with its own empty feature cache (``LAB_CACHE_DIR``; a notebook reuses what the earlier notebooks
of its own tree cached, as in one ``make report``). Base and new alternate notebook by notebook, so
a change in the machine's load hits both alike. Prints each notebook's wall time in both trees, the
ratio new/base, and the totals.

    python benchmarks/bench_report.py --base f0898de            # ~25-40 min on 2 cores
    python benchmarks/bench_report.py --base f0898de --no-png   # without kaleido's PNG export
    python benchmarks/bench_report.py --base f0898de --new HEAD # a commit, not the working tree
    python benchmarks/bench_report.py --whole --jobs 1 2        # this tree's whole `lab report`, one
                                                                # notebook at a time vs two side by side

``--whole`` times the whole command instead (``lab report --jobs J`` for each J of ``--jobs`` here,
and with ``--base`` the base tree's whole ``lab report`` first), each with its own empty cache, the
settings alternating ``--repeats`` times; it prints each elapsed time and its ratio to the first.
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


def _report(tree: Path, out: Path, cache: Path, args: list[str]) -> tuple[float, int]:
    """``lab report ARGS --out OUT`` in ``tree`` (imported through ``PYTHONPATH``) with its own feature
    cache: (wall seconds, exit status)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "LAB_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "lab", "report", "--out", str(out), *args], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=7200)
    return time.perf_counter() - t0, r.returncode


def _run(tree: Path, nb: str, out: Path, cache: Path, extra: list[str]) -> tuple[float, int]:
    return _report(tree, out, cache, ["--only", nb, *extra])


def whole(a, extra: list[str]) -> int:
    """``--whole``: the whole command per setting, alternating, each with an empty cache."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        tmp = Path(tmp)
        settings = [(f"this tree, --jobs {j}", ROOT, [*extra, "--jobs", str(j)]) for j in a.jobs]
        if a.base:
            base = tmp / "base"
            subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT, check=True,
                           capture_output=True)
            settings.insert(0, (f"{a.base} (one at a time)", base, extra))
        times = {name: [] for name, _, _ in settings}
        try:
            for rep in range(a.repeats):
                for i, (name, tree, args) in enumerate(settings):
                    folder = tmp / f"run{rep}-{i}"
                    t, rc = _report(tree, folder / "out", folder / "cache", args)
                    shutil.rmtree(folder, ignore_errors=True)
                    times[name].append(t)
                    print(f"  {name:32s} {t:7.1f} s{'' if rc == 0 else f'  (exit {rc})'}", flush=True)
        finally:
            if a.base:
                subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "base")], cwd=ROOT,
                               capture_output=True)
    first = min(times[settings[0][0]])
    print(f"{'setting':34s} {'best s':>7s} {'ratio':>6s}")
    for name, ts in times.items():
        print(f"{name:34s} {min(ts):7.1f} {min(ts) / first:6.2f}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="f0898de", help="the earlier commit (default: f0898de; with --whole: none "
                                                     "unless given)")
    p.add_argument("--new", default=None, help="compare this commit instead of the checkout (a worktree too)")
    p.add_argument("--no-png", action="store_true", help="pass --no-png to both trees")
    p.add_argument("--whole", action="store_true", help="time the whole `lab report` per setting (see above)")
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="with --whole: the --jobs values timed here")
    p.add_argument("--repeats", type=int, default=1, help="with --whole: rounds of every setting (best kept)")
    a = p.parse_args(argv)
    extra = ["--no-png"] if a.no_png else []
    if a.whole:
        a.base = a.base if "--base" in (argv if argv is not None else sys.argv[1:]) else None
        return whole(a, extra)
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT, check=True,
                       capture_output=True)
        new = ROOT
        if a.new:
            new = tmp / "new"
            subprocess.run(["git", "worktree", "add", "--detach", str(new), a.new], cwd=ROOT, check=True,
                           capture_output=True)
        try:
            names = sorted(n.name for n in (new / "notebooks").glob("*.ipynb")
                           if (base / "notebooks" / n.name).is_file())
            print(f"{'notebook':40s} {'base s':>8s} {'new s':>8s} {'ratio':>6s}")
            tot_b = tot_n = 0.0
            for nb in names:
                tb, rb = _run(base, nb, tmp / "out-base", tmp / "cache-base", extra)
                tn, rn = _run(new, nb, tmp / "out-new", tmp / "cache-new", extra)
                tot_b, tot_n = tot_b + tb, tot_n + tn
                flag = "" if rb == rn == 0 else f"  (exit base {rb}, new {rn})"
                print(f"{nb:40s} {tb:8.1f} {tn:8.1f} {tn / tb:6.2f}{flag}", flush=True)
            print(f"{'all notebooks in both trees':40s} {tot_b:8.1f} {tot_n:8.1f} {tot_n / tot_b:6.2f}")
            only_new = sorted(set(n.name for n in (new / "notebooks").glob("*.ipynb")) - set(names))
            all_new = tot_n
            for nb in only_new:      # timed too, for this tree's whole make report
                tn, rn = _run(new, nb, tmp / "out-new", tmp / "cache-new", extra)
                all_new += tn
                print(f"{nb:40s} {'-':>8s} {tn:8.1f}  (only in this tree{'' if rn == 0 else f'; exit {rn}'})", flush=True)
            if only_new:
                print(f"{'every notebook of this tree':40s} {'':8s} {all_new:8.1f}")
        finally:
            for tree in {base, new} - {ROOT}:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
