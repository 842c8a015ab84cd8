"""The GPU check: the paper-scale foundation on one GPU, in about two minutes, nothing downloaded.

[1] ViT-B/16 feature extraction through the lab's own path (:func:`lab.features._compute`: a
    DataLoader of uint8 CIFAR-shaped 32 px images, pinned memory and workers, the reference
    preprocessing Resize(256) + CenterCrop(224) on the device, bf16 autocast), random weights.
    Prints images/s, FLOPs per image (counted by ``torch.utils.flop_counter`` on the model) and the
    share of the dense bf16 peak (``--peak-tflops``, 989 for an H200 SXM).
[2] TOSCA end-to-end at CIFAR-100 shape through the lab's harness (``lab.experiments.tosca.run``):
    random Gaussian-cluster features, 50,000 train / 10,000 test of dim 768, 100 classes, B0 Inc10
    = 10 tasks, the reference's 20 epochs, every routing evaluated after every task, run files
    written. Prints its wall time divided by ONE feature pass over the 60,000 images (from [1]'s
    rate); the target is <= 1.5 (TOSCA costs at most half a feature pass on top of it).

Exit status 0 when every number is finite and the ratio meets ``--target``, 1 otherwise.

    benchmarks/gpu_check.sh                                  # the H200 check (defaults)
    python benchmarks/gpu_check.py --device cpu --tiny       # proves it runs, in seconds
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time

import numpy as np
import torch

TINY = dict(arch="vit_tiny_patch16_224", res=32, images=64, batch=32, train_per_class=20, test_per_class=10,
            classes=10, inc=5, dim=64, epochs=1)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def random_vit(arch: str, res: int, device: str):
    """A frozen lab Backbone around timm's ``arch`` with random weights (seed 0), reference preprocessing."""
    import timm

    from lab import backbones

    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, num_classes=0, img_size=res)
    bb = backbones._finish(f"{arch} (random init)", model, res, "random-seed0", True, (0.5,) * 3, (0.5,) * 3,
                           "vit", "reference")
    return bb.to(device)


def flops_per_image(bb) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.rand(1, 3, bb.resolution, bb.resolution, device=bb.device)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        bb.features(x)
    return float(counter.get_total_flops())


def extraction(args) -> dict:
    from lab import features

    bb = random_vit(args.arch, args.res, args.device)
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, (args.images, 32, 32, 3)).astype(np.uint8)   # CIFAR's shape
    workers = features.default_workers(args.device) if args.workers is None else args.workers
    features._compute(bb, images[:2 * args.batch], [None], args.batch, False, "", "auto", workers)   # warm-up
    _sync(args.device)
    t0 = time.perf_counter()
    out = features._compute(bb, images, [None], args.batch, False, "", "auto", workers)[None]
    _sync(args.device)
    seconds = time.perf_counter() - t0
    flops = flops_per_image(bb)
    rate = args.images / seconds
    return dict(rate=rate, flops=flops, peak=100 * rate * flops / (args.peak_tflops * 1e12), precision=bb.precision(),
                finite=bool(torch.isfinite(out).all()), dim=out.shape[1], workers=workers)


def tosca_end_to_end(args) -> dict:
    from lab.experiments.tosca._synthetic import synthetic_data
    from lab.experiments.tosca.run import RunConfig, run

    data = synthetic_data(num_tasks=args.classes // args.inc, classes_per_task=args.inc, dim=args.dim,
                          n_train=args.train_per_class, n_test=args.test_per_class, seed=0)
    engine = args.engine or ("cuda_graph" if torch.device(args.device).type == "cuda" else "eager")
    cfg = RunConfig(datasets=("cifar100",), init=0, inc=args.inc, epochs=args.epochs, device=args.device,
                    engine=engine, name="gpu_check")
    with tempfile.TemporaryDirectory() as runs:
        _sync(args.device)
        t0 = time.perf_counter()
        res = run(cfg, runs_root=runs, progress=False, data=data)
        _sync(args.device)
        seconds = time.perf_counter() - t0
    head = res.headline()
    return dict(seconds=seconds, engine=engine, tasks=res.info["num_tasks"], n_train=len(data.train_y),
                n_test=len(data.test_y), acc=float(head["last_acc"]), finite=math.isfinite(float(head["last_acc"])))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (a CPU dry run): " + str(TINY))
    p.add_argument("--arch", default="vit_base_patch16_224", help="timm ViT, random weights")
    p.add_argument("--res", type=int, default=224)
    p.add_argument("--images", type=int, default=16384, help="images timed in [1]")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: lab's choice)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--inc", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=500)
    p.add_argument("--test-per-class", type=int, default=100)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--engine", default=None, help="TOSCA engine (default: cuda_graph on CUDA, eager elsewhere)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 SXM: 989)")
    p.add_argument("--target", type=float, default=1.5, help="pass if end-to-end / feature pass <= this")
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in TINY.items():
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but CUDA is not available", file=sys.stderr)
        return 1
    where = torch.cuda.get_device_name(torch.device(args.device)) if torch.device(args.device).type == "cuda" else "CPU"
    print(f"gpu_check on {where}, torch {torch.__version__}")

    t0 = time.perf_counter()
    ex = extraction(args)
    print(f"[1] {args.arch} @ {args.res}px, random weights, {ex['precision']}, batch {args.batch}, "
          f"{ex['workers']} workers: {ex['rate']:,.0f} images/s; {ex['flops'] / 1e9:.2f} GFLOPs/image -> "
          f"{ex['rate'] * ex['flops'] / 1e12:.1f} TFLOP/s = {ex['peak']:.1f} % of {args.peak_tflops:g} TFLOP/s")
    n_all = args.classes * (args.train_per_class + args.test_per_class)
    t_pass = n_all / ex["rate"]
    tosca = tosca_end_to_end(args)
    ratio = (t_pass + tosca["seconds"]) / t_pass
    print(f"[2] TOSCA ({tosca['engine']}), {tosca['n_train']:,} train / {tosca['n_test']:,} test features of dim "
          f"{args.dim}, {tosca['tasks']} tasks x {args.epochs} epochs, every routing after every task: "
          f"{tosca['seconds']:.2f} s (final A_B {tosca['acc']:.1f} on random clusters)")
    print(f"    one feature pass over {n_all:,} images at [1]'s rate: {t_pass:.2f} s; end-to-end / feature pass = "
          f"({t_pass:.2f} + {tosca['seconds']:.2f}) / {t_pass:.2f} = {ratio:.3f} (target <= {args.target:g})")
    ok = ex["finite"] and tosca["finite"] and math.isfinite(ratio) and ratio <= args.target
    print(f"{'PASS' if ok else 'FAIL'} in {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
