"""One-off: record the sha256 of the shipped TOSCA tables in results/tosca's manifests, without
re-running the study (the study and efficiency writers record them themselves since).

    .venv/bin/python tools/tosca_manifest_sha256.py [results/tosca]

Adds ``"sha256": {"runs.csv": ..., "summary.csv": ...}`` to ``manifest.json`` and the same for
``efficiency_params.csv`` / ``efficiency_time.csv`` to ``efficiency_manifest.json``; every other
field is kept as it is. It refuses tables that differ from the committed ones (``git diff``), so
that only the tables the study wrote are vouched for.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab import _io, _manifest  # noqa: E402

MANIFESTS = {"manifest.json": ("runs.csv", "summary.csv"),
             "efficiency_manifest.json": ("efficiency_params.csv", "efficiency_time.csv")}


def main(folder: Path) -> int:
    for mname, tables in MANIFESTS.items():
        mpath = folder / mname
        if not mpath.is_file():
            continue
        paths = [folder / t for t in tables]
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *map(str, paths)],
                               capture_output=True, text=True).stdout.strip()
        if dirty:
            print(f"{folder}: tables differ from the committed ones:\n{dirty}", file=sys.stderr)
            return 1
        manifest = json.loads(mpath.read_text())
        manifest["sha256"] = _manifest.digests(folder, tables)
        _io.write_json(mpath, manifest)
        print(f"{mpath}: sha256 of {', '.join(tables)} recorded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results" / "tosca"))
