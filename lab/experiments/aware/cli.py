"""``lab aware profile | finetune | tune | ablate | study`` (registered into ``lab``'s CLI; imports are lazy).

Every handler checks all its parameters first (:func:`check_common` and its own checks: numbers,
target patterns against the mini-LLaVA's module names, output paths), before any model is loaded.
"""
from __future__ import annotations

_GROUPS = ("methods", "rule", "rho", "targets", "calibration", "calib_size", "continual")


def register(subparsers) -> None:
    from lab import tracking
    from lab._names import AWARE_METHODS, AWARE_RULES, AWARE_SIZES, AWARE_TASKS   # static: no torch for --help

    p = subparsers.add_parser("aware", help="AWARe on the mini-LLaVA: profile saliency, fine-tune, run ablations",
                              description="AWARe (activation-weighted adaptive retention) on the offline "
                                          "mini-LLaVA (efficientnet_lite0 + projector + SmolLM2-135M).")
    sub = p.add_subparsers(dest="aware_command", metavar="ACTION")

    def common(q):
        q.add_argument("--size", default="default", choices=AWARE_SIZES,
                       help="data/steps preset (smoke: seconds-scale check; default: ~22 min per seed on 2 idle CPU cores)")
        q.add_argument("--cache-dir", default=None, help="cache root (default $LAB_CACHE_DIR or ~/.cache/continual-lab)")
        q.add_argument("--quiet", action="store_true", help="no progress bars")
        q.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
        q.add_argument("--steps", type=int, default=None, help="training steps per run (default: the preset's)")
        q.add_argument("--lr", type=float, default=None, help="language-model lr of full fine-tuning (default 2e-5)")
        q.add_argument("--lr-aware", type=float, default=None,
                       help="AWARe's language-model lr (default 3e-4, chosen by `lab aware tune`; "
                            "the reference uses the same lr as full fine-tuning: pass --lr-aware 2e-5)")
        q.add_argument("--lr-projector", type=float, default=None, help="projector lr (default 1e-3)")
        q.add_argument("--lr-adapter", type=float, default=None, help="LoRA/DoRA lr (default 1e-4, chosen by `lab aware tune`)")
        q.add_argument("--model", default=None, metavar="NAME",
                       help="a transformers LLaVA instead of the mini-LLaVA: hub id (e.g. llava-hf/llava-1.5-7b-hf; "
                            "needs internet or the hub cache) or a local folder")
        q.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"],
                       help="weights while training and scoring (--model: default bf16 on CUDA, fp32 on the CPU; "
                            "the mini-LLaVA: default fp32, its projector aligned in fp32 either way; "
                            "docs/aware.md, 'Precision', has bf16's measured cost in accuracy)")
        q.add_argument("--batch-size", type=int, default=None,
                       help="training questions per step (default: the preset's; the shipped study: 16)")
        q.add_argument("--n-eval", type=int, default=None,
                       help="downstream test questions (default: the preset's; the shipped study: 400)")
        q.add_argument("--n-easy-eval", type=int, default=None,
                       help="easy-VQA test questions, upstream retention (default: the preset's; the shipped study: 600)")
        q.add_argument("--n-probe", type=int, default=None,
                       help="text-probe questions, upstream retention (default: the preset's; at most 320, the shipped study's)")

    q = sub.add_parser("profile", help="saliency of every target neuron on a calibration set (safetensors)")
    common(q)
    q.add_argument("--calib", default="upstream", choices=["upstream", "proxy"], help="calibration set")
    q.add_argument("--n", type=int, default=200, help="calibration samples (default 200)")
    q.add_argument("--targets", default="qkv+projector",
                   help="preset (qkv, qkv+projector, qkv+projector+mlp) or comma-separated name patterns")
    q.add_argument("--out", default=None, help="output .safetensors (default: a new run directory)")
    q.set_defaults(func=cmd_profile)

    q = sub.add_parser("finetune", help="fine-tune one method on one downstream task; print upstream retention",
                       epilog="The --size default budget (24 steps x 8) is a quick look; the shipped study's budget, "
                              "in which full fine-tuning learns the task and forgets, is --steps 64 --batch-size 16 "
                              "with each method's rate chosen on validation questions (results/aware/README.md, "
                              "'Learning-rate candidates'), e.g. lab aware finetune --method full --steps 64 --batch-size 16 --lr 8e-6")
    common(q)
    q.add_argument("--method", default="aware", choices=AWARE_METHODS)
    q.add_argument("--task", default="fashion", choices=AWARE_TASKS)
    q.add_argument("--rho", type=float, default=0.3, help="retention ratio in [0, 1] (AWARe)")
    q.add_argument("--rule", default="activation-global", choices=AWARE_RULES)
    q.add_argument("--targets", default="qkv+projector")
    q.add_argument("--calib", default="upstream", choices=["upstream", "proxy"])
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--save", default=None, help="save the fine-tuned (merged, standard) model to this folder "
                                                "(a new or empty one; see --replace)")
    q.add_argument("--replace", action="store_true",
                   help="let --save replace a folder that is not empty (as a whole, once the new checkpoint is "
                        "written; never the input --model)")
    tracking.add_argument(q)
    q.set_defaults(func=cmd_finetune)

    q = sub.add_parser("ablate", help="run the sweep (methods, rule, rho, targets, calibration, continual); print the table")
    common(q)
    q.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default: the size preset's)")
    q.add_argument("--groups", nargs="+", default=None, choices=_GROUPS,
                   help="only these groups (full fine-tuning and main AWARe always run: E needs them)")
    q.add_argument("--rules", nargs="+", default=None, metavar="NAME",
                   help="the selection rules the rule group compares with activation-global (built-in or a "
                        "plugin's: `lab plugins`; default: the preset's, activation-balanced weight-norm random); "
                        "implies the rule group")
    q.add_argument("--task", default="fashion", choices=AWARE_TASKS)
    q.add_argument("--run-dir", default=None, help="output folder (default: a new unique runs/aware/... folder)")
    executor_args(q)
    tracking.add_argument(q)
    q.set_defaults(func=cmd_ablate)
    q = sub.add_parser("tune", help="choose each method's learning rate on held-out validation questions; print the flags",
                       description="Fine-tune full / LoRA / AWARe at each candidate lr on the sweep's train pool and score "
                                   "on validation questions (train-split questions the sweep never tests on). Full "
                                   "fine-tuning: best validation downstream accuracy; the others: best validation H.")
    common(q)
    q.add_argument("--task", default="fashion", choices=AWARE_TASKS)
    q.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds; validation scores are averaged (default 0)")
    q.add_argument("--n-val", type=int, default=100, help="validation questions per set (default 100)")
    q.add_argument("--grid", nargs="+", default=None, metavar="METHOD=LR,LR",
                   help="candidate lrs, e.g. full=1e-5,2e-5 aware=1e-4,3e-4 (default: each method's grid in the methods registry, lab.aware.methods)")
    q.add_argument("--run-dir", default=None, help="output folder (default: a new unique runs/aware/... folder)")
    executor_args(q)
    q.set_defaults(func=cmd_tune)
    q = sub.add_parser("study", help="the shipped study: every method's learning-rate front on 5 test seeds, the "
                                     "ablations at their best rates, 95%% t-intervals paired by seed",
                       description="Run every method's learning-rate front (each scale of its base recipe on every "
                                   "test seed), choose each ablation variant's best scales on tuning seeds that are "
                                   "never test seeds and run those on the test seeds, run the continual sequence "
                                   "(paper protocol and the replay extension), and write tidy tables with 95 % "
                                   "t-intervals over seeds (paired by seed for differences) plus manifest.json into "
                                   "--out. Every finished run is written at once to OUT/runs/<key>.json and skipped "
                                   "when the study is started again, so an interrupted study resumes where it stopped.")
    q.add_argument("--out", default=None,
                   help="study folder (default: results/aware for --preset shipped, which resumes the shipped "
                        "study; a new runs/aware/study-... folder for any other preset)")
    q.add_argument("--preset", default="shipped", choices=["shipped", "smoke"],
                   help="study size (shipped: the committed study; smoke: a random tiny model, seconds)")
    q.add_argument("--replace", action="store_true",
                   help="allow writing tables over a study in --out that was made with another preset")
    q.add_argument("--add-rules", nargs="+", default=None, metavar="NAME",
                   help="more selection rules for the rule group, beside the preset's (a plugin's, say: `lab "
                        "plugins`); a study with them is another study, so it needs its own --out")
    q.add_argument("--status", action="store_true", help="print which runs are finished and which are missing; run nothing")
    q.add_argument("--tables-only", action="store_true",
                   help="write the tables from the finished runs (the phases that are complete); run nothing")
    q.add_argument("--cache-dir", default=None, help="cache root (default $LAB_CACHE_DIR or ~/.cache/continual-lab)")
    q.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    executor_args(q, kept="OUT/runs/ and skipped when the study is started again", unit="run")
    q.add_argument("--workers", type=int, default=None,
                   help="CPUs of the local Ray instance, one run each (with --executor ray; default: all cores)")
    tracking.add_argument(q)
    q.set_defaults(func=cmd_study)
    q = sub.add_parser("check", help="re-run one finished run of a study and compare its answers with the stored ones",
                       description="Does this code, on this machine, still give a study's answers? Re-runs one "
                                   "finished run (default: the first finished full fine-tuning run; 2-6 min on "
                                   "one core at the shipped size) and compares every answer with the stored run's; "
                                   "with --steps N only its first N training steps, compared loss by loss with "
                                   "the stored run's.")
    q.add_argument("--out", default="results/aware", help="the study folder (default results/aware)")
    q.add_argument("--preset", default="shipped", choices=["shipped", "smoke"], help="the study's preset")
    q.add_argument("--run", default=None, metavar="KEY", help="the run to re-run: its file name in OUT/runs without .json")
    q.add_argument("--steps", type=int, default=None, metavar="N",
                   help="re-run only the first N training steps and compare their losses (seconds, not minutes)")
    q.add_argument("--cache-dir", default=None, help="cache root (default $LAB_CACHE_DIR or ~/.cache/continual-lab)")
    q.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    q.set_defaults(func=cmd_check)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def executor_args(q, kept: str = "RUN_DIR/variants/ and skipped when rerun with --run-dir",
                  unit: str = "variant") -> None:
    """``--executor`` / ``--address`` of a sweep (:func:`lab.executors.add_arguments`)."""
    from lab import executors

    executors.add_arguments(q, kept, unit)


STEPS_MAX = 1_000_000      # --steps (the shipped study: 64 per run)
SAMPLES_MAX = 1_000_000    # --n, --n-val (calibration / validation questions)
PROBE_MAX = 320            # the packaged text probe's questions (lab/experiments/aware/run/tasks.py)


def check_common(args, *, cheap_only: bool = False) -> None:
    """The options every `lab aware` action shares (one line naming the first bad one);
    ``cheap_only``: only those that need no torch (the caller runs :func:`check_model_args` later)."""
    import os

    from lab import _validate as V
    from lab._validate import check_cache_dir

    action = getattr(args, "aware_command", None)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and action != "finetune":   # as distributed.launched()
        raise V.BadInput(f"$WORLD_SIZE {os.environ['WORLD_SIZE']}: one of several launched processes; only "
                         f"`lab aware finetune` runs under accelerate launch (sweeps: --executor ray)")
    if action == "finetune" and int(os.environ.get("WORLD_SIZE", "1")) > 1:   # launched: its environment first
        from lab.experiments.aware.run.distributed import launch_env

        launch_env()
    check_cache_dir(args.cache_dir)
    V.device("--device", args.device)
    if args.steps is not None:
        V.count("--steps", args.steps, maximum=STEPS_MAX)
    for flag in ("lr", "lr_aware", "lr_projector", "lr_adapter"):
        if getattr(args, flag) is not None:
            V.learning_rate("--" + flag.replace("_", "-"), getattr(args, flag))   # the same check as TrainConfig's
    for flag in ("batch_size", "n_eval", "n_easy_eval", "n_probe"):
        if getattr(args, flag, None) is not None:
            V.count("--" + flag.replace("_", "-"), getattr(args, flag), maximum=SAMPLES_MAX)
    if getattr(args, "n_probe", None) is not None and args.n_probe > PROBE_MAX:
        raise V.bad("--n-probe", args.n_probe, f"the text probe has {PROBE_MAX} questions: give 1..{PROBE_MAX}")
    if not cheap_only:
        check_model_args(args)


def check_model_args(args) -> None:
    """The checks of :func:`check_common` that import torch: the size preset with its overrides
    (TrainConfig) and the --model id (one short HEAD request for a hub id)."""
    _size(args)
    _check_set_sizes(args)
    if args.model is not None:
        from lab.experiments.aware.run.hub_llava import check

        check(args.model)


def _check_set_sizes(args) -> None:
    """--n-eval / --n-easy-eval against the test questions that exist (never cut silently)."""
    from lab import _validate as V

    if getattr(args, "n_easy_eval", None) is not None:
        import easy_vqa

        most = len(easy_vqa.get_test_questions()[0])
        if args.n_easy_eval > most:
            raise V.bad("--n-easy-eval", args.n_easy_eval, f"easy-VQA has {most} test questions: give 1..{most}")
    if getattr(args, "n_eval", None) is not None:
        from lab.data import dataset_info
        from lab.experiments.aware.run.tasks import TEMPLATES

        tasks = [args.task] if getattr(args, "task", None) else list(TEMPLATES)
        for t in tasks:
            most = dataset_info(TEMPLATES[t][0])["test"]
            if args.n_eval > most:
                raise V.bad("--n-eval", args.n_eval, f"the {t} task has {most} test images: give 1..{most}")


def _run_dir_check(args) -> None:
    from lab import _validate as V
    from lab import runs

    if args.run_dir is not None:      # '' is refused, not read as "the default"
        V.out_dir("--run-dir", args.run_dir)
    else:
        runs.check_root("aware", param="$LAB_RUNS_DIR")


def _threads():
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    import transformers

    transformers.logging.set_verbosity_error()


def _check_n_val(args, size) -> None:
    """--n-val against the questions that can serve as validation, before any model loads: the task's
    train images the training pool leaves, and easy-VQA train questions about images no alignment
    question shows (otherwise the set would be cut to the pool, silently, after minutes of set-up)."""
    import easy_vqa

    from lab import _validate as V
    from lab.data import dataset_info
    from lab.experiments.aware.run.tasks import TEMPLATES, unseen_image_index

    down = dataset_info(TEMPLATES[args.task][0])["train"] - size.n_train
    easy = len(unseen_image_index(easy_vqa.get_train_questions()[2], size.n_align, 10**9, seed=0))
    most = min(down, easy)
    if args.n_val > most:
        raise V.bad("--n-val", args.n_val, f"at most {most} validation questions exist at --size {args.size} "
                                           f"({down} {args.task} train images outside the training pool, "
                                           f"{easy} easy-VQA questions about unseen images)")


def _size(args):
    """The preset with any training overrides from the command line (validated by TrainConfig)."""
    from dataclasses import replace

    from lab.experiments.aware.run.context import SIZES

    size = SIZES[args.size]
    keys = ("steps", "lr", "lr_aware", "lr_projector", "lr_adapter", "batch_size")
    over = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    sets = {k: getattr(args, k) for k in ("n_eval", "n_easy_eval", "n_probe") if getattr(args, k, None) is not None}
    if getattr(args, "rules", None):      # `lab aware ablate --rules` (checked by _check_rules)
        sets["rules"] = tuple(args.rules)
    return replace(size, train=replace(size.train, **over), **sets) if over or sets else size


REFERENCE_RULE = "activation-global"      # lab.experiments.aware.run.context.MAIN.rule (no torch here)


def _check_rules(args, flag: str = "--rules", already: tuple[str, ...] = ()) -> None:
    """``--rules`` (or ``--add-rules``): registered AWARe rules (built-in or a plugin's), each once, not
    the reference rule nor one of ``already``; one line listing the valid names otherwise. Needs no
    torch unless a rule plugin is installed."""
    from lab import _validate as V
    from lab._names import AWARE_RULES

    rules = getattr(args, flag[2:].replace("-", "_"), None)
    if not rules:
        return
    for r in rules:
        if r == REFERENCE_RULE:
            raise V.bad(flag, r, "is the reference the rule group compares every rule with (main AWARe, "
                                 "always run); list the others")
        if r in already:
            raise V.bad(flag, r, f"is in the study already (its rules: {', '.join(already)}); list the others")
        if r not in AWARE_RULES:
            valid = [n for n in AWARE_RULES.names() if n != REFERENCE_RULE]
            raise V.bad(flag, r, f"unknown AWARe rule; valid rules: {', '.join(valid)}")
    _no_duplicates(flag, rules)


def _ablate_groups(args) -> tuple[str, ...] | None:
    """The groups `lab aware ablate` runs: --groups (None: all), with the rule group when --rules is given."""
    groups = tuple(args.groups) if args.groups else None
    if getattr(args, "rules", None) and groups is not None and "rule" not in groups:
        groups += ("rule",)
    return groups


def _ctx(args):
    from lab.experiments.aware.run.context import setup

    size = _size(args)          # bad overrides fail here, before any model is loaded
    _threads()
    return setup(size, progress=not args.quiet, cache_dir=args.cache_dir, device=args.device, model=args.model,
                 dtype=args.dtype)


def cmd_profile(args) -> int:
    from dataclasses import replace

    from lab import runs
    from lab.experiments.aware.run import tasks
    from lab import _validate as V
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.ablate import _save_saliency
    from lab.experiments.aware.run.checks import check_targets
    from lab.experiments.aware.run.context import setup
    from lab.experiments.aware.run.profiling import calibration_batches

    check_common(args)              # everything before any model is loaded
    pool = _size(args).n_align      # upstream calibration draws from the alignment questions
    if args.calib == "upstream" and args.n > pool:
        raise V.bad("--n", args.n, f"the {args.size} preset has {pool} upstream (easy-VQA train) questions to "
                                   f"calibrate on: give 1..{pool}, or --calib proxy")
    V.count("--n", args.n, maximum=SAMPLES_MAX)
    if args.out is not None:          # '' is refused, not read as "the default"
        V.out_file("--out", args.out)
    else:
        runs.check_root("aware", param="$LAB_RUNS_DIR")
    check_targets(args.targets, model=args.model)     # last: it builds the model's skeleton (a few seconds)
    size = replace(_size(args), n_calib=args.n, calib_sizes=())
    _threads()
    ctx = setup(size, progress=not args.quiet, cache_dir=args.cache_dir, device=args.device, model=args.model,
                dtype=args.dtype)
    qa = ctx.calib[(args.calib, args.n)] if (args.calib, args.n) in ctx.calib else \
        tasks.calibration(args.calib, args.n, upstream=ctx.easy)
    sal = profile(ctx.base, calibration_batches(qa, ctx.enc), targets=args.targets, progress=not args.quiet)
    out_dir = runs.new_run_dir("aware", f"profile-{args.calib}-{args.n}") if not args.out else None
    if args.out:
        from lab._io import save_tensors

        save_tensors(args.out, {"matrix": sal.matrix(), **{f"layer/{k}": v for k, v in sal.scores.items()}})
        where = args.out
    else:
        _save_saliency(out_dir, (args.calib, args.n), sal)
        where = out_dir
    top = sorted(((float(v.max()), k) for k, v in sal.scores.items()), reverse=True)[:5]
    print(f"profiled {len(sal.scores)} layers on {sal.n_samples} samples in {sal.seconds:.1f}s "
          f"({sal.seconds / max(sal.n_samples, 1) * 1000:.0f} ms/sample) -> {where}")
    for v, k in top:
        print(f"  max saliency {v:.4f}  {k}")
    return 0


def cmd_finetune(args) -> int:
    import math

    from lab import _validate as V

    check_common(args, cheap_only=True)     # the checks that need no torch first: a typo answers at once
    if not (isinstance(args.rho, (int, float)) and math.isfinite(args.rho) and 0 <= args.rho <= 1):
        raise V.bad("--rho", args.rho, "must be a number in [0, 1]")    # as lab.aware.masking.check_rho
    V.seed("--seed", args.seed)
    if args.save is not None:     # "" is refused, not read as "do not save"
        from pathlib import Path

        V.out_dir("--save", args.save)
        dst = Path(args.save).expanduser().resolve()
        if args.model:       # never the input checkpoint, --replace or not
            src = Path(args.model).expanduser().resolve()
            if src.exists() and (dst == src or src in dst.parents or dst in src.parents):
                raise V.bad("--save", args.save, f"is (or holds, or is inside) the input checkpoint --model "
                                                 f"{args.model}: saving there would overwrite it; give another folder")
        if dst.is_dir() and any(dst.iterdir()) and not args.replace:
            raise V.bad("--save", args.save, "is a folder that is not empty; give a new or empty folder, or "
                                             "--replace to replace it as a whole")
    elif args.replace:
        raise V.BadInput("--replace: applies to --save, which is not given")
    from lab.aware.config import AwareConfig
    from lab.aware.methods import MethodSpec, reference_method, uses_saliency
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.ablate import Variant, run_variant
    from lab.experiments.aware.run.checks import check_targets
    from lab.experiments.aware.run.context import MAIN, upstream
    from lab.experiments.aware.run.profiling import calibration_batches

    check_model_args(args)
    check_targets(args.targets, model=args.model)     # last: it builds the model's skeleton (a few seconds)
    aware = AwareConfig(rho=args.rho, rule=args.rule, targets=args.targets)   # validates before work
    from lab import tracking
    from lab.experiments.aware.study import tracked
    from lab.experiments.aware.run.finetune import train

    track = tracking.start(args.track, "lab aware finetune")    # mlflow imports, its store opens
    from contextlib import nullcontext

    from lab.experiments.aware.run import distributed

    dist = distributed.session(args.device)     # None in one process; under `accelerate launch`: DDP, rank 0 writes
    if dist:
        args.device = str(dist.device)
    with dist.main_first() if dist else nullcontext():
        ctx = _ctx(args)
    before = upstream(ctx.base, ctx, exact=False)
    v = Variant("cli", args.method, MethodSpec(args.method, aware if args.method != reference_method() else MAIN), calib=args.calib)
    sal = None
    if uses_saliency(v.spec):
        qa = ctx.calib[v.calib_key(ctx.size)]
        if dist:    # every rank profiles its share of the batches (at least one each)
            sal = dist.profile(ctx.base, calibration_batches(qa, ctx.enc, batch_size=dist.shard_batch_size(len(qa))),
                               targets=aware.targets, progress=not args.quiet)
        else:
            sal = profile(ctx.base, calibration_batches(qa, ctx.enc), targets=aware.targets, progress=not args.quiet)
    row, info = run_variant(ctx, v, args.task, args.seed, before=before, saliency=sal, progress=not args.quiet,
                            keep_model=bool(args.save), trainer=track.watch(dist.train if dist else train))
    if dist and not dist.is_main:
        return 0
    if dist:
        print(dist.summary())
    print(f"{args.method} on {args.task}: downstream acc {row['downstream']:.3f}; upstream easy-VQA "
          f"{before['easy_vqa']:.3f} -> {row['up_easy_vqa']:.3f}, probe {before['probe']:.3f} -> "
          f"{row['up_probe']:.3f}; R {row['R']:.1f}; trainable {row['trainable_frac'] * 100:.1f}%; "
          f"{row['step_s']:.2f} s/step")
    if args.save is not None:     # "" is refused, not read as "do not save"
        from lab._io import replace_dir

        def write(tmp):
            info["model"].save_pretrained(tmp)
            if getattr(ctx.enc, "processor", None) is not None:    # a transformers LLaVA: loadable as it was
                ctx.enc.processor.save_pretrained(tmp)

        replace_dir(args.save, write)     # written beside it, then swapped in: never half a checkpoint
        print(f"saved a standard checkpoint to {args.save}")
    tracking.log_run(track, None, lambda: tracked.finetune(args, ctx.size, row, before, track.steps))
    return 0


def cmd_ablate(args) -> int:
    from lab import _validate as V
    from lab import executors

    _check_rules(args)          # before the checks that import torch: a typo answers at once
    check_common(args)
    from lab.experiments.aware.run.ablate import summary, sweep

    for s in args.seeds or ():
        V.seed("--seeds", s)
    _no_duplicates("--seeds", args.seeds or ())
    _run_dir_check(args)
    executors.check_arguments(args)
    from lab import tracking
    from lab.experiments.aware.study import tracked

    track = tracking.start(args.track, "lab aware ablate")    # mlflow imports, its store opens
    ctx = _ctx(args)            # its Size carries --rules
    out = sweep(ctx, seeds=tuple(args.seeds) if args.seeds else None,
                groups=_ablate_groups(args), task=args.task,
                run_dir=args.run_dir, progress=not args.quiet, executor=args.executor, address=args.address)
    import pandas as pd

    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.precision", 3):
        print("\nupstream skills before fine-tuning:")
        print(out["upstream_before"].to_string(index=False))
        print("\nR, E, H (mean over seeds):")
        print(summary(out["results"]).to_string(index=False))
        if len(out["continual_summary"]):
            print("\ncontinual sequence:")
            print(out["continual_summary"].to_string(index=False))
        if len(out["mask_composition"]):
            mc = out["mask_composition"]
            print("\nfrozen fraction by layer kind (seed 0):")
            print(mc.pivot_table(index=["group", "variant"], columns="kind", values="frozen_frac", sort=False).to_string())
        if len(out["overlap"]):
            print("\nmask overlap (rho=0.3, q/k/v+projector):")
            print(out["overlap"].to_string(index=False))
    print(f"\nwall time {out['timings']['total_s']:.0f}s; tables in {out['run_dir']}")
    tracking.log_run(track, out["run_dir"], lambda: tracked.ablate(out))
    return 0


def _no_duplicates(param: str, values) -> None:
    """A list option given the same value twice is a mistake (it would run one configuration twice
    and count it as two): one line naming it, before any work."""
    from lab import _validate as V

    seen = [v for i, v in enumerate(values) if v in list(values)[:i]]
    if seen:
        raise V.bad(param, " ".join(map(str, values)), f"lists {seen[0]} twice; give each value once")


def _grids(specs) -> dict | None:
    """``["full=1e-5,2e-5", "aware=3e-4"]`` -> ``{"full": (1e-5, 2e-5), "aware": (3e-4,)}``."""
    if not specs:
        return None
    out = {}
    for spec in specs:
        method, sep, values = spec.partition("=")
        try:
            out[method] = tuple(float(v) for v in values.split(",") if v)
        except ValueError:
            raise ValueError(f"--grid {spec!r}: learning rates must be numbers, e.g. aware=1e-4,3e-4") from None
        if not sep:
            raise ValueError(f"--grid {spec!r}: write METHOD=LR,LR, e.g. aware=1e-4,3e-4")
    return out


def cmd_tune(args) -> int:
    from lab import _validate as V
    from lab import executors
    from lab.experiments.aware.run.context import setup
    from lab.experiments.aware.run.tune import check_grids, default_grids, flags, tune

    check_common(args)
    grids = check_grids(_grids(args.grid) or default_grids())     # bad grids fail here, before any model is loaded
    V.count("--n-val", args.n_val, maximum=SAMPLES_MAX)
    for s in args.seeds:
        V.seed("--seeds", s)
    _no_duplicates("--seeds", args.seeds)
    for m, lrs in grids.items():
        _no_duplicates(f"--grid {m}", lrs)
    _run_dir_check(args)
    executors.check_arguments(args)
    size = _size(args)
    _check_n_val(args, size)
    _threads()
    ctx = setup(size, progress=not args.quiet, cache_dir=args.cache_dir, device=args.device, tasks_needed=(args.task,),
                model=args.model, dtype=args.dtype)
    out = tune(ctx, task=args.task, grids=grids, seeds=tuple(args.seeds), n_val=args.n_val, run_dir=args.run_dir,
               cache_dir=args.cache_dir, progress=not args.quiet, executor=args.executor, address=args.address)
    import pandas as pd

    with pd.option_context("display.width", 160, "display.precision", 3):
        print(f"\nvalidation easy-VQA before fine-tuning: {out['before']['easy_vqa']:.3f}")
        print(out["table"].to_string(index=False))
    print(f"\nchosen: {flags(out['chosen'])}\ntables in {out['run_dir']}")
    return 0


def interrupted_study(argv: list[str], out: str) -> str:
    """What a stopped ``lab aware study`` prints: where its finished runs are and the command that
    resumes it (the same options on the same folder, without ``--replace``, which would start over)."""
    import shlex

    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--out", "--replace"):
            skip = a == "--out"
        elif not a.startswith("--out="):
            keep.append(a)
    return (f"lab aware study: interrupted; finished runs are kept in {out}/runs/ and skipped: resume with: "
            f"{shlex.join(['lab', *keep, '--out', str(out)])}")


def cmd_study(args) -> int:
    import shlex
    import sys

    from lab import _validate as V
    from lab._validate import check_cache_dir
    from lab.experiments.aware.study.plan import PRESETS

    check_cache_dir(args.cache_dir)
    V.device("--device", args.device)
    from lab import executors

    executors.check_arguments(args)
    if args.workers is not None:
        V.count("--workers", args.workers, maximum=1024)
    cfg = PRESETS[args.preset]
    if args.add_rules:
        _check_rules(args, "--add-rules", cfg.rules)
        from dataclasses import replace

        cfg = replace(cfg, rules=(*cfg.rules, *args.add_rules))
    if args.out is None:
        if args.preset == "shipped" and not args.add_rules:
            out = "results/aware"
        else:
            from lab import runs

            out = str(runs.new_run_dir("aware", f"study-{args.preset}"))
    else:
        out = args.out
    V.out_dir("--out", out)
    _refuse_other_study(out, cfg, args.replace)
    from lab import tracking
    from lab.experiments.aware.study import tracked

    track = tracking.start(args.track, "lab aware study")    # mlflow imports, its store opens
    _threads()
    from lab import runs
    from lab.experiments.aware.study.shipped import run_study

    args.interrupted = lambda args, argv: interrupted_study(argv, out)   # the line Ctrl-C / SIGTERM prints
    with runs.terminated_as_interrupted():
        res = run_study(cfg, out, command="lab " + shlex.join(sys.argv[1:]), cache_dir=args.cache_dir,
                        device=args.device, progress=not args.quiet, executor=args.executor, address=args.address,
                        workers=args.workers, status_only=args.status, tables_only=args.tables_only)
    if res.get("status") is not None:
        print(res["status"])
        return 0
    f = res.get("findings")
    if f is not None and len(f):
        print("\nverdicts (R at matched downstream accuracy, paired by seed, 95 % t-interval):")
        for r in f.to_dict("records"):
            import math

            from lab.experiments.aware.study.tables import RETENTION_READ

            d = "" if not r["seeds"] else f"{r['diff']:+.1f} pts (one seed), " if math.isnan(r["lo"]) else \
                f"{r['diff']:+.1f} [{r['lo']:+.1f}, {r['hi']:+.1f}] pts, "
            other = "" if r["read"] == RETENTION_READ else f" [{r['read']}]"
            print(f"  {r['finding']} ({r['b'].split('/')[-1]}){other}: {d}{r['verdict']}")
    m = res["manifest"]
    regen = (m.get("regenerations") or [{}])[-1] if args.tables_only else {}
    print(f"\nwall time {regen.get('wall_s', m['wall_s']):.0f}s; tables and manifest.json in {res['out']}")
    tracking.log_run(track, res["out"], lambda: tracked.study(res, args.preset))
    return 0


def _refuse_other_study(out, cfg, replace: bool) -> None:
    """A study folder made with another configuration (the shipped study, say) is never written over
    by accident: one line, before any work; ``--replace`` allows it."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    from lab import _validate as V
    from lab._io import read_json

    f = Path(out) / "manifest.json"
    if replace or not f.exists():
        return
    try:
        then = read_json(f).get("config")
    except Exception:
        then = None
    # extra seeds for the headline variants only add runs (each run is keyed by what changes it):
    # the same study, planned further
    def same_study(c):
        return {k: v for k, v in c.items() if k not in ("headline", "headline_seeds")} if isinstance(c, dict) else c

    if same_study(then) != same_study(json.loads(json.dumps(asdict(cfg)))):
        raise V.bad("--out", str(out), "holds a study made with another configuration; give another --out, "
                                       "or --replace to write over its tables")


def _refuse_preset_mismatch(out, preset: str) -> None:
    """``lab aware check`` on a study made with another preset would re-run a job that study never
    planned (and load a model it never used): one line, before any work."""
    import json
    from dataclasses import asdict

    from lab import _validate as V
    from lab._io import read_json
    from lab.experiments.aware.study.plan import PRESETS

    f = out / "manifest.json"
    if not f.is_file():
        return
    try:
        then = read_json(f).get("config")
    except Exception:
        return
    if isinstance(then, dict) and then != json.loads(json.dumps(asdict(PRESETS[preset]))):
        others = [k for k, c in PRESETS.items() if json.loads(json.dumps(asdict(c))) == then]
        raise V.bad("--preset", preset, f"is not the preset {out} was made with"
                    + (f" (it was made with --preset {others[0]})" if others else " (a custom configuration)"))


def _stored_threads(out, key: str | None) -> None:
    """Use the torch thread count the checked run was recorded with from the start, before the shared
    model and its frozen parts (the vision tower's tokens, cached) are computed: a float sum split over
    another number of threads rounds differently in its last bits, and under bf16 training that moves
    the first step's loss. ``key`` None: the study's runs, when they all used one count (the
    manifest's ``runs.machines``)."""
    import re

    import torch

    from lab._io import read_json

    try:
        if key:
            machines = [read_json(out / "runs" / f"{key}.json").get("machine", "")]
        else:
            machines = (read_json(out / "manifest.json").get("runs") or {}).get("machines") or []
    except Exception:   # an unknown run or an unreadable manifest: the check itself says so
        return
    counts = {int(m.group(1)) for m in (re.search(r"(\d+) torch threads", str(s)) for s in machines) if m}
    if len(counts) == 1:
        torch.set_num_threads(counts.pop())


def cmd_check(args) -> int:
    from pathlib import Path

    from lab import _validate as V
    from lab._validate import check_cache_dir
    from lab.experiments.aware.study.plan import PRESETS

    check_cache_dir(args.cache_dir)
    V.device("--device", args.device)
    if args.steps is not None:
        V.count("--steps", args.steps, maximum=100000)
    out = Path(args.out)
    if not (out / "runs").is_dir():
        raise V.bad("--out", args.out, "holds no study runs (no runs/ folder); run `lab aware study` first")
    _refuse_preset_mismatch(out, args.preset)
    _threads()
    _stored_threads(out, args.run)
    from lab.experiments.aware.study import runner
    from lab.experiments.aware.views.study import seed_caches

    seed_caches(out, args.cache_dir)
    env = runner.build_env(PRESETS[args.preset], cache_dir=args.cache_dir, device=args.device,
                           progress=not args.quiet, store=out / "saliency")
    try:
        res = runner.check(env, out, args.run, steps=args.steps, log=None if args.quiet else print)
    except ValueError as e:
        raise V.bad("--run", args.run or "(default)", str(e)) from None
    if args.steps:
        for r in res["rows"]:
            same = "same" if r["stored loss"] == r["live loss"] else "DIFFERS"
            print(f"  step {r['step']:>3}: stored loss {r['stored loss']:.6f}, live {r['live loss']:.6f}  {same}")
        print(f"{res['key']}: the first {len(res['rows'])} steps' losses are "
              + ("identical" if res["same"] else "NOT identical") + f" ({res['seconds']:.0f} s)")
        return 0 if res["same"] else 1
    for r in res["rows"]:
        print(f"  {r['set']:<14} {r['same']}/{r['questions']} answers the same  (stored acc {r['stored acc']:.3f}, "
              f"live {r['live acc']:.3f})")
    if res["same"]:
        print(f"{res['key']}: the same answers on every question ({res['seconds']:.0f} s)")
        return 0
    print(f"{res['key']}: ANSWERS DIFFER — stored by code {str(res['stored_code'])[:12]} on {res['stored_machine']}; "
          f"this code {res['code'][:12]}")
    return 1
