"""Where a study's numbers came from: the sha256 of the code that determines them, which of those
source files changed since, the machine (written into every run record and the study's manifest),
and what the runs cost (:func:`run_account`).

The code that determines a run's numbers is chosen by folder, not by file name: every file of
:mod:`lab.aware` (the method) and of :mod:`lab.experiments.aware.run` (the model, data, training and
scoring), and the study files that decide what runs and how (:data:`STUDY_COMPUTING`). Nothing under
``views/``, no table and no command line enters it: a change there cannot change a run's numbers, so
a pure refactor of the tables or views keeps every finished run valid."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Mapping

# the study's own files that decide what runs and how: the plan (variants, recipes, keys) and the
# runner (one run from a job)
STUDY_COMPUTING = ("plan.py", "runner.py")
# manifests written before the package was split into run/, study/ and views/ name the files they
# left out of the hash (``not_hashed``, by file name); this was that list
_OLD_NOT_COMPUTING = ("ablation_views.py", "figures.py", "prose.py", "study_views.py", "cli.py", "hub_llava.py",
                      "study_tables.py", "fronts.py", "shipped.py", "provenance.py", "tables.py", "study.py",
                      "distributed.py", "__init__.py")


def _root(root: Path | None) -> Path:
    return Path(root) if root else Path(__file__).resolve().parents[4]


def computing_files(root: Path | None = None) -> list[Path]:
    """The files that determine a run's numbers: all of ``lab/aware`` and
    ``lab/experiments/aware/run``, and ``lab/experiments/aware/study``'s :data:`STUDY_COMPUTING`."""
    root = _root(root)
    pkg = root / "lab" / "experiments" / "aware"
    return sorted([*(root / "lab" / "aware").rglob("*.py"), *(pkg / "run").rglob("*.py"),
                   *(pkg / "study" / name for name in STUDY_COMPUTING)])


def source_hashes(root: Path | None = None) -> dict:
    """sha256 of every ``lab/aware`` and ``lab/experiments/aware`` source file (``files``), the ones
    that determine a run's numbers (``hashed``: :func:`computing_files`) and of those together
    (``sha256``)."""
    root = _root(root)
    files = sorted({*computing_files(root), *(root / "lab" / "experiments" / "aware").rglob("*.py")})
    per = {f.relative_to(root).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    hashed = [f.relative_to(root).as_posix() for f in computing_files(root)]
    total = hashlib.sha256("".join(f"{k}:{per[k]}\n" for k in hashed).encode()).hexdigest()
    return {"sha256": total, "files": per, "hashed": hashed}


def changed_sources(manifest: Mapping, root: Path | None = None) -> list[str]:
    """The source files that determine a run's numbers, now or when the manifest was written, whose
    sha256 differs from the manifest's: changed, new since, or missing now (a file the manifest
    hashed that has moved or gone counts as changed). A manifest without ``hashed`` (written before
    the package was laid out by concept) hashed every file it lists but those it names
    ``not_hashed``."""
    now = source_hashes(root)
    src = manifest.get("sources", {})
    then = src.get("files", {})
    if "hashed" in src:
        then_hashed = set(src["hashed"])
    else:
        skip = set(src.get("not_hashed", _OLD_NOT_COMPUTING))
        then_hashed = {k for k in then if Path(k).name not in skip}
    keys = {*now["hashed"], *then_hashed}
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
    recorded it: the manifest's ``machine`` is where the tables were written); ``code_versions``, how
    many runs each version of the computing sources recorded (:func:`code_versions`: a study that
    resumed across refactors holds several). Records are told apart by ``key`` (their
    file name)."""
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
            "machines": sorted({str(r["machine"]) for r in runs.values() if r.get("machine")}),
            "code_versions": code_versions(runs.values())}


def code_versions(records: Iterable[Mapping]) -> list[dict]:
    """The versions of the computing sources the ``records`` were run with (their ``code`` field):
    ``[{sha256 (first 12 hex digits), runs, first_finished}]``, oldest first (a list: JSON keeps its order)."""
    first, count = {}, {}
    for r in records:
        if r.get("code"):
            c = str(r["code"])[:12]
            count[c] = count.get(c, 0) + 1
            f = str(r.get("finished") or "")
            first[c] = min(first.get(c, f), f)
    return [{"sha256": c, "runs": count[c], "first_finished": first[c]} for c in sorted(count, key=lambda c: first[c])]


def time_spread(records: Iterable[Mapping]) -> dict | None:
    """``{n, min_s, max_s}`` of the run times of ``records`` (runs of one job type on the same
    machine: how much their time varied with what else the machine was running); None if empty."""
    secs = [float(r["seconds"]) for r in records if r.get("seconds")]
    return {"n": len(secs), "min_s": min(secs), "max_s": max(secs)} if secs else None
