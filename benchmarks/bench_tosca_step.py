"""One TOSCA training step on cached features against its floor, measured in the same run.

Three closures on the same random cached batch, timed interleaved (rounds of each in turn, so a load
change on the machine hits all alike):

* ``step``: the 'fused' engine (lab/tosca/engines/_fused.py: the 14 matrix
  products in torch, everything between them in C kernels of lab/tosca/engines/_fused.c, the L1 + SGD update
  one pass over one flat buffer).
* ``eager``: the 'eager' engine's step (lab/tosca/engines/_step.py: the same gradients in torch's kernels,
  bit-identical to autograd's, and the update as five torch passes over the flat buffer).
* ``floor``: the bare arithmetic of the same shapes with nothing around it: the 14 matmuls of the
  forward and backward pass (adapter, calibrator, head; no input gradient for the cached features,
  as the step needs none) into buffers allocated once, plus the update's five passes over one flat
  buffer of all parameters (sign, L1 add, momentum scale, momentum add, parameter add). No GELU,
  LayerNorm, sigmoid, normalisation or CE: what any implementation of this step has to do.

    python benchmarks/bench_tosca_step.py                  # efficientnet_lite0 (d=1280) and ViT-B/16 (d=768) shapes
    python benchmarks/bench_tosca_step.py --threads 1 2 --batch 48 --rounds 5

Prints one line per (shape, threads): median ms of each and the ratios to the floor (median over
rounds, and the range of the per-round ratios); target: step <= 1.5x floor. Without a C compiler
the fused step cannot be built and the benchmark says so.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPES = {"lite0 d=1280 K=10": (1280, 10), "vit-b16 d=768 K=100": (768, 100)}
LR, L1, MOMENTUM = 1e-3, 5e-4, 0.9


def _time(fn, reps: int, inner: int = 20) -> float:
    """Median over ``reps`` of the mean ms of ``inner`` calls."""
    for _ in range(5):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) / inner * 1e3)
    return statistics.median(out)


def _batch_and_modules(d: int, k: int, batch: int):
    from lab.tosca.head import CosineHead
    from lab.tosca.luca import LuCA

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, d, generator=g), torch.randint(0, k, (batch,), generator=g)
    return x, y, LuCA(d), CosineHead(d, k)


def library_step(d: int, k: int, batch: int, engine: str = "fused"):
    """A closure running one step of the given engine ('fused' or 'eager') on random cached features."""
    from lab.tosca.engines._fused import FusedStep
    from lab.tosca.engines._step import TrainStep
    from lab.tosca.learner import ToscaConfig

    x, y, luca, head = _batch_and_modules(d, k, batch)
    step = (FusedStep if engine == "fused" else TrainStep)(luca, head, ToscaConfig(l1=L1, momentum=MOMENTUM))
    return lambda: step(x, y, LR)


def _views(buf: torch.Tensor, shapes):
    """Consecutive views of ``buf`` with the given 2-d shapes."""
    out, off = [], 0
    for rows, cols in shapes:
        out.append(buf[off:off + rows * cols].view(rows, cols))
        off += rows * cols
    return out


def floor_step(d: int, k: int, batch: int):
    """The bare arithmetic of the same step: per linear layer the forward matmul, the weight
    gradient and (except the first layer: cached features need no gradient) the input gradient,
    into preallocated buffers; then the update's five passes over one flat parameter buffer."""
    r = d // 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, d, generator=g)
    layers = [(d, r), (r, d), (d, r), (r, d), (d, k)]      # (in, out): down, up, se_down, se_up, head
    shapes = [(o, i) for i, o in layers]
    n = sum(i * o for i, o in layers) + r + 3 * d + 1     # + down/up biases, LayerNorm, σ
    n_l1 = n - d * k - 1                                   # the LuCA's share carries the L1 term
    params, grads, momentum, sign = (torch.zeros(n) for _ in range(4))
    torch.nn.init.normal_(params, std=0.01, generator=g)
    w, gw = _views(params, shapes), _views(grads, shapes)
    acts = [torch.empty(batch, o) for _, o in layers]
    gin = [torch.empty(batch, i) for i, _ in layers]
    ins = [x, *acts[:-1]]
    grad_out = [torch.randn(batch, o, generator=g) for _, o in layers]

    def step():
        for a, wi, out in zip(ins, w, acts):
            torch.mm(a, wi.t(), out=out)
        for go, wi, gi, a, gwi in zip(grad_out, w, gin, ins, gw):
            if a is not x:
                torch.mm(go, wi, out=gi)
            torch.mm(go.t(), a, out=gwi)
        torch.sign(params[:n_l1], out=sign[:n_l1])
        grads[:n_l1].add_(sign[:n_l1], alpha=L1)
        momentum.mul_(MOMENTUM)
        momentum.add_(grads)
        params.add_(momentum, alpha=-LR)
    return step


def _ratio_range(num, den) -> str:
    r = [a / b for a, b in zip(num, den)]
    return f"{statistics.median(r):5.2f} ({min(r):.2f}-{max(r):.2f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each times every closure)")
    p.add_argument("--reps", type=int, default=3, help="timings of 20 calls per closure and round (median)")
    p.add_argument("--alloc", choices=("on", "off"), default="on",
                   help="on: lab._alloc.tune_allocator() first, as the library's training does")
    a = p.parse_args(argv)
    if a.alloc == "on":
        from lab._alloc import tune_allocator

        tune_allocator()
    old = torch.get_num_threads()
    from lab.tosca.engines._fused import SOURCE, kernels

    if kernels() is None:
        from lab._cc import why_not

        print(f"the fused step is not available here: {why_not(SOURCE)}")
        return 1
    print(f"{'shape':20s} {'thr':>3s} {'step ms':>8s} {'eager ms':>8s} {'floor ms':>8s}"
          f"  {'step/floor (range)':>19s}  {'eager/floor (range)':>19s}")
    worst = 0.0
    for name, (d, k) in SHAPES.items():
        for n in a.threads:
            torch.set_num_threads(n)
            fns = {"step": library_step(d, k, a.batch), "eager": library_step(d, k, a.batch, "eager"),
                   "floor": floor_step(d, k, a.batch)}
            t = {key: [] for key in fns}
            for _ in range(a.rounds):  # interleaved, so a load change on the machine hits all alike
                for key, fn in fns.items():
                    t[key].append(_time(fn, a.reps))
            med = {key: statistics.median(v) for key, v in t.items()}
            worst = max(worst, statistics.median([s / f for s, f in zip(t["step"], t["floor"])]))
            print(f"{name:20s} {n:3d} {med['step']:8.3f} {med['eager']:8.3f} {med['floor']:8.3f}"
                  f"  {_ratio_range(t['step'], t['floor']):>19s}  {_ratio_range(t['eager'], t['floor']):>19s}")
    torch.set_num_threads(old)
    print(f"worst step/floor {worst:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
