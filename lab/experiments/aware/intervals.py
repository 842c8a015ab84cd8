"""95 % intervals for the AWARe study: a paired, two-level bootstrap over test questions and seeds.

Every run of the study stores which test questions it answered correctly (``answers`` table). One
bootstrap replicate draws

1. the seeds, with replacement (``k`` of the ``k`` seeds), and
2. for every evaluation set, its questions with replacement — the *same* draw for every seed and
   every method, because every run is scored on the same fixed questions (the study is paired).

Accuracies, R (retention against the base model's accuracy on the same resampled questions), E
(against full fine-tuning of the same seed) and H are recomputed on every replicate, then averaged
over the drawn seeds. The interval is the 2.5-97.5 percentile range of ``B`` replicates; a
difference between two variants is computed inside each replicate, so its interval is paired.
Replicate 0 is the observed data (all weights 1): its value is the point estimate, the mean over
seeds of the per-seed number, so the same code gives estimates and intervals.

The formulas are those of :mod:`lab.aware.metrics` written for arrays (R = 100 after/before,
averaged over upstream skills; E = 100 method/full; H = 2RE/(R+E)); the tests check that replicate
0 equals :mod:`lab.aware.metrics` on the observed accuracies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

KIND = ("paired bootstrap, 95 % percentile interval: questions resampled within each evaluation set "
        "(the same draw for every run) and seeds resampled with replacement")


@dataclass(frozen=True)
class Draws:
    """Bootstrap weights: ``seeds [B+1, k]`` and ``questions[set] [B+1, n]`` (row 0: all ones)."""

    seeds: tuple[int, ...]
    seed_w: np.ndarray
    question_w: Mapping[str, np.ndarray]

    @property
    def replicates(self) -> int:
        return self.seed_w.shape[0] - 1


def draw(seeds: Sequence[int], set_sizes: Mapping[str, int], *, replicates: int = 2000, rng_seed: int = 0) -> Draws:
    """Multinomial resampling weights for ``seeds`` and each evaluation set of ``set_sizes``."""
    if replicates < 1:
        raise ValueError("replicates must be >= 1")
    rng = np.random.default_rng(rng_seed)
    k = len(seeds)
    if k == 0:
        raise ValueError("no seeds to resample")

    def weights(n: int) -> np.ndarray:
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(float) if n else np.zeros((replicates, 0))
        return np.vstack([np.ones((1, n)), w])

    seed_w = weights(k)
    qw = {name: weights(int(n)) for name, n in sorted(set_sizes.items())}
    return Draws(tuple(int(s) for s in seeds), seed_w, qw)


def accuracy(d: Draws, set_name: str, correct) -> np.ndarray:
    """``[B+1]`` accuracies of one run's 0/1 ``correct`` vector on ``set_name`` under every replicate."""
    w = d.question_w[set_name]
    c = np.asarray(correct, float)
    if c.shape[0] != w.shape[1]:
        raise ValueError(f"{set_name}: {c.shape[0]} answers, but the draw has {w.shape[1]} questions")
    return (w @ c) / max(w.shape[1], 1)


def retention(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """100 * after / before, elementwise (NaN where before is 0): :func:`lab.aware.metrics.retention`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(before > 0, 100.0 * after / before, np.nan)


def h_score(r: np.ndarray, e: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(r + e > 0, 2 * r * e / (r + e), np.nan)


def over_seeds(d: Draws, per_seed: Mapping[int, np.ndarray]) -> np.ndarray:
    """Mean over the drawn seeds of per-seed ``[B+1]`` values (seeds missing from ``per_seed``: an error)."""
    missing = set(d.seeds) - set(per_seed)
    if missing:
        raise ValueError(f"no result for seeds {sorted(missing)}")
    stack = np.stack([per_seed[s] for s in d.seeds], axis=1)            # [B+1, k]
    return (stack * d.seed_w).sum(1) / d.seed_w.sum(1)


def summarise(values: np.ndarray) -> dict:
    """``{estimate, lo, hi}`` from ``[B+1]`` replicate values (row 0 the estimate)."""
    boot = values[1:]
    boot = boot[np.isfinite(boot)]
    lo, hi = (np.percentile(boot, [2.5, 97.5]) if boot.size else (np.nan, np.nan))
    return {"estimate": float(values[0]), "lo": float(lo), "hi": float(hi)}


def spans_zero(lo: float, hi: float) -> bool:
    return not (lo > 0 or hi < 0)


def verdict(name_a: str, name_b: str, diff: Mapping, metric: str, unit: str = "") -> str:
    """Words for a paired difference ``a - b`` with its interval: which is higher, or "no difference
    detected" when the interval spans zero."""
    d, lo, hi = diff["estimate"], diff["lo"], diff["hi"]
    if not np.isfinite(d):
        return f"{metric}: {name_a} vs {name_b} not measured"
    ci = f"{d:+.1f}{unit} [{lo:+.1f}, {hi:+.1f}]"
    if spans_zero(lo, hi):
        return f"{metric}: no difference detected between {name_a} and {name_b} ({name_a} − {name_b} = {ci})"
    word = "higher" if d > 0 else "lower"
    return f"{metric}: {name_a} is {word} than {name_b} ({name_a} − {name_b} = {ci})"


ACCURACIES = ("downstream",)    # metrics in [0, 1] whose differences read in percentage points


def metric_verdict(name_a: str, name_b: str, diff: Mapping, metric: str) -> str:
    """:func:`verdict` with an accuracy's difference in points (``ACCURACIES``), every other metric as is."""
    k, unit = (100, " pts") if metric in ACCURACIES else (1, "")
    return verdict(name_a, name_b, {x: k * diff[x] for x in ("estimate", "lo", "hi")}, metric, unit)


def fmt(s: Mapping, digits: int = 1) -> str:
    """``'88.7 [83.0, 93.1]'``."""
    if not np.isfinite(s["estimate"]):
        return "n/a"
    return f"{s['estimate']:.{digits}f} [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"
