"""Read an AWARe run directory back (for notebooks and reports): tables, config, saliency, masks."""
from __future__ import annotations

import json
from pathlib import Path


def latest_run(root=None, prefix: str = "ablate") -> Path:
    """The newest ``runs/aware/<stamp>-<prefix>...`` folder holding a ``config.json``."""
    from lab import runs

    base = runs.runs_root(root) / "aware"
    found = sorted(p for p in base.glob(f"*-{prefix}*") if (p / "config.json").exists()) if base.exists() else []
    if not found:
        raise FileNotFoundError(f"no finished AWARe {prefix!r} run under {base}; run `lab aware ablate` first")
    return found[-1]


def _read_table(path: Path):
    import pandas as pd

    for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
        if path.with_suffix(suffix).exists():
            return reader(path.with_suffix(suffix))
    return None


def load_run(run_dir: str | Path) -> dict:
    """``{'config', 'results', 'upstream_before', 'overlap', 'mask_composition', 'continual',
    'continual_summary', 'saliency': {'upstream_200': (matrix [layers, neurons], layer names)},
    'masks': {label: {layer: BoolTensor}}}``; ``run_dir='latest'``: the newest finished ablation run.
    A table the run did not write is an empty DataFrame; tensors are verified against their sha256."""
    import pandas as pd

    from lab._io import load_tensors, read_json

    run_dir = latest_run() if str(run_dir) == "latest" else Path(run_dir)
    if not (run_dir / "config.json").exists():
        raise FileNotFoundError(f"{run_dir} is not an AWARe ablation run (no config.json); "
                                f"runs are written under runs/aware/ by `lab aware ablate`")
    out: dict = {"run_dir": run_dir, "config": read_json(run_dir / "config.json")}
    for name in ("results", "upstream_before", "overlap", "mask_composition", "continual", "continual_summary"):
        table = _read_table(run_dir / name)
        out[name] = pd.DataFrame() if table is None else table
    out["saliency"], out["masks"] = {}, {}
    for f in sorted(run_dir.glob("saliency_*.safetensors")):
        t, meta = load_tensors(f)
        out["saliency"][f.stem.removeprefix("saliency_")] = (t["matrix"], json.loads(meta["layers"]))
    for f in sorted(run_dir.glob("masks_*.safetensors")):
        t, _ = load_tensors(f)
        out["masks"][f.stem.removeprefix("masks_")] = {k: v.bool() for k, v in t.items()}
    return out
