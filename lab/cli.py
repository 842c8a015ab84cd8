"""The ``lab`` command line. ``lab --help`` lists the subcommands; each has its own ``--help``.

Foundation subcommands live here (``backbones``, ``datasets``, ``features``); the methods and the
report pipeline contribute theirs through a ``register(subparsers)`` function in their own module.

Bad input costs nothing: every handler checks all its parameters first (:mod:`lab._validate`),
and :func:`main` turns every expected failure into ONE line on stderr and exit status 2 (argparse's
own errors included), never a traceback. Ctrl-C prints one line naming the run folder being
written and, where the command can resume, the command that does (exit status 130).
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import sys

from lab._validate import one_line  # noqa: F401  (tests/test_bad_input.py imports it from here)

# each plugin module's register(subparsers) adds its command; registering imports no torch (the
# parsers' choices come from lab._names), so every command's parser is built on every call
_PLUGINS = ("lab.experiments.tosca.cli", "lab.experiments.aware.cli", "lab.report", "lab.jupyter")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``lab tosca: error: argument --epochs: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _table(rows: list[dict]) -> str:
    """Rows as a plain text table, columns right-aligned as pandas' ``to_string(index=False)``
    (without importing pandas: ~1-2 s on a loaded machine)."""
    if not rows:
        return ""
    cols = list(rows[0])
    cells = [[str(c) for c in cols]] + [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join(" ".join(v.rjust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def cmd_backbones(args) -> int:
    from lab import backbones as B

    rows = []
    for name in B.list_backbones():
        info = B.backbone_info(name)
        ok, where = B.weights_available(name)
        rows.append({"backbone": name + (" (UNTRAINED)" if info["untrained"] else ""), "weights": info["pretrained"],
                     "params": f"{B.params(name):,}", "feature_dim": info["feature_dim"],
                     "default_px": info["default_resolution"], "available": "yes" if ok else "no", "where / how": where})
    print(_table(rows))
    return 0


def cmd_datasets(args) -> int:
    from lab import _validate, data

    if args.root is not None and os.path.exists(args.root):
        _validate.in_dir("--root", args.root)
    elif args.root is None and os.environ.get("LAB_DATA_DIR") and os.path.exists(os.environ["LAB_DATA_DIR"]):
        _validate.in_dir("$LAB_DATA_DIR", os.environ["LAB_DATA_DIR"])

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
    from lab import _validate, backbones, features
    from lab.data import dataset_info

    backbones.check_args(args.backbone, args.resolution, args.weights, args.preprocess)   # everything before any work
    dataset_info(args.dataset)
    _validate.count("--batch-size", args.batch_size)
    _validate.device("--device", args.device)
    _validate.check_cache_dir(args.cache_dir)
    bb = backbones.load(args.backbone, resolution=args.resolution, weights=args.weights, device=args.device,
                        preprocess=args.preprocess)
    layers = [None] + (bb.stage_names if args.all_stages else [])
    for split in args.splits:
        sets = features.extract_layers(bb, args.dataset, split, layers, batch_size=args.batch_size,
                                       cache_dir_=args.cache_dir, progress=not args.quiet, precision=args.precision)
        fs = sets[None]
        how = "cache hit" if fs.cache_hit else "extracted"
        print(f"{args.dataset}/{split}: {len(fs.labels)} images -> {tuple(fs.features.shape)} "
              f"[{bb.name}@{bb.resolution}px, {bb.transform}, {bb.device.type} {bb.precision(args.precision)}] {how} in {fs.seconds:.2f} s ({fs.images_per_second:,.0f} images/s)"
              f"\n  {fs.meta['path']}")
    return 0


def cmd_plugins(args) -> int:
    from lab import plugins

    rows = [{"kind": k, "name": n, "package": src} for k, n, src in plugins.entries()]
    print(_table(rows))
    groups = ", ".join(plugins.GROUPS.values())
    print(f"\nPlugins add entries through the entry-point groups {groups} (docs/plugins.md)")
    return 0


_JUPYTER_FIXED = ("--ip", "--ServerApp.ip", "--port", "--ServerApp.port", "--ServerApp.token",
                  "--IdentityProvider.token", "--ServerApp.password", "--PasswordIdentityProvider",
                  "--ServerApp.allow_origin", "--ServerApp.allow_origin_pat", "--ServerApp.allow_remote_access",
                  "--ServerApp.disable_check_xsrf", "--ServerApp.allow_unauthenticated_access", "--config",
                  "--ServerApp.config_file", "--JupyterApp.config_file", "--IdentityProvider.token",
                  "--IdentityProvider.token_generator", "--ServerApp.identity_provider_class",
                  "--ServerApp.authorizer_class")


def check_jupyter(args) -> None:
    """`lab jupyter`: port, token, root folder and the pass-through arguments (the server stays
    on 127.0.0.1 with a token whatever is passed after '--')."""
    from lab import _validate

    _validate.count("--port", args.port, minimum=0, maximum=65535)
    if args.token is not None and (not args.token or not re.fullmatch(r"[A-Za-z0-9_.~-]+", args.token)):
        raise _validate.bad("--token", args.token, "must be non-empty letters, digits or -_.~ (it goes into a URL)")
    if args.root_dir is not None:
        _validate.in_dir("--root-dir", args.root_dir)
    if not args.kernel or not re.fullmatch(r"[A-Za-z0-9_.-]+", args.kernel):
        raise _validate.bad("--kernel", args.kernel, "must be a kernel name (see `jupyter kernelspec list`)")
    for a in args.extra:
        if a.split("=", 1)[0] in _JUPYTER_FIXED:
            raise _validate.bad("-- (JupyterLab arguments)", a, "the address, port and token are set by lab jupyter "
                                "(127.0.0.1 with a token); use --port/--token")


_PRECHECK = {"jupyter": check_jupyter}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``lab`` parser with every subcommand. Building it imports no torch (nor numpy): the
    registries' names for ``choices=`` come from the static tables in :mod:`lab._names`, and each
    handler imports what it needs. ``argv`` is accepted for compatibility and not used."""
    from lab._names import DEFAULT_BACKBONE, DEFAULT_DATASET, PRECISIONS, PREPROCESS

    p = Parser(prog="lab", description="continual-lab: TOSCA and AWARe on real pretrained models.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser("backbones", help="list frozen backbones: parameters, feature dim, weight availability")
    b.set_defaults(func=cmd_backbones)

    d = sub.add_parser("datasets", help="list datasets with size, classes, licence and availability")
    d.add_argument("--root", default=None, help="data root (default $LAB_DATA_DIR or ~/data)")
    d.set_defaults(func=cmd_datasets)

    f = sub.add_parser("features", help="build the feature cache for a backbone and dataset; prints images/s")
    f.add_argument("--backbone", default=DEFAULT_BACKBONE, help=f"backbone name (default {DEFAULT_BACKBONE}; see `lab backbones`)")
    f.add_argument("--dataset", default=DEFAULT_DATASET, help=f"dataset name (default {DEFAULT_DATASET}; see `lab datasets`)")
    f.add_argument("--resolution", type=int, default=None, help="input resolution in px (default: the backbone's)")
    f.add_argument("--splits", nargs="+", default=["train", "test"], choices=["train", "test"])
    f.add_argument("--batch-size", type=int, default=128)
    f.add_argument("--all-stages", action="store_true", help="also cache every intermediate stage (pooled)")
    f.add_argument("--cache-dir", default=None, help="cache root (default $LAB_CACHE_DIR or ~/.cache/continual-lab)")
    f.add_argument("--weights", default=None, metavar="FILE",
                   help="backbone weights file (as $LAB_VIT_B16_WEIGHTS; default: the backbone's own source)")
    f.add_argument("--preprocess", default=None, choices=PREPROCESS,
                   help="ViT preprocessing: reference (Resize 256 bicubic + CenterCrop 224, no Normalize: the TOSCA "
                        "reference's; default) or timm (resize to 224, mean/std 0.5)")
    f.add_argument("--device", default="cpu", help="device of the feature pass: cpu, cuda or cuda:N (default cpu; "
                                                   "CUDA runs in bf16 autocast)")
    f.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="auto (default): bf16 autocast on CUDA, float32 on the CPU; bf16 on the CPU is an option "
                        "whose cost and accuracy effect benchmarks/bench_features_precision.py measures "
                        "(a separate cache entry)")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.set_defaults(func=cmd_features)

    g = sub.add_parser("plugins", help="list every registry entry (backbones, datasets, methods, routers, rules) "
                                       "and the package it came from")
    g.set_defaults(func=cmd_plugins)

    for mod in _PLUGINS:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name and (exc.name == mod or mod.startswith(exc.name + ".")):
                continue  # that part of the lab is not installed in this checkout
            raise
        module.register(sub)
    return p


def _prog(args) -> str:
    sub = getattr(args, "aware_command", None)
    return "lab " + args.command + (f" {sub}" if sub else "")


def _interrupted(args, argv: list[str]) -> str:
    """The one line Ctrl-C prints: where the run was writing and how to continue it."""
    from lab import runs

    if callable(getattr(args, "interrupted", None)):   # a command that knows its own resume line
        return args.interrupted(args, argv)
    folder = runs.active() or getattr(args, "run_dir", None) or getattr(args, "resume", None)
    if folder is not None and not os.path.isdir(folder):
        folder = None
    if folder is None:
        if hasattr(args, "resume") or args.command == "aware":
            return f"{_prog(args)}: interrupted before its run folder was created; nothing to resume"
        return f"{_prog(args)}: interrupted"
    if hasattr(args, "resume"):  # commands that can resume
        keep, skip = [], False
        for a in argv:
            if skip:
                skip = False
                continue
            if a in ("--resume", "--runs-dir"):
                skip = True
                continue
            if a.startswith(("--resume=", "--runs-dir=")):
                continue
            keep.append(a)
        return (f"{_prog(args)}: interrupted; finished tasks are saved in {folder}; resume with: "
                f"{shlex.join(['lab', *keep, '--resume', str(folder)])}")
    return f"{_prog(args)}: interrupted; partial results in {folder} (this command does not resume: run it again)"


# Failures a user can meet and act on: bad names and values, files and folders, missing data or
# weights, corrupt files, a package not installed. Anything else is a bug and keeps its traceback.
EXPECTED = (KeyError, ValueError, OSError, RuntimeError, re.error, ImportError, MemoryError)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:    # Ctrl-C before a command starts (reading the command line) is one line and 130 as well
        if argv[:2] == ["tosca", "study"]:    # the shipped TOSCA study: its own parser (lab tosca study --help)
            study_main = importlib.import_module("lab.experiments.tosca.cli").study_main   # with --track

            return study_main(argv[2:], prog="lab tosca study")
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        from lab import _validate, runs
    except KeyboardInterrupt:
        print(f"lab{' ' + argv[0] if argv and not argv[0].startswith('-') else ''}: interrupted", file=sys.stderr,
              flush=True)
        return 130
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    runs.set_active(None)  # a run folder from an earlier call in this process is not this one's
    try:
        if args.command in _PRECHECK:
            _PRECHECK[args.command](args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(_interrupted(args, argv), file=sys.stderr, flush=True)
        return 130
    except BrokenPipeError:   # `lab plugins | head`: the reader left; say nothing, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit's flush
        return 141
    except EXPECTED as exc:
        print(f"{_prog(args)}: error: {_validate.one_line(exc)}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
