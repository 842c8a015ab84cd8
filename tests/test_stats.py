"""The lab's one interval rule (lab.stats): its 95 % interval covers the true mean at the seed counts
the studies have, checked on synthetic studies whose mean and spread are known."""
import math

import numpy as np
import pytest

from lab import stats


def _coverage(draw, truth: float, n: int, studies: int = 4000, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    hit = 0
    for _ in range(studies):
        _, lo, hi = stats.t_interval(draw(rng, n))
        hit += lo <= truth <= hi
    return hit / studies


@pytest.mark.parametrize("n", [3, 5])
def test_t_interval_covers_a_known_mean_at_three_and_five_seeds(n):
    # per-seed values around a known mean with a known spread (a seed effect)
    cov = _coverage(lambda rng, k: rng.normal(0.7, 0.05, k), 0.7, n)
    assert cov >= 0.93, cov


@pytest.mark.parametrize("n", [3, 5])
def test_t_interval_covers_a_study_of_accuracies(n):
    # closer to the AWARe study: a seed effect on the log-odds, then 400 questions scored per seed
    def draw(rng, k):
        p = 1 / (1 + np.exp(-(1.0 + rng.normal(0, 0.3, k))))
        return rng.binomial(400, p) / 400
    rng = np.random.default_rng(99)
    truth = float(np.mean(1 / (1 + np.exp(-(1.0 + rng.normal(0, 0.3, 2_000_000))))))
    cov = _coverage(draw, truth, n)
    assert cov >= 0.93, cov


@pytest.mark.parametrize("n", [3, 5])
def test_paired_difference_covers_the_true_difference(n):
    def draw(rng, k):            # a shared seed effect that pairing removes
        shared = rng.normal(0, 0.1, k)
        return list(0.75 + shared + rng.normal(0, 0.02, k) - (0.70 + shared + rng.normal(0, 0.02, k)))
    assert _coverage(draw, 0.05, n) >= 0.93


def test_a_percentile_bootstrap_over_three_seeds_would_fail_this_check():
    """Why the rule is a t-interval: resampling 3 seeds with replacement covers far less than 95 %."""
    rng = np.random.default_rng(1)
    hit, studies = 0, 1000
    for _ in range(studies):
        v = rng.normal(0, 1, 3)
        boots = v[rng.integers(0, 3, (2000, 3))].mean(1)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        hit += lo <= 0 <= hi
    assert hit / studies < 0.85


def test_paired_differences_and_verdicts():
    m, lo, hi = stats.paired([1.0, 2.0, 3.0], [0.5, 1.4, 2.6])
    assert math.isclose(m, 0.5) and lo < 0.5 < hi
    assert stats.verdict(0.1, 0.9) == "reproduced" and stats.verdict(-0.9, -0.1) == "contradicted"
    assert stats.verdict(-0.1, 0.4) == "no difference detected"
    assert stats.verdict(-0.9, -0.1, expect="lower") == "reproduced"
    assert stats.t_interval([0.3])[1] != stats.t_interval([0.3])[1]      # one seed: no interval (NaN)
    with pytest.raises(ValueError):
        stats.paired([1.0], [1.0, 2.0])
