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
[3] AWARe on a LLaVA in bf16 through the lab's hub-LLaVA path (:mod:`lab.experiments.aware.run.hub_llava`):
    ``--model llava-1.5-7b`` (default) builds a random ``LlavaForConditionalGeneration`` of
    llava-hf/llava-1.5-7b-hf's shapes (CLIP ViT-L/14-336 + a 7B Llama, 576 image tokens) on the
    device; a hub id or folder loads that checkpoint instead. Profiles q/k/v + projector on
    ``--llava-calib`` questions about random images, then 10 AWARe fine-tuning steps (rho 0.3,
    gradient checkpointing, AdamW) of ``--llava-batch`` questions. Prints profiling samples/s,
    seconds per training step, tokens/s and the peak GPU memory, and checks that the retained rows
    are bit-identical after the steps. Without CUDA the 7B shape is skipped (``--tiny`` uses a tiny one).

Exit status 0 when every number is finite, the ratio meets ``--target`` and [3]'s retained rows
held, 1 otherwise.

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
            classes=10, inc=5, dim=64, epochs=1, model="tiny", llava_calib=8, llava_batch=4)
_COLOURS = ("red", "green", "blue", "yellow", "teal", "brown", "gray", "black")


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


def llava_aware(args) -> dict:
    """[3]: profile + ``args.llava_steps`` AWARe steps on a (random) LLaVA, in ``args.llava_dtype``."""
    from lab.aware.config import AwareConfig
    from lab.aware.freeze import RowSplitLinear
    from lab.aware.methods import MethodSpec, finish, prepare
    from lab.aware.saliency import profile
    from lab.experiments.aware.run import hub_llava
    from lab.experiments.aware.run.finetune import TrainConfig, train
    from lab.experiments.aware.run.profiling import calibration_batches
    from lab.experiments.aware.run.tasks import QASet

    cuda = torch.device(args.device).type == "cuda"
    dtype = hub_llava.dtype_of(args.llava_dtype, "cuda")          # bf16 unless told otherwise, CPU included
    question = "What colour is the shape?"
    t0 = time.perf_counter()
    if args.model in hub_llava.SHAPES:
        model, processor = hub_llava.random_llava(args.model, words=[question, *_COLOURS], dtype=dtype,
                                                  device=args.device)
        model, enc = hub_llava.wrap(model, processor, device=args.device, dtype=dtype)
    else:
        model, enc = hub_llava.load(args.model, device=args.device, dtype=dtype)
    _sync(args.device)
    load_s = time.perf_counter() - t0
    n = max(args.llava_calib, args.llava_steps * args.llava_batch)
    rng = np.random.RandomState(0)
    images = hub_llava.raw_images(rng.randint(0, 256, (n, 64, 64, 3)).astype(np.uint8))
    answers = [_COLOURS[i] for i in rng.randint(0, len(_COLOURS), n)]
    qa = QASet("random", [question] * n, answers, [_COLOURS] * n, np.arange(n), images)
    batches = calibration_batches(qa.subset(range(args.llava_calib)), enc, batch_size=args.llava_batch)
    if cuda:
        torch.cuda.reset_peak_memory_stats(args.device)
    _sync(args.device)
    t0 = time.perf_counter()
    sal = profile(model, batches, targets="qkv+projector", progress=False)
    _sync(args.device)
    profile_s = time.perf_counter() - t0
    cfg = TrainConfig(steps=args.llava_steps, batch_size=args.llava_batch)
    model, groups, info = prepare(model, MethodSpec("aware", AwareConfig(rho=0.3)), cfg, saliency=sal)
    kept = {n: (m.frozen_rows, m.base_layer.weight[m.frozen_rows].clone()) for n, m in model.named_modules()
            if isinstance(m, RowSplitLinear)}
    log = train(model, groups, qa, enc, cfg, progress=False, desc="gpu_check")
    model = finish(model, "aware")
    mods = dict(model.named_modules())
    held = all(torch.equal(mods[n].weight[rows], w) for n, (rows, w) in kept.items())
    steps = log["step_seconds"][1:] or log["step_seconds"]          # the first step pays warm-up
    tokens = enc.collate([enc.encode(question, "red", image=True)] * args.llava_batch,
                         images[:args.llava_batch])["input_ids"].numel()
    params = sum(p.numel() for p in model.parameters())
    return dict(name=args.model, params=params, dtype=str(dtype).replace("torch.", ""), load_s=load_s,
                layers=len(sal.scores), n_calib=sal.n_samples, profile_rate=sal.n_samples / profile_s,
                step_s=float(np.median(steps)), tokens_per_s=tokens / float(np.median(steps)), steps=len(log["losses"]),
                loss=log["losses"][-1], trainable=info["trainable"], n_image=enc.n_image, held=held,
                peak_gb=torch.cuda.max_memory_allocated(args.device) / 2**30 if cuda else float("nan"),
                finite=all(math.isfinite(x) for x in log["losses"]) and all(bool(torch.isfinite(v).all())
                                                                            for v in sal.scores.values()))


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
    p.add_argument("--model", default="llava-1.5-7b",
                   help="[3]'s LLaVA: llava-1.5-7b or tiny (random weights of that shape), or a hub id / local folder")
    p.add_argument("--llava-dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--llava-calib", type=int, default=64, help="[3] calibration questions profiled")
    p.add_argument("--llava-batch", type=int, default=8, help="[3] questions per training step")
    p.add_argument("--llava-steps", type=int, default=10, help="[3] AWARe training steps")
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
    if args.model == "llava-1.5-7b" and torch.device(args.device).type != "cuda":
        print("[3] skipped: the llava-1.5-7b shape needs CUDA (--tiny, or --model tiny, runs a tiny one)")
    else:
        lv = llava_aware(args)
        peak = f"{lv['peak_gb']:.1f} GiB" if math.isfinite(lv["peak_gb"]) else "n/a (CPU)"
        print(f"[3] AWARe on {lv['name']} ({lv['params']:,} parameters, {lv['dtype']}, {lv['n_image']} image "
              f"tokens; built/loaded in {lv['load_s']:.1f} s): profiled {lv['layers']} q/k/v + projector layers on "
              f"{lv['n_calib']} questions at {lv['profile_rate']:.1f} samples/s; {lv['steps']} AWARe steps (rho 0.3, "
              f"{lv['trainable']:,} trainable, batch {args.llava_batch}): {lv['step_s']:.3f} s/step, "
              f"{lv['tokens_per_s']:,.0f} tokens/s, last loss {lv['loss']:.3f}; peak GPU memory {peak}; "
              f"retained rows {'bit-identical' if lv['held'] else 'MOVED'}")
        ok = ok and lv["finite"] and lv["held"]
    print(f"{'PASS' if ok else 'FAIL'} in {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
