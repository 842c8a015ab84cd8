"""The ``lab`` command line. ``lab --help`` lists the subcommands; each has its own ``--help``.

Foundation subcommands live here (``backbones``, ``datasets``, ``features``); the methods and the
report pipeline contribute theirs through a ``register(subparsers)`` function in their own module.
"""
from __future__ import annotations

import argparse
import importlib
import sys

_PLUGINS = ("lab.tosca.cli", "lab.aware.cli", "lab.report", "lab.jupyter")


def _table(rows: list[dict]) -> str:
    import pandas as pd

    return pd.DataFrame(rows).to_string(index=False)


def cmd_backbones(args) -> int:
    from lab import backbones as B

    rows = []
    for name in B.list_backbones():
        info = B.backbone_info(name)
        ok, where = B.weights_available(name)
        rows.append({"backbone": name + (" (UNTRAINED)" if info["untrained"] else ""), "weights": info["pretrained"],
                     "params": f"{B.param_count(name):,}", "feature_dim": info["feature_dim"],
                     "default_px": info["default_resolution"], "available": "yes" if ok else "no", "where / how": where})
    print(_table(rows))
    return 0


def cmd_datasets(args) -> int:
    from lab import data

    rows = []
    for name in data.list_datasets():
        info = data.dataset_info(name)
        ok, where = data.is_available(name, args.root)
        rows.append({"dataset": name + (" (default)" if name == data.DEFAULT_DATASET else ""),
                     "classes": info["classes"], "train": info["train"] or "?", "test": info["test"] or "?",
                     "image": info["image"], "licence": info["licence"], "available": "yes" if ok else "no",
                     "where": where})
    print(_table(rows))
    print("\nData cards: data_cards/<name>.md")
    return 0


def cmd_features(args) -> int:
    from lab import backbones, features

    backbones.backbone_info(args.backbone)  # fail fast on unknown names
    from lab.data import dataset_info

    dataset_info(args.dataset)
    bb = backbones.load(args.backbone, resolution=args.resolution)
    layers = [None] + (bb.stage_names if args.all_stages else [])
    for split in args.splits:
        sets = features.extract_layers(bb, args.dataset, split, layers, batch_size=args.batch_size,
                                       cache_dir_=args.cache_dir, progress=not args.quiet)
        fs = sets[None]
        how = "cache hit" if fs.cache_hit else "extracted"
        print(f"{args.dataset}/{split}: {len(fs.labels)} images -> {tuple(fs.features.shape)} "
              f"[{bb.name}@{bb.resolution}px] {how} in {fs.seconds:.2f} s ({fs.images_per_second:,.0f} images/s)"
              f"\n  {fs.meta['path']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lab", description="continual-lab: TOSCA and AWARe on real pretrained models.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser("backbones", help="list frozen backbones: parameters, feature dim, weight availability")
    b.set_defaults(func=cmd_backbones)

    d = sub.add_parser("datasets", help="list datasets with size, classes, licence and availability")
    d.add_argument("--root", default=None, help="data root (default $LAB_DATA_DIR or ~/data)")
    d.set_defaults(func=cmd_datasets)

    from lab.backbones import DEFAULT_BACKBONE
    from lab.data.datasets import DEFAULT_DATASET

    f = sub.add_parser("features", help="build the feature cache for a backbone and dataset; prints images/s")
    f.add_argument("--backbone", default=DEFAULT_BACKBONE, help=f"backbone name (default {DEFAULT_BACKBONE}; see `lab backbones`)")
    f.add_argument("--dataset", default=DEFAULT_DATASET, help=f"dataset name (default {DEFAULT_DATASET}; see `lab datasets`)")
    f.add_argument("--resolution", type=int, default=None, help="input resolution in px (default: the backbone's)")
    f.add_argument("--splits", nargs="+", default=["train", "test"], choices=["train", "test"])
    f.add_argument("--batch-size", type=int, default=128)
    f.add_argument("--all-stages", action="store_true", help="also cache every intermediate stage (pooled)")
    f.add_argument("--cache-dir", default=None, help="cache root (default $LAB_CACHE_DIR or ~/.cache/continual-lab)")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.set_defaults(func=cmd_features)

    for mod in _PLUGINS:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name and (exc.name == mod or mod.startswith(exc.name + ".")):
                continue  # that part of the lab is not installed in this checkout
            raise
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (KeyError, ValueError, FileNotFoundError, RuntimeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"lab {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
