"""What `lab aware finetune`, `ablate` and `study` hand to tracking (``--track mlflow``): each
function reads a finished command's results and returns the keyword arguments of
:func:`lab.tracking.log_run`, which calls it only when tracking (the run folder is the command's to
hand over). docs/tracking.md lists the names.

    tracking.log_run(track, out["run_dir"], lambda: tracked.ablate(out))
"""
from __future__ import annotations

from lab.tracking import finite, flatten, table_metrics


def finetune(args, size, row: dict, before: dict, steps=()) -> dict:
    """``lab aware finetune`` (no run folder): the method's settings and training recipe, downstream
    accuracy, upstream skills before and after, retention; per step (``steps``: the watched
    trainer's logs, the last one counts) the training loss and step time; the row as ``result.json``."""
    from dataclasses import asdict

    params = {k: getattr(args, k) for k in ("method", "task", "rho", "rule", "targets", "calib", "seed", "size",
                                            "model", "device") if hasattr(args, k)}
    params["train"] = asdict(size.train)
    metrics = {k: v for k, v in row.items() if finite(v) and k != "seed"}
    metrics.update({f"before/{k}": v for k, v in before.items()})
    series = {}
    for log in list(steps)[-1:]:
        series = {"loss": list(enumerate(log.get("losses", []))),
                  "step_seconds": list(enumerate(log.get("step_seconds", [])))}
    result = {"row": {k: (v if finite(v) or isinstance(v, str) else None) for k, v in row.items()},
              "before": dict(before)}
    return {"name": f"{args.method}-{args.task}-seed{args.seed}", "params": params, "metrics": metrics,
            "series": series, "files": {"result.json": result}, "tags": {"lab.kind": "run"}}


def ablate(out: dict) -> dict:
    """``lab aware ablate``: R/E/H per variant (mean over seeds) and its timings on one run (the
    parameters: the folder's config.json), one child run per variant and seed."""
    from lab.experiments.aware.run.ablate import summary

    metrics = table_metrics(summary(out["results"]), ["group", "variant"])
    metrics.update({f"timings/{k}": v for k, v in out.get("timings", {}).items()})
    return {"metrics": metrics, "tags": {"lab.kind": "sweep"}, "children": (out["results"], ["group", "variant", "seed"])}


def study(res: dict, preset: str | None = None) -> dict:
    """``lab aware study``: the preset's config, the summary estimates with their intervals on one
    run, one child run per variant and seed."""
    m = res.get("manifest") or {}
    params = flatten({"config": m.get("config") or {}})
    params.update({"preset": preset, "complete": m.get("complete")})
    summary = res.get("summary")
    metrics = table_metrics(summary, ["variant", "metric"], ["estimate", "lo", "hi"]) if summary is not None else {}
    metrics.update({k: m[k] for k in ("wall_s", "compute_s") if k in m})
    return {"params": params, "metrics": metrics,
            "tags": {"lab.kind": "study", "lab.command": m.get("command", "")},
            "children": (res["runs"], ["variant", "seed"]) if res.get("runs") is not None else None}
