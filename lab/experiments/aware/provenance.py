"""Where a study's numbers came from: the sha256 of the code that computes them, which source files
changed since, and the machine (written into every run record and the study's manifest)."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

# modules that only show or launch results (and the hub-LLaVA path, which the study never imports):
# editing them cannot change a number of the study, so they do not enter its source hash
NOT_COMPUTING = ("ablation_views.py", "figures.py", "prose.py", "study_views.py", "cli.py", "hub_llava.py")


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


