"""The frozen backbone's feature pass: batch size and allocator settings, side by side in one run.

Each setting runs in its own process (glibc's allocator settings are per process), interleaved
A, B, A, B ... so a change in the machine's load hits every setting alike. Every process embeds
the same images of the offline default (efficientnet_lite0 at its default resolution on
fashion_mnist_mini's training split) and writes its features; the table prints images/s (median over
repeats) and CPU ms per image (steadier on a busy machine), each as a ratio to the first setting
(higher = faster), and whether the features are bit-identical to it.

    python benchmarks/bench_features.py                         # ~2-4 min on 2 cores
    python benchmarks/bench_features.py --images 1024 --repeats 3 --settings 128:off 32:on 64:on

A setting is ``BATCH:ALLOC``: ALLOC ``on`` = :func:`lab._alloc.tune_allocator` (what the library
does), ``off`` = glibc's defaults (what it did before).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import numpy as np
batch, alloc, n, out = int(sys.argv[1]), sys.argv[2] == "on", int(sys.argv[3]), sys.argv[4]
from lab import _alloc
_alloc.ENABLED = alloc
import torch
from lab import backbones
from lab.data.datasets import load_dataset
sp = load_dataset("fashion_mnist_mini").train
images = sp.images[:n]
bb = backbones.load()
bb.embed(images[: batch], batch_size=batch, progress=False)          # warm-up: weights paged in
t0, c0 = time.perf_counter(), time.process_time()
f = bb.embed(images, batch_size=batch, progress=False)
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
np.save(out, f.numpy())
print(json.dumps({"ips": n / dt, "cpu_ms": cpu / n * 1e3, "threads": torch.get_num_threads()}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--settings", nargs="+", default=["128:off", "32:on", "64:on", "128:on"])
    a = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}   # the process decides
    ips = {s: [] for s in a.settings}
    cpu = {s: [] for s in a.settings}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for s in a.settings:
                batch, alloc = s.split(":")
                out = os.path.join(tmp, f"{batch}-{alloc}.npy")
                res = subprocess.run([sys.executable, "-c", CHILD, batch, alloc, str(a.images), out],
                                     env=env, capture_output=True, text=True, timeout=900)
                if res.returncode:
                    sys.exit(f"{s}: {res.stderr.strip().splitlines()[-1]}")
                got = json.loads(res.stdout.strip().splitlines()[-1])
                ips[s].append(got["ips"])
                cpu[s].append(got["cpu_ms"])
                print(f"  repeat {r + 1}/{a.repeats} {s:9s} {ips[s][-1]:6.1f} images/s  {cpu[s][-1]:6.2f} CPU ms/image",
                      flush=True)
        import numpy as np

        ref = np.load(os.path.join(tmp, "{}-{}.npy".format(*a.settings[0].split(":"))))
        base = statistics.median(ips[a.settings[0]])
        cbase = statistics.median(cpu[a.settings[0]])
        print(f"\n{'setting':10s} {'images/s':>9s} {'ratio':>6s} {'CPU ms/img':>10s} {'ratio':>6s}  features vs {a.settings[0]}")
        for s in a.settings:
            f = np.load(os.path.join(tmp, "{}-{}.npy".format(*s.split(":"))))
            same = "bit-identical" if np.array_equal(f, ref) else f"max |diff| {np.abs(f - ref).max():.3g}"
            m, c = statistics.median(ips[s]), statistics.median(cpu[s])
            print(f"{s:10s} {m:9.1f} {m / base:6.2f} {c:10.2f} {cbase / c:6.2f}  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
