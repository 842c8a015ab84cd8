"""The AWARe study's plan: how big it is (:class:`StudyConfig`), which variants it compares, and the
runs (:class:`Job`) that compute them — data only, nothing is trained here.

The pipeline flows one way: config -> plan (this module) -> runs (:mod:`.runner`, each stored as
``<study>/runs/<key>.json`` the moment it finishes) -> tables (:mod:`.shipped`) -> views
(notebook 04, the README section). A run's key is a hash of everything that changes its numbers —
the data and evaluation sets (:func:`data_fingerprint`), the variant's method spec and calibration
set, the training recipe with its learning rate and seed, the question sets it answers — plus
:data:`STUDY_VERSION`, bumped whenever the code that computes a run changes its numbers. Adding a
variant, a seed or a grid point therefore never invalidates a finished run, and a study resumed on
another day (or by the next person) runs only what is missing.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
from dataclasses import asdict, dataclass, replace

from lab.aware.config import AwareConfig
from lab.aware.methods import (METHODS, MethodSpec, get_method, lr_field, main_method, method_variant,  # noqa: F401
                               reference_method)
from lab.experiments.aware.run.ablate import Variant

# Bump when a change of the run code changes a finished run's numbers (scoring, training loop, data).
# 2: options shuffled per question, ties and non-finite scores wrong, LoRA/DoRA seeded, 320-item probe.
# 3: learning-rate fronts (the projector's rate scales with the method's), bf16, tuning seeds apart.
STUDY_VERSION = 3
MAIN = AwareConfig(rho=0.3, rule="activation-global", targets="qkv+projector")


@dataclass(frozen=True)
class StudyConfig:
    """How big the study is. ``size``: the :data:`lab.experiments.aware.run.context.SIZES` preset whose
    aligned projector and train pool are reused; the other fields replace the preset's.

    Every trained variant runs on a learning-rate *front*: its method's base recipe (``Method.rate``
    for the language model or adapter, ``projector_rate`` for the projector, which every method
    trains) multiplied by each of ``scales``. The methods group runs every scale on every test seed
    (``seeds``); an ablation variant runs every scale on the tuning seeds (``tune_seeds``, never test
    seeds, answering validation questions only), then its ``keep`` best scales by validation H on the
    first ``ablation_seeds`` test seeds (answering test questions only)."""

    size: str = "default"
    tiny: bool = False                 # a random 2-layer Llama (tests and smoke renders only)
    task: str = "fashion"
    precision: str = "bf16"            # bf16 autocast training, bf16 scoring (lab.experiments.aware.run.finetune)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)   # test seeds: the methods group's fronts
    ablation_seeds: int = 3            # every other group: the first this many of ``seeds``
    tune_seeds: tuple[int, ...] = (100,)   # tuning seeds: rate choices only, never a test seed
    scales: tuple[float, ...] = (1 / 27, 1 / 9, 1 / 3, 1.0, 3.0)   # the front: multiples of the base recipe
    keep: int = 3                      # an ablation variant's best scales (on the tuning seeds) it is tested at
    projector_rate: float = 1e-3       # the projector's rate at scale 1 (every method trains it)
    steps: int = 64
    batch_size: int = 16
    n_eval: int = 400                  # downstream test questions
    n_easy_eval: int = 600             # easy-VQA test questions
    n_probe: int = 320                 # text-probe questions (all 320)
    n_val: int = 400                   # validation questions per set, for choosing the rates
    rates: tuple[tuple[str, float], ...] = ()   # (method, base rate) beside the registry's Method.rate
    methods: tuple[str, ...] = tuple(METHODS.builtin_names())   # every built-in method, in registration order
    rho0_in_methods: bool = True       # q/k/v + projector trained with nothing frozen (rho = 0)
    rules: tuple[str, ...] = ("activation-balanced", "weight-norm", "random")
    rhos: tuple[float, ...] = (0.0, 0.1, 0.5, 0.7, 0.9)
    targets: tuple[str, ...] = ("qkv", "qkv+projector+mlp")     # compared with q/k/v + projector
    proxy: bool = True                 # the proxy calibration set (vs upstream)
    calib_sizes: tuple[int, ...] = (8, 16, 64)
    n_calib: int = 200
    continual: bool = True
    continual_steps: int = 64
    n_continual_eval: int = 200
    continual_calib: int = 64
    # bf16 checked against float32: these methods at these scales re-run in float32 on the first
    # ``ablation_seeds`` test seeds, paired with their bf16 front runs
    precision_check: tuple[tuple[str, tuple[float, ...]], ...] = (("aware", (1 / 3, 1.0)), ("full", (1.0,)))

    def __post_init__(self):
        clash = set(self.tune_seeds) & set(self.seeds)
        if clash:
            raise ValueError(f"tuning seeds {sorted(clash)} are also test seeds: a rate chosen on a test seed "
                             "flatters it; give tune_seeds of their own")
        if not self.tune_seeds or not self.seeds:
            raise ValueError("a study needs test seeds and tuning seeds")
        if any(s <= 0 for s in self.scales) or len(set(self.scales)) != len(self.scales):
            raise ValueError("scales are distinct positive multiples of each method's base rate")
        if not 1 <= self.keep <= len(self.scales):
            raise ValueError(f"keep is between 1 and the number of scales ({len(self.scales)})")
        from lab.experiments.aware.run.finetune import PRECISIONS

        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose from {list(PRECISIONS)}")

    def base_rate(self, method: str) -> float | None:
        """``method``'s rate at scale 1: ``rates``' entry, else the registry's ``Method.rate``, else the
        geometric middle of its ``Method.grid`` (a method registered without a base rate)."""
        own = dict(self.rates)
        if method in own:
            return float(own[method])
        m = get_method(method)
        if m.rate is None and m.grid:
            return float(f"{float(np.exp(np.mean(np.log(m.grid)))):.3g}")
        return m.rate

    def rate(self, method: str, scale: float | None) -> float | None:
        """The language-model (or adapter) rate of ``method`` at ``scale`` (None: nothing trains)."""
        if scale is None or not lr_field(method):
            return None
        return float(f"{self.base_rate(method) * scale:.4g}")

    def seeds_for(self, group: str) -> tuple[int, ...]:
        """The test seeds a variant of ``group`` runs on."""
        return tuple(self.seeds) if group == "methods" else tuple(self.seeds[: self.ablation_seeds])

    def to_size(self):
        from lab.experiments.aware.run.context import SIZES

        base = SIZES[self.size]
        return replace(base, n_eval=self.n_eval, n_easy_eval=self.n_easy_eval, n_probe=self.n_probe,
                       train=replace(base.train, steps=self.steps, batch_size=self.batch_size,
                                     precision=self.precision),
                       methods=self.methods, rules=self.rules, calib_sizes=self.calib_sizes,
                       n_calib=self.n_calib, seeds=self.seeds, continual_steps=self.continual_steps,
                       n_continual_eval=self.n_continual_eval, continual_calib=self.continual_calib,
                       continual_methods=(reference_method(), main_method()), exact=False)


PRESETS = {
    # 5 scales x 5 test seeds for each method's front; every ablation variant's 3 best scales (of the 5,
    # on tuning seed 100) on 3 test seeds. The scales span the front: at 1/27 the projector moves at
    # 3.7e-5 (the task is barely learned), at 3 full fine-tuning's language model at 3e-5 (the old
    # study's grid: 2e-5 with the projector at 1e-3 already forgot easy-VQA to near zero).
    "shipped": StudyConfig(),
    "smoke": StudyConfig(size="smoke", tiny=True, seeds=(0, 1), ablation_seeds=2, tune_seeds=(100,),
                         scales=(0.1, 1.0), keep=1, steps=2, batch_size=4, n_eval=16, n_easy_eval=16, n_probe=16,
                         n_val=8, rhos=(0.0, 0.5), targets=("qkv",), calib_sizes=(4,), n_calib=8,
                         continual_steps=1, n_continual_eval=8, continual_calib=8),
}
NOTES = {
    "shipped": ("Every method's learning-rate front: its base recipe (language model or adapter, and the projector "
                "every method trains) scaled by 1/27, 1/9, 1/3, 1 and 3, each on test seeds 0-4; every ablation "
                "variant's 3 best scales, chosen by validation H on tuning seed 100 (400 + 400 validation "
                "questions), on test seeds 0-2. 64 steps x 16 questions per run (1,024 training questions), bf16; "
                "400 downstream, 600 easy-VQA and 320 probe test questions."),
    "smoke": "A random tiny 2-layer model: checks the code path, its numbers mean nothing.",
}
# What a preset may cost: the wall clock of this project's 2-core machine during which its runs
# (tuning included) are going. The manifest states the study's against it (the shipped one: 12 hours).
BUDGETS = {"shipped": 12 * 3600.0}


# ---------------------------------------------------------------- variants
def variants(cfg: StudyConfig) -> list[Variant]:
    """Every compared variant, main AWARe first after the baselines (it is every group's reference)."""
    role = lambda m: get_method(m).role   # noqa: E731
    out = [Variant("methods", m, MethodSpec(m, MAIN)) for m in cfg.methods if role(m) != "method"]
    if not any(role(v.spec.method) == "reference" for v in out):
        ref = reference_method()
        out.insert(0, Variant("methods", ref, MethodSpec(ref, MAIN)))   # E is relative to it
    out += [Variant("methods", m, MethodSpec(m, MAIN)) for m in cfg.methods if role(m) == "method"]
    main = main_method()   # AWARe: what every ablation group varies
    if not any(v.spec.method == main for v in out):
        out.append(Variant("methods", main, MethodSpec(main, MAIN)))   # every group's reference point
    if cfg.rho0_in_methods:
        out.append(Variant("methods", "rho=0", MethodSpec(main, replace(MAIN, rho=0.0))))
    out += [Variant("rule", r, MethodSpec(main, replace(MAIN, rule=r))) for r in cfg.rules]
    out += [Variant("rho", f"rho={r:g}", MethodSpec(main, replace(MAIN, rho=float(r)))) for r in cfg.rhos
            if r != MAIN.rho]
    out += [Variant("targets", t, MethodSpec(main, replace(MAIN, targets=t))) for t in cfg.targets]
    if cfg.proxy:
        out.append(Variant("calibration", "proxy", MethodSpec(main, MAIN), calib="proxy"))
    out += [Variant("calib_size", f"n={n}", MethodSpec(main, MAIN), calib_n=n) for n in cfg.calib_sizes]
    return out


def variant_id(v: Variant) -> str:
    return f"{v.group}/{v.label}"


# ---------------------------------------------------------------- runs
@dataclass(frozen=True)
class Job:
    """One fine-tuning run: a variant at one scale of its base recipe and one seed, answering
    ``sets`` (``("val",)`` on a tuning seed, ``("test",)`` on a test seed). ``scale`` None: nothing
    trains (zero-shot)."""

    variant: Variant
    scale: float | None
    seed: int
    sets: tuple[str, ...] = ("test",)
    precision: str | None = None     # None: the study's; "fp32": the precision check's float32 twin


@dataclass(frozen=True)
class ContinualJob:
    """One continual sequence (fashion -> digits -> even) of one protocol and seed."""

    label: str
    method: str
    replay: bool
    scale: float | None
    seed: int


def _canon(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _hash(obj) -> str:
    return hashlib.sha256(_canon(obj).encode()).hexdigest()[:20]


def data_fingerprint(cfg: StudyConfig, device: str) -> str:
    """What every run of a study shares and what changes its numbers apart from the job itself: the
    data (alignment, training pool, every evaluation set and its size), the model, the device, the
    precision the base model is scored in."""
    from lab.experiments.aware.run.tasks import PROBE_FILE

    s = cfg.to_size()
    data = {"tiny": cfg.tiny, "task": cfg.task, "device": device, "n_align": s.n_align, "align": asdict(s.align),
            "n_train": s.n_train, "grid": s.grid, "n_eval": s.n_eval, "n_easy_eval": s.n_easy_eval,
            "n_probe": s.n_probe, "n_val": cfg.n_val, "n_calib": s.n_calib, "eval_batch": s.eval_batch,
            "precision": cfg.precision, "probe": hashlib.sha256(PROBE_FILE.read_bytes()).hexdigest()}
    return _hash({"v": STUDY_VERSION, "data": data})


def train_config(cfg: StudyConfig, method: str, scale: float | None, seed: int, steps: int | None = None,
                 precision: str | None = None):
    """The training recipe of one run: the study's steps, batch and precision (or ``precision``);
    ``method``'s rate and the projector's, both at ``scale`` times their base."""
    base = cfg.to_size().train
    if precision is not None:
        base = replace(base, precision=precision)
    field = lr_field(method)
    over = {field: cfg.rate(method, scale), "lr_projector": float(f"{cfg.projector_rate * scale:.4g}")} \
        if scale is not None and field else {}
    return replace(base, seed=int(seed), **({"steps": steps} if steps is not None else {}), **over)


def job_key(fp: str, job: Job, cfg: StudyConfig) -> str:
    """A file-name-safe key: the variant's name (for people) and a hash of everything that changes it."""
    v = job.variant
    trains = bool(lr_field(v.spec.method))
    seed = job.seed if trains else 0    # nothing trains: one run for every seed
    payload = {"fp": fp, "spec": asdict(v.spec), "calib": v.calib, "calib_n": v.calib_n or cfg.n_calib,
               "train": asdict(train_config(cfg, v.spec.method, job.scale, seed, precision=job.precision)),
               "sets": sorted(job.sets) if trains else ["test", "val"]}
    slug = "".join(c if c.isalnum() or c in "=.+-" else "_" for c in f"{v.spec.method}-{v.label}")
    return f"{slug}-{_hash(payload)}"


def continual_key(fp: str, job: ContinualJob, cfg: StudyConfig) -> str:
    from lab.experiments.aware.run.continual import ORDER

    payload = {"fp": fp, "continual": asdict(job), "order": ORDER, "main": MAIN.to_dict(),
               "train": asdict(train_config(cfg, job.method, job.scale, job.seed, steps=cfg.continual_steps)),
               "n_eval": cfg.n_continual_eval, "calib": cfg.continual_calib}
    return f"continual-{job.method}{'-replay' if job.replay else ''}-s{job.seed}-{_hash(payload)}"


def trains(v: Variant) -> bool:
    return bool(lr_field(v.spec.method))


def plan_fronts(cfg: StudyConfig) -> list[Job]:
    """The methods group's fronts: every scale on every test seed, seed by seed (an interrupted study
    has whole fronts of its first seeds); zero-shot once."""
    vs = [v for v in variants(cfg) if v.group == "methods"]
    out = [Job(v, None, cfg.seeds[0], ("test", "val")) for v in vs if not trains(v)]
    return out + [Job(v, sc, seed, ("test",)) for seed in cfg.seeds for v in vs if trains(v) for sc in cfg.scales]


def plan_precision(cfg: StudyConfig) -> list[Job]:
    """The float32 twins of some front runs (``precision_check``): bf16 must not move the front."""
    vs = {v.spec.method: v for v in variants(cfg) if v.group == "methods" and v.label == v.spec.method}
    return [Job(vs[m], sc, seed, ("test",), precision="fp32") for seed in cfg.seeds[: cfg.ablation_seeds]
            for m, scales in cfg.precision_check if m in vs for sc in scales if sc in cfg.scales]


# The ablation phases, each tuned then tested before the next: what each of the paper's four findings
# needs first (the rule group; rho = 0.3's neighbours; the MLP target; proxy calibration), then the rest.
PHASES = (("rule",), ("rho/rho=0.1", "rho/rho=0.5", "targets/qkv+projector+mlp", "calibration/proxy"), None)


def in_phase(v: Variant, phase: tuple[str, ...] | None) -> bool:
    """Whether variant ``v`` belongs to ``phase`` (group names or variant ids; None: all)."""
    return phase is None or v.group in phase or variant_id(v) in phase


def plan_tuning(cfg: StudyConfig, groups: tuple[str, ...] | None = None, *, methods: bool = True) -> list[Job]:
    """Validation runs on the tuning seeds: every trained variant (of ``groups``, see :func:`in_phase`)
    at every scale; with ``methods``, the methods group too (full fine-tuning's best validation
    downstream accuracy is every validation E's denominator; each method's operating point)."""
    vs = [v for v in variants(cfg) if trains(v) and (in_phase(v, groups) and v.group != "methods"
                                                     or (methods and v.group == "methods"))]
    return [Job(v, sc, seed, ("val",)) for seed in cfg.tune_seeds for v in vs for sc in cfg.scales]


def plan_tests(cfg: StudyConfig, kept: dict, groups: tuple[str, ...] | None = None) -> list[Job]:
    """Every ablation variant (of ``groups``) at its kept scales (``kept[variant id]``, chosen on the
    tuning seeds) on each of its test seeds. Variants whose runs are the methods group's (the same
    spec: ``rho/rho=0`` is ``methods/rho=0``) reuse those by key."""
    out = []
    for v in variants(cfg):
        if v.group == "methods" or not in_phase(v, groups) or variant_id(v) not in kept:
            continue
        out += [Job(v, sc, seed, ("test",)) for seed in cfg.seeds_for(v.group) for sc in kept[variant_id(v)]]
    return out


# (label, method, replay saliency): full fine-tuning, AWARe as the paper runs it, AWARe re-profiled on replay
CONTINUAL = ((reference_method(), reference_method(), False),
             (f"{main_method()} (paper: upstream saliency)", main_method(), False),
             (f"{main_method()} + replay saliency (extension)", main_method(), True))


def plan_continual(cfg: StudyConfig, points: dict) -> list[ContinualJob]:
    """The continual sequences at each method's operating point (``points[variant id]``: a scale
    chosen on the tuning seeds) on the ablation test seeds."""
    sc = {"full": points.get("methods/full"), "aware": points.get("methods/aware")}
    return [ContinualJob(label, method, replay, sc[method], seed)
            for seed in cfg.seeds[: cfg.ablation_seeds] for label, method, replay in CONTINUAL] if cfg.continual else []
