"""One TOSCA training step on cached features against its floor, measured in the same run.

The step is the library's: ``Tosca._epochs``' body (LuCA + cosine head forward, ``autograd.grad``,
the L1 sub-gradient, the SGD-with-momentum update). The floor is the same arithmetic with nothing
around it: every matmul of the forward and backward pass (the adapter, the calibrator, the head;
[B, d] x [d, r] shapes, written into buffers allocated once) plus one pass of the update over the
parameters (momentum, L1 sign, parameter add) — what any implementation of this step has to do.

    python benchmarks/bench_tosca_step.py                  # efficientnet_lite0 (d=1280) and ViT-B/16 (d=768) shapes
    python benchmarks/bench_tosca_step.py --threads 1 2 --batch 48

Prints one line per (shape, threads): step ms, floor ms and their ratio (target <= 1.5).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {"lite0 d=1280 K=10": (1280, 10), "vit-b16 d=768 K=100": (768, 100)}


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


def library_step(d: int, k: int, batch: int):
    """A closure running one step of the library's eager loop on random cached features."""
    from lab.tosca.head import CosineHead
    from lab.tosca.learner import add_l1_grad, sgd_step
    from lab.tosca.luca import LuCA

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, d, generator=g), torch.randint(0, k, (batch,), generator=g)
    luca, head = LuCA(d), CosineHead(d, k)
    params = [*luca.parameters(), *head.parameters()]
    n_luca = len(list(luca.parameters()))
    bufs = [torch.zeros_like(p) for p in params]

    def step():
        ce = F.cross_entropy(head(luca(x)), y)
        grads = list(torch.autograd.grad(ce, params))
        add_l1_grad(params[:n_luca], grads[:n_luca], 5e-4)
        sgd_step(params, grads, bufs, lr=1e-3, momentum=0.9)
    return step


def floor_step(d: int, k: int, batch: int):
    """The bare arithmetic of the same step: 3 matmuls per linear layer (forward, input grad, weight
    grad) into preallocated buffers, and the update's passes over the parameters."""
    r = d // 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, d, generator=g)
    layers = [(d, r), (r, d), (d, r), (r, d), (d, k)]      # down, up, se_down, se_up, head
    w = [torch.randn(o, i, generator=g) * 0.01 for i, o in layers]
    acts = [torch.empty(batch, o) for _, o in layers]
    gin = [torch.empty(batch, i) for i, _ in layers]
    gw = [torch.empty(o, i) for i, o in layers]
    ins = [x, acts[0], acts[1], acts[2], acts[3]]
    grad_out = [torch.randn(batch, o, generator=g) for _, o in layers]
    params = w + [torch.zeros(n) for n in (r, d, d, d)]     # weights + down/up biases + LayerNorm
    grads = gw + [torch.zeros(n) for n in (r, d, d, d)]
    bufs = [torch.zeros_like(p) for p in params]

    def step():
        for a, wi, out in zip(ins, w, acts):
            torch.mm(a, wi.t(), out=out)
        for go, wi, gi, a, gwi in zip(grad_out, w, gin, ins, gw):
            torch.mm(go, wi, out=gi)
            torch.mm(go.t(), a, out=gwi)
        torch._foreach_add_(grads, torch._foreach_sign(params), alpha=5e-4)
        torch._foreach_mul_(bufs, 0.9)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-1e-3)
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--alloc", choices=("on", "off"), default="on",
                   help="on: lab._alloc.tune_allocator() first, as the library's training does")
    a = p.parse_args(argv)
    if a.alloc == "on":
        from lab._alloc import tune_allocator

        tune_allocator()
    old = torch.get_num_threads()
    print(f"{'shape':22s} {'threads':>7s} {'step ms':>8s} {'floor ms':>9s} {'ratio':>6s}")
    worst = 0.0
    for name, (d, k) in SHAPES.items():
        for n in a.threads:
            torch.set_num_threads(n)
            lib, flo = library_step(d, k, a.batch), floor_step(d, k, a.batch)
            # interleaved, so a load change on the machine hits both alike
            ts, tf = [], []
            for _ in range(3):
                ts.append(_time(lib, a.reps // 3 or 1))
                tf.append(_time(flo, a.reps // 3 or 1))
            s, f = statistics.median(ts), statistics.median(tf)
            worst = max(worst, s / f)
            print(f"{name:22s} {n:7d} {s:8.3f} {f:9.3f} {s / f:6.2f}")
    torch.set_num_threads(old)
    print(f"worst ratio {worst:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
