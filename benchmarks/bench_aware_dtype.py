"""bf16 vs float32 on the mini-LLaVA (CPU): what `--dtype bf16` costs in answers and gains (or not) in time.

Scores the aligned base model's upstream skills (easy-VQA, the text probe) in both precisions, answer
by answer, and times a few full fine-tuning steps of each, interleaved so a busy machine slows both
alike. Prints accuracies, the fraction of questions scored alike, and time ratios (bf16 / fp32)::

    python benchmarks/bench_aware_dtype.py [--n-easy 200] [--n-probe 320] [--steps 3] [--batch-size 16] [--device cpu]
"""
from __future__ import annotations

import argparse
import copy
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-easy", type=int, default=200)
    ap.add_argument("--n-probe", type=int, default=320)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    a = ap.parse_args(argv)

    from dataclasses import replace

    import numpy as np
    import torch

    from lab.experiments.aware.run.context import SIZES, setup
    from lab.experiments.aware.run.finetune import TrainConfig, evaluate, train

    size = replace(SIZES["default"], n_easy_eval=a.n_easy, n_probe=a.n_probe)
    ctx = setup(size, tasks_needed=("fashion",), device=a.device, progress=False)
    models = {"fp32": ctx.base, "bf16": copy.deepcopy(ctx.base).to(torch.bfloat16)}
    preds, secs = {}, {}
    for name, m in models.items():
        t0 = time.perf_counter()
        preds[name] = {s: evaluate(m, qa, ctx.enc, batch_size=50)["correct"] for s, qa in
                       (("easy-VQA", ctx.easy.test), ("probe", ctx.probe.test))}
        secs[name] = time.perf_counter() - t0
    for s in ("easy-VQA", "probe"):
        f, b = np.asarray(preds["fp32"][s], bool), np.asarray(preds["bf16"][s], bool)
        print(f"{s:9s} n={len(f)}: accuracy fp32 {f.mean():.3f}, bf16 {b.mean():.3f}; the same question right/wrong "
              f"in both: {np.mean(f == b) * 100:.1f} %")
    print(f"scoring both sets: fp32 {secs['fp32']:.1f} s, bf16 {secs['bf16']:.1f} s, ratio bf16/fp32 "
          f"{secs['bf16'] / secs['fp32']:.2f}")

    cfg = TrainConfig(steps=a.steps, batch_size=a.batch_size, lr=8e-6)
    step = {"fp32": [], "bf16": []}
    for _ in range(2):                       # interleaved: fp32, bf16, fp32, bf16
        for name, m in models.items():
            mm = copy.deepcopy(m)
            groups = [{"params": [p for p in mm.parameters() if p.requires_grad], "lr": cfg.lr}]
            out = train(mm, groups, ctx.down["fashion"].train, ctx.enc, cfg, progress=False)
            step[name] += out["step_seconds"][1:]      # the first step warms up
            del mm
    f, b = np.median(step["fp32"]), np.median(step["bf16"])
    print(f"full fine-tuning step (batch {a.batch_size}): fp32 {f:.2f} s, bf16 {b:.2f} s (median of "
          f"{len(step['fp32'])}), ratio bf16/fp32 {b / f:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
