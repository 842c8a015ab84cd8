"""``lab tosca``: run a whole class-incremental scenario with TOSCA or a baseline, print the summary.

Imports stay inside the handler, so ``lab --help`` does not load torch.
"""
from __future__ import annotations

import contextlib

_EPILOG = """\
the shipped study (every router and baseline, several seeds, 95 % intervals): lab tosca study --help

methods:
  tosca              one LuCA module per task on the frozen decision-point feature, entropy routing
  simplecil          prototype cosine classifier on the frozen features (no training)
  ncm                nearest class mean (Euclidean) on the frozen features (no training)
  fecam              class-wise Mahalanobis with shrinkage and a Tukey transform (FeCAM; no training)
  ranpac             random projection + ReLU + ridge regression (RanPAC, without its first-task
                     adaptation; no gradient training)
  finetune           one linear head fine-tuned task after task (forgetting lower bound)
  joint              a linear head trained on every class seen so far (upper bound)
  layerwise_adapter  bottleneck adapters in every backbone block, trained on task 0, then
                     prototypes (APER-adapter); runs the backbone, slow on a CPU

routing (TOSCA is evaluated under --routings and --routing; --routing picks the headline row):
  per-sample   each test image picks the module with the lowest softmax entropy (honest)
  per-batch    the reference protocol: mean entropy over a batch of --per-batch-size test images in
               class-ordered test order; ONE module per batch (leaks the task grouping)
  oracle       the module of the image's true task (upper bound)
  max-softmax  the module with the highest top softmax probability
  energy       the module with the largest log-sum-exp of its logits
  ncm          the task of the nearest class mean of the frozen features
  mahalanobis  the same under one shared, shrunk covariance of the frozen features
  entropy-ncm  entropy where its winner is confident, ncm elsewhere
  ridge        the task of the top-1 class of a global ridge classifier on random ReLU features
               of the frozen features: a RanPAC-style global ridge router from a follow-up
               method (PRISM) developed in the repository that first published TOSCA's code;
               the TOSCA paper's own routing is entropy

modes:
  cached   train on cached backbone features (no backbone pass during training; default)
  augment  run the backbone every epoch on augmented images (random resized crop + flip), as the
           reference does; slow, for comparison

Results go to a new directory under $LAB_RUNS_DIR or ./runs/tosca/ (tables, summary.json, every
task's module as safetensors). --resume DIR continues an interrupted run.

example:
  lab tosca --dataset fashion_mnist_mini --init 0 --inc 2 --method tosca --routing per-sample
  lab tosca --dataset mnist_5k fashion_mnist_mini --inc 2 --seed 1994     # chained, 10 tasks
  lab tosca --seeds 1993 1994 1995 --l1 0 5e-4 2e-3 --executor ray     # a sweep: 9 runs, 1 Ray task each

A sweep (several --seeds or --l1 values, or --executor ray) writes into a new folder under
$LAB_RUNS_DIR or ./runs/tosca-sweep/: runs.parquet (one row per seed, L1 and routing),
summary.parquet (mean and 95 % t-interval over seeds) and variants/ (one file per finished run,
skipped by --resume).
"""


def register(subparsers) -> None:
    import argparse

    from lab import executors
    from lab._names import DEFAULT_ROUTINGS, PREPROCESS, ROUTINGS, TOSCA_FLOWS, TOSCA_METHODS, TOSCA_MODES

    p = subparsers.add_parser(
        "tosca", help="TOSCA and baselines on a class-incremental scenario; prints the summary table",
        description="Run a class-incremental scenario (B<init> Inc<inc>) with TOSCA or a baseline on a frozen "
                    "backbone and print Ā, A_B, forgetting, BWT and routing accuracy.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", nargs="+", default=["fashion_mnist_mini"], metavar="D",
                   help="dataset name(s); several are chained in the given order (default fashion_mnist_mini; "
                        "see `lab datasets`)")
    p.add_argument("--backbone", default="efficientnet_lite0", help="frozen backbone (default efficientnet_lite0; "
                                                                    "see `lab backbones`)")
    p.add_argument("--resolution", type=int, default=None, help="input resolution in px (default: the backbone's)")
    p.add_argument("--weights", default=None, metavar="FILE",
                   help="backbone weights file (as $LAB_VIT_B16_WEIGHTS; default: the backbone's own source)")
    p.add_argument("--preprocess", default=None, choices=PREPROCESS,
                   help="ViT preprocessing: reference (Resize 256 bicubic + CenterCrop 224, no Normalize; default) "
                        "or timm (resize to 224, mean/std 0.5); see lab/backbones.py")
    p.add_argument("--init", type=int, default=0, help="classes in the first task; 0 = same as --inc (default 0)")
    p.add_argument("--inc", type=int, default=2, help="classes per later task (default 2)")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=1993, help="class order and training seed (default 1993)")
    seeds.add_argument("--seeds", type=int, nargs="+", default=None, metavar="S",
                       help="several seeds: a sweep, one run per seed (and per --l1 value), summarised with "
                            "95 %% intervals over seeds")
    p.add_argument("--method", default="tosca", choices=TOSCA_METHODS, help="method (default tosca)")
    p.add_argument("--routing", default="per-sample", choices=ROUTINGS, help="headline routing (default per-sample)")
    p.add_argument("--routings", nargs="+", default=list(DEFAULT_ROUTINGS), choices=ROUTINGS,
                   metavar="R", help="routings TOSCA is evaluated under (default per-sample per-batch oracle)")
    p.add_argument("--mode", default="cached", choices=TOSCA_MODES, help="training mode (default cached)")
    p.add_argument("--epochs", type=int, default=20, help="epochs per task (default 20, the reference)")
    p.add_argument("--batch-size", type=int, default=48, help="training batch (default 48)")
    p.add_argument("--lr", type=float, default=0.025, help="SGD learning rate, cosine to 1e-8 (default 0.025)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="SGD weight decay (default 0)")
    p.add_argument("--eta-min", type=float, default=1e-8, help="the cosine schedule's final lr (default 1e-8)")
    p.add_argument("--l1", type=float, nargs="+", default=[5e-4], metavar="L1",
                   help="L1 coefficient on the LuCA parameters (default 5e-4); several values: a sweep over them")
    p.add_argument("--ratio", type=int, default=16, help="LuCA bottleneck r = d // ratio (default 16)")
    p.add_argument("--flow", default="tosca", choices=TOSCA_FLOWS,
                   help="LuCA flow (default tosca; the others are the reference's ablations)")
    p.add_argument("--ridge-dim", type=int, default=None, metavar="D",
                   help="the ridge router's random-projection dimension (default 2000; PRISM's 15000; "
                        "needs ridge among --routings)")
    p.add_argument("--ridge-lambda", type=float, default=None, metavar="LAMBDA",
                   help="the ridge router's regularisation λ (default 1e3, PRISM's)")
    p.add_argument("--per-batch-size", type=int, default=48, help="test batch of the per-batch protocol (default 48)")
    p.add_argument("--device", default="cpu", help="device of the feature pass and the TOSCA modules (default cpu; "
                                                   "cuda: features in bf16 autocast)")
    p.add_argument("--engine", default="autograd", choices=("autograd", "eager", "fused", "compile", "static",
                                                           "cuda_graph"),
                   help="TOSCA training step: autograd (default: loss.backward(), torch.optim.SGD); opt-in "
                        "accelerators of the same update (lab/tosca/engines/): eager (hand-written backward), "
                        "fused (its element-wise work in C kernels built with the C compiler; where it cannot "
                        "run, eager, said in one line), compile (torch.compile), static buffers, or one CUDA "
                        "graph per epoch (GPU)")
    p.add_argument("--head-scale-param", default="positive", choices=("positive", "free"),
                   help="cosine-head scale σ: positive (softplus, stays > 0; default) or free (the reference's "
                        "unconstrained σ, which can turn negative and flip every logit)")
    p.add_argument("--head-scale", type=float, default=1.0, help="initial σ of the cosine head (default 1)")
    p.add_argument("--head-init", default="reference", choices=("reference", "uniform"),
                   help="new head rows: reference (first task uniform, later tasks zero rows, as the "
                        "reference; default) or uniform (uniform rows for every task)")
    p.add_argument("--luca-init", default="reference", choices=("reference", "xavier"),
                   help="LuCA init: reference (task 0 from nn.Linear's default, later tasks Xavier; "
                        "default) or xavier (every task)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads while training (0 = torch's setting; default 1, see ToscaConfig)")
    p.add_argument("--runs-dir", default=None, help="runs root (default $LAB_RUNS_DIR or ./runs)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue an interrupted run (or sweep: its finished variants are skipped) in DIR")
    executors.add_arguments(p, "SWEEP_DIR/variants/ and skipped by --resume SWEEP_DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    track_given(p)
    from lab import tracking

    tracking.add_argument(p)        # after track_given: how a run is watched is not part of its config
    p.set_defaults(func=cmd_tosca)


class _Given:
    """Mixed into an argparse action: records its dest in ``namespace._given`` when the option is on
    the command line (a default never passes through here), so checks tell typed flags from defaults."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace._given = tuple(dict.fromkeys((*getattr(namespace, "_given", ()), self.dest)))
        super().__call__(parser, namespace, values, option_string)


def track_given(parser) -> None:
    """Every option of ``parser`` records itself in ``args._given`` when given (:func:`given`)."""
    import argparse

    for a in parser._actions:
        if a.option_strings and not isinstance(a, (argparse._HelpAction, _Given)):
            a.__class__ = type(f"Given{type(a).__name__}", (_Given, type(a)), {})
    parser.set_defaults(_given=())


def given(args) -> tuple:
    """The dests of the options typed on the command line (not their defaults), in the order typed."""
    return getattr(args, "_given", ())


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _shown(args, dest: str) -> str:
    from lab._validate import show

    v = getattr(args, dest)
    return f"{_flag(dest)} {' '.join(show(x) for x in v) if isinstance(v, (list, tuple)) else show(v)}"


# which options apply to which method: (dests, whether a method has them from (name, registry info), why not);
# the capabilities are the registry info each method declares (lab.experiments.tosca._base.register)
APPLIES = (
    (("routing", "routings", "per_batch_size"), lambda name, info: info["routed"],
     "it is not routed: one model, no task modules"),
    (("l1", "ratio", "flow", "luca_init", "head_init", "engine", "ridge_dim", "ridge_lambda"),
     lambda name, info: info["luca"],
     "it has no LuCA module"),
    (("epochs", "batch_size", "lr", "momentum", "weight_decay", "eta_min"), lambda name, info: info["trains"],
     "it takes no gradient steps"),
    (("head_scale", "head_scale_param"), lambda name, info: info["cosine_head"],
     "it has no trained cosine head"),
)


def check_applies(args, info) -> None:
    """Options typed on the command line that the chosen method does not use are refused, all named
    in one line (a run that silently ignores --epochs 7 reports numbers the user did not ask for)."""
    from lab import _validate as V

    typed = given(args)
    unused, why = [], []
    for dests, has, reason in APPLIES:
        hit = [d for d in dests if d in typed]
        if hit and not has(args.method, info):
            unused += [_shown(args, d) for d in hit]
            why.append(reason)
    if "mode" in typed and args.mode == "augment" and not info["augments"]:
        from lab._names import TOSCA_METHODS

        changed = [n for n in TOSCA_METHODS if TOSCA_METHODS.info(n)["augments"]]   # they train through the backbone
        unused.append("--mode augment")
        why.append(f"augment mode changes only {' and '.join(changed)}")
    if unused:
        raise V.BadInput(f"{' '.join(unused)}: not used by --method {args.method} ({'; '.join(why)}); "
                         f"leave {'it' if len(unused) == 1 else 'them'} out")


# upper bounds of `lab tosca`'s numbers (a value past them is a typo; each message states its bound)
CLASSES_MAX = 100_000      # --init, --inc
EPOCHS_MAX = 100_000       # --epochs (as lab tosca study)
BATCH_MAX = 1_000_000      # --batch-size, --per-batch-size
L1_MAX = 10.0              # --l1 (the reference: 5e-4)
WEIGHT_DECAY_MAX = 1.0     # --weight-decay
HEAD_SCALE_MAX = 1000.0    # --head-scale (the cosine head's initial sigma; the reference: 1)


def check_args(args) -> None:
    """Every parameter of `lab tosca`, one line naming it on the first bad one; nothing is loaded,
    created or computed (the run itself checks the datasets and weights before its run folder)."""
    from lab import _validate as V
    from lab import backbones, data, executors, runs

    backbones.check_args(args.backbone, args.resolution, args.weights, args.preprocess)
    for d in args.dataset:
        data.dataset_info(d)
    V.count("--init", args.init, minimum=0, maximum=CLASSES_MAX)
    V.count("--inc", args.inc, maximum=CLASSES_MAX)
    for s in args.seeds or [args.seed]:
        V.seed("--seeds" if args.seeds else "--seed", s)
    if args.seeds and len(set(args.seeds)) < len(args.seeds):
        raise V.BadInput(f"--seeds {' '.join(map(str, args.seeds))}: lists a seed twice")
    V.count("--epochs", args.epochs, maximum=EPOCHS_MAX)
    V.count("--batch-size", args.batch_size, maximum=BATCH_MAX)
    from lab._names import TOSCA_METHODS as METHODS   # the registry's info, static (no torch for a usage error)

    if METHODS.info(args.method)["trains"]:
        V.learning_rate("--lr", args.lr)
    else:
        V.number("--lr", args.lr, ge=0, le=V.LR_MAX)
    for l1 in args.l1:
        V.number("--l1", l1, ge=0, le=L1_MAX)
    if len(set(args.l1)) < len(args.l1):
        raise V.BadInput(f"--l1 {' '.join(map(str, args.l1))}: lists a value twice")
    if len(args.l1) > 1 and not METHODS.info(args.method)["luca"]:
        raise V.BadInput(f"--l1 {' '.join(map(str, args.l1))}: sweeps TOSCA's L1; method {args.method} has none")
    check_applies(args, METHODS.info(args.method))
    executors.check_arguments(args)
    if is_sweep(args) and args.resume is None:
        if args.mode != "cached":
            raise V.bad("--mode", args.mode, "a sweep (--seeds, several --l1, --executor ray) trains on cached features")
        if METHODS.info(args.method)["needs_backbone"]:
            raise V.bad("--method", args.method, "runs the backbone; a sweep (--seeds, several --l1, --executor "
                                                 "ray) needs a method on cached features")
    V.number("--momentum", args.momentum, ge=0, lt=1)      # >= 1: every step adds to a growing velocity
    V.number("--weight-decay", args.weight_decay, ge=0, le=WEIGHT_DECAY_MAX)
    V.number("--eta-min", args.eta_min, ge=0)
    if METHODS.info(args.method)["trains"] and not args.eta_min < args.lr:
        raise V.bad("--eta-min", args.eta_min, f"must be below --lr {V.show(args.lr)} (the cosine schedule falls "
                                               f"from --lr to --eta-min)")
    V.number("--head-scale", args.head_scale, gt=0, le=HEAD_SCALE_MAX)
    V.threads("--threads", args.threads)
    dim = backbones.backbone_info(args.backbone)["feature_dim"]
    V.count("--ratio", args.ratio, maximum=dim)
    V.count("--per-batch-size", args.per_batch_size, maximum=BATCH_MAX)
    from lab._names import RIDGE_DIM_MAX, RIDGE_LAMBDA_MAX

    if args.ridge_dim is not None:
        V.count("--ridge-dim", args.ridge_dim, maximum=RIDGE_DIM_MAX)
    if args.ridge_lambda is not None:
        V.number("--ridge-lambda", args.ridge_lambda, gt=0, le=RIDGE_LAMBDA_MAX)
    typed = [d for d in ("ridge_dim", "ridge_lambda") if d in given(args)]
    if typed and "ridge" not in (*args.routings, args.routing):
        raise V.BadInput(f"{' '.join(_shown(args, d) for d in typed)}: set the ridge router, which is not among "
                         f"--routings {' '.join(args.routings)}; add ridge to --routings or leave "
                         f"{'it' if len(typed) == 1 else 'them'} out")
    if args.runs_dir is not None and not str(args.runs_dir).strip():
        raise V.bad("--runs-dir", args.runs_dir, "must be a folder path (leave the flag out for $LAB_RUNS_DIR "
                                                 "or ./runs)")
    V.device("--device", args.device)
    if args.engine == "cuda_graph" and not str(args.device).startswith("cuda"):
        raise V.bad("--engine", args.engine, "needs --device cuda")
    if args.resume is not None:
        from . import sweep    # imports torch (through .run): only here

        folder = V.in_dir("--resume", args.resume)
        if not ((folder / "config.json").is_file() or (folder / sweep.MANIFEST).is_file()):
            raise V.bad("--resume", args.resume, f"is not a tosca run or sweep folder (no config.json, "
                                                 f"no {sweep.MANIFEST})")
        V.out_dir("--resume", folder)
        runs.check_unlocked(folder)
        check_resume(args, folder)
    else:
        runs.check_root("tosca", args.runs_dir)


NOT_CONFIG = ("resume", "runs_dir", "executor", "address", "quiet")   # how and where to run, not what


def stored(folder):
    """``(kind, config, seeds, l1 values)`` a run or sweep folder holds (``kind``: 'run' or 'sweep'),
    each file checked: one line naming it when it is not a config of this version."""
    from pathlib import Path

    from lab import _io

    from . import sweep
    from .run import config_from_stored

    folder = Path(folder)
    if (folder / sweep.MANIFEST).is_file():
        base, seeds, l1s = sweep.read_manifest(folder)
        return "sweep", base, list(seeds), list(l1s)
    path = folder / "config.json"
    cfg = config_from_stored(_io.read_json(path), path)
    return "run", cfg, [cfg.seed], [cfg.l1]


def check_resume(args, folder) -> None:
    """``--resume DIR``: the folder's stored config is read and checked, and every option typed
    beside ``--resume`` must agree with it (a resumed run or sweep uses its stored settings; an
    option that says otherwise is refused, all of them named, instead of being ignored)."""
    from lab import _validate as V

    kind, cfg, seeds, l1s = stored(folder)

    def then(dest):
        if dest in ("seed", "seeds"):
            return seeds
        if dest == "l1":
            return l1s
        if dest == "dataset":
            return list(cfg.datasets)
        value = getattr(cfg, dest, None)
        return list(value) if isinstance(value, tuple) else value

    def now(dest):
        value = getattr(args, dest)
        return [value] if dest == "seed" else (list(value) if isinstance(value, (list, tuple)) else value)

    clash = [d for d in given(args) if d not in NOT_CONFIG and now(d) != then(d)]
    if clash:
        typed = " ".join(_shown(args, d) for d in clash)
        had = ", ".join(f"{'seeds' if d in ('seed', 'seeds') else d} "
                        f"{' '.join(map(V.show, then(d))) if isinstance(then(d), list) else V.show(then(d))}"
                        for d in clash)
        one = len(clash) == 1
        raise V.BadInput(f"--resume {folder}: {typed} contradict{'s' if one else ''} the {kind}'s stored config "
                         f"({had}); resume without {'it' if one else 'them'}, or start a new {kind} (no --resume)")


def is_sweep(args) -> bool:
    """Several seeds or L1 values, Ray, or resuming a sweep folder: run as a sweep (lab.experiments.tosca.sweep)."""
    if args.resume is not None:
        from pathlib import Path

        from .sweep import MANIFEST

        return (Path(args.resume) / MANIFEST).is_file()
    return bool(args.seeds) or len(args.l1) > 1 or args.executor == "ray"


def cmd_tosca(args) -> int:
    check_args(args)                # before torch is imported: a usage error answers at once
    from lab import runs, tracking

    track = tracking.start(args.track, "lab tosca", root=args.runs_dir)   # mlflow imports, its store opens
    from . import tracked
    from .run import run

    with runs.terminated_as_interrupted(), disk_full_resumes():
        if is_sweep(args):
            return cmd_sweep(args, track)
        # a resumed run continues with its stored config (the options typed agree with it: check_resume)
        cfg = stored(args.resume)[1] if args.resume is not None else config_from_args(args)
        res = run(cfg, runs_root=args.runs_dir, resume=args.resume, progress=not args.quiet)
    print(format_summary(res))
    tracking.log_run(track, res.run_dir, lambda: tracked.run(res))
    return 0


@contextlib.contextmanager
def disk_full_resumes():
    """A disk that fills during a run: its one line (:class:`lab._io.DiskFull`) says how to resume
    the run folder (the finished tasks or variants are kept); a run folder that holds nothing yet
    is removed."""
    from lab import _io, runs

    try:
        yield
    except _io.DiskFull as exc:
        folder = runs.active()
        if folder is not None and folder.is_dir() and not any((folder / f).is_file() for f in ("config.json",
                                                                                                "sweep.json")):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            raise _io.DiskFull(f"{exc}; free some space and run the command again") from exc
        if folder is None or not folder.is_dir():
            raise
        raise _io.DiskFull(f"{exc}; the finished work is kept in {folder}: free some space, then resume with: "
                           f"lab tosca --resume {folder}") from exc


def cmd_sweep(args, track=None) -> int:
    from pathlib import Path

    from lab import runs

    from . import sweep

    if args.resume is not None:
        folder = Path(args.resume)
        base, seeds, l1s = sweep.read_manifest(folder)
    else:
        base, seeds, l1s = config_from_args(args), args.seeds or [args.seed], args.l1
        folder = runs.new_run_dir("tosca-sweep", f"{base.method}-{'+'.join(base.datasets)}", root=args.runs_dir)
        sweep.write_manifest(folder, base, seeds, l1s, args.executor)
    lock = runs.lock(folder)
    try:
        print(f"sweep: {len(seeds)} seed(s) x {len(l1s)} L1 value(s) = {len(seeds) * len(l1s)} runs "
              f"({args.executor}) into {folder}", flush=True)
        table, summary = sweep.run_sweep(base, seeds, l1s, folder, executor=args.executor, address=args.address,
                                         log=None if args.quiet else print)
    finally:
        runs.set_active(folder)        # an interrupted sweep resumes as a sweep, not as its last run
        lock.unlink(missing_ok=True)
    print(sweep.format_summary(summary, folder))
    if track is not None:
        from lab import tracking

        from . import tracked

        tracking.log_run(track, folder, lambda: tracked.sweep(base, seeds, l1s, table, summary))
    return 0


def study_main(argv, prog: str = "lab tosca study") -> int:
    """``lab tosca study`` with ``--track``: the study's own parser plus that flag (so ``--help`` and
    usage errors are the study's), the study run unchanged without it, its folder logged after."""
    import argparse
    import sys

    from lab import runs, tracking
    from lab._validate import one_line

    from . import study, tracked

    if argv[:1] == ["mechanism"]:              # the mechanism study: its own command line
        from . import mechanism

        from lab.experiments.tosca.mechanism_views import write_derived

        return mechanism.main(argv[1:], prog=f"{prog} mechanism", derive=write_derived)
    p = study.parser(prog)
    p.epilog = ("--executor defaults to ray where Ray is installed and the machine has two cores or more "
                "(every core, one variant per task), else local. `lab tosca study mechanism --help`: the "
                "mechanism study (L1 x training length: sparsity, gates, overlap against chance)")
    tracking.add_argument(p)
    args = p.parse_args(argv)
    only = argparse.ArgumentParser(add_help=False)
    tracking.add_argument(only)
    rest = only.parse_known_args(argv)[1]       # the study's own arguments, in their order
    try:
        track = tracking.start(args.track, prog)                 # mlflow imports, its store opens
    except (ImportError, ValueError, RuntimeError) as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    with runs.terminated_as_interrupted():
        rc = study.main(with_default_executor(rest), prog=prog)
    try:
        if rc == 0:
            folder = args.out or runs.active()
            tracking.log_run(track, folder, lambda: tracked.study(folder))
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    return rc


def with_default_executor(argv: list[str], cpus: int | None = None) -> list[str]:
    """``lab tosca study`` on every core by default: where Ray is installed (the dev and scale
    extras) and the machine has two cores or more, ``--executor ray`` unless the command line names
    an executor (``--executor local``: one variant after another in this process). Ray itself is
    not imported here."""
    import os

    if any(a.split("=")[0] in ("--executor", "--address") for a in argv):   # named, or implied by --address
        return list(argv)
    from lab.executors import has_ray

    if (cpus or os.cpu_count() or 1) < 2 or not has_ray():
        return list(argv)
    return [*argv, "--executor", "ray"]


def config_from_args(args):
    """A RunConfig from parsed arguments: every field of the config has an argument of its name."""
    from dataclasses import fields

    from .run import RunConfig

    given = {f.name: getattr(args, f.name) for f in fields(RunConfig) if hasattr(args, f.name)}
    given["datasets"] = tuple(args.dataset)
    given["routings"] = tuple(args.routings)
    given["l1"] = args.l1[0]
    return RunConfig(**given)


def format_summary(res) -> str:
    from lab.tosca.head import scale_warning

    s = res.summary.copy()
    cols = {"method": "method", "routing": "routing", "avg_inc_acc": "Ā", "last_acc": "A_B", "forgetting": "forget",
            "bwt": "BWT", "routing_accuracy_last": "route_acc"}
    s = s[list(cols)].rename(columns=cols)
    t, info = res.info["seconds"], res.info
    scale = info["head_scale_per_task"][-1]
    lines = [f"{' + '.join(res.config.datasets)} B{res.config.init} Inc{res.config.inc} seed {res.config.seed}, "
             f"{res.config.backbone}, {res.config.mode} mode, {info['num_tasks']} tasks",
             s.to_string(index=False, float_format=lambda v: f"{v:.2f}"),
             f"per-batch: batch {info['per_batch_size']}, order {info['per_batch_order']}" if "per-batch" in
             info["routings"] else "",
             f"trainable params: {info['trainable_params_total']:,} in all, per task {info['trainable_params_per_task']}",
             f"head scale σ after the last task: {scale:.3f}" if scale is not None else "",
             scale_warning(scale),
             f"seconds: extraction {t['extraction']:.1f}, training {t['training']:.1f}, evaluation {t['evaluation']:.1f}",
             f"run dir: {res.run_dir}"]
    return "\n".join(l for l in lines if l)
