"""TOSCA's training time per run with the 'fused' engine against the 'eager' one, side by side.

The offline default scenario (fashion_mnist_mini on cached EfficientNet-Lite0 features, B0 Inc2,
20 epochs), one run per (seed, engine), the two engines alternating which goes first, so a load
change on the machine hits both alike. Prints each run's training seconds and the ratio
eager / fused: geometric mean over seeds with its 95 % t-interval.

    python benchmarks/bench_tosca_engines.py              # seeds 1993-2000
    python benchmarks/bench_tosca_engines.py --seeds 4
"""
from __future__ import annotations

import argparse
import statistics
import tempfile

import numpy as np
from scipy import stats

from lab.experiments.tosca.run import RunConfig, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=8, help="how many seeds from 1993 (default 8)")
    a = p.parse_args(argv)
    secs = {"fused": [], "eager": []}
    with tempfile.TemporaryDirectory() as d:
        for seed in range(1993, 1993 + a.seeds):
            for engine in ("fused", "eager") if seed % 2 else ("eager", "fused"):
                res = run(RunConfig(seed=seed, method="tosca", engine=engine, routings=("per-sample",)),
                          progress=False, runs_root=d)
                ran = set(res.epochs.engine)
                if ran != {engine}:
                    print(f"engine {engine!r} asked, {sorted(ran)} ran (no C compiler?)")
                    return 1
                secs[engine].append(res.info["seconds"]["training"])
                print(f"seed {seed} {engine:5s} {secs[engine][-1]:6.2f} s training", flush=True)
    log_ratio = np.log(np.array(secs["eager"]) / np.array(secs["fused"]))
    half = stats.t.ppf(0.975, len(log_ratio) - 1) * log_ratio.std(ddof=1) / np.sqrt(len(log_ratio))
    m = log_ratio.mean()
    print(f"median training s: eager {statistics.median(secs['eager']):.2f}, fused {statistics.median(secs['fused']):.2f}; "
          f"eager / fused {np.exp(m):.2f} [{np.exp(m - half):.2f}, {np.exp(m + half):.2f}] over {a.seeds} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
