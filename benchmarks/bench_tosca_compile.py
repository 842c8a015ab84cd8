"""The plain TOSCA step, torch.compile and the fused C step, side by side on the study's workload.

One TOSCA run of the shipped study's default scenario (fashion_mnist_mini on cached
EfficientNet-Lite0 features, B0 Inc2 = 5 tasks, 20 epochs, per-sample routing) per engine, one
thread. Each engine runs in a fresh interpreter with an empty inductor cache, so 'compile' pays its
compilation (timed as part of training, as a user meets it); ``--runs 2`` adds a second run in the
same interpreter (compiled code reused). Prints each engine's training seconds and the ratios.

    python benchmarks/bench_tosca_compile.py              # autograd, compile, fused; one run each
    python benchmarks/bench_tosca_compile.py --runs 2 --seed 1994
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ENGINES = ("autograd", "compile", "fused")


def one_engine(engine: str, runs: int, seed: int) -> list[float]:
    """Training seconds of ``runs`` runs with ``engine``, in this interpreter."""
    import torch

    from lab.experiments.tosca.run import RunConfig, run

    torch.set_num_threads(1)
    out = []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(runs):
            res = run(RunConfig(seed=seed, method="tosca", engine=engine, routings=("per-sample",), threads=1),
                      progress=False, runs_root=d)
            ran = set(res.epochs.engine)
            if ran != {engine}:
                raise SystemExit(f"engine {engine!r} asked, {sorted(ran)} ran")
            out.append(res.info["seconds"]["training"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=1, help="runs per engine in one interpreter (default 1)")
    p.add_argument("--seed", type=int, default=1993)
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(one_engine(a.child, a.runs, a.seed)))
        return 0
    secs = {}
    for engine in a.engines.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": cache}
            r = subprocess.run([sys.executable, __file__, "--child", engine, "--runs", str(a.runs),
                                "--seed", str(a.seed)], env=env, capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-2000:], file=sys.stderr)
            return 1
        secs[engine] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{engine:9s} training s per run: {', '.join(f'{s:.2f}' for s in secs[engine])}", flush=True)
    base = secs.get("autograd")
    for engine, s in secs.items():
        if base and engine != "autograd":
            ratios = ", ".join(f"{b / x:.2f}" for b, x in zip(base, s))
            print(f"autograd / {engine}: {ratios} (run 1 = with {engine}'s start-up{', then reused' if a.runs > 1 else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
