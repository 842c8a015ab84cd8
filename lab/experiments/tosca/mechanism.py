"""TOSCA's mechanism, measured: does L1 leave each task's LuCA sparse, and do the tasks' active
gate dimensions overlap less than chance? (docs/tosca.md, "Sparsity and orthogonality".)

The paper's lesson is that the L1 penalty makes each task's module sparse, so each task specialises
on its own, nearly orthogonal subset of feature dimensions. This study trains TOSCA (reference
initialisation, per-sample entropy routing, cached features) over seeds x scenarios x L1 strengths x
training lengths and records, per task module, on that task's own training features (no test data
describes a module):

* **weight sparsity** — per part, the fraction of entries with ``|w| < THRESHOLD`` (1e-3). The
  headline is the four *weight matrices* pooled (adapter down / up, calibrator down / up); the
  adapter's biases and the LayerNorm are recorded apart (they start at 0 and 1, so pooling them in
  would measure their initialisation, not L1);
* **gate openness** — the calibrator's sigmoid gate g in (0, 1) per dimension. With its weights at
  zero a gate sits at sigmoid(0) = 0.5, which is where L1 pulls it: mean ``|g - 0.5|`` and the
  fractions of gates open (g > 0.9) and closed (g < 0.1); a freshly initialised module's mean
  ``|g - 0.5|`` beside it (``gate_departure_init``);
* **active dimensions** — the ``TOP`` fraction (10 %) of dimensions with the largest
  ``|mean gate - 0.5|`` on the task's own images, of those departing at least ``ACTIVE_MIN`` (0.01,
  a gate that scales its dimension 2 % away from the neutral 0.5): a module whose gates L1 has
  pulled to 0.5 has none, and its pairs have no Jaccard index;
* **task x task overlap** — cosine of centred mean gates (mean gate - 0.5) and Jaccard index of
  active sets, each against a **permutation null**: the same set sizes drawn at random (Jaccard), each
  task's centred mean-gate vector with its dimensions shuffled (cosine), ``NULL_DRAWS`` draws: the
  null's mean and 95 % band of the run's mean over task pairs;
* **accuracy** — A_B and routing accuracy under per-sample entropy routing (the paper's rule), A_B
  with the true task's module (oracle), Ā, and the stability-plasticity pair at the last stage:
  accuracy on the earlier tasks' test images and on the newest task's.

    lab tosca study mechanism --out results/tosca/mechanism      # the shipped study, one process
    lab tosca study mechanism --seeds 1993 --l1 0 5e-4 --epochs 2 --scenarios fashion_mnist_mini --out /tmp/m

A finished run waits as one JSON file under ``$LAB_RUNS_DIR/tosca-mechanism/`` (skipped when the
same command runs again on the same sources). Written into ``--out``: ``runs.csv`` (one row per
run), ``modules.csv`` (per task module), ``parts.csv`` (per task module and part), ``pairs.csv``
(per task pair) and ``manifest.json`` (command, sources' sha256, date, machine, wall time, the
tables' sha256); then ``summary.csv``, ``verdicts.csv`` and ``README.md`` from those tables alone
(:mod:`.mechanism_results`; ``python -m lab.experiments.tosca.mechanism_views`` rewrites them).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

SCENARIOS = ("fashion_mnist_mini", "mnist_5k+fashion_mnist_mini")
SEEDS = tuple(range(1993, 1998))
# from none to past the point where every gate sits at 0.5 (the reference's 5e-4 among them)
L1S = (0.0, 1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 2e-2)
EPOCHS = (20, 60)          # the reference's 20 and three times as long
THRESHOLD = 1e-3           # |w| below this counts as near zero
TOP = 0.1                  # active dimensions: this fraction of d with the largest |mean gate - 0.5|
ACTIVE_MIN = 0.01          # ... of those with |mean gate - 0.5| >= this (below it a gate does not select)
OPEN, CLOSED = 0.9, 0.1    # a gate above OPEN is open, below CLOSED closed
NULL_DRAWS = 1000          # draws of the permutation null per run
# the training engine: the shipped TOSCA study's (lab.experiments.tosca.study.STUDY_ENGINE, the fused C
# step), so this study's reference regime is that study's runs; recorded in the manifest
ENGINE = "fused"
# what makes this study's numbers, hashed into its manifest: lab/tosca (every engine), the C builder and
# these files of lab/experiments/tosca
SOURCES = ("__init__.py", "_base.py", "augment.py", "baselines.py", "layerwise.py", "methods.py", "run.py",
           "mechanism.py")
TABLES = ("runs.csv", "modules.csv", "parts.csv", "pairs.csv")
# LuCA parameter -> (part, kind); kind 'weight' are the four matrices L1 is meant to sparsify
PARTS = {"down.weight": ("adapter down", "weight"), "up.weight": ("adapter up", "weight"),
         "se_down.weight": ("calibrator down", "weight"), "se_up.weight": ("calibrator up", "weight"),
         "down.bias": ("adapter down bias", "bias"), "up.bias": ("adapter up bias", "bias"),
         "norm.weight": ("LayerNorm scale", "layernorm"), "norm.bias": ("LayerNorm shift", "layernorm")}


@dataclass(frozen=True)
class Variant:
    """One run of the study: a scenario, a seed, an L1 strength, a training length."""

    scenario: str
    seed: int
    l1: float
    epochs: int
    threshold: float = THRESHOLD
    top: float = TOP
    active_min: float = ACTIVE_MIN
    null_draws: int = NULL_DRAWS
    engine: str = ENGINE


def variants(scenarios=SCENARIOS, seeds=SEEDS, l1s=L1S, epochs=EPOCHS) -> list[Variant]:
    """Every run, grouped by (scenario, seed) so each process loads a scenario's features once."""
    return [Variant(s, int(seed), float(l1), int(e)) for s in scenarios for seed in seeds for e in epochs
            for l1 in l1s]


# --- measures: pure functions of a trained lab.tosca.learner.Tosca and features ----------------------
def part_sparsity(model, threshold: float = THRESHOLD) -> list[dict]:
    """Per task module and part: the fraction of entries with |w| < threshold and the mean |w|."""
    rows = []
    for t, m in enumerate(model.luca):
        for name, p in m.named_parameters():
            part, kind = PARTS.get(name, (name, "other"))
            w = p.detach().abs().cpu()
            rows.append({"task": t, "part": part, "kind": kind, "numel": w.numel(),
                         "near_zero": float((w < threshold).float().mean()), "mean_abs": float(w.mean())})
    return rows


def weight_sparsity(parts: list[dict]) -> dict[int, float]:
    """Per task: the fraction of near-zero entries over the four weight matrices pooled (biases and
    LayerNorm apart)."""
    out: dict[int, list] = {}
    for r in parts:
        if r["kind"] == "weight":
            n, z = out.get(r["task"], (0, 0.0))
            out[r["task"]] = (n + r["numel"], z + r["near_zero"] * r["numel"])
    return {t: z / n for t, (n, z) in out.items()}


def centred_mean_gates(gates_own: list) -> np.ndarray:
    """``[T, d]``: each module's mean gate on its own task's images, minus the neutral 0.5."""
    return np.stack([g.mean(0).numpy() - 0.5 for g in gates_own]).astype(np.float64)


def openness(g) -> dict:
    """One module's gates on its task's images ``[n, d]``: mean |g - 0.5|, fractions open and closed."""
    g = g.numpy()
    return {"gate_departure": float(np.abs(g - 0.5).mean()), "gate_open": float((g > OPEN).mean()),
            "gate_closed": float((g < CLOSED).mean()), "gate_mean": float(g.mean())}


def active_sets(centred: np.ndarray, top: float = TOP, minimum: float = ACTIVE_MIN) -> list[np.ndarray]:
    """Per task, the sorted indices of its active dimensions: the ``top`` fraction with the largest
    |mean gate - 0.5|, of those departing at least ``minimum`` from 0.5."""
    k = max(1, int(round(top * centred.shape[1])))
    out = []
    for v in np.abs(centred):
        idx = np.argsort(-v, kind="stable")[:k]
        out.append(np.sort(idx[v[idx] >= minimum]))
    return out


def _pairs(n: int):
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def _jaccard(masks: np.ndarray) -> np.ndarray:
    """``masks [..., T, d]`` boolean -> Jaccard of every pair ``[..., P]`` (NaN where either set is empty:
    a module with no active dimension has no overlap to measure)."""
    m = masks.astype(np.float32)
    inter = m @ np.swapaxes(m, -1, -2)
    sizes = m.sum(-1)
    union = sizes[..., :, None] + sizes[..., None, :] - inter
    i, j = np.triu_indices(masks.shape[-2], 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((sizes[..., i] > 0) & (sizes[..., j] > 0), inter[..., i, j] / union[..., i, j], np.nan)


def _cosine(v: np.ndarray) -> np.ndarray:
    """``v [..., T, d]`` -> cosine of every pair ``[..., P]`` (NaN for a zero vector)."""
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = np.where(norm > 0, v / norm, np.nan)
    c = u @ np.swapaxes(u, -1, -2)
    i, j = np.triu_indices(v.shape[-2], 1)
    return c[..., i, j]


def _nanmean(x) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def overlap_null(centred: np.ndarray, sets: list[np.ndarray], draws: int = NULL_DRAWS, seed: int = 0):
    """Observed overlap of every task pair and the permutation null.

    Returns ``(pairs, run)``: per pair (i < j) the observed cosine and Jaccard with the null's mean
    for that pair; for the run, the mean over pairs observed, the null's mean, its 95 % band (2.5th
    and 97.5th percentiles of the mean over pairs across draws) and the share of draws at or below
    the observed mean (small: less overlap than chance)."""
    T, d = centred.shape
    rng = np.random.default_rng(seed)
    masks = np.zeros((T, d), bool)
    for t, s in enumerate(sets):
        masks[t, s] = True
    obs_j, obs_c = _jaccard(masks), _cosine(centred)
    # null: sets of the same sizes drawn at random, each vector's dimensions shuffled (independently per
    # task and draw); in chunks of draws to bound memory ([chunk, T, d] permutations)
    sizes = masks.sum(1)
    null_j, null_c = [], []
    for n in np.diff([*range(0, draws, 200), draws]):
        perm = np.argsort(rng.random((n, T, d)), axis=-1)                      # a random permutation each
        null_j.append(_jaccard(perm < sizes[None, :, None]))                   # k_t random dimensions
        null_c.append(_cosine(np.take_along_axis(np.broadcast_to(centred, (n, T, d)), perm, -1)))
    null_j, null_c = np.concatenate(null_j), np.concatenate(null_c)            # [draws, P]
    pairs = [{"task_i": i, "task_j": j, "size_i": int(sizes[i]), "size_j": int(sizes[j]),
              "cosine": float(obs_c[p]), "cosine_null": _nanmean(null_c[:, p]),
              "jaccard": float(obs_j[p]), "jaccard_null": _nanmean(null_j[:, p])}
             for p, (i, j) in enumerate(_pairs(T))]
    run = {}
    for name, obs, null in (("jaccard", obs_j, null_j), ("cosine", obs_c, null_c)):
        ok = np.isfinite(obs)
        if not ok.any():
            run.update({f"{name}{s}": float("nan") for s in ("", "_null", "_null_lo", "_null_hi", "_p_below")})
            continue
        m, nm = float(obs[ok].mean()), null[:, ok].mean(1)
        run.update({name: m, f"{name}_null": float(nm.mean()), f"{name}_null_lo": float(np.percentile(nm, 2.5)),
                    f"{name}_null_hi": float(np.percentile(nm, 97.5)), f"{name}_p_below": float((nm <= m).mean())})
    run["active_size"] = float(sizes.mean())
    return pairs, run


# --- one run -------------------------------------------------------------------------------------
def torch_no_grad(fn):
    """``torch.no_grad()`` around ``fn``, torch imported at the call (``--help`` needs no torch)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        import torch

        with torch.no_grad():
            return fn(*a, **kw)
    return wrapper


def _scenario_data(scenario: str, seed: int, cache: dict):
    from lab import backbones, data, features

    from .methods import ScenarioData

    key = (scenario, seed)
    if key not in cache:
        cache.clear()                  # variants come grouped by (scenario, seed)
        scn = data.scenario(scenario.split("+"), init=0, inc=2, seed=seed)
        bb = backbones.load("efficientnet_lite0")
        cache[key] = ScenarioData.from_scenario(scn, features.scenario_features(scn, bb, progress=False))
    return cache[key]


_DATA: dict = {}


def run_one(v: Variant, data=None) -> dict:
    """Train TOSCA for one variant (as :func:`lab.experiments.tosca.run.run` does: the same seed, config
    and evaluation, so its A_B is the study's) and :func:`measure` it; adds Ā and the training time."""
    import torch

    from lab.tosca.learner import cpu_threads
    from lab.tosca.routing import route

    from .methods import create
    from .run import RunConfig

    data = data if data is not None else _scenario_data(v.scenario, v.seed, _DATA)
    cfg = RunConfig(datasets=tuple(v.scenario.split("+")), seed=v.seed, epochs=v.epochs, l1=v.l1, engine=v.engine)
    torch.manual_seed(cfg.seed)                                  # as lab.experiments.tosca.run
    method = create("tosca", data.dim, cfg.tosca_config())
    A, train_s = [], 0.0
    for t, classes in enumerate(data.task_classes):
        t0 = time.perf_counter()
        method.learn_task(t, classes, data)
        train_s += time.perf_counter() - t0
        with cpu_threads(cfg.threads):
            idx = torch.nonzero(data.test_task <= t).squeeze(1)
            r = route(method.logits(data, idx), "per-sample", method.route_context(data, idx),
                      task_ids=data.test_task[idx])
            A.append(100 * float((r.preds == data.test_y[idx]).float().mean()))
    with cpu_threads(cfg.threads):
        out = measure(method.model, data, seed=v.seed, threshold=v.threshold, top=v.top, active_min=v.active_min,
                      null_draws=v.null_draws)
    out["run"].update(avg_inc_acc=float(np.mean(A)), train_s=train_s)
    return out


@torch_no_grad
def measure(model, data, *, seed: int, threshold: float = THRESHOLD, top: float = TOP,
            active_min: float = ACTIVE_MIN, null_draws: int = NULL_DRAWS) -> dict:
    """Every measure of the study on a trained :class:`~lab.tosca.learner.Tosca` and its scenario's
    cached features (``data``: a ScenarioData): ``{"run": {...}, "modules": [...], "parts": [...],
    "pairs": [...]}``, JSON-able. Gates and overlap on each task's own training features; accuracies
    on the test split (per-sample entropy routing, and the oracle) at the last stage."""
    import torch

    from lab.tosca.luca import LuCA
    from lab.tosca.routing import route

    T = model.num_tasks
    logits = model.all_logits(data.test_x)
    ps = route(logits, "per-sample", model.route_context(data.test_x), task_ids=data.test_task)
    orc = route(logits, "oracle", task_ids=data.test_task)
    right = ps.preds == data.test_y
    old, new = data.test_task < T - 1, data.test_task == T - 1
    own = [model.luca[t].gate(model.luca[t].gate_input(data.train_x[data.train_task == t])) for t in range(T)]
    gen = torch.Generator().manual_seed(seed)      # fresh modules, initialised as the reference: where gates start
    init = []
    for t in range(T):
        fresh = LuCA(data.dim, ratio=model.config.ratio, flow=model.config.flow)
        fresh.reset_parameters(gen, init="default" if t == 0 else "xavier")
        init.append(float((fresh.gate(fresh.gate_input(data.train_x[data.train_task == t])) - 0.5).abs().mean()))
    centred = centred_mean_gates(own)
    sets = active_sets(centred, top, active_min)
    pairs, ov = overlap_null(centred, sets, null_draws, seed=seed)
    parts = part_sparsity(model, threshold)
    ws = weight_sparsity(parts)
    modules = [{"task": t, **openness(own[t]), "gate_departure_init": init[t], "weight_near_zero": ws[t],
                "active_size": len(sets[t]), "active_dims": " ".join(map(str, sets[t].tolist())),
                "active_gates": " ".join(f"{x:.4f}" for x in centred[t, sets[t]])} for t in range(T)]
    run = {"A_B": 100 * float(right.float().mean()), "A_B_oracle": 100 * float((orc.preds == data.test_y).float().mean()),
           "routing_accuracy": 100 * ps.routing_accuracy,
           "old_tasks_acc": 100 * float(right[old].float().mean()), "new_task_acc": 100 * float(right[new].float().mean()),
           **{k: float(np.mean([m[k] for m in modules]))
              for k in ("weight_near_zero", "gate_departure", "gate_departure_init", "gate_open", "gate_closed")},
           **ov, "head_scale": float(model.head.scale), "tasks": T}
    return {"run": run, "modules": modules, "parts": parts, "pairs": pairs}


def scratch() -> Path:
    """Where finished runs wait for the tables (one JSON each, under the sources' digest): the runs root
    (``$LAB_RUNS_DIR`` or ./runs), not the shipped folder — the tables hold every number they hold."""
    from lab.runs import runs_root

    return runs_root() / "tosca-mechanism"


def _job(v: Variant) -> dict:
    return run_one(v)


# --- the command ---------------------------------------------------------------------------------
def parser(prog: str = "lab tosca study mechanism") -> argparse.ArgumentParser:
    from .study import _OneLine

    p = _OneLine(prog=prog, description="TOSCA's mechanism over seeds, L1 strengths and training lengths: weight "
                                        "sparsity, gate openness, active dimensions and their overlap against a "
                                        "permutation null, routing accuracy and A_B (one process, one thread).")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), help="datasets, '+' chains them")
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="each its own class order")
    p.add_argument("--l1", nargs="+", type=float, default=list(L1S), help="L1 strengths (include 0)")
    p.add_argument("--epochs", nargs="+", type=int, default=list(EPOCHS), help="training lengths (epochs per task)")
    p.add_argument("--out", required=True, help="study folder (the shipped one: results/tosca/mechanism)")
    return p


def main(argv=None, prog: str = "lab tosca study mechanism", derive=None) -> int:
    """Run the study; ``derive(folder)`` then writes its summary, verdicts and README (the command line
    passes :func:`lab.experiments.tosca.mechanism_views.write_derived`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(prog).parse_args(argv)
    try:
        return _main(args, argv, prog, derive)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; finished runs are kept in {scratch()} and skipped when the same command "
              "runs again", file=sys.stderr)
        return 130
    except (ValueError, KeyError, OSError) as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


def _check(args) -> None:
    from lab import _validate as V
    from lab.data import datasets

    for e in args.epochs:
        V.count("--epochs", e, maximum=100_000)
    for s in args.seeds:
        V.seed("--seeds", s)
    for x in args.l1:
        V.number("--l1", x, ge=0, le=10)
    if len(set(args.seeds)) < 2:
        raise V.bad("--seeds", " ".join(map(str, args.seeds)), "give at least two seeds (intervals are over seeds)")
    if 0.0 not in args.l1:
        raise V.bad("--l1", " ".join(map(str, args.l1)), "include 0: every L1 strength is compared with none")
    valid = set(datasets.list_datasets())
    for scn in args.scenarios:
        for part in scn.split("+"):
            if part not in valid:
                raise V.bad("--scenarios", scn, f"unknown dataset {part!r}; valid: {', '.join(sorted(valid))}")
    V.out_dir("--out", args.out)


def _main(args, argv, prog, derive=None) -> int:
    import pandas as pd
    import torch

    from lab import _io, executors

    from .study import _digest, _write_csv, machine, sources_sha256

    _check(args)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vs = variants(args.scenarios, args.seeds, sorted(set(args.l1)), sorted(set(args.epochs)))
    sources = {k: h for k, h in sources_sha256(()).items()     # what makes the numbers (SOURCES), this file included
               if not k.startswith("lab/experiments/tosca/") or k.rsplit("/", 1)[1] in SOURCES}
    t0 = time.perf_counter()
    jobs = [executors.Job(executors.key(f"{v.scenario}-s{v.seed}-e{v.epochs}-l1{v.l1:g}", v), _job, v) for v in vs]
    results = executors.run(jobs, executor="local", results_dir=scratch() / _digest(sources), log=print)
    wall = time.perf_counter() - t0
    keys = [{k: getattr(v, k) for k in ("scenario", "seed", "l1", "epochs")} for v in vs]
    tables = {"runs.csv": pd.DataFrame([{**k, **r["run"]} for k, r in zip(keys, results)]),
              "modules.csv": pd.DataFrame([{**k, **m} for k, r in zip(keys, results) for m in r["modules"]]),
              "parts.csv": pd.DataFrame([{**k, **m} for k, r in zip(keys, results) for m in r["parts"]]),
              "pairs.csv": pd.DataFrame([{**k, **m} for k, r in zip(keys, results) for m in r["pairs"]])}
    for name, df in tables.items():
        _write_csv(out / name, df)
    manifest = {"command": f"{prog} " + " ".join(argv), "scenarios": list(args.scenarios), "seeds": list(args.seeds),
                "l1": sorted(set(args.l1)), "epochs": sorted(set(args.epochs)),
                "measures": {"threshold": THRESHOLD, "top": TOP, "active_min": ACTIVE_MIN, "open": OPEN, "closed": CLOSED,
                             "null_draws": NULL_DRAWS},
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                "executor": "local", "engine": ENGINE, "wall_seconds": round(wall, 1),
                "run_seconds": round(float(tables["runs.csv"].train_s.sum()), 1), "runs": len(vs),
                "sources_sha256": sources, "variant": asdict(vs[0])}
    from lab import _manifest

    _io.write_json(out / "manifest.json", {**manifest, "sha256": _manifest.digests(out, TABLES)})
    if derive is not None:
        derive(out)                # summary, verdicts, README: from the tables alone (rewritable by themselves)
    print(f"wrote {out}/: {', '.join(TABLES)}, summary.csv, verdicts.csv, README.md, manifest.json ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m lab.experiments.tosca.mechanism"))   # then: python -m ...mechanism_views
