"""bf16 autocast vs float32 features on the CPU: the effect on TOSCA's A_B and on prototype accuracy.

The frozen backbone (efficientnet_lite0 at 160 px) embeds the offline default fashion_mnist_mini
(6,000 train + 1,000 test images) once per precision, through the library's feature cache (bf16 is
its own entry, so a rerun only reads it). Then, for each seed (its own class order, B0 Inc2, as
``lab tosca study`` does), TOSCA with the RunConfig defaults (routed per-sample, oracle and ridge)
and the prototype classifiers SimpleCIL (cosine) and NCM (Euclidean) run on both feature sets. It
prints, per method and routing, A_B in each precision (mean ± 95 % t half-width over seeds) and the
paired difference bf16 - fp32 over seeds with its 95 % t-interval and a verdict, plus how far the
features moved (cosine per image, relative L2), and writes the per-seed rows to ``--out`` (CSV)::

    python benchmarks/bench_tosca_precision.py --out docs/data/tosca_bf16.csv [--threads 1]
    python benchmarks/bench_tosca_precision.py --smoke        # 300 train / 100 test, 2 seeds, 2 epochs

Time on one thread: the bf16 feature pass is emulated on CPUs without native bf16 (AVX2 only: ~2
images/s, about an hour for the 7,000 images) and native with AVX512-BF16/AMX (a minute or two); it
runs once, then the cache is read. The 60 TOSCA and prototype runs take a few minutes. ``--smoke``
takes under a minute with native bf16 (its features are embedded, not cached).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

DATASET = "fashion_mnist_mini"
SEEDS = tuple(range(1993, 2003))  # as lab tosca study
PRECISIONS = ("fp32", "bf16")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="CSV of the per-seed rows (written atomically)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--epochs", type=int, default=None, help="TOSCA epochs (default: RunConfig's)")
    ap.add_argument("--speed-images", type=int, default=256, help="images timed per precision (default 256)")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per precision, interleaved (default 3)")
    ap.add_argument("--smoke", action="store_true", help="300 train / 100 test images, 2 seeds, 2 epochs, no cache")
    a = ap.parse_args(argv)
    if a.smoke:
        a.seeds, a.epochs, a.speed_images, a.repeats = a.seeds[:2], a.epochs or 2, min(a.speed_images, 32), 1
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))

    import numpy as np
    import pandas as pd
    import torch

    from lab import backbones, features
    from lab.data import load_dataset, scenario
    from lab.experiments.tosca.methods import ScenarioData
    from lab.experiments.tosca.run import RunConfig, run
    from lab.experiments.tosca.study import t_interval

    torch.set_num_threads(a.threads)
    ds, bb = load_dataset(DATASET), backbones.load()
    sub = {"train": np.arange(len(ds.train.labels)), "test": np.arange(len(ds.test.labels))}
    if a.smoke:
        rng = np.random.RandomState(0)
        sub = {s: np.sort(rng.permutation(len(i))[:n]) for (s, i), n in zip(sub.items(), (300, 100))}

    # speed: the same images in both precisions, interleaved (a busy machine slows both alike), best of --repeats
    imgs = ds.train.images[:a.speed_images]
    for p in PRECISIONS:
        bb.embed(imgs[:8], batch_size=8, progress=False, precision=p)   # warm-up
    secs = {p: [] for p in PRECISIONS}
    for _ in range(a.repeats):
        for p in PRECISIONS:
            t0 = time.perf_counter()
            bb.embed(imgs, batch_size=128, progress=False, precision=p)
            secs[p].append(time.perf_counter() - t0)
    ips = {p: len(imgs) / min(s) for p, s in secs.items()}
    print(f"feature pass, {len(imgs)} images, batch 128, {a.threads} thread(s), best of {a.repeats}: " +
          ", ".join(f"{p} {v:.1f} images/s" for p, v in ips.items()) + f"; bf16/fp32 {ips['bf16'] / ips['fp32']:.2f}x",
          flush=True)

    # features of the whole dataset (cache) or of the smoke subset (embedded here), per precision
    feats = {}
    for p in PRECISIONS:
        t0 = time.perf_counter()
        if a.smoke:
            feats[p] = {s: bb.embed(ds.split(s).images[i], batch_size=50, progress=False, precision=p) for s, i in sub.items()}
        else:
            feats[p] = {s: features.extract(bb, DATASET, s, precision=p).features for s in sub}
        dt = time.perf_counter() - t0
        print(f"{p} features: {dt:.0f} s ({sum(len(i) for i in sub.values()) / dt:.1f} images/s; a cache read is fast)",
              flush=True)
    x32, x16 = (torch.cat([feats[p][s] for s in sub]) for p in PRECISIONS)
    cos = torch.nn.functional.cosine_similarity(x16, x32, dim=1)
    rel = (x16 - x32).norm(dim=1) / x32.norm(dim=1)
    print(f"features bf16 vs fp32 over {len(cos)} images: cosine mean {cos.mean():.5f} min {cos.min():.5f}; "
          f"relative L2 median {rel.median():.4f} max {rel.max():.4f}", flush=True)

    rows, right = [], {}
    with tempfile.TemporaryDirectory() as runs_root:
        for seed in a.seeds:
            scn = scenario([DATASET], init=0, inc=2, seed=seed)
            lab = {"train": scn.train_labels, "test": scn.test_labels}
            task = {"train": scn.train_task_ids, "test": scn.test_task_ids}
            for p in PRECISIONS:
                t = {s: (feats[p][s], torch.from_numpy(lab[s][i].astype(np.int64)), torch.from_numpy(task[s][i].astype(np.int64)))
                     for s, i in sub.items()}
                data = ScenarioData(*t["train"], *t["test"], [list(k.classes) for k in scn.tasks])
                for method in ("tosca", "simplecil", "ncm"):
                    kw = dict(routings=("per-sample", "oracle", "ridge")) if method == "tosca" else {}
                    if a.epochs:
                        kw["epochs"] = a.epochs
                    cfg = RunConfig(datasets=(DATASET,), method=method, seed=seed, threads=a.threads, **kw)
                    t0 = time.perf_counter()
                    res = run(cfg, data=data, runs_root=runs_root, progress=False)
                    if method != "tosca" and seed == a.seeds[0]:   # final prototypes: the same for every class order
                        pred = res.method.logits(data, torch.arange(len(data.test_y)))[0].argmax(-1)
                        right[method, p] = (pred == data.test_y).numpy().astype(float)
                    for r in res.summary.to_dict("records"):
                        rows.append({"seed": seed, "precision": p, "method": method, "routing": r["routing"],
                                     "A_B": r["last_acc"], "A_bar": r["avg_inc_acc"],
                                     "seconds": round(time.perf_counter() - t0, 2)})
            done = [r for r in rows if r["seed"] == seed and r["routing"] in ("per-sample", "single")]
            print(f"seed {seed}: " + ", ".join(f"{r['method']}/{r['precision']} {r['A_B']:.2f}" for r in done), flush=True)

    df = pd.DataFrame(rows)
    if a.out:
        from lab._io import atomic_write
        atomic_write(a.out, lambda tmp: df.to_csv(tmp, index=False, float_format="%.4f"))
        print(f"wrote {a.out} ({len(df)} rows)")

    # the table: per (method, routing) A_B in each precision and the paired difference over seeds
    print(f"\nA_B (%) over {len(a.seeds)} seeds, mean ± 95 % t half-width; paired bf16 - fp32 with its 95 % t-interval")
    print(f"{'method':10} {'routing':11} {'fp32':>14} {'bf16':>14} {'bf16 - fp32':>24}  verdict")
    for (method, routing), g in df.groupby(["method", "routing"], sort=False):
        w = g.pivot(index="seed", columns="precision", values="A_B")
        (m32, h32), (m16, h16), (d, hd) = (t_interval(w["fp32"]), t_interval(w["bf16"]),
                                           t_interval(w["bf16"] - w["fp32"]))
        verdict = "no difference detected" if d - hd <= 0 <= d + hd else ("bf16 higher" if d > 0 else "bf16 lower")
        if hd != hd:
            verdict = "one seed: no interval"
        elif hd == 0:   # the same difference on every seed: no spread to make an interval from
            verdict = ("equal on every seed" if d == 0 else "same on every seed: see the test-image interval below"
                       if method != "tosca" else f"bf16 {'higher' if d > 0 else 'lower'} on every seed")
        print(f"{method:10} {routing:11} {m32:7.2f} ± {h32:4.2f} {m16:7.2f} ± {h16:4.2f} "
              f"{d:+7.3f} [{d - hd:+6.3f}, {d + hd:+6.3f}]  {verdict}")

    # the prototype classifiers' final A_B does not depend on the class order: its interval is over test images
    n = len(sub["test"])
    print(f"\nprototype accuracy, all classes, paired over the {n} test images (95 % bootstrap, 2,000 replicates)")
    g = np.random.RandomState(1).randint(0, n, size=(2000, n))
    for method in ("simplecil", "ncm"):
        d = right[method, "bf16"] - right[method, "fp32"]
        lo, hi = np.percentile(d[g].mean(1), [2.5, 97.5]) * 100
        flips = int((d != 0).sum())
        verdict = "no difference detected" if lo <= 0 <= hi else ("bf16 higher" if d.mean() > 0 else "bf16 lower")
        print(f"{method:10} fp32 {100 * right[method, 'fp32'].mean():.2f} %  bf16 {100 * right[method, 'bf16'].mean():.2f} %  "
              f"bf16 - fp32 {100 * d.mean():+.2f} [{lo:+.2f}, {hi:+.2f}] pts (changed: {flips} images)  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
