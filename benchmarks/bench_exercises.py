"""How long does each exercise take to run? Every exercise cell of the notebooks, timed as `lab report`
runs them.

Renders the notebooks (``lab report --solutions``, so each exercise also computes and self-checks its
solution: the most a cell ever does) with the given parameter profile into a temporary folder, then
reads papermill's per-cell durations from the executed notebooks: for every cell tagged ``exercise``,
its exercise id(s) and seconds, against the budget of two minutes a student has per exercise. A
*predict* exercise's cell also measures what was predicted, so its time is the whole exercise's.
Notebooks without exercise cells yet are skipped with a line saying so.

    python benchmarks/bench_exercises.py                       # 00, 03, 05 with the smoke profile
    python benchmarks/bench_exercises.py --params report       # at the report's parameters
    python benchmarks/bench_exercises.py --only 00_quickstart  # one notebook

Exit status 1 when a notebook fails or an exercise cell takes longer than the budget.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 120.0
DEFAULT = ("00_quickstart", "03_aware_saliency", "05_your_own_idea")
_ID = re.compile(r'exercises\.check\("(\d\d\.\d+)"')


def exercise_cells(nb) -> list[tuple[list[str], float]]:
    """``(exercise ids, seconds)`` of every cell tagged ``exercise`` in an executed notebook."""
    out = []
    for cell in nb.cells:
        if "exercise" in cell.metadata.get("tags", []):
            pm = cell.metadata.get("papermill") or {}
            out.append((_ID.findall(cell.source), float(pm.get("duration") or float("nan"))))
    return out


def main(argv=None) -> int:
    import nbformat

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", choices=("smoke", "report"), default="smoke")
    ap.add_argument("--only", action="append", metavar="NAME", help=f"notebook (default: {', '.join(DEFAULT)})")
    ap.add_argument("--out", help="keep the rendered notebooks here (default: a temporary folder)")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks side by side (default 1: timings undisturbed)")
    a = ap.parse_args(argv)
    names = a.only or list(DEFAULT)
    with tempfile.TemporaryDirectory(prefix="bench-exercises-") as tmp:
        out = Path(a.out or tmp)
        argv_ = [sys.executable, "-m", "lab", "report", "--params", a.params, "--no-png", "--solutions",
                 "--jobs", str(a.jobs), "--out", str(out), *[x for n in names for x in ("--only", n)]]
        t0 = time.perf_counter()
        r = subprocess.run(argv_, cwd=ROOT, capture_output=True, text=True)
        print(f"lab report --params {a.params} --solutions ({len(names)} notebooks): {time.perf_counter() - t0:.0f} s, "
              f"exit {r.returncode}")
        if r.returncode:
            print(r.stdout[-2000:] + r.stderr[-2000:])
        print(f"\n{'notebook':<26} {'exercise':<9} {'seconds':>8}  within {BUDGET_S:.0f} s")
        worst, over = 0.0, 0
        for name in names:
            path = out / "solutions" / f"{name}.ipynb"
            if not path.exists():
                print(f"{name:<26} (not rendered)")
                continue
            cells = exercise_cells(nbformat.read(path, as_version=4))
            if not cells:
                print(f"{name:<26} (no exercise cells yet)")
            for ids, sec in cells:
                worst = max(worst, sec)
                over += sec > BUDGET_S
                print(f"{name:<26} {', '.join(ids):<9} {sec:8.2f}  {'yes' if sec <= BUDGET_S else 'NO'}")
        print(f"\nslowest exercise cell: {worst:.2f} s; over the budget: {over}")
    return 1 if r.returncode or over else 0


if __name__ == "__main__":
    sys.exit(main())
