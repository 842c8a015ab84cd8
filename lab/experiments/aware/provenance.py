"""Where a study's numbers came from: the sha256 of the code that computes them, which source files
changed since, the machine (written into every run record and the study's manifest), and what the
runs cost (:func:`run_account`)."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Mapping

# modules that only show or launch results (and the hub-LLaVA path, which the study never imports):
# editing them cannot change a number of the study, so they do not enter its source hash
# files that read, tabulate or draw finished runs, or parse the command line: a change to them cannot
# change a run's numbers, so they are outside the hash a run is stamped with (a pure refactor of the
# tables or views keeps every finished run valid)
NOT_COMPUTING = ("ablation_views.py", "figures.py", "prose.py", "study_views.py", "cli.py", "hub_llava.py",
                 "study_tables.py", "fronts.py", "shipped.py", "provenance.py", "tables.py", "study.py",
                 "distributed.py", "__init__.py")


def source_hashes(root: Path | None = None) -> dict:
    """sha256 of every ``lab/aware`` and ``lab/experiments/aware`` source file (``files``) and of the
    ones that compute the study together (``sha256``: all but :data:`NOT_COMPUTING`)."""
    root = Path(root) if root else Path(__file__).resolve().parents[3]
    files = sorted([*(root / "lab" / "aware").glob("*.py"), *(root / "lab" / "experiments" / "aware").glob("*.py")])
    per = {f.relative_to(root).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    computing = {k: v for k, v in per.items() if Path(k).name not in NOT_COMPUTING}
    total = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in computing.items()).encode()).hexdigest()
    return {"sha256": total, "files": per, "not_hashed": list(NOT_COMPUTING)}


def changed_sources(manifest: Mapping, root: Path | None = None) -> list[str]:
    """The computing source files that differ from (or are missing in / new since) the manifest's."""
    now = source_hashes(root)
    then = manifest.get("sources", {}).get("files", {})
    keys = {k for k in {*now["files"], *then} if Path(k).name not in NOT_COMPUTING}
    return sorted(k for k in keys if now["files"].get(k) != then.get(k))


def machine() -> dict:
    import os
    import platform

    import torch

    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"host": platform.node(), "platform": platform.platform(), "cpu": cpu or platform.processor(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(),
            "device": "cuda:" + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}


def run_account(records: Iterable[Mapping]) -> dict:
    """What the study's runs cost, each distinct run once (a tuning run that is also a seed's test
    run, or a variant shared by two groups, is one file and is counted once): ``count``; ``run_s``,
    their summed run time; ``machine_s``, the wall clock during which at least one of them was running
    (the union of ``[finished - seconds, finished]``), ``concurrent_s`` of it with two or more at once;
    ``first_started`` and ``last_finished``; ``machines``, the machines they ran on (as each run
    recorded it: the manifest's ``machine`` is where the tables were written). Records are told
    apart by ``key`` (their file name)."""
    import datetime

    runs = {}
    for r in records:
        runs.setdefault(r.get("key") or (r.get("finished"), r.get("seconds")), r)
    spans = []
    for r in runs.values():
        if r.get("finished") and r.get("seconds"):
            end = datetime.datetime.fromisoformat(r["finished"]).timestamp()
            spans.append((end - float(r["seconds"]), end))
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    busy = concurrent = 0.0
    depth, last = 0, None
    for t, step in events:
        if last is not None and depth >= 1:
            busy += t - last
            if depth >= 2:
                concurrent += t - last
        depth, last = depth + step, t
    iso = lambda t: datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    return {"count": len(runs), "run_s": float(sum(float(r.get("seconds") or 0.0) for r in runs.values())),
            "machine_s": busy, "concurrent_s": concurrent,
            "first_started": iso(min(s for s, _ in spans)) if spans else None,
            "last_finished": iso(max(e for _, e in spans)) if spans else None,
            "machines": sorted({str(r["machine"]) for r in runs.values() if r.get("machine")})}


def time_spread(records: Iterable[Mapping]) -> dict | None:
    """``{n, min_s, max_s}`` of the run times of ``records`` (runs of one job type on the same
    machine: how much their time varied with what else the machine was running); None if empty."""
    secs = [float(r["seconds"]) for r in records if r.get("seconds")]
    return {"n": len(secs), "min_s": min(secs), "max_s": max(secs)} if secs else None
