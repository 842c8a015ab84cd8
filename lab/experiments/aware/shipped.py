"""The shipped AWARe study: every group, several seeds, a learning rate per variant, 95 % intervals.

``lab aware study --out results/aware`` runs it and writes tidy tables plus ``manifest.json``
(the exact command, the sha256 of the ``lab/aware`` and ``lab/experiments/aware`` sources, date,
machine, wall time). Notebook 04 and the README show what it wrote.

The shape (what a distributed executor needs): :func:`plan_tuning` and :func:`plan_tests` return
lists of frozen :class:`Job` s; :func:`run_job` maps one job to one record, a pure function of the
shared, read-only :class:`Env` and the job; the records are cached on disk by the job's
configuration (:func:`job_key`), so a configuration runs once and an interrupted study resumes.

1. **A learning rate per variant.** Every compared variant (method, selection rule, each rho, each
   target set, each calibration set and size) is trained at every rate of its method's grid on the
   tuning seed and scored on *validation* questions (train-split questions no test set contains,
   :func:`lab.experiments.aware.tune.validation_context`). Full fine-tuning keeps the rate with the
   best validation downstream accuracy; every other variant the rate with the best validation H
   (E against full fine-tuning's chosen rate), ties to the smaller rate — the procedure of
   :mod:`lab.experiments.aware.tune`, applied to each variant with the same grid size and budget.
   The choice is cached as JSON keyed by the variant's configuration.
2. **Test runs.** Every variant at its chosen rate, every seed, scored on the fixed test
   questions. A tuning run also answers the test questions (never read by the choice), so the
   tuning seed's test run at the chosen rate is that same run.
3. **The continual sequence, both ways**: the paper's protocol (before each stage, saliency of the
   current model on upstream calibration data only) and this project's extension (upstream plus
   stored training questions of the finished tasks), beside full fine-tuning.
4. **Intervals** (:mod:`lab.experiments.aware.intervals`): a paired bootstrap over test questions
   and seeds for every number and every headline difference.
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from lab.aware.methods import MethodSpec
from lab.experiments.aware.ablate import Variant

TUNE_GRIDS = {"full": (1e-5, 2e-5, 5e-5), "lora": (1e-4, 3e-4, 1e-3), "dora": (1e-4, 3e-4, 1e-3),
              "aware": (1e-4, 3e-4, 1e-3)}
CACHE_VERSION = 1


@dataclass(frozen=True)
class StudyConfig:
    """How big the study is. ``size``: the :data:`lab.experiments.aware.context.SIZES` preset whose
    aligned projector and train pools are reused; the other fields replace the preset's."""

    size: str = "default"
    tiny: bool = False                 # a random 2-layer Llama (tests and smoke renders only)
    task: str = "fashion"
    seeds: tuple[int, ...] = (0, 1, 2)
    tune_seed: int = 0
    steps: int = 24
    batch_size: int = 8
    n_eval: int = 150                  # downstream test questions
    n_easy_eval: int = 150             # easy-VQA test questions
    n_probe: int = 100                 # text-probe questions (all 100)
    n_val: int = 60                    # validation questions per set, for choosing the rates
    grids: tuple[tuple[str, tuple[float, ...]], ...] = tuple(TUNE_GRIDS.items())
    methods: tuple[str, ...] = ("zero-shot", "full", "lora", "dora", "aware")
    rules: tuple[str, ...] = ("activation-balanced", "weight-norm", "random")
    rhos: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7)
    targets: tuple[str, ...] = ("qkv", "qkv+projector+mlp")     # target sets compared with q/k/v + projector
    calib_sizes: tuple[int, ...] = (16,)
    n_calib: int = 200
    continual_steps: int = 16
    n_continual_eval: int = 60
    continual_calib: int = 64
    replicates: int = 2000

    def grid(self, method: str) -> tuple[float, ...]:
        return dict(self.grids).get(method, ())

    def to_size(self):
        from lab.experiments.aware.context import SIZES

        base = SIZES[self.size]
        return replace(base, n_eval=self.n_eval, n_easy_eval=self.n_easy_eval, n_probe=self.n_probe,
                       train=replace(base.train, steps=self.steps, batch_size=self.batch_size),
                       methods=self.methods, rules=self.rules, rhos=self.rhos, calib_sizes=self.calib_sizes,
                       n_calib=self.n_calib, seeds=self.seeds, continual_steps=self.continual_steps,
                       n_continual_eval=self.n_continual_eval, continual_calib=self.continual_calib,
                       continual_methods=("full", "aware"), exact=False)


PRESETS = {
    # sized to finish in about 90 minutes on one shared CPU core (see NOTES)
    "shipped": StudyConfig(steps=12, n_eval=60, n_easy_eval=60, n_probe=40, n_val=24,
                           grids=(("full", (2e-5, 5e-5)), ("lora", (1e-4, 3e-4)), ("dora", (1e-4, 3e-4)),
                                  ("aware", (3e-4, 1e-3))),
                           rules=("weight-norm", "random"), rhos=(0.1, 0.3, 0.5), targets=("qkv+projector+mlp",),
                           calib_sizes=(16,), continual_steps=6, n_continual_eval=24, continual_calib=32),
    "smoke": StudyConfig(size="smoke", tiny=True, seeds=(0, 1), steps=2, batch_size=4, n_eval=16, n_easy_eval=16,
                         n_probe=16, n_val=8, grids=(("full", (1e-5, 1e-3)), ("lora", (1e-4, 1e-3)), ("dora", (1e-4, 1e-3)),
                                                     ("aware", (1e-4, 1e-3))),
                         rhos=(0.0, 0.1, 0.3, 0.5), calib_sizes=(4,), n_calib=8, continual_steps=1, n_continual_eval=8,
                         continual_calib=8, replicates=200),
}


NOTES = {
    "shipped": ("Reduced from the default preset so that every group with 3 seeds and a tuned rate per variant "
                "finishes in about 90 minutes on one CPU core shared with other jobs (measured there: ~6.5 s per "
                "alignment step of 16): 12 training steps of 8 (default 24); two candidate rates per method (full "
                "2e-5/5e-5, LoRA/DoRA 1e-4/3e-4, AWARe variants 3e-4/1e-3; lab aware tune's default grids have "
                "three or four); rho 0.1/0.3/0.5 (default also 0, 0.7, 0.9); rules weight-norm and random "
                "(activation-balanced omitted); targets q/k/v+projector+MLP (q/k/v alone omitted); one smaller "
                "calibration size (16); test sets of 60 downstream, 60 easy-VQA and 40 probe questions; 24 + 24 "
                "validation questions; continual sequence 6 steps per stage, 24 test questions per task, 32 "
                "upstream calibration samples per stage."),
    "smoke": "A random tiny 2-layer model: checks the code path, its numbers mean nothing.",
}


@dataclass(frozen=True)
class Job:
    """One fine-tuning run: a variant at one learning rate and seed, answering ``sets``."""

    variant: Variant
    lr: float | None
    seed: int
    sets: tuple[str, ...] = ("val", "test")


@dataclass(frozen=True)
class Env:
    """Everything built once, read-only afterwards: the test context, its validation twin, the base
    model's answers, and the saliency of every calibration set."""

    ctx: object
    val: object                        # None: no validation questions (a job may not ask for "val")
    task: str
    base_answers: Mapping[str, list]
    saliency: Mapping
    fingerprint: str


# ---------------------------------------------------------------- variants and jobs
LR_FIELD = {"full": "lr", "lora": "lr_adapter", "dora": "lr_adapter", "aware": "lr_aware"}


def variants(cfg: StudyConfig) -> list[Variant]:
    """Every compared variant of the study (the list :func:`lab.experiments.aware.ablate.variants` sweeps)."""
    from lab.experiments.aware.ablate import variants as sweep_variants

    return [v for v in sweep_variants(cfg.to_size()) if v.group != "targets" or v.label in cfg.targets]


def variant_id(v: Variant) -> str:
    return f"{v.group}/{v.label}"


def _canon(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def job_key(fingerprint: str, job: Job) -> str:
    """The cache key of a job: the context's fingerprint and the job's whole configuration (the
    variant's group/label are names only and do not enter)."""
    v = job.variant
    seed = 0 if v.spec.method == "zero-shot" else job.seed     # nothing trains: every seed is the same run
    payload = {"v": CACHE_VERSION, "ctx": fingerprint, "spec": asdict(v.spec), "calib": v.calib, "calib_n": v.calib_n,
               "train": asdict(v.train) if v.train else None, "lr": job.lr, "seed": seed, "sets": sorted(job.sets)}
    return hashlib.sha256(_canon(payload).encode()).hexdigest()[:24]


def fingerprint(cfg: StudyConfig, device: str) -> str:
    """What every run of a context shares: the size (data, eval sets, recipe), the task, the model and
    the code that computes a run (:func:`source_hashes`' ``sha256``), so that a run cached by other
    code is never reused."""
    fields = {k: v for k, v in asdict(cfg).items() if k not in ("seeds", "replicates", "tune_seed")}
    return hashlib.sha256(_canon({"size": asdict(cfg.to_size()), "cfg": fields, "device": device,
                                  "code": source_hashes()["sha256"]}).encode()).hexdigest()[:16]


def plan_tuning(cfg: StudyConfig) -> list[Job]:
    """Every variant at every rate of its method's grid, on the tuning seed (full fine-tuning first)."""
    vs = [v for v in variants(cfg) if cfg.grid(v.spec.method)]
    vs.sort(key=lambda v: v.spec.method != "full")
    return [Job(v, lr, cfg.tune_seed, ("val", "test")) for v in vs for lr in cfg.grid(v.spec.method)]


def plan_tests(cfg: StudyConfig, chosen: Mapping[str, float | None]) -> list[Job]:
    """Every variant at its chosen rate on every seed (the tuning seed's run is the tuning run itself)."""
    out = []
    for seed in cfg.seeds:
        for v in variants(cfg):
            lr = chosen.get(variant_id(v))
            sets = ("val", "test") if seed == cfg.tune_seed and lr is not None else ("test",)
            out.append(Job(v, lr, seed, sets))
    return out


# ---------------------------------------------------------------- the environment
def build_env(cfg: StudyConfig, *, cache_dir=None, device: str | None = None, progress: bool = True) -> Env:
    import torch

    from lab.experiments.aware.ablate import profile_calibrations, tasks_for
    from lab.experiments.aware.context import setup
    from lab.experiments.aware.finetune import evaluate
    from lab.experiments.aware.tune import validation_context

    size = cfg.to_size()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ctx = setup(size, tiny=cfg.tiny, tasks_needed=tasks_for(None, cfg.task), cache_dir=cache_dir, device=device,
                progress=progress)
    val = validation_context(ctx, cfg.task, cfg.n_val, cache_dir=cache_dir, progress=progress)
    b = ctx.size.eval_batch
    base = {"easy_vqa": evaluate(ctx.base, ctx.easy.test, ctx.enc, batch_size=b)["correct"],
            "probe": evaluate(ctx.base, ctx.probe.test, ctx.enc, batch_size=b)["correct"],
            "down": evaluate(ctx.base, ctx.down[cfg.task].test, ctx.enc, batch_size=b)["correct"],
            "val:easy_vqa": evaluate(ctx.base, val.easy.test, ctx.enc, batch_size=b)["correct"],
            "val:down": evaluate(ctx.base, val.down[cfg.task].test, ctx.enc, batch_size=b)["correct"]}
    sal = profile_calibrations(ctx, variants(cfg), progress=progress)
    return Env(ctx, val, cfg.task, base, sal, fingerprint(cfg, device))


def run_job(env: Env, job: Job, *, progress: bool = False) -> dict:
    """Train one job's variant from a fresh copy of the base and answer its question sets; a pure
    function of (env, job): the record holds every answer (0/1 per question) and the run's cost."""
    from lab.aware.methods import finish, prepare
    from lab.experiments.aware.finetune import evaluate, train

    ctx, v = env.ctx, job.variant
    task = env.task
    method = v.spec.method
    base_cfg = v.train or ctx.size.train
    over = {LR_FIELD[method]: job.lr} if job.lr is not None and method in LR_FIELD else {}
    cfg = replace(base_cfg, seed=job.seed, **over)
    spec = v.spec if v.spec.aware.rule != "random" else replace(v.spec, aware=replace(v.spec.aware, seed=job.seed))
    t0 = time.perf_counter()
    model = copy.deepcopy(ctx.base)
    model, groups, info = prepare(model, spec, cfg, saliency=env.saliency.get(v.calib_key(ctx.size)))
    log = train(model, groups, ctx.down[task].train, ctx.enc, cfg, progress=progress, desc=variant_id(v))
    train_s = time.perf_counter() - t0
    model = finish(model, method)
    b = ctx.size.eval_batch
    answers = {}
    if method == "zero-shot":
        answers = {k: list(a) for k, a in env.base_answers.items()
                   if k.startswith("val:") == False or "val" in job.sets}  # noqa: E712
    else:
        if "val" in job.sets:
            answers["val:easy_vqa"] = evaluate(model, env.val.easy.test, ctx.enc, batch_size=b)["correct"]
            answers["val:down"] = evaluate(model, env.val.down[task].test, ctx.enc, batch_size=b)["correct"]
        if "test" in job.sets:
            answers["easy_vqa"] = evaluate(model, ctx.easy.test, ctx.enc, batch_size=b)["correct"]
            answers["probe"] = evaluate(model, ctx.probe.test, ctx.enc, batch_size=b)["correct"]
            answers["down"] = evaluate(model, ctx.down[task].test, ctx.enc, batch_size=b)["correct"]
    return {"variant": variant_id(v), "method": method, "lr": job.lr, "seed": job.seed,
            "answers": {k: [int(x) for x in a] for k, a in answers.items()},
            "trainable": int(info["trainable"]), "total": int(info["total"]), "lora_rank": int(info.get("lora_rank", 0)),
            "steps": len(log["losses"]), "final_loss": float(np.mean(log["losses"][-4:])) if log["losses"] else float("nan"),
            "train_s": train_s, "seconds": time.perf_counter() - t0}


def cached(env: Env, job: Job, cache_root: Path, *, progress: bool = False) -> dict:
    """:func:`run_job` through the on-disk cache (atomic JSON keyed by :func:`job_key`)."""
    from lab._io import read_json, write_json

    path = cache_root / "runs" / f"{job_key(env.fingerprint, job)}.json"
    if path.exists():
        rec = read_json(path)
        return {**rec, "seed": job.seed, "variant": variant_id(job.variant), "cached": True}
    rec = run_job(env, job, progress=progress)
    write_json(path, rec)
    return {**rec, "cached": False}


# ---------------------------------------------------------------- choosing the rates
def _acc(a) -> float:
    return float(np.mean(a)) if len(a) else float("nan")


def choose_rates(env: Env, records: list[dict], cfg: StudyConfig) -> tuple[dict, list[dict]]:
    """``({variant id: lr}, candidate rows)`` from tuning records, by the module's procedure."""
    from lab.aware import metrics as M

    before = _acc(env.base_answers["val:easy_vqa"])
    rows = []
    for r in records:
        rows.append({"variant": r["variant"], "method": r["method"], "lr": r["lr"], "seed": r["seed"],
                     "val_downstream": _acc(r["answers"]["val:down"]),
                     "val_R": M.retention(before, _acc(r["answers"]["val:easy_vqa"]))})
    full_rows = [r for r in rows if r["method"] == "full"]
    if not full_rows:
        raise ValueError("tuning needs full fine-tuning: E of every other variant is relative to it")
    pick = lambda rs, k: max(rs, key=lambda r: (np.nan_to_num(r[k], nan=-1.0), -r["lr"]))  # noqa: E731
    full_best = pick(full_rows, "val_downstream")
    for r in rows:
        r["val_E"] = M.efficiency(r["val_downstream"], full_best["val_downstream"])
        r["val_H"] = M.h_score(r["val_R"], r["val_E"])
    chosen = {}
    for vid in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == vid]
        chosen[vid] = pick(mine, "val_downstream" if mine[0]["method"] == "full" else "val_H")["lr"]
    for r in rows:
        r["chosen"] = chosen[r["variant"]] == r["lr"]
    return chosen, rows


def lr_cache_path(cache_root: Path, env: Env, cfg: StudyConfig, v: Variant) -> Path:
    payload = {"ctx": env.fingerprint, "spec": asdict(v.spec), "calib": v.calib, "calib_n": v.calib_n,
               "grid": cfg.grid(v.spec.method), "full_grid": cfg.grid("full"), "tune_seed": cfg.tune_seed,
               "n_val": cfg.n_val}
    return cache_root / "lr" / f"{hashlib.sha256(_canon(payload).encode()).hexdigest()[:24]}.json"


# ---------------------------------------------------------------- the continual sequence
CONTINUAL = (("full", "full", False), ("aware (paper: upstream saliency)", "aware", False),
             ("aware + replay saliency (extension)", "aware", True))


def run_continual(env: Env, cfg: StudyConfig, chosen: Mapping[str, float], *, cache_root: Path | None = None,
                  progress: bool = False, log=None) -> list[dict]:
    """Rows ``{label, method, replay, seed, stage, stage_task, task, acc, correct}`` for every
    protocol of :data:`CONTINUAL` and seed, at full fine-tuning's and main AWARe's chosen rates."""
    from lab.experiments.aware.context import MAIN
    from lab.experiments.aware.continual import ORDER, run_sequence

    from lab._io import read_json, write_json

    rows = []
    lrs = {"full": chosen.get("methods/full"), "aware": chosen.get("methods/aware")}
    for seed in cfg.seeds:
        for label, method, replay in CONTINUAL:
            train = env.ctx.size.train
            if lrs.get(method) is not None:
                train = replace(train, **{LR_FIELD[method]: lrs[method]})
            key = hashlib.sha256(_canon({"v": CACHE_VERSION, "ctx": env.fingerprint, "method": method, "replay": replay,
                                         "seed": seed, "train": asdict(train), "order": ORDER,
                                         "main": MAIN.to_dict()}).encode()).hexdigest()[:24]
            path = (cache_root / "continual" / f"{key}.json") if cache_root else None
            hit = path is not None and path.exists()
            if hit:
                seq = read_json(path)
            else:
                t0 = time.perf_counter()
                ctx = replace(env.ctx, size=replace(env.ctx.size, train=train))
                seq = {"rows": run_sequence(ctx, method, seed, order=ORDER, aware=MAIN, replay=replay, progress=progress),
                       "seconds": time.perf_counter() - t0}
                if path is not None:
                    write_json(path, seq)
            if log:
                log(f"continual {label:<38} seed {seed} ({seq['seconds']:.0f}s{', cached' if hit else ''})")
            rows += [{"label": label, "replay": replay, "seconds": seq["seconds"], **r} for r in seq["rows"]]
    return rows


# ---------------------------------------------------------------- tables with intervals
def _set_sizes(answers: pd.DataFrame) -> dict:  # noqa: F821
    return answers.groupby("set").question.max().add(1).astype(int).to_dict()


def answers_table(records: list[dict], base_answers: Mapping[str, list]):
    """Tidy ``variant, seed, set, question, correct`` (``variant='base'``: the model before fine-tuning)."""
    import pandas as pd

    parts = []
    for r in [{"variant": "base", "seed": -1, "answers": base_answers}, *records]:
        for s, a in r["answers"].items():
            if s.startswith("val:"):
                continue
            parts.append(pd.DataFrame({"variant": r["variant"], "seed": int(r["seed"]), "set": s,
                                       "question": np.arange(len(a)), "correct": np.asarray(a, np.int8)}))
    return pd.concat(parts, ignore_index=True)


def variant_metrics(answers, seeds, *, replicates: int = 2000, rng_seed: int = 0) -> tuple[dict, object]:
    """``{variant: {metric: [B+1] array}}`` for downstream, easy-VQA, probe, R, E, H (paired draws)."""
    from lab.experiments.aware import intervals as I

    sizes = {s: n for s, n in _set_sizes(answers).items() if not s.startswith("cont:")}
    d = I.draw(seeds, sizes, replicates=replicates, rng_seed=rng_seed)
    vec = {(v, int(s), st): g.sort_values("question").correct.to_numpy()
           for (v, s, st), g in answers[~answers.set.str.startswith("cont:")].groupby(["variant", "seed", "set"])}
    base = {st: I.accuracy(d, st, vec[("base", -1, st)]) for st in ("easy_vqa", "probe", "down")}
    per = {}
    for v in sorted({k[0] for k in vec if k[0] != "base"}):
        per[v] = {}
        for seed in seeds:
            acc = {st: I.accuracy(d, st, vec[(v, seed, st)]) for st in ("easy_vqa", "probe", "down")}
            r = (I.retention(base["easy_vqa"], acc["easy_vqa"]) + I.retention(base["probe"], acc["probe"])) / 2
            per[v][seed] = {"downstream": acc["down"], "up_easy_vqa": acc["easy_vqa"], "up_probe": acc["probe"], "R": r}
    for v in per:
        for seed in seeds:
            full = per["methods/full"][seed]["downstream"]
            with np.errstate(divide="ignore", invalid="ignore"):
                e = np.where(full > 0, 100 * per[v][seed]["downstream"] / full, np.nan)
            per[v][seed]["E"] = e
            per[v][seed]["H"] = I.h_score(per[v][seed]["R"], e)
    out = {v: {m: I.over_seeds(d, {s: per[v][s][m] for s in seeds}) for m in per[v][seeds[0]]} for v in per}
    return out, d


HEADLINE = (  # (name, a, b, metrics)
    ("AWARe vs full fine-tuning", "methods/aware", "methods/full", ("R", "H", "downstream")),
    ("AWARe vs LoRA", "methods/aware", "methods/lora", ("R", "E", "H")),
    ("AWARe vs DoRA", "methods/aware", "methods/dora", ("R", "E", "H")),
    ("activation vs weight-norm", "methods/aware", "rule/weight-norm", ("R", "E", "H")),
    ("activation vs random", "methods/aware", "rule/random", ("R", "E", "H")),
    ("weight-norm vs random", "rule/weight-norm", "rule/random", ("R", "E", "H")),
    ("global vs balanced", "methods/aware", "rule/activation-balanced", ("R", "E", "H")),
    ("rho 0.3 vs 0.1", "methods/aware", "rho/rho=0.1", ("R", "E", "H")),
    ("rho 0.3 vs 0.5", "methods/aware", "rho/rho=0.5", ("R", "E", "H")),
    ("q/k/v+projector vs +MLP", "methods/aware", "targets/qkv+projector+mlp", ("R", "E", "H")),
    ("q/k/v+projector vs q/k/v", "methods/aware", "targets/qkv", ("R", "E", "H")),
    ("upstream vs proxy calibration", "methods/aware", "calibration/proxy", ("R", "E", "H")),
)


def summary_table(metrics: Mapping, runs, cfg: StudyConfig):
    """One row per (variant, metric): estimate and 95 % interval, with the variant's chosen rate."""
    import pandas as pd

    from lab.experiments.aware import intervals as I

    info = runs.groupby("variant", sort=False).agg(group=("group", "first"), label=("label", "first"),
                                                    method=("method", "first"), lr=("lr", "first"),
                                                    trainable_frac=("trainable_frac", "mean"), seeds=("seed", "nunique"))
    rows = []
    for v, ms in metrics.items():
        for m, arr in ms.items():
            rows.append({"variant": v, **info.loc[v].to_dict(), "metric": m, **I.summarise(arr)})
    order = {v: i for i, v in enumerate(info.index)}
    return pd.DataFrame(rows).sort_values(["variant"], key=lambda s: s.map(order), kind="stable").reset_index(drop=True)


def comparisons_table(metrics: Mapping):
    import pandas as pd

    from lab.experiments.aware import intervals as I

    rows = []
    for name, a, b, ms in HEADLINE:
        if a not in metrics or b not in metrics:
            continue
        for m in ms:
            s = I.summarise(metrics[a][m] - metrics[b][m])
            rows.append({"comparison": name, "a": a, "b": b, "metric": m, **s,
                         "detected": not I.spans_zero(s["lo"], s["hi"]),
                         "verdict": I.verdict(a.split("/")[-1], b.split("/")[-1], s, m)})
    return pd.DataFrame(rows)


def continual_tables(cont_rows: list[dict], base_answers: Mapping, seeds, *, replicates: int = 2000, rng_seed: int = 1):
    """Per protocol: Avg, Last, BWT and R after the sequence with intervals, plus paired differences
    (each AWARe protocol minus full fine-tuning, replay minus paper) — :mod:`lab.metrics` on every replicate."""
    import pandas as pd

    from lab import metrics as LM
    from lab.experiments.aware import intervals as I

    df = pd.DataFrame(cont_rows)
    tasks = [t for t in dict.fromkeys(df.task) if not t.startswith("upstream:")]
    n_stages = int(df.stage.max()) + 1
    sizes = {f"cont:{t}": len(df[df.task == t].correct.iloc[0]) for t in tasks}
    sizes.update({k: len(base_answers[k]) for k in ("easy_vqa", "probe")})
    d = I.draw(seeds, sizes, replicates=replicates, rng_seed=rng_seed)
    base = {k: I.accuracy(d, k, base_answers[k]) for k in ("easy_vqa", "probe")}
    out = {}
    for label in dict.fromkeys(df.label):
        per = {}
        for seed in seeds:
            mine = df[(df.label == label) & (df.seed == seed)]
            acc = {(int(r.stage), r.task): I.accuracy(d, f"cont:{r.task}" if not r.task.startswith("upstream:")
                                                     else r.task.split(":", 1)[1], r.correct)
                   for r in mine.itertuples()}
            avg, last, bwt = (np.empty(d.replicates + 1) for _ in range(3))
            for b in range(d.replicates + 1):
                m = LM.from_stage_rows([[acc[(i, tasks[j])][b] for j in range(i + 1)] for i in range(n_stages)])
                a_b = LM.stage_averages(m)
                avg[b], last[b], bwt[b] = LM.average_incremental_accuracy(a_b), LM.last_accuracy(a_b), LM.backward_transfer(m)
            r_after = (I.retention(base["easy_vqa"], acc[(n_stages - 1, "upstream:easy_vqa")])
                       + I.retention(base["probe"], acc[(n_stages - 1, "upstream:probe")])) / 2
            per[seed] = {"Avg": avg, "Last": last, "BWT": bwt, "R_after": r_after}
        out[label] = {m: I.over_seeds(d, {s: per[s][m] for s in seeds}) for m in ("Avg", "Last", "BWT", "R_after")}
    rows = [{"protocol": lab_, "metric": m, **I.summarise(arr)} for lab_, ms in out.items() for m, arr in ms.items()]
    labels = list(out)
    pairs = [(labels[1], labels[0]), (labels[2], labels[0]), (labels[2], labels[1])] if len(labels) == 3 else []
    diffs = []
    for a, b in pairs:
        for m in ("Avg", "Last", "BWT", "R_after"):
            s = I.summarise(out[a][m] - out[b][m])
            scale = 100 if m in ("Avg", "Last", "BWT") else 1
            diffs.append({"a": a, "b": b, "metric": m, **s, "detected": not I.spans_zero(s["lo"], s["hi"]),
                          "verdict": I.verdict(a, b, {k: v * scale for k, v in s.items()}, m,
                                               " pts" if scale == 100 else "")})
    return pd.DataFrame(rows), pd.DataFrame(diffs)


# ---------------------------------------------------------------- provenance
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


# ---------------------------------------------------------------- the whole study
def run_study(cfg: StudyConfig, out: str | Path, *, command: str = "", cache_dir=None, device: str | None = None,
              progress: bool = True, log=print) -> dict:
    """Tune, test, run the continual sequence, compute intervals; write everything into ``out``
    atomically (a sibling temporary folder renamed into place). Returns the tables."""
    import datetime
    import os
    import shutil
    import tempfile

    import pandas as pd

    from lab._cache import cache_root as _root
    from lab._io import write_json

    t_start = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    sources = source_hashes()
    out = Path(out)
    env = build_env(cfg, cache_dir=cache_dir, device=device, progress=progress)
    root = _root(cache_dir) / "aware" / "study" / env.fingerprint
    timings = {"setup_s": time.perf_counter() - t_start}

    def go(jobs, what):
        recs = []
        for i, j in enumerate(jobs):
            t = time.perf_counter()
            r = cached(env, j, root, progress=False)
            recs.append(r)
            if progress:
                el = time.perf_counter() - t_start
                log(f"[{el / 60:5.1f} min] {what} {i + 1}/{len(jobs)} {r['variant']:<32} lr {j.lr!s:<7} seed {j.seed} "
                    f"{'(cached)' if r['cached'] else f'{time.perf_counter() - t:.0f}s'}")
        return recs

    t0 = time.perf_counter()
    tune_recs = go(plan_tuning(cfg), "tune")
    chosen, tuning_rows = choose_rates(env, tune_recs, cfg)
    for v in variants(cfg):
        if variant_id(v) in chosen:
            from lab._io import write_json as _w

            _w(lr_cache_path(root, env, cfg, v), {"variant": variant_id(v), "lr": chosen[variant_id(v)],
                                                  "candidates": [r for r in tuning_rows if r["variant"] == variant_id(v)]})
    timings["tuning_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    test_recs = go(plan_tests(cfg, chosen), "test")
    timings["tests_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cont = run_continual(env, cfg, chosen, cache_root=root, progress=False, log=log if progress else None)
    timings["continual_s"] = time.perf_counter() - t0

    # tables
    from lab.aware import metrics as M

    vinfo = {variant_id(v): v for v in variants(cfg)}
    base_acc = {k: _acc(a) for k, a in env.base_answers.items()}
    run_rows = []
    full_down = {r["seed"]: _acc(r["answers"]["down"]) for r in test_recs if r["variant"] == "methods/full"}
    for r in test_recs:
        v = vinfo[r["variant"]]
        a = {k: _acc(x) for k, x in r["answers"].items()}
        R = M.mean_retention({k: base_acc[k] for k in ("easy_vqa", "probe")}, {k: a[k] for k in ("easy_vqa", "probe")})
        E = M.efficiency(a["down"], full_down[r["seed"]])
        aw = v.spec.method == "aware"
        run_rows.append({"variant": r["variant"], "group": v.group, "label": v.label, "method": v.spec.method,
                         "rho": v.spec.aware.rho if aw else np.nan, "rule": v.spec.aware.rule if aw else "",
                         "targets": v.spec.aware.targets if v.spec.method not in ("full", "zero-shot") else "all",
                         "calib": v.calib if aw else "", "calib_n": (v.calib_n or cfg.n_calib) if aw else 0,
                         "seed": r["seed"], "lr": r["lr"], "downstream": a["down"], "up_easy_vqa": a["easy_vqa"],
                         "up_probe": a["probe"], "R": R, "E": E, "H": M.h_score(R, E),
                         "trainable_frac": r["trainable"] / r["total"], "lora_rank": r["lora_rank"],
                         "steps": r["steps"], "final_loss": r["final_loss"], "train_s": r["train_s"]})
    runs = pd.DataFrame(run_rows)
    answers = answers_table(test_recs, env.base_answers)
    metrics, _ = variant_metrics(answers, list(cfg.seeds), replicates=cfg.replicates)
    summary = summary_table(metrics, runs, cfg)
    comps = comparisons_table(metrics)
    cont_df = pd.DataFrame([{k: v for k, v in r.items() if k not in ("correct", "seconds")} for r in cont])
    cont_summary, cont_comps = continual_tables(cont, env.base_answers, list(cfg.seeds), replicates=cfg.replicates)
    ctx = env.ctx
    before = pd.DataFrame([
        {"skill": "easy_vqa", "acc": base_acc["easy_vqa"], "reference": "majority answer",
         "reference_acc": ctx.easy.test.majority_rate(), "n": len(ctx.easy.test)},
        {"skill": "probe", "acc": base_acc["probe"], "reference": "chance (4 options)",
         "reference_acc": ctx.probe.test.chance_rate(), "n": len(ctx.probe.test)},
        {"skill": f"downstream:{cfg.task}", "acc": base_acc["down"], "reference": "most common answer",
         "reference_acc": ctx.down[cfg.task].test.majority_rate(), "n": len(ctx.down[cfg.task].test)}])
    tables = {"runs": runs, "summary": summary, "comparisons": comps, "tuning": pd.DataFrame(tuning_rows),
              "continual": cont_df, "continual_summary": cont_summary, "continual_comparisons": cont_comps,
              "upstream_before": before}
    timings["total_s"] = time.perf_counter() - t_start
    seq_s = {(r["label"], r["seed"]): r["seconds"] for r in cont}
    timings["compute_s"] = (sum(r["seconds"] for r in tune_recs)
                            + sum(r["seconds"] for r in test_recs if not (r["cached"] and r["seed"] == cfg.tune_seed))
                            + sum(seq_s.values()))   # every run's own time, cached ones included
    manifest = {
        "command": command, "config": asdict(cfg), "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": timings["total_s"], "timings": timings, "machine": machine(), "sources": sources,
        "intervals": __import__("lab.experiments.aware.intervals", fromlist=["KIND"]).KIND,
        "tuning": ("per variant: every rate of its method's grid on seed %d, scored on %d validation questions per "
                   "set; full fine-tuning by validation downstream accuracy, every other variant by validation H"
                   % (cfg.tune_seed, cfg.n_val)),
        "sizes": {"steps": cfg.steps, "batch_size": cfg.batch_size, "n_eval": cfg.n_eval,
                  "n_easy_eval": cfg.n_easy_eval, "n_probe": cfg.n_probe, "n_val": cfg.n_val,
                  "continual_steps": cfg.continual_steps, "n_continual_eval": cfg.n_continual_eval},
        "note": next((v for k, v in NOTES.items() if PRESETS.get(k) == cfg), "a custom configuration"),
        "chosen_lr": chosen, "tables": sorted(f"{k}.csv" for k in tables), "cache": str(root),
    }
    # atomic: write a sibling temporary folder, then swap it into place
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, df in tables.items():
            df.to_csv(tmp / f"{name}.csv", index=False)
        answers.to_parquet(tmp / "answers.parquet", index=False)
        from lab.experiments.aware.study import Study

        Study.from_context(env.ctx, env.saliency).save(tmp)   # saliency + row norms: notebook 04's mask panel
        manifest["tables"] += sorted(p.name for p in tmp.glob("*.safetensors"))
        manifest["tables"].append("answers.parquet")
        write_json(tmp / "manifest.json", manifest)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**tables, "answers": answers, "manifest": manifest, "out": out}
