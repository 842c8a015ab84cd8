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
from dataclasses import asdict, dataclass, replace

from lab.aware.config import AwareConfig
from lab.aware.methods import MethodSpec, get_method, lr_field, reference_method
from lab.experiments.aware.ablate import Variant

# Bump when a change of the run code changes a finished run's numbers (scoring, training loop, data).
# 2: options shuffled per question, ties and non-finite scores wrong, LoRA/DoRA seeded, 320-item probe.
STUDY_VERSION = 2
MAIN = AwareConfig(rho=0.3, rule="activation-global", targets="qkv+projector")


@dataclass(frozen=True)
class StudyConfig:
    """How big the study is. ``size``: the :data:`lab.experiments.aware.context.SIZES` preset whose
    aligned projector and train pool are reused; the other fields replace the preset's."""

    size: str = "default"
    tiny: bool = False                 # a random 2-layer Llama (tests and smoke renders only)
    task: str = "fashion"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)   # the methods group
    ablation_seeds: int = 3            # every other group: the first this many of ``seeds``
    headline_seeds: tuple[int, ...] = ()   # more seeds for the ``headline`` variants (the shipped preset's)
    headline: tuple[str, ...] = ("methods/full", "methods/aware")
    tune_seed: int = 0
    steps: int = 64
    batch_size: int = 16
    n_eval: int = 400                  # downstream test questions
    n_easy_eval: int = 600             # easy-VQA test questions
    n_probe: int = 320                 # text-probe questions (all 320)
    n_val: int = 150                   # validation questions per set, for choosing the rates
    grids: tuple[tuple[str, tuple[float, ...]], ...] = ()   # () : each method's registry grid
    max_extensions: int = 4            # grid points added past an edge choice, per variant (rho=0.9 needed a third)
    methods: tuple[str, ...] = ("zero-shot", "full", "lora", "dora", "aware")
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
    replicates: int = 2000

    def grid(self, method: str) -> tuple[float, ...]:
        own = dict(self.grids)
        return tuple(own[method]) if method in own else tuple(get_method(method).grid)

    def seeds_for(self, group: str, variant: str | None = None) -> tuple[int, ...]:
        """The seeds a variant runs on: its group's, plus ``headline_seeds`` for the ``headline`` variants
        (``variant``: its id, e.g. ``methods/full``)."""
        own = tuple(self.seeds) if group == "methods" else tuple(self.seeds[: self.ablation_seeds])
        extra = tuple(s for s in self.headline_seeds if s not in own) if variant in self.headline else ()
        return own + extra

    def to_size(self):
        from lab.experiments.aware.context import SIZES

        base = SIZES[self.size]
        return replace(base, n_eval=self.n_eval, n_easy_eval=self.n_easy_eval, n_probe=self.n_probe,
                       train=replace(base.train, steps=self.steps, batch_size=self.batch_size),
                       methods=self.methods, rules=self.rules, calib_sizes=self.calib_sizes,
                       n_calib=self.n_calib, seeds=self.seeds, continual_steps=self.continual_steps,
                       n_continual_eval=self.n_continual_eval, continual_calib=self.continual_calib,
                       continual_methods=("full", "aware"), exact=False)


PRESETS = {
    # more seeds for the headline pair: with 5, R's 95 % interval for full fine-tuning and AWARe was
    # +-6.6 to +-7.2 points (easy-VQA retention varies from seed to seed far more than from question to
    # question); 1/sqrt(n) said about 10 seeds for +-5. With 10, full fine-tuning's R was still +-6.1
    # (AWARe's +-4.6), so 16: 6.1 * sqrt(10/16) = 4.8
    "shipped": StudyConfig(headline_seeds=tuple(range(5, 16))),
    "smoke": StudyConfig(size="smoke", tiny=True, seeds=(0, 1), ablation_seeds=2, steps=2, batch_size=4, n_eval=16,
                         n_easy_eval=16, n_probe=16, n_val=8,
                         grids=(("full", (1e-5, 1e-3)), ("lora", (1e-4, 1e-3)), ("dora", (1e-4, 1e-3)),
                                ("aware", (1e-4, 1e-3))), max_extensions=0,
                         rhos=(0.0, 0.5), targets=("qkv",), calib_sizes=(4,), n_calib=8, continual_steps=1,
                         n_continual_eval=8, continual_calib=8, replicates=200),
}
NOTES = {
    "shipped": ("Sized so that full fine-tuning learns the downstream task and clearly forgets: 64 steps x 16 "
                "questions per run (1,024 training questions), every variant's rate chosen from a grid of at least "
                "three on 150 + 150 validation questions (extended past an edge), 5 seeds for the methods group (16 "
                "for full fine-tuning and AWARe, whose R needs them for a +-5-point interval) and 3 for every other, "
                "400 downstream, 600 easy-VQA and 320 probe test questions."),
    "smoke": "A random tiny 2-layer model: checks the code path, its numbers mean nothing.",
}
# What a preset may cost: the wall clock of this project's 2-core machine during which its runs
# (tuning included) are going. The manifest states the study's against it (the shipped one: 8 hours).
BUDGETS = {"shipped": 8 * 3600.0}


# ---------------------------------------------------------------- variants
def variants(cfg: StudyConfig) -> list[Variant]:
    """Every compared variant, main AWARe first after the baselines (it is every group's reference)."""
    role = lambda m: get_method(m).role   # noqa: E731
    out = [Variant("methods", m, MethodSpec(m, MAIN)) for m in cfg.methods if role(m) != "method"]
    if not any(role(v.spec.method) == "reference" for v in out):
        ref = reference_method()
        out.insert(0, Variant("methods", ref, MethodSpec(ref, MAIN)))   # E is relative to it
    out += [Variant("methods", m, MethodSpec(m, MAIN)) for m in cfg.methods if role(m) == "method"]
    if not any(v.spec.method == "aware" for v in out):
        out.append(Variant("methods", "aware", MethodSpec("aware", MAIN)))   # every group's reference point
    if cfg.rho0_in_methods:
        out.append(Variant("methods", "rho=0", MethodSpec("aware", replace(MAIN, rho=0.0))))
    out += [Variant("rule", r, MethodSpec("aware", replace(MAIN, rule=r))) for r in cfg.rules]
    out += [Variant("rho", f"rho={r:g}", MethodSpec("aware", replace(MAIN, rho=float(r)))) for r in cfg.rhos
            if r != MAIN.rho]
    out += [Variant("targets", t, MethodSpec("aware", replace(MAIN, targets=t))) for t in cfg.targets]
    if cfg.proxy:
        out.append(Variant("calibration", "proxy", MethodSpec("aware", MAIN), calib="proxy"))
    out += [Variant("calib_size", f"n={n}", MethodSpec("aware", MAIN), calib_n=n) for n in cfg.calib_sizes]
    return out


def variant_id(v: Variant) -> str:
    return f"{v.group}/{v.label}"


# ---------------------------------------------------------------- runs
@dataclass(frozen=True)
class Job:
    """One fine-tuning run: a variant at one learning rate and seed, answering ``sets``."""

    variant: Variant
    lr: float | None
    seed: int
    sets: tuple[str, ...] = ("val", "test")


@dataclass(frozen=True)
class ContinualJob:
    """One continual sequence (fashion -> digits -> even) of one protocol and seed."""

    label: str
    method: str
    replay: bool
    lr: float | None
    seed: int


def _canon(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _hash(obj) -> str:
    return hashlib.sha256(_canon(obj).encode()).hexdigest()[:20]


def data_fingerprint(cfg: StudyConfig, device: str) -> str:
    """What every run of a study shares and what changes its numbers apart from the job itself: the
    data (alignment, training pool, every evaluation set and its size), the model, the device."""
    from lab.experiments.aware.tasks import PROBE_FILE

    s = cfg.to_size()
    data = {"tiny": cfg.tiny, "task": cfg.task, "device": device, "n_align": s.n_align, "align": asdict(s.align),
            "n_train": s.n_train, "grid": s.grid, "n_eval": s.n_eval, "n_easy_eval": s.n_easy_eval,
            "n_probe": s.n_probe, "n_val": cfg.n_val, "n_calib": s.n_calib, "eval_batch": s.eval_batch,
            "probe": hashlib.sha256(PROBE_FILE.read_bytes()).hexdigest()}
    return _hash({"v": STUDY_VERSION, "data": data})


def train_config(cfg: StudyConfig, method: str, lr: float | None, seed: int, steps: int | None = None):
    """The training recipe of one run: the study's steps and batch, ``method``'s rate set to ``lr``."""
    base = cfg.to_size().train
    field = lr_field(method)
    over = {field: lr} if lr is not None and field else {}
    return replace(base, seed=int(seed), **({"steps": steps} if steps is not None else {}), **over)


def job_key(fp: str, job: Job, cfg: StudyConfig) -> str:
    """A file-name-safe key: the variant's name (for people) and a hash of everything that changes it."""
    v = job.variant
    seed = job.seed if lr_field(v.spec.method) else 0    # nothing trains: one run for every seed
    payload = {"fp": fp, "spec": asdict(v.spec), "calib": v.calib, "calib_n": v.calib_n or cfg.n_calib,
               "train": asdict(train_config(cfg, v.spec.method, job.lr, seed)), "sets": sorted(job.sets)}
    slug = "".join(c if c.isalnum() or c in "=.+-" else "_" for c in f"{v.spec.method}-{v.label}")
    return f"{slug}-{_hash(payload)}"


def continual_key(fp: str, job: ContinualJob, cfg: StudyConfig) -> str:
    from lab.experiments.aware.continual import ORDER

    payload = {"fp": fp, "continual": asdict(job), "order": ORDER, "main": MAIN.to_dict(),
               "train": asdict(train_config(cfg, job.method, job.lr, job.seed, steps=cfg.continual_steps)),
               "n_eval": cfg.n_continual_eval, "calib": cfg.continual_calib}
    return f"continual-{job.method}{'-replay' if job.replay else ''}-s{job.seed}-{_hash(payload)}"


# The order the study runs in, each phase tuned then tested before the next starts: the methods group
# first (the headline), then what each of the paper's four findings needs (the rule group; rho = 0.3's
# neighbours; the MLP target; proxy calibration), then everything else. A phase names groups or variant
# ids; None: every variant. An interrupted study therefore has its findings soonest.
PHASES = (("methods",), ("rule",),
          ("rho/rho=0.1", "rho/rho=0.5", "targets/qkv+projector+mlp", "calibration/proxy"), None)


def in_phase(v: Variant, phase: tuple[str, ...] | None) -> bool:
    """Whether variant ``v`` belongs to ``phase`` (group names or variant ids; None: all)."""
    return phase is None or v.group in phase or variant_id(v) in phase


def plan_tuning(cfg: StudyConfig, extra: dict | None = None, groups: tuple[str, ...] | None = None) -> list[Job]:
    """Every variant that trains (of ``groups``: a phase, see :func:`in_phase`) at every rate of its
    grid (plus ``extra[variant id]`` rates past an edge) on the tuning seed; full fine-tuning first
    and in every phase (every other choice is relative to it)."""
    extra = extra or {}
    ref = lambda v: get_method(v.spec.method).role == "reference"   # noqa: E731  (every phase's E needs it)
    vs = [v for v in variants(cfg) if lr_field(v.spec.method) and (in_phase(v, groups) or ref(v))]
    vs.sort(key=lambda v: get_method(v.spec.method).role != "reference")
    return [Job(v, lr, cfg.tune_seed, ("val", "test"))
            for v in vs for lr in sorted({*cfg.grid(v.spec.method), *extra.get(variant_id(v), ())})]


def plan_tests(cfg: StudyConfig, chosen: dict, groups: tuple[str, ...] | None = None) -> list[Job]:
    """Every variant (of ``groups``: a phase, see :func:`in_phase`) at its chosen rate on each of its
    group's seeds; the tuning seed's run is the tuning run itself (same key)."""
    out = []
    for v in variants(cfg):
        if not in_phase(v, groups):
            continue
        lr = chosen.get(variant_id(v))
        if lr_field(v.spec.method) and lr is None:
            continue
        for seed in cfg.seeds_for(v.group, variant_id(v)):
            sets = ("val", "test") if seed == cfg.tune_seed and lr is not None else ("test",)
            out.append(Job(v, lr, seed, sets))
    return out


CONTINUAL = (("full", "full", False), ("aware (paper: upstream saliency)", "aware", False),
             ("aware + replay saliency (extension)", "aware", True))


def plan_continual(cfg: StudyConfig, chosen: dict) -> list[ContinualJob]:
    lrs = {"full": chosen.get("methods/full"), "aware": chosen.get("methods/aware")}
    return [ContinualJob(label, method, replay, lrs[method], seed)
            for seed in cfg.seeds[: cfg.ablation_seeds] for label, method, replay in CONTINUAL] if cfg.continual else []
