"""Ray vs the local executor on the TOSCA study's sweep, measured in one run (README, "Beyond one machine").

The sweep: 3 seeds x the study's first two (head, LuCA) initialisations (the reference's, the
former default), TOSCA evaluated under every router, 20 epochs per task as in the study, on the
offline scenario's cached features (fashion_mnist_mini, efficientnet_lite0; the first run extracts
them). Each variant trains with one thread (ToscaConfig.threads = 1), so the local executor keeps
one core busy and Ray with 2 workers can use two. Prints

1. the wall time of the sweep under the local executor and under Ray with ``--workers`` workers, and
   their ratio, with and without Ray's start-up (``ray.init`` of a local instance). Ray is timed
   twice on the same instance: a first sweep, whose workers start cold (each imports torch and
   lab on its first task), and the same sweep again in a fresh folder, on workers that are up
   (the steady state of a cluster that serves several sweeps: ``--address``);
2. Ray's overhead per task: the wall time per task of ``--noop`` empty tasks through the same executor
   (scheduling + serialisation + the result's round trip), and, in the sweep, the worker time not
   spent inside the variants, per task;
3. that both executors gave the same tables (keys equal; the largest difference of a number);
4. the machine's load (``/proc/loadavg``) before and after: other processes share the cores.

    python benchmarks/bench_ray.py                    # ~10 min on 2 shared cores
    python benchmarks/bench_ray.py --epochs 2 --seeds 1993 1994   # a quick look
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time


def _load() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def _noop(config):
    return {"i": config}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1993, 1994, 1995])
    p.add_argument("--epochs", type=int, default=20, help="epochs per task (default 20, the study's and the reference's)")
    p.add_argument("--workers", type=int, default=2, help="Ray workers (CPUs of the local Ray instance; default 2)")
    p.add_argument("--noop", type=int, default=200, help="empty tasks for the per-task overhead (default 200)")
    args = p.parse_args(argv)

    import pandas as pd
    import ray
    import torch

    from lab import executors
    from lab.experiments.tosca import study
    from lab.experiments.tosca.run import RunConfig
    from lab.tosca.routing import list_routings

    configs = [c for c in study.variants(RunConfig(epochs=args.epochs), scenarios=["fashion_mnist_mini"],
                                         seeds=args.seeds, baselines=(), inits=study.INITS[:2], routings=list_routings())
               if c.flow == "tosca"]                               # the initialisations; no flow ablation
    print(f"sweep: {len(configs)} TOSCA runs ({len(args.seeds)} seeds x 2 inits), "
          f"{len(list_routings())} routers each, {args.epochs} epochs per task; {os.cpu_count()} cores")
    load_before = _load()
    for cfg in {(c.datasets, c.seed): c for c in configs}.values():      # features on disk before timing
        study._data(cfg, {})
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        local = study.run_all(configs, root, executor="local", log=lambda s: None)
        t_local = time.perf_counter() - t0

        t0 = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
        t_init = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            remote = study.run_all(configs, root, executor="ray", log=lambda s: None)
            t_ray = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = study.run_all(configs, os.path.join(root, "again"), executor="ray", log=lambda s: None)
            t_warm = time.perf_counter() - t0
            jobs = [executors.Job(f"noop{i}", _noop, i) for i in range(args.noop)]
            t0 = time.perf_counter()
            executors.run(jobs, executor="ray")
            t_noop = time.perf_counter() - t0
        finally:
            ray.shutdown()
    load_after = _load()

    a = pd.DataFrame(local)
    timing = [c for c in ("seconds", "train_s") if c in a]              # wall clock: differs by nature
    nums = [c for c in a.drop(columns=timing).select_dtypes("number").columns]

    def compare(rows):
        b = pd.DataFrame(rows)
        keys = a.drop(columns=timing).select_dtypes(exclude="number").equals(b.drop(columns=timing).select_dtypes(exclude="number"))
        return keys, float((a[nums] - b[nums]).abs().max().max())

    def idle(rows, seconds):   # worker time per task outside the variants
        busy = sum({(r["seed"], r["head_init"], r["luca_init"]): r["seconds"] for r in rows}.values())
        return (args.workers * seconds - busy) / len(configs)

    (same_keys, worst), (same_again, worst_again) = compare(remote), compare(again)
    print(f"local executor           {t_local:7.1f} s")
    print(f"ray, {args.workers} workers, cold      {t_ray:7.1f} s   (+ {t_init:.1f} s ray.init; workers start on the first tasks)")
    print(f"ray, {args.workers} workers, warm      {t_warm:7.1f} s   (the same sweep again on the same instance)")
    print(f"ratio local / ray        {t_local / t_ray:7.2f}x cold, {t_local / t_warm:.2f}x warm (target >= 1.7x); "
          f"cold with ray.init: {t_local / (t_ray + t_init):.2f}x")
    print(f"ray overhead per task    {1000 * t_noop / args.noop:7.1f} ms  ({args.noop} empty tasks, "
          f"{args.workers} workers); in the sweep, worker time per task outside the variant (worker start-up, "
          f"loading its features, scheduling, result): {idle(remote, t_ray):.2f} s cold, {idle(again, t_warm):.2f} s warm")
    print(f"same tables              rows and keys {same_keys and same_again}; largest difference of a number "
          f"{max(worst, worst_again):.2g} (local runs with torch's {torch.get_num_threads()} threads outside "
          f"training, a Ray worker with 1)")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    return 0 if same_keys and same_again and max(worst, worst_again) < 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
