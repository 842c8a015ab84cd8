"""AWARe cost on the offline mini-LLaVA, measured in one run (docs/aware.md, "Cost").

- training-step time, AWARe (rho=0.3, q/k/v+projector) / full fine-tuning   (target <= 1.0)
- training-step time of the row-frozen layer, ``RowSplitLinear`` (the original Linear kept as
  ``base_layer``, trainable rows scattered in) / the earlier split into two parameters gathered back
  at every forward (kept below only for this comparison), same model, steps interleaved (target <= 1.0)
- optimizer-state memory, AWARe / full                                        (target <= trainable fraction)
- profiling time per calibration sample
(LoRA at the matched rank is timed too, for reference.)

Both wall and process CPU time are reported: on a machine shared with other jobs the wall time
is inflated by load, CPU time much less so. Usage::

    .venv/bin/python benchmarks/bench_aware.py [--steps 5] [--batch 8] [--calib 32] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class _TwoBlockRowSplit(nn.Module):
    """The earlier row-frozen layer, for timing only: the original Linear's rows copied into a
    trainable and a frozen parameter, concatenated and re-ordered at every forward."""

    def __init__(self, base: nn.Linear, frozen_rows: torch.Tensor):
        super().__init__()
        dev = base.weight.device
        f_idx, t_idx = frozen_rows.nonzero().flatten().to(dev), (~frozen_rows).nonzero().flatten().to(dev)
        self.register_buffer("order", torch.argsort(torch.cat([t_idx, f_idx])), persistent=False)
        w = base.weight.detach()
        self.trainable_weight = nn.Parameter(w[t_idx].clone())
        self.frozen_weight = nn.Parameter(w[f_idx].clone(), requires_grad=False)
        self.trainable_bias = self.frozen_bias = None
        if base.bias is not None:
            b = base.bias.detach()
            self.trainable_bias = nn.Parameter(b[t_idx].clone())
            self.frozen_bias = nn.Parameter(b[f_idx].clone(), requires_grad=False)

    def forward(self, x):
        w = torch.cat([self.trainable_weight, self.frozen_weight])[self.order]
        b = None if self.trainable_bias is None else torch.cat([self.trainable_bias, self.frozen_bias])[self.order]
        return F.linear(x, w, b)


def _with_two_block_split(model):
    """``model`` (prepared for AWARe) with every RowSplitLinear replaced by the earlier layer."""
    from lab.aware.freeze import RowSplitLinear

    for name, mod in list(model.named_modules()):
        if isinstance(mod, RowSplitLinear):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child,
                    _TwoBlockRowSplit(mod.base_layer, mod.frozen_rows))
    return model


def _opt_state_bytes(opt: torch.optim.Optimizer, *, moments_only: bool = False) -> int:
    """Bytes of AdamW state; ``moments_only`` skips the scalar per-tensor step counters."""
    return sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
               if torch.is_tensor(v) and not (moments_only and k == "step"))


def _time_steps(model, groups, batches, answer_loss) -> dict:
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    params = [p for g in groups for p in g["params"]]
    wall, cpu = [], []
    model.train()
    for i, b in enumerate(batches):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = answer_loss(model, b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:  # the first step allocates optimizer state: not counted
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu),
            "optimizer_state_bytes": _opt_state_bytes(opt),
            "optimizer_moment_bytes": _opt_state_bytes(opt, moments_only=True)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per method (after 1 warm-up)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--calib", type=int, default=32, help="calibration samples profiled")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the row-split comparison")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import transformers

    from lab import runs
    from lab.experiments.aware.run import tasks
    from lab.aware.config import AwareConfig
    from lab.aware.methods import MethodSpec, prepare
    from lab.experiments.aware.run.finetune import TrainConfig, iterate
    from lab.experiments.aware.run.minillava import MiniLlava, load_language_model
    from lab.experiments.aware.run.profiling import calibration_batches
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.scoring import answer_loss

    transformers.logging.set_verbosity_error()
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    tok, lm = load_language_model()
    task = tasks.downstream("fashion", n_train=args.batch * (args.steps + 1), n_test=1, progress=False)
    torch.manual_seed(0)
    base = MiniLlava(lm, task.train.tokens.shape[-1]).eval()
    enc = ChatEncoder(tok, task.train.tokens.shape[1])
    batches = list(iterate(task.train, enc, args.batch, answers=True))[: args.steps + 1]
    setup_s = time.perf_counter() - t0

    cal = tasks.calibration("proxy", args.calib, progress=False)
    t0, c0 = time.perf_counter(), time.process_time()
    sal = profile(base, calibration_batches(cal, enc), targets="qkv+projector", progress=False)
    prof = {"wall_s_per_sample": (time.perf_counter() - t0) / args.calib,
            "cpu_s_per_sample": (time.process_time() - c0) / args.calib}

    cfg = TrainConfig(batch_size=args.batch)
    res = {}
    for name, spec in (("full", MethodSpec("full")), ("aware", MethodSpec("aware", AwareConfig(rho=0.3))),
                       ("lora", MethodSpec("lora"))):
        model, groups, info = prepare(copy.deepcopy(base), spec, cfg, saliency=sal)
        res[name] = {**_time_steps(model, groups, batches, answer_loss), "trainable": info["trainable"],
                     "total": info["total"], "trainable_frac": info["trainable"] / info["total"],
                     "lora_rank": info.get("lora_rank")}
        del model, groups
    # the row-frozen layer against its earlier two-parameter form: same masks, steps interleaved
    from lab.aware.methods import param_groups as _groups

    aware_spec = MethodSpec("aware", AwareConfig(rho=0.3))
    new, new_groups, _ = prepare(copy.deepcopy(base), aware_spec, cfg, saliency=sal)
    old = _with_two_block_split(prepare(copy.deepcopy(base), aware_spec, cfg, saliency=sal)[0])
    old_groups = _groups(old, cfg.aware_lr, cfg.lr_projector)
    split = {"base_layer": [], "two_block": []}
    for _ in range(args.rounds):
        split["base_layer"].append(_time_steps(new, new_groups, batches, answer_loss)["wall_s"])
        split["two_block"].append(_time_steps(old, old_groups, batches, answer_loss)["wall_s"])
    del new, old
    seq_len = int(batches[0]["input_ids"].shape[1])
    out = {
        "step_time_ratio_rowsplit_base_layer_over_two_block":
            statistics.median(split["base_layer"]) / statistics.median(split["two_block"]),
        "rowsplit_step_wall_s": split,
        "step_time_ratio_aware_over_full": res["aware"]["wall_s"] / res["full"]["wall_s"],
        "step_cpu_ratio_aware_over_full": res["aware"]["cpu_s"] / res["full"]["cpu_s"],
        "optimizer_memory_ratio_aware_over_full": res["aware"]["optimizer_state_bytes"] / res["full"]["optimizer_state_bytes"],
        "optimizer_moment_ratio_aware_over_full": res["aware"]["optimizer_moment_bytes"] / res["full"]["optimizer_moment_bytes"],
        "aware_trainable_fraction": res["aware"]["trainable_frac"],
        "profiling": prof, "methods": res, "batch": args.batch, "seq_len": seq_len, "steps": args.steps,
        "setup_s": setup_s, "load_average_at_start": load, "load_average_at_end": os.getloadavg()[0],
        "torch_threads": torch.get_num_threads(), "versions": runs.versions(),
    }
    print(f"batch {args.batch} x {seq_len} tokens, torch threads {torch.get_num_threads()}, "
          f"load avg {load:.1f} -> {os.getloadavg()[0]:.1f}")
    for name, r in res.items():
        print(f"  {name:<6} step {r['wall_s']:.2f}s wall / {r['cpu_s']:.2f}s cpu; trainable "
              f"{r['trainable_frac'] * 100:.1f}%; optimizer state {r['optimizer_state_bytes'] / 2**20:.0f} MiB")
    print(f"AWARe / full step time: {out['step_time_ratio_aware_over_full']:.2f} wall, "
          f"{out['step_cpu_ratio_aware_over_full']:.2f} cpu (target <= 1.0)")
    print(f"AWARe / full optimizer memory: moments {out['optimizer_moment_ratio_aware_over_full']:.5f}, "
          f"all state {out['optimizer_memory_ratio_aware_over_full']:.5f} (target <= trainable fraction "
          f"{out['aware_trainable_fraction']:.5f}; the difference is AdamW's 4-byte step counter per tensor)")
    print(f"RowSplitLinear (base_layer kept) / earlier two-parameter split, step time: "
          f"{out['step_time_ratio_rowsplit_base_layer_over_two_block']:.3f} wall (target <= 1.0; medians of "
          f"{args.rounds} interleaved rounds of {args.steps} steps)")
    print(f"profiling: {prof['wall_s_per_sample'] * 1000:.0f} ms/sample wall, "
          f"{prof['cpu_s_per_sample'] * 1000:.0f} ms/sample cpu")
    path = args.out or (runs.new_run_dir("bench", "aware") / "bench_aware.json")
    from lab._io import write_json

    write_json(path, out)
    print(f"-> {path}")
    return out


if __name__ == "__main__":
    main()
