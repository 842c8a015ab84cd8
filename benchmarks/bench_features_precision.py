"""bf16 autocast vs float32 for the frozen feature pass on the CPU: speed and what it does to accuracy.

Embeds the same images of the offline default (efficientnet_lite0 on fashion_mnist_mini) in both
precisions, interleaved (fp32, bf16, fp32, bf16) so a busy machine slows both alike, and prints
images/s with the ratio bf16 / fp32, the features' relative difference, and the prototype (nearest
class mean, SimpleCIL's classifier over all classes) accuracy on the test split in each precision
with its 95 % bootstrap interval over test items, plus the paired difference with a verdict::

    python benchmarks/bench_features_precision.py [--train 1000] [--test 1000] [--batch-size 128] [--repeats 2]

The library's CPU default stays float32 unless no accuracy difference is detected *and* bf16 is
faster on the machine at hand (CPUs without native bf16 instructions, e.g. AVX2-only, emulate it).
"""
from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=1000, help="training images for the prototypes (default 1000)")
    ap.add_argument("--test", type=int, default=1000, help="test images scored (default 1000, the whole split)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per precision, interleaved (default 2)")
    ap.add_argument("--replicates", type=int, default=2000)
    a = ap.parse_args(argv)

    import numpy as np
    import torch

    from lab import backbones
    from lab.data.datasets import load_dataset

    ds = load_dataset("fashion_mnist_mini")
    rng = np.random.RandomState(0)
    tr = rng.permutation(len(ds.train.labels))[: a.train]
    te = np.arange(min(a.test, len(ds.test.labels)))
    bb = backbones.load()
    bb.embed(ds.train.images[:a.batch_size], batch_size=a.batch_size, progress=False)   # warm-up
    feats, secs = {"fp32": [], "bf16": []}, {"fp32": [], "bf16": []}
    for _ in range(a.repeats):
        for p in ("fp32", "bf16"):
            t0 = time.perf_counter()
            f = (bb.embed(ds.train.images[tr], batch_size=a.batch_size, progress=False, precision=p),
                 bb.embed(ds.test.images[te], batch_size=a.batch_size, progress=False, precision=p))
            secs[p].append(time.perf_counter() - t0)
            feats[p] = f
    n = len(tr) + len(te)
    ips = {p: n / min(s) for p, s in secs.items()}
    ytr, yte = torch.from_numpy(ds.train.labels[tr].astype(np.int64)), ds.test.labels[te].astype(np.int64)
    right = {}
    for p, (ftr, fte) in feats.items():
        protos = torch.stack([ftr[ytr == c].mean(0) for c in range(int(ytr.max()) + 1)])
        pred = torch.cdist(fte, protos).argmin(1).numpy()
        right[p] = (pred == yte).astype(float)
    rel = float(((feats["bf16"][1] - feats["fp32"][1]).norm(dim=1) / feats["fp32"][1].norm(dim=1)).median())

    def boot(x):
        g = np.random.RandomState(1)
        m = x[g.randint(0, len(x), size=(a.replicates, len(x)))].mean(1)
        return x.mean(), *np.percentile(m, [2.5, 97.5])

    print(f"feature pass, {n} images (best of {a.repeats}, interleaved): fp32 {ips['fp32']:.0f} images/s, "
          f"bf16 {ips['bf16']:.0f} images/s; ratio bf16/fp32 {ips['bf16'] / ips['fp32']:.2f}x "
          f"({'faster' if ips['bf16'] > ips['fp32'] else 'slower'} in bf16)")
    print(f"features: median relative difference |bf16 - fp32| / |fp32| = {rel:.4f}")
    for p in ("fp32", "bf16"):
        e, lo, hi = boot(right[p])
        print(f"prototype accuracy {p}: {100 * e:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] over {len(te)} test images")
    e, lo, hi = boot(right["bf16"] - right["fp32"])
    verdict = "no difference detected" if lo <= 0 <= hi else ("bf16 higher" if e > 0 else "bf16 lower")
    print(f"bf16 - fp32: {100 * e:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] (paired over test images): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
