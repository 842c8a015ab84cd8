"""The lab's one rule for uncertainty: a 95 % t-interval over per-seed values.

A seed is the unit that varies (the model's initialisation, the data order, a random selection), so
an interval over seeds says how the number would move on a rerun. At 3-5 seeds a percentile bootstrap
that resamples the seeds is far too narrow (it has only 3-5 distinct values to draw, and ignores
that the spread itself is estimated); Student's t does not: ``mean +- t(0.975, n-1) * sd / sqrt(n)``.
A difference between two things measured on the same seeds is computed per seed first (paired),
then given the same interval. ``tests/test_stats.py`` checks the coverage of the 95 % interval on
synthetic studies with a known mean at 3 and 5 seeds.

Verdicts read off an interval (:func:`verdict`): *reproduced* / *contradicted* when the interval
excludes zero on the side a claim predicts or the other, *no difference detected* when it spans zero.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

KIND = "95 % t-interval over per-seed values (differences paired by seed)"


def t_quantile(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def t_interval(values: Iterable[float]) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of the 95 % t-interval over ``values`` (NaNs dropped); with one value the
    interval is unknown (NaN bounds), with none everything is NaN."""
    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], float)
    if len(v) == 0:
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if len(v) < 2:
        return m, math.nan, math.nan
    half = t_quantile(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return m, m - half, m + half


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The t-interval of ``a - b`` seed by seed (``a[i]`` and ``b[i]`` from the same seed; a pair
    with a NaN is dropped)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same seeds: {len(a)} vs {len(b)}")
    return t_interval(x - y for x, y in zip(a, b) if not (math.isnan(x) or math.isnan(y)))


def verdict(lo: float, hi: float, *, expect: str = "higher") -> str:
    """What an interval of a difference says about a claim that it is ``expect`` ("higher" or
    "lower") than zero: reproduced, contradicted, or no difference detected."""
    if expect not in ("higher", "lower"):
        raise ValueError("expect is 'higher' or 'lower'")
    if math.isnan(lo) or math.isnan(hi):
        return "not enough seeds"
    if lo > 0:
        return "reproduced" if expect == "higher" else "contradicted"
    if hi < 0:
        return "reproduced" if expect == "lower" else "contradicted"
    return "no difference detected"


def direction(lo: float, hi: float) -> str:
    """A difference's interval in words, with no claim attached: higher, lower or no difference detected."""
    if math.isnan(lo) or math.isnan(hi):
        return "not enough seeds"
    return "higher" if lo > 0 else "lower" if hi < 0 else "no difference detected"
