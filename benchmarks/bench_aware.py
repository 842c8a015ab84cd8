"""AWARe cost on the offline mini-LLaVA, measured in one run (issue 4, "benchmarks").

- training-step time, AWARe (rho=0.3, q/k/v+projector) / full fine-tuning   (target <= 1.0)
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
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import transformers

    from lab import runs
    from lab.aware import tasks
    from lab.aware.config import AwareConfig
    from lab.aware.continual import calibration_batches
    from lab.aware.finetune import MethodSpec, TrainConfig, iterate, prepare
    from lab.aware.minillava import MiniLlava, load_language_model
    from lab.aware.prompts import ChatEncoder
    from lab.aware.saliency import profile
    from lab.aware.scoring import answer_loss

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
    seq_len = int(batches[0]["input_ids"].shape[1])
    out = {
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
    print(f"profiling: {prof['wall_s_per_sample'] * 1000:.0f} ms/sample wall, "
          f"{prof['cpu_s_per_sample'] * 1000:.0f} ms/sample cpu")
    path = args.out or (runs.new_run_dir("bench", "aware") / "bench_aware.json")
    from lab._io import write_json

    write_json(path, out)
    print(f"-> {path}")
    return out


if __name__ == "__main__":
    main()
