"""Run a whole class-incremental scenario with one method and record everything.

    >>> from lab.experiments.tosca.run import RunConfig, run
    >>> res = run(RunConfig(datasets=("fashion_mnist_mini",), init=0, inc=2, method="tosca"))
    >>> res.summary          # one row per routing: Ā, A_B, forgetting, BWT, routing accuracy

Every run writes into its own directory (``lab.runs.new_run_dir``; two runs never collide):
``config.json`` (written first), ``modules/task{t}.safetensors`` (that task's module + head, with a
checksum sidecar) and ``stages/stage{t}.json`` (its evaluation) after every task, each with an owner
sidecar (``.owner``: the run's seed, config hash and the task index, checked on resume), then the tidy
tables (``summary``, ``stages``, ``matrix``, ``tasks``, ``epochs``; parquet) and ``summary.json``
(full config, seed, versions, times, parameter counts). ``run(cfg, resume=run_dir)`` continues an
interrupted run after its last finished task and gives the same numbers as an uninterrupted one
(every task draws from its own seeded generator). Everything is validated before any work.
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lab._names import RIDGE_DIM_MAX, RIDGE_LAMBDA_MAX
from lab.tosca import metrics as M
from lab.tosca.learner import NonFiniteLoss, ToscaConfig, cpu_threads
from lab.tosca.routing import PER_BATCH_ORDER, ROUTERS, ROUTINGS, check_routing, route

from .methods import METHODS, MODES, ScenarioData, create

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunConfig(ToscaConfig):
    """One scenario run: every :class:`~lab.tosca.learner.ToscaConfig` field (the method's
    hyper-parameters, inherited) plus what the harness adds (data, method, routing, mode)."""

    datasets: tuple[str, ...] = ("fashion_mnist_mini",)  # several = chained (a domain shift)
    backbone: str = "efficientnet_lite0"
    resolution: int | None = None  # None: the backbone's default
    init: int = 0
    inc: int = 2
    method: str = "tosca"
    routing: str = "per-sample"  # the headline routing (lab.tosca.routing's registry)
    routings: tuple[str, ...] = ROUTINGS  # every routing a routed method is evaluated under (+ the headline)
    mode: str = "cached"
    per_batch_size: int = 48  # the reference protocol's test batch
    name: str = ""  # run-dir label; default "<method>-<datasets>-B<init>Inc<inc>-s<seed>"
    weights: str | None = None  # backbone weights file (as $LAB_VIT_B16_WEIGHTS); None: the registry's
    preprocess: str | None = None  # ViT preprocessing 'reference' | 'timm' (lab.backbones); None: the backbone's
    ridge_dim: int | None = None  # the ridge router's projection D; None: lab.tosca.ridge.PROJ_DIM (PRISM: 15,000)
    ridge_lambda: float | None = None  # the ridge router's λ; None: lab.tosca.ridge.LAMBDA (1e3, PRISM's)

    def __post_init__(self):
        super().__post_init__()  # the method's hyper-parameters
        ds = (self.datasets,) if isinstance(self.datasets, str) else tuple(self.datasets)
        object.__setattr__(self, "datasets", ds)
        object.__setattr__(self, "routings", tuple(self.routings))
        if not ds:
            raise ValueError("at least one dataset is needed")
        METHODS.check(self.method)
        for r in (self.routing, *self.routings):
            check_routing(r)
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        if self.per_batch_size < 1:
            raise ValueError(f"per_batch_size must be >= 1 (got {self.per_batch_size})")
        from lab import _validate

        _validate.seed("seed", self.seed)
        _validate.device("device", self.device)
        if METHODS.info(self.method)["trains"]:  # lr 0 would "train" and report the untrained modules' numbers
            _validate.learning_rate("lr", self.lr)
        if self.ridge_dim is not None:
            _validate.count("ridge_dim", self.ridge_dim, maximum=RIDGE_DIM_MAX)
        if self.ridge_lambda is not None:
            _validate.number("ridge_lambda", self.ridge_lambda, gt=0, le=RIDGE_LAMBDA_MAX)
        if (self.ridge_dim, self.ridge_lambda) != (None, None) and (
                not METHODS.info(self.method)["luca"] or "ridge" not in self.evaluated_routings):
            raise ValueError("ridge_dim and ridge_lambda set TOSCA's ridge router: they need method 'tosca' with "
                             f"'ridge' among its routings (got method {self.method!r}, routings "
                             f"{', '.join(self.evaluated_routings)})")

    def tosca_config(self) -> ToscaConfig:
        """The method's part of this config."""
        return ToscaConfig(**{f.name: getattr(self, f.name) for f in fields(ToscaConfig)})

    @property
    def evaluated_routings(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.routings, self.routing)))

    @property
    def label(self) -> str:
        return self.name or f"{self.method}-{'+'.join(self.datasets)}-B{self.init}Inc{self.inc}-s{self.seed}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["datasets"], d["routings"] = list(self.datasets), list(self.routings)
        for k in ("weights", "preprocess", "ridge_dim", "ridge_lambda"):
            if d[k] is None:  # runs saved before the field existed still resume (and keep their hash)
                del d[k]
        return d


def _config_differences(stored: dict, cfg: RunConfig) -> dict:
    """Fields whose stored value differs; a field missing from an older run's config.json counts
    as its default."""
    defaults = RunConfig().to_dict()
    return {k: (stored.get(k, defaults.get(k)), v) for k, v in cfg.to_dict().items()
            if stored.get(k, defaults.get(k)) != v}


def config_from_stored(stored, where) -> RunConfig:
    """The :class:`RunConfig` a run folder's ``config.json`` (or a sweep's ``base_config``) holds,
    checked: a JSON object whose fields this version knows (a newer version's run is refused, not
    half-read) and whose values are valid; otherwise one line naming ``where``."""
    if not isinstance(stored, dict):
        kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(stored), "null")
        raise ValueError(f"{where}: not a run config (a JSON {kind}, not an object)")
    known = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (written by a newer version of the lab?); "
                         f"resume it with that version, or start a new run")
    d = dict(stored)
    for k in ("datasets", "routings"):
        if isinstance(d.get(k), list):
            d[k] = tuple(d[k])
    try:
        return RunConfig(**d)
    except (TypeError, ValueError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ValueError(f"{where}: not a valid run config ({' '.join(str(msg).split())})") from None


OWNER = ".owner"   # beside every module and stage file: the run it belongs to (seed, config hash, task)


def config_hash(cfg: RunConfig) -> str:
    return hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()


def _owner_path(path: Path) -> Path:
    return path.with_name(path.name + OWNER)


def _write_owner(path: Path, cfg: RunConfig, t: int, digest: str) -> None:
    from lab import _io

    _io.write_json(_owner_path(path), {"seed": cfg.seed, "config_sha256": config_hash(cfg), "task": t,
                                       "sha256": digest})


def _read_owner(path: Path) -> dict | None:
    """The owner sidecar of ``path`` (``None`` when there is none: a run written before sidecars)."""
    from lab import _io

    side = _owner_path(path)
    if not side.exists():
        return None
    try:
        owner = _io.read_json(side)
    except (OSError, UnicodeDecodeError, _io.CorruptFile) as exc:
        raise ValueError(f"{side}: unreadable ({' '.join(str(exc).split())}); remove it and {path.name} to retrain "
                         f"that task") from None
    if not isinstance(owner, dict) or not {"seed", "config_sha256", "task", "sha256"} <= set(owner):
        raise ValueError(f"{side}: not an owner record (seed, config_sha256, task, sha256); remove it and "
                         f"{path.name} to retrain that task")
    return owner


def _task_of(path: Path) -> int | None:
    digits = "".join(c for c in path.name.split(".")[0] if c.isdigit())
    return int(digits) if digits else None


def verify_owners(run_dir: Path, cfg: RunConfig) -> None:
    """Every stored module and stage file of ``run_dir`` that records its owner belongs to this run:
    the same seed, config hash and task index (a file copied in from another run is refused, one
    line naming it, before any work)."""
    want = config_hash(cfg)
    files = [*sorted((run_dir / "modules").glob("task*.safetensors")), *sorted((run_dir / "stages").glob("stage*.json"))]
    for f in files:
        owner = _read_owner(f)
        if owner is None:
            continue
        if owner["seed"] != cfg.seed or owner["config_sha256"] != want or owner["task"] != _task_of(f):
            raise ValueError(f"cannot resume {run_dir}: {f} belongs to another run (seed {owner['seed']}, task "
                             f"{owner['task']}, config {str(owner['config_sha256'])[:12]}…; this run: seed {cfg.seed}, "
                             f"task {_task_of(f)}, config {want[:12]}…); remove it and {_owner_path(f).name} to retrain "
                             f"that task")


def _check_owned(path: Path, cfg: RunConfig, t: int) -> None:
    """Before restoring ``path`` (task ``t``): its owner sidecar exists and records this file's sha256
    (:class:`lab._io.CorruptFile` otherwise: the task is retrained)."""
    from lab import _io

    owner = _read_owner(path)
    if owner is None:
        raise _io.CorruptFile(f"{path}: no owner record {_owner_path(path).name} (written by an older version, or "
                              f"interrupted)")
    if _io.sha256_file(path) != owner["sha256"]:
        raise _io.CorruptFile(f"{path}: sha256 differs from the one its owner record {_owner_path(path).name} holds")


@dataclass
class RunResult:
    run_dir: Path
    config: RunConfig
    summary: "pd.DataFrame"  # one row per routing
    stages: "pd.DataFrame"  # A_b per stage and routing
    matrix: "pd.DataFrame"  # accuracy per (routing, task, stage)
    tasks: "pd.DataFrame"  # per task: classes, sizes, trainable params, times
    epochs: "pd.DataFrame"  # per (task, epoch) training log
    info: dict = field(default_factory=dict)  # summary.json
    method: object = None  # the trained method (for lab.experiments.tosca.analysis)
    data: ScenarioData | None = None

    def headline(self) -> dict:
        row = self.summary[self.summary.routing == self.info["headline_routing"]].iloc[0]
        return row.to_dict()


# --------------------------------------------------------------------------------------------
def _prepare(cfg: RunConfig) -> tuple[object, object]:
    """The scenario (datasets loaded) and the backbone (weights read): what can fail on a missing
    dataset or bad weights, done before any run folder exists."""
    from lab import backbones, data

    scn = data.scenario(list(cfg.datasets), init=cfg.init, inc=cfg.inc, seed=cfg.seed)
    return scn, backbones.load(cfg.backbone, resolution=cfg.resolution, weights=cfg.weights, device=cfg.device,
                               preprocess=cfg.preprocess)   # the feature pass runs on cfg.device


def _load_data(cfg: RunConfig, progress: bool, prepared=None) -> tuple[ScenarioData, float, object]:
    from lab import features

    scn, bb = prepared or _prepare(cfg)
    t0 = time.perf_counter()
    feats = features.scenario_features(scn, bb, progress=progress)
    return ScenarioData.from_scenario(scn, feats, backbone=bb), time.perf_counter() - t0, scn


def _validate_inputs(cfg: RunConfig, needs_images: bool) -> None:
    """Cheap checks that need the registries (names, split sizes, images) — before any work."""
    from lab import backbones, data

    backbones.backbone_info(cfg.backbone)
    backbones.check_resolution(cfg.backbone, cfg.resolution)
    for d in cfg.datasets:
        data.dataset_info(d)
    total = sum(data.dataset_info(d)["classes"] for d in cfg.datasets)
    from lab.data import validate_split

    validate_split(total, cfg.init, cfg.inc)
    if cfg.weights is not None:
        from lab import _validate

        _validate.in_file("weights", cfg.weights)
    else:
        ok, where = backbones.weights_available(cfg.backbone)
        if not ok:
            raise RuntimeError(f"backbone {cfg.backbone}: weights unavailable ({where}; or pass a file with --weights)")
    if needs_images and len({data.dataset_info(d)["image"] for d in cfg.datasets}) > 1:
        raise ValueError(f"{cfg.method} in {cfg.mode} mode needs raw images, and the chained datasets "
                         f"{list(cfg.datasets)} have different image formats; use cached mode")


def _lock(run_dir: Path) -> Path:
    from lab import runs

    return runs.lock(run_dir)  # stale locks replaced, unreadable ones reported with how to clear them


def _evaluate(method, data: ScenarioData, t: int, routings, per_batch_size: int) -> dict:
    """Accuracy of stage t on every test sample of tasks 0..t, under each routing (a method that
    is not routed: ``routings == ()``, one row 'single')."""
    idx = torch.nonzero(data.test_task <= t).squeeze(1)
    y, task = data.test_y[idx], data.test_task[idx]
    logits = method.logits(data, idx)  # [M, n, C]
    ctx = method.route_context(data, idx) if routings else None
    out = {}
    for routing in (routings or ("single",)):
        if routings:
            r = route(logits, routing, ctx, task_ids=task, labels=y, batch_size=per_batch_size)
            preds, racc, bs, order = r.preds, r.routing_accuracy, r.batch_size, r.order
        else:
            preds, racc, bs, order = logits[0].argmax(-1), float("nan"), None, None
        out[routing] = {"A_b": M.accuracy(preds, y), "routing_accuracy": racc, "per_batch_size": bs,
                        "order": order, "column": M.task_accuracies(preds, y, task, data.num_tasks).tolist()}
    return out


def run(cfg: RunConfig, *, runs_root=None, resume=None, progress: bool = True,
        data: ScenarioData | None = None) -> RunResult:
    """Run (or resume) a whole scenario. ``data`` injects ready features (tests, notebooks)."""
    from lab import _io, runs

    info_m = METHODS.info(cfg.method)
    needs_images = info_m["needs_backbone"] or cfg.mode == "augment"
    if data is None:
        _validate_inputs(cfg, needs_images)
    elif needs_images and (data.images is None or data.backbone is None):
        raise ValueError(f"{cfg.method} in {cfg.mode} mode needs images and a backbone in the data")
    if resume is not None:
        run_dir = Path(resume)
        stored = _io.read_json(run_dir / "config.json")
        config_from_stored(stored, run_dir / "config.json")   # an object of known, valid fields
        diff = _config_differences(stored, cfg)
        if diff:
            raise ValueError(f"cannot resume {run_dir}: its config differs (stored, given): {diff}")
        verify_owners(run_dir, cfg)   # every stored module / stage file is this run's: before any work
    else:
        runs.check_root("tosca", runs_root)
    prepared = _prepare(cfg) if data is None else None  # missing data / bad weights: no run folder yet
    if resume is None:
        run_dir = runs.new_run_dir("tosca", cfg.label, root=runs_root)
        _io.write_json(run_dir / "config.json", cfg.to_dict())
    lock = _lock(run_dir)
    try:
        return _run(cfg, run_dir, data, progress, cfg.evaluated_routings if info_m["routed"] else (), prepared)
    except NonFiniteLoss as exc:  # the finished tasks stay resumable; the failure is recorded
        _io.write_json(run_dir / "error.json", {"error": str(exc), "type": type(exc).__name__})
        raise
    finally:
        lock.unlink(missing_ok=True)


def _run(cfg, run_dir, data, progress, routings, prepared=None) -> RunResult:
    from tqdm.auto import tqdm

    from lab import _io

    t_extract = 0.0
    if data is None:
        data, t_extract, _ = _load_data(cfg, progress, prepared)
    torch.manual_seed(cfg.seed)
    method = create(cfg.method, data.dim, cfg.tosca_config(), backbone=data.backbone, mode=cfg.mode)
    for field in ("ridge_dim", "ridge_lambda"):     # the ridge router's (ToscaMethod's; see __post_init__)
        if getattr(cfg, field) is not None:
            setattr(method, field, getattr(cfg, field))
    stages, epochs = [], []
    bar = tqdm(range(data.num_tasks), desc=f"{cfg.method} tasks", disable=not progress)
    for t in bar:
        classes = data.task_classes[t]
        mfile, sfile = run_dir / "modules" / f"task{t:03d}.safetensors", run_dir / "stages" / f"stage{t:03d}.json"
        if sfile.exists() and mfile.exists() and len(stages) == t:  # finished before an interruption
            try:
                _check_owned(mfile, cfg, t)
                _check_owned(sfile, cfg, t)
                tensors, _ = _io.load_tensors(mfile)
                stage = _io.read_json(sfile)
                method.restore_task(t, tensors, classes, data)
                stages.append(stage)
                epochs.extend(stage["epochs"])
                bar.set_postfix_str(f"task {t} restored")
                continue
            except _io.CorruptFile as exc:
                warnings.warn(f"resume: {exc}; retraining from task {t}")
        ebar = tqdm(total=cfg.epochs if METHODS.info(cfg.method)["trains"] else 0, desc=f"task {t} epochs",
                    leave=False, disable=not progress)
        log = []

        def on_epoch(row, t=t):
            log.append({"task": t, **row})
            ebar.update(1)
            ebar.set_postfix(loss=f"{row['loss']:.3f}")

        t0 = time.perf_counter()
        method.learn_task(t, classes, data, on_epoch=on_epoch)
        t1 = time.perf_counter()
        with cpu_threads(cfg.threads if cfg.device == "cpu" else 0):  # small ops: see ToscaConfig
            ev = _evaluate(method, data, t, routings, cfg.per_batch_size)
        t2 = time.perf_counter()
        ebar.close()
        stage = {"task": t, "classes": classes, "train_seconds": t1 - t0, "eval_seconds": t2 - t1,
                 "trainable_params": method.trainable_parameters(t), "eval": ev, "epochs": log,
                 "head_scale": method.head_scale(),
                 "n_train": int((data.train_task == t).sum()), "n_test": int((data.test_task == t).sum())}
        _io.save_tensors(mfile, method.task_tensors(t), {"task": str(t), "method": cfg.method,
                                                         "classes": json.dumps(classes),
                                                         "config": json.dumps(cfg.to_dict())})
        _write_owner(mfile, cfg, t, _io.sha256_file(mfile))
        text = json.dumps(stage, indent=2, sort_keys=True, default=str) + "\n"   # as _io.write_json
        _write_owner(sfile, cfg, t, hashlib.sha256(text.encode()).hexdigest())
        _io.atomic_write(sfile, lambda p: p.write_text(text))  # written last: its presence marks the task finished
        stages.append(stage)
        epochs.extend(log)
        hs = f" σ={stage['head_scale']:.2f}" if stage["head_scale"] is not None else ""
        first = next(iter(ev))
        bar.set_postfix_str(f"A_{t}={ev[first]['A_b']:.1f} ({first}){hs}")
    return _finish(cfg, run_dir, data, method, stages, epochs, t_extract)


def _finish(cfg, run_dir, data, method, stages, epochs, t_extract) -> RunResult:
    import pandas as pd

    from lab import _io, runs

    routings = [r for r in (*ROUTERS.names(), "single") if r in stages[0]["eval"]]  # JSON sorted the keys
    stage_rows, matrix_rows, summary_rows = [], [], []
    for r in routings:
        col = [s["eval"][r]["column"] for s in stages]
        R = M.accuracy_matrix(col)
        a_b = [s["eval"][r]["A_b"] for s in stages]
        racc = [s["eval"][r]["routing_accuracy"] for s in stages]
        for s in stages:
            e = s["eval"][r]
            stage_rows.append({"method": cfg.method, "routing": r, "stage": s["task"],
                               "n_classes": s["classes"][-1] + 1, "A_b": e["A_b"],
                               "routing_accuracy": e["routing_accuracy"], "head_scale": s["head_scale"],
                               "per_batch_size": e["per_batch_size"], "order": e["order"]})
        for i in range(R.shape[0]):
            for b in range(R.shape[1]):
                matrix_rows.append({"method": cfg.method, "routing": r, "task": i, "stage": b, "accuracy": R[i, b]})
        summary_rows.append({"method": cfg.method, "routing": r, **M.summarize(R, a_b),
                             "routing_accuracy_last": racc[-1], "routing_accuracy_mean": float(pd.Series(racc).mean()),
                             "per_batch_size": cfg.per_batch_size if r == "per-batch" else None})
    task_rows = [{"task": s["task"], "classes": json.dumps(s["classes"]), "n_train": s["n_train"], "n_test": s["n_test"],
                  "trainable_params": s["trainable_params"], "train_seconds": s["train_seconds"],
                  "eval_seconds": s["eval_seconds"], "head_scale": s["head_scale"]} for s in stages]
    tables = {"summary": pd.DataFrame(summary_rows), "stages": pd.DataFrame(stage_rows),
              "matrix": pd.DataFrame(matrix_rows), "tasks": pd.DataFrame(task_rows), "epochs": pd.DataFrame(epochs)}
    for name, df in tables.items():
        _io.write_table(run_dir / name, df)
    headline = cfg.routing if cfg.routing in routings else routings[0]
    times = {"extraction": t_extract, "training": sum(s["train_seconds"] for s in stages),
             "evaluation": sum(s["eval_seconds"] for s in stages)}
    times["total"] = sum(times.values())
    info = {"config": cfg.to_dict(), "seed": cfg.seed, "versions": runs.versions(), "run_dir": str(run_dir),
            "headline_routing": headline, "routings": routings, "per_batch_order": PER_BATCH_ORDER,
            "per_batch_size": cfg.per_batch_size, "results": tables["summary"].to_dict("records"),
            "seconds": times, "trainable_params_per_task": [s["trainable_params"] for s in stages],
            "trainable_params_total": sum(s["trainable_params"] for s in stages),
            "head_scale_per_task": [s["head_scale"] for s in stages], "num_tasks": len(stages),
            "backbone_untrained": bool(getattr(data.backbone, "untrained", False))}
    _io.write_json(run_dir / "summary.json", info)
    return RunResult(run_dir, cfg, *tables.values(), info=info, method=method, data=data)
