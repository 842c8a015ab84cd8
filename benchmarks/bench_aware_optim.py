"""AdamW implementations on the offline mini-LLaVA: default vs ``foreach=True`` vs ``fused=True``.

For the parameter sets of full fine-tuning and of AWARe (rho=0.3, q/k/v+projector), with the lrs of
``TrainConfig`` and weight decay 0 (the fine-tuning loop's, ``lab/experiments/aware/run/finetune.py``):

- the optimizer step alone, on the real gradients of one training batch (clipped as in training),
  replayed for N steps from the same start: median time of steps 2..N, implementations interleaved;
- the whole training step (forward + backward + clipping + step) on N real batches from the same
  start: median time of steps 2..N (the first allocates the optimizer state), and the optimizer
  step's share of it;
- whether the parameters after N steps are bit-identical to the default implementation's
  (``torch.equal`` over every parameter; else the largest absolute difference), for both runs.

On a CPU the default is the single-tensor (for-loop) implementation. Usage::

    .venv/bin/python benchmarks/bench_aware_optim.py [--threads 1] [--rounds 3] [--steps 3] [--batch 8] [--calib 8]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

IMPLS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def _fused_unsupported() -> str | None:
    """None when ``AdamW(fused=True)`` steps on CPU float32 in this torch, else the error."""
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    try:
        torch.optim.AdamW([p], fused=True).step()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return f"{type(e).__name__}: {e}"
    return None


def _compare(params, ref) -> tuple[bool, float]:
    same = all(torch.equal(p, r) for p, r in zip(params, ref))
    return same, (0.0 if same else max(float((p - r).abs().max()) for p, r in zip(params, ref)))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per implementation")
    ap.add_argument("--steps", type=int, default=3, help="N: steps per round (the first is not timed)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--calib", type=int, default=8, help="calibration samples profiled (AWARe's row mask)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    import transformers

    from lab.aware.config import AwareConfig
    from lab.aware.methods import MethodSpec, prepare
    from lab.aware.saliency import profile
    from lab.experiments.aware.run import tasks
    from lab.experiments.aware.run.finetune import TrainConfig, iterate
    from lab.experiments.aware.run.minillava import MiniLlava, load_language_model
    from lab.experiments.aware.run.profiling import calibration_batches
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.scoring import answer_loss

    transformers.logging.set_verbosity_error()
    impls = dict(IMPLS)
    fused_err = _fused_unsupported()
    if fused_err:
        del impls["fused"]
        print(f"fused=True not supported on CPU in torch {torch.__version__}: {fused_err}")
    load = os.getloadavg()[0]
    tok, lm = load_language_model()       # as benchmarks/bench_aware.py builds the model and batches
    task = tasks.downstream("fashion", n_train=args.batch * args.steps, n_test=1, progress=False)
    torch.manual_seed(0)
    base = MiniLlava(lm, task.train.tokens.shape[-1]).eval()
    enc = ChatEncoder(tok, task.train.tokens.shape[1])
    batches = list(iterate(task.train, enc, args.batch, answers=True))[: args.steps]
    sal = profile(base, calibration_batches(tasks.calibration("proxy", args.calib, progress=False), enc),
                  targets="qkv+projector", progress=False)
    cfg = TrainConfig(batch_size=args.batch)

    rows = {}
    for name, spec in (("full", MethodSpec("full")), ("aware", MethodSpec("aware", AwareConfig(rho=0.3)))):
        model, groups, info = prepare(copy.deepcopy(base), spec, cfg, saliency=sal)
        groups = [dict(g) for g in groups]   # never handed to an optimizer: each one gets fresh copies
        params = [p for g in groups for p in g["params"]]
        start = [p.detach().clone() for p in params]
        model.train()
        answer_loss(model, batches[0]).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        grads = [p.grad.clone() for p in params]

        def restart(kw):
            with torch.no_grad():
                for p, s in zip(params, start):
                    p.copy_(s)
                    p.grad = None
            return torch.optim.AdamW([dict(g) for g in groups], weight_decay=cfg.weight_decay, **kw)

        opt_s = {k: [] for k in impls}
        step_s = {k: [] for k in impls}
        in_step_s = {k: [] for k in impls}
        final_opt, final_step = {}, {}
        for r in range(args.rounds):
            order = list(impls)[r % len(impls):] + list(impls)[: r % len(impls)]   # rotate who goes first
            for k in order:                   # the optimizer step alone, on the one batch's gradients
                opt = restart(impls[k])
                for i in range(args.steps):
                    for p, g in zip(params, grads):
                        p.grad = g.clone()
                    t0 = time.perf_counter()
                    opt.step()
                    if i:
                        opt_s[k].append(time.perf_counter() - t0)
                final_opt.setdefault(k, [p.detach().clone() for p in params])
            for k in order:                   # the whole training step on N real batches
                opt = restart(impls[k])
                for i, b in enumerate(batches):
                    t0 = time.perf_counter()
                    answer_loss(model, b).backward()
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                    t1 = time.perf_counter()
                    opt.step()
                    t2 = time.perf_counter()
                    opt.zero_grad(set_to_none=True)
                    if i:
                        step_s[k].append(time.perf_counter() - t0)
                        in_step_s[k].append(t2 - t1)
                if k not in final_step:
                    final_step[k] = [p.detach().clone() for p in params]
                elif k == "default":          # the baseline itself reproduces across rounds?
                    assert _compare(params, final_step[k])[0], "default AdamW run not reproducible"
        med = lambda xs: statistics.median(xs)  # noqa: E731
        rows[name] = {}
        for k in impls:
            same_o, diff_o = _compare(final_opt[k], final_opt["default"])
            same_s, diff_s = _compare(final_step[k], final_step["default"])
            rows[name][k] = {"opt_s": med(opt_s[k]), "step_s": med(step_s[k]), "opt_in_step_s": med(in_step_s[k]),
                             "share": med(in_step_s[k]) / med(step_s[k]),
                             "identical_opt_only": same_o, "max_abs_diff_opt_only": diff_o,
                             "identical_training": same_s, "max_abs_diff_training": diff_s}
        rows[name]["trainable"] = sum(p.numel() for p in params)
        del model, groups, params, start, grads, final_opt, final_step

    seq_len = int(batches[0]["input_ids"].shape[1])
    print(f"\nAdamW on CPU, torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch {args.batch} x "
          f"{seq_len} tokens, {args.rounds} interleaved rounds x {args.steps} steps (medians of steps 2..N), "
          f"load avg {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'params':<16} {'impl':<8} {'opt step':>9} {'/default':>8} {'train step':>10} {'/default':>8} "
          f"{'opt share':>9}  identical after N steps (opt only; training)")
    for name, rr in rows.items():
        d = rr["default"]
        for k in impls:
            x = rr[k]
            ident = lambda s, m: "yes" if s else f"no, max |diff| {m:.2e}"  # noqa: E731
            print(f"{name + ' (' + format(rr['trainable'] / 1e6, '.1f') + 'M)':<16} {k:<8} {x['opt_s'] * 1e3:7.1f}ms "
                  f"{x['opt_s'] / d['opt_s']:8.3f} {x['step_s']:9.3f}s {x['step_s'] / d['step_s']:8.3f} "
                  f"{x['share'] * 100:8.1f}%  {ident(x['identical_opt_only'], x['max_abs_diff_opt_only'])}; "
                  f"{ident(x['identical_training'], x['max_abs_diff_training'])}")
    return {"rows": rows, "fused_unsupported": fused_err, "threads": torch.get_num_threads(), "seq_len": seq_len}


if __name__ == "__main__":
    main()
