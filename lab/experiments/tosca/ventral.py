"""Notebook 01's comparisons over seeds: is a stage before the head more linearly decodable, does full
fine-tuning change what the backbone's decision-point feature says about the other classes, and how
does its task accuracy compare with TOSCA's at the budgets given?

One seed draws its own class-balanced subset of the images (``lab.analysis.balanced_indices``) and
trains everything with that seed: a linear probe on every stage of the frozen backbone, full
fine-tuning of a copy of the backbone on one task (``lab.analysis.finetune_backbone``), TOSCA's LuCA
on the frozen decision-point feature of the same task's images, and a nearest-prototype read-out of
the other classes on the frozen and on the fine-tuned backbone. Differences are paired by seed and
given the lab's one interval (:mod:`lab.stats`: a 95 % t-interval over per-seed values) and a
direction — *higher*, *lower* or *no difference detected*.

    python -m lab.experiments.tosca.ventral --out results/tosca/ventral     # the shipped table (one process)

Written into ``--out``: ``per_seed.csv`` (one row per seed; accuracies as fractions) and
``manifest.json`` (command, settings, sources' sha256, date, machine, wall time, the table's sha256).
Notebook 01 reads it at the notebook's report settings (:data:`Settings` defaults).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from lab import stats

FOLDER = Path(__file__).resolve().parents[3] / "results" / "tosca" / "ventral"
SEEDS = tuple(range(1, 11))     # notebook 01's own run is seed 0: it picks the stage, these test it


@dataclass(frozen=True)
class Settings:
    """Notebook 01's report parameters (its ``parameters`` cell), what every seed runs with."""

    backbone: str = "efficientnet_lite0"
    dataset: str = "fashion_mnist_mini"
    resolution: int = 96
    train_per_class: int = 100
    test_per_class: int = 50
    probe_epochs: int = 30
    adapt_task: int = 0
    ft_epochs: int = 2
    ft_lr: float = 0.01
    tosca_epochs: int = 20


def one_seed(bb, ds, task_classes, s: Settings, seed: int) -> dict:
    """Every number of one seed (accuracies as fractions): the linear probe at every stage, full
    fine-tuning's and TOSCA's accuracy on the task, and the other classes' nearest-prototype accuracy
    on the frozen and on the fine-tuned backbone's decision-point features."""
    import torch

    from lab import analysis
    from lab.probes import linear_probe_accuracy, prototype_accuracy
    from lab.tosca import Tosca, ToscaConfig

    tr = analysis.balanced_indices(ds.train.labels, s.train_per_class, seed=seed)
    te = analysis.balanced_indices(ds.test.labels, s.test_per_class, seed=seed)
    ytr, yte = torch.from_numpy(ds.train.labels[tr]), torch.from_numpy(ds.test.labels[te])
    f_tr, f_te = analysis.stage_features(bb, ds.train.images[tr]), analysis.stage_features(bb, ds.test.images[te])
    probes = {f"probe {k}": linear_probe_accuracy(f_tr[k], ytr, f_te[k], yte, epochs=s.probe_epochs, seed=seed)
              for k in f_tr}
    in_tr, in_te = np.isin(ds.train.labels[tr], task_classes), np.isin(ds.test.labels[te], task_classes)
    ty_tr = analysis.relabel(ds.train.labels[tr][in_tr], task_classes)
    ty_te = analysis.relabel(ds.test.labels[te][in_te], task_classes)
    ft = analysis.finetune_backbone(bb, ds.train.images[tr][in_tr], ty_tr, epochs=s.ft_epochs, lr=s.ft_lr, seed=seed)
    ft_acc = float((ft.predict(ds.test.images[te][in_te]) == ty_te).float().mean())
    torch.manual_seed(seed)
    tosca = Tosca(bb.feature_dim, ToscaConfig(epochs=s.tosca_epochs, seed=seed))
    tosca.learn_task(list(range(len(task_classes))), f_tr["head"][in_tr], ty_tr)
    tosca_acc = float((tosca.all_logits(f_te["head"][in_te])[0].argmax(1) == ty_te).float().mean())
    ft_tr = analysis.stage_features(ft.backbone, ds.train.images[tr][~in_tr])["head"]
    ft_te = analysis.stage_features(ft.backbone, ds.test.images[te][~in_te])["head"]
    return {"seed": seed, **probes, "ft_task": ft_acc, "tosca_task": tosca_acc,
            "other_frozen": prototype_accuracy(f_tr["head"][~in_tr], ytr[~in_tr], f_te["head"][~in_te], yte[~in_te]),
            "other_ft": prototype_accuracy(ft_tr, ytr[~in_tr], ft_te, yte[~in_te]),
            "test_task_images": int(in_te.sum()), "test_other_images": int((~in_te).sum())}


def task_classes(s: Settings) -> list[int]:
    """The dataset's own class ids of the adapted task (B0 Inc2, class order of seed 1993, as notebook 01)."""
    from lab import data

    scn = data.scenario(s.dataset, init=0, inc=2, seed=1993)
    return [scn.class_order[c] for c in scn.tasks[s.adapt_task].classes]


# --- the shipped table ---------------------------------------------------------------------------
def load(folder=None) -> tuple[pd.DataFrame, dict]:
    """``(per_seed, manifest)`` of the table in ``folder`` (default ``results/tosca/ventral``), its
    sha256 checked against the manifest."""
    from lab import _manifest

    folder = Path(folder or FOLDER)
    mpath = folder / "manifest.json"
    fix = f"rerun `python -m lab.experiments.tosca.ventral --out {folder}`"
    if not mpath.is_file():
        raise FileNotFoundError(f"no table of notebook 01's comparisons in {folder}: {fix}")
    manifest = _manifest.read(mpath, fix=fix)
    paths = _manifest.verify(folder, manifest, mpath, ("per_seed.csv",), fix=fix)
    return _manifest.read_csv_table(paths["per_seed.csv"], rows=True), manifest


def differs(manifest: dict, **params) -> dict:
    """The notebook parameters (by :class:`Settings` field name) that differ from the table's."""
    have = manifest["settings"]
    return {k: (v, have[k]) for k, v in params.items() if k in have and v != have[k]}


def comparisons(per_seed: pd.DataFrame, stage: str) -> pd.DataFrame:
    """Each comparison as the mean of ``a`` and of ``b`` and their difference paired by seed, each with
    its 95 % t-interval over seeds, and the difference's direction (:func:`lab.stats.direction`)."""
    pairs = ((f"linear probe, {stage} − head", f"probe {stage}", "probe head"),
             ("other classes' prototype accuracy, after full fine-tuning − before", "other_ft", "other_frozen"),
             ("task accuracy, full fine-tuning − TOSCA", "ft_task", "tosca_task"))
    rows = []
    for name, a, b in pairs:
        if a not in per_seed:          # a stage the table's backbone does not have
            rows.append({"comparison": name, "seeds": len(per_seed), "verdict": "not in the table",
                         **dict.fromkeys(("a", "a_lo", "a_hi", "b", "b_lo", "b_hi", "difference", "lo", "hi"), np.nan)})
            continue
        ma, mb = stats.t_interval(per_seed[a]), stats.t_interval(per_seed[b])
        d = stats.paired(per_seed[a].tolist(), per_seed[b].tolist())
        rows.append({"comparison": name, "a": ma[0], "a_lo": ma[1], "a_hi": ma[2], "b": mb[0], "b_lo": mb[1],
                     "b_hi": mb[2], "difference": d[0], "lo": d[1], "hi": d[2], "seeds": len(per_seed),
                     "verdict": stats.direction(d[1], d[2])})
    return pd.DataFrame(rows)


def interval(mean: float, lo: float, hi: float, digits: int = 3, sign: bool = False) -> str:
    """'0.832 [0.815, 0.849]' ('+' on differences with ``sign``); the mean alone without an interval."""
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f.format(mean)
    return f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"


def sentence(row) -> str:
    """One comparison in words: '... +0.004 [−0.010, +0.018] over 10 seeds — no difference detected'."""
    return (f"{row.comparison}: {interval(row.difference, row.lo, row.hi, sign=True)} over {row.seeds} seeds — "
            f"{row.verdict}")


# --- the command ---------------------------------------------------------------------------------
def main(argv=None, prog: str = "python -m lab.experiments.tosca.ventral") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=prog, description="Notebook 01's comparisons over seeds (one process).")
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--out", default=str(FOLDER))
    for f in fields(Settings):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = p.parse_args(argv)
    import torch

    from lab import _io, _manifest, backbones, data

    from .study import _write_csv, machine, sources_sha256

    torch.set_num_threads(1)
    s = Settings(**{f.name: getattr(args, f.name) for f in fields(Settings)})
    import hashlib

    root = Path(__file__).resolve().parents[3]
    sources = {k: v for k, v in sources_sha256(()).items() if not k.startswith("lab/experiments/tosca/")
               or k.endswith("ventral.py")}             # TOSCA itself, the compiled engine and this file
    sources.update({f"lab/{n}": hashlib.sha256((root / "lab" / n).read_bytes()).hexdigest()
                    for n in ("analysis.py", "probes.py", "backbones.py")})
    bb, ds = backbones.load(s.backbone, resolution=s.resolution), data.load_dataset(s.dataset)
    t0 = time.perf_counter()
    rows = []
    for seed in args.seeds:
        t1 = time.perf_counter()
        rows.append({**one_seed(bb, ds, task_classes(s), s, seed), "seconds": time.perf_counter() - t1})
        print(f"  seed {seed}: {rows[-1]['seconds']:.0f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "per_seed.csv", pd.DataFrame(rows))
    _io.write_json(out / "manifest.json", {
        "command": f"{prog} " + " ".join(argv), "settings": asdict(s), "seeds": list(args.seeds),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "wall_seconds": round(time.perf_counter() - t0, 1), "sources_sha256": sources,
        "sha256": _manifest.digests(out, ("per_seed.csv",))})
    print(f"wrote {out}/per_seed.csv, manifest.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
