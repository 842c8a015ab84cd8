"""Does the command line answer at once? Wall time of `lab` commands that should not load torch.

Each command runs as a fresh process (``python -m lab.cli ...``, as the ``lab`` script does), a few
times; the median is printed beside its budget and the ratio (median / budget; above 1 = too slow):
every ``--help`` and usage error 0.5 s, ``lab backbones`` 1 s (the issue "First contact on a slower
machine"). A first run (Python compiling the lab's bytecode) is discarded, and the commands run
with bytecode caching on even where $PYTHONDONTWRITEBYTECODE is set. The times include
Python's own start-up (~0.03-0.1 s); on a loaded machine they grow with the load, so compare
runs on the same machine, quiet. For a command over its budget, ``python -X importtime -m lab.cli
...`` shows what it imports. Nothing is asserted here (tests/test_cli.py checks that no --help
imports torch); the exit status is 1 when a median is over its budget.

    python benchmarks/bench_cli.py            # 5 runs each
    python benchmarks/bench_cli.py --runs 9 --only "tosca --help"
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP, LISTING = 0.5, 1.0   # budgets, seconds

COMMANDS = [
    ("--help", HELP), ("tosca --help", HELP), ("tosca study --help", HELP), ("aware --help", HELP),
    ("aware finetune --help", HELP), ("aware study --help", HELP), ("report --help", HELP),
    ("backbones --help", HELP), ("datasets --help", HELP), ("features --help", HELP), ("jupyter --help", HELP),
    # usage errors: argparse's own, then the first checks of a handler
    ("tosca --method nope", HELP), ("aware finetune --rule nope", HELP), ("report --params huge", HELP),
    ("tosca --epochs 0", HELP), ("features --batch-size 0", HELP), ("jupyter --port -1", HELP),
    ("backbones", LISTING),
]


def _time(argv: list[str], env: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "lab.cli", *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - t0, p.returncode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs per command (default 5; the median is shown)")
    p.add_argument("--only", action="append", metavar="COMMAND", help="only this command (repeatable), e.g. 'tosca --help'")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}   # `lab backbones`: no network wait
    # bytecode cached, Python's default (a machine that sets PYTHONDONTWRITEBYTECODE compiles every
    # imported module on every start: ~0.1 s more here; the Makefile does not pass it on either)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    todo = [(c, b) for c, b in COMMANDS if not args.only or c in args.only]
    if not todo:
        p.error(f"no such command; choose from: {', '.join(c for c, _ in COMMANDS)}")
    _time(["--help"], env)   # compiles the lab's bytecode once
    print(f"{'command':<30} {'median s':>9} {'min s':>7} {'budget s':>9} {'ratio':>6}  exit")
    over = 0
    for command, budget in todo:
        words = shlex.split(command)
        _time(words, env)    # warm: this command's modules compiled and in the page cache
        runs = [_time(words, env) for _ in range(args.runs)]
        times = [t for t, _ in runs]
        med = statistics.median(times)
        over += med > budget
        print(f"lab {command:<26} {med:>9.2f} {min(times):>7.2f} {budget:>9.1f} {med / budget:>6.2f}  "
              f"{runs[-1][1]}{'   OVER BUDGET' if med > budget else ''}", flush=True)
    print(f"\n{len(todo) - over}/{len(todo)} commands within budget ({args.runs} runs each, median; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
