"""What `lab tosca` and its sweep and study hand to tracking (``--track mlflow``): each function reads
a finished run's results or folder and returns the keyword arguments of :func:`lab.tracking.log_run`,
which calls it only when tracking (the run folder is the command's to hand over). docs/tracking.md
lists the names.

    tracking.log_run(track, res.run_dir, lambda: tracked.run(res))
"""
from __future__ import annotations

from pathlib import Path

from lab.tracking import numeric, table_metrics


def run(res) -> dict:
    """``lab tosca``: the config as parameters; per routing the summary (Ā, A_B, forgetting, BWT,
    routing accuracy) as metrics and, per task (step = task index), A_b, routing accuracy and each
    task's accuracy after every stage; per epoch (step = epoch counted over all tasks) the training
    log."""
    info, head = res.info, res.info["headline_routing"]
    values = [c for c in numeric(res.summary) if c != "per_batch_size"]
    metrics = table_metrics(res.summary, ["routing"], values)
    metrics.update({k: v for k, v in res.headline().items() if k in values})      # the headline routing's
    metrics.update({f"seconds/{k}": v for k, v in info["seconds"].items()})
    metrics["trainable_params_total"] = info["trainable_params_total"]
    series = {}
    for r in res.stages.to_dict("records"):
        for c in ("A_b", "routing_accuracy"):
            series.setdefault(f"{r['routing']}/{c}", []).append((r["stage"], r[c]))
            if r["routing"] == head:
                series.setdefault(c, []).append((r["stage"], r[c]))
    for r in res.matrix.to_dict("records"):
        series.setdefault(f"{r['routing']}/accuracy/task {r['task']}", []).append((r["stage"], r["accuracy"]))
    for r in res.tasks.to_dict("records"):
        for c in ("train_seconds", "eval_seconds", "trainable_params", "head_scale"):
            series.setdefault(f"task/{c}", []).append((r["task"], r.get(c)))
    for i, r in enumerate(res.epochs.to_dict("records")):
        for c, v in r.items():
            if c != "epoch":
                series.setdefault(f"train/{c}", []).append((i, v))
    params = {**res.config.to_dict(), "num_tasks": info["num_tasks"], "headline_routing": head}
    return {"params": params, "metrics": metrics, "series": series,
            "tags": {"lab.kind": "run", "lab.backbone_untrained": info.get("backbone_untrained")}}


def sweep(base, seeds, l1s, runs, summary) -> dict:
    """``lab tosca --seeds/--l1``: the sweep's settings and its summary (mean and interval over seeds
    per L1 and routing) on one run, one child run per (seed, L1) with its rows."""
    from dataclasses import asdict

    params = {**{k: v for k, v in asdict(base).items() if k not in ("seed", "l1")}, "seeds": list(seeds),
              "l1": list(l1s)}
    return {"params": params, "metrics": table_metrics(summary, ["l1", "routing"]), "tags": {"lab.kind": "sweep"},
            "children": (runs, ["seed", "l1"], "routing")}


def study(folder) -> dict:
    """``lab tosca study``: its manifest's settings, the summary (mean and 95 % half-width over seeds)
    on one run, one child run per variant and seed (its numbers per routing)."""
    import pandas as pd

    from lab._io import read_json

    folder = Path(folder)
    m = read_json(folder / "manifest.json")
    keys = ["scenario", "method", "flow", "head_init", "luca_init", "routing"]
    params = {k: m.get(k) for k in ("scenarios", "seeds", "executor", "runs")}
    params.update({f"base_config.{k}": v for k, v in (m.get("base_config") or {}).items()})
    return {"params": params, "metrics": table_metrics(pd.read_csv(folder / "summary.csv"), keys),
            "tags": {"lab.kind": "study"},
            "children": (pd.read_csv(folder / "runs.csv"), ["scenario", "seed", *keys[1:-1]], "routing")}
