"""One AWARe study run, before and after: float32 (the old study's runs) against bf16 (autocast while
training, a bf16 copy while scoring), side by side in one process, interleaved so a busy machine
slows both alike.

A run is training (``--steps`` steps of the study's batch) then scoring its question sets. Both
precisions start from the same aligned base; the script prints each part's seconds, the ratio
bf16 / fp32, the run time projected to the study's size (64 steps; 400 + 600 + 320 test
questions), and how many questions each precision answers alike::

    python benchmarks/bench_aware_run.py [--methods aware full] [--steps 8] [--questions 200] [--threads 1]

At the defaults (8 steps, 200 questions a set) it takes ~5-10 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["aware", "full"])
    ap.add_argument("--steps", type=int, default=8, help="training steps timed (the study: 64)")
    ap.add_argument("--questions", type=int, default=200, help="questions scored per set (the study: 400-600)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the study: 1 per run, a run per core)")
    ap.add_argument("--rounds", type=int, default=1, help="repeats of the interleaved pair")
    a = ap.parse_args(argv)

    from dataclasses import replace

    import numpy as np
    import torch

    from lab.aware.methods import MethodSpec, lr_field
    from lab.experiments.aware.run.ablate import Variant, profile_calibrations, tasks_for
    from lab.experiments.aware.run.context import setup
    from lab.experiments.aware.run.finetune import evaluate, fit, for_scoring
    from lab.experiments.aware.study.plan import MAIN, PRESETS
    from lab.experiments.aware.views.study import seed_caches

    torch.set_num_threads(a.threads)
    cfg = PRESETS["shipped"]
    seed_caches()      # the shipped study's aligned projector
    ctx = setup(cfg.to_size(), tasks_needed=tasks_for((), cfg.task), progress=False)
    key = ("upstream", cfg.n_calib)
    sal = profile_calibrations(ctx, [Variant("x", "x", MethodSpec("aware"), calib=key[0], calib_n=key[1])],
                               progress=False)[key]
    sets = {"downstream": ctx.down[cfg.task].test, "easy-VQA": ctx.easy.test, "probe": ctx.probe.test}
    sets = {k: qa.subset(range(min(a.questions, len(qa)))) for k, qa in sets.items()}
    full_q = {"downstream": cfg.n_eval, "easy-VQA": cfg.n_easy_eval, "probe": cfg.n_probe}
    print(f"torch {torch.__version__}, {a.threads} thread(s); timing {a.steps} steps of {cfg.batch_size} and "
          f"{sum(len(q) for q in sets.values())} questions per run")
    for method in a.methods:
        spec = MethodSpec(method, MAIN)
        res = {p: {"train": [], "score": [], "answers": None} for p in ("fp32", "bf16")}
        for _ in range(a.rounds):
            for p in ("fp32", "bf16"):
                tc = replace(cfg.to_size().train, steps=a.steps, seed=0, precision=p,
                             **{lr_field(method): cfg.base_rate(method)}, lr_projector=cfg.projector_rate)
                t0 = time.perf_counter()
                model, _, log, _ = fit(ctx.base, spec, tc, ctx.down[cfg.task].train, ctx.enc, saliency=sal)
                t1 = time.perf_counter()
                scored = for_scoring(model, p)
                ans = {k: evaluate(scored, qa, ctx.enc, batch_size=ctx.size.eval_batch)["correct"]
                       for k, qa in sets.items()}
                t2 = time.perf_counter()
                res[p]["train"].append((t1 - t0) / a.steps)
                res[p]["score"].append((t2 - t1) / sum(len(q) for q in sets.values()))
                res[p]["answers"] = ans
                del model, scored
        proj = {}
        for p in ("fp32", "bf16"):
            step, per_q = np.median(res[p]["train"]), np.median(res[p]["score"])
            proj[p] = (step * cfg.steps, per_q * sum(full_q.values()))
            print(f"{method:6s} {p}: {step:.2f} s/step, {per_q * 1000:.0f} ms/question -> one study run "
                  f"~{sum(proj[p]):.0f} s (training {proj[p][0]:.0f} s, scoring {proj[p][1]:.0f} s)")
        r_train = proj["bf16"][0] / proj["fp32"][0]
        r_score = proj["bf16"][1] / proj["fp32"][1]
        r_all = sum(proj["bf16"]) / sum(proj["fp32"])
        same = {k: float(np.mean(np.asarray(res["fp32"]["answers"][k]) == np.asarray(res["bf16"]["answers"][k])))
                for k in sets}
        print(f"{method:6s} ratio bf16/fp32: training {r_train:.2f}, scoring {r_score:.2f}, one run {r_all:.2f}; "
              "answered alike: " + ", ".join(f"{k} {v * 100:.0f} %" for k, v in same.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
