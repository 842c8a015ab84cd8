"""The shared continual-learning metrics (lab.metrics) on a hand-computed accuracy matrix, and the
two methods' views of them (lab.tosca.metrics in percent, lab.aware.metrics in fractions)."""
import math

import numpy as np
import pytest

from lab import metrics as M
from lab.aware import metrics as AM
from lab.tosca import metrics as TM

nan = float("nan")
# R[i, b]: accuracy (%) on task i after stage b; 3 tasks, 3 stages.
R = np.array([[90.0, 60.0, 30.0],
              [nan, 80.0, 50.0],
              [nan, nan, 70.0]])


def test_matrix_from_columns_and_from_stage_rows_agree():
    cols = [[90.0, nan, nan], [60.0, 80.0, nan], [30.0, 50.0, 70.0]]
    np.testing.assert_array_equal(M.accuracy_matrix(cols), R)
    np.testing.assert_array_equal(M.from_stage_rows([[90.0], [60.0, 80.0], [30.0, 50.0, 70.0]]), R)
    with pytest.raises(ValueError, match="stage 1 row"):
        M.from_stage_rows([[0.5], []])
    with pytest.raises(ValueError, match="empty"):
        M.from_stage_rows([])


def test_hand_computed_values():
    # stage averages: 90, (60+80)/2 = 70, (30+50+70)/3 = 50
    np.testing.assert_allclose(M.stage_averages(R), [90.0, 70.0, 50.0])
    assert M.average_incremental_accuracy([90.0, 70.0, 50.0]) == pytest.approx(70.0)
    assert M.last_accuracy([90.0, 70.0, 50.0]) == 50.0
    # forgetting: task 0 best 90 (stages 0..1) -> 30: 60; task 1 best 80 -> 50: 30; mean 45
    assert M.forgetting(R) == pytest.approx(45.0)
    # BWT: (30 - 90) + (50 - 80) = -90, over 2 tasks
    assert M.backward_transfer(R) == pytest.approx(-45.0)
    # sample-weighted A_b with 10 / 30 / 60 test samples per task
    np.testing.assert_allclose(M.stage_accuracies(R, [10, 30, 60]),
                               [90.0, (600 + 2400) / 40, (300 + 1500 + 4200) / 100])


def test_forgetting_uses_the_best_earlier_accuracy_and_bwt_can_be_positive():
    R2 = np.array([[50.0, 70.0, 60.0], [nan, 40.0, 60.0], [nan, nan, 80.0]])
    assert M.forgetting(R2) == pytest.approx(((70 - 60) + (40 - 60)) / 2)
    assert M.backward_transfer(R2) == pytest.approx(((60 - 50) + (60 - 40)) / 2)


def test_single_stage_is_nan_not_zero():
    one = np.array([[75.0]])
    assert math.isnan(M.forgetting(one)) and math.isnan(M.backward_transfer(one))
    assert math.isnan(AM.bwt([[0.75]]))
    assert TM.summarize(one, [75.0])["last_acc"] == 75.0 and math.isnan(TM.summarize(one, [75.0])["bwt"])


def test_both_methods_give_the_shared_numbers_in_their_own_unit():
    acc = [[0.9], [0.6, 0.8], [0.3, 0.5, 0.7]]  # AWARe: fractions, stage-major
    assert AM.stage_averages(acc) == pytest.approx([0.9, 0.7, 0.5])
    assert AM.average_over_stages(acc) == pytest.approx(M.average_incremental_accuracy(M.stage_averages(R)) / 100)
    assert AM.last(acc) == pytest.approx(0.5)
    assert AM.bwt(acc) == pytest.approx(M.backward_transfer(R) / 100)
    s = TM.summarize(R, [90.0, 70.0, 50.0])  # TOSCA: percent
    assert s == pytest.approx({"avg_inc_acc": 70.0, "last_acc": 50.0, "forgetting": 45.0, "bwt": -45.0})
    assert TM.accuracy_matrix is M.accuracy_matrix and TM.backward_transfer is M.backward_transfer


def test_wilson_interval_hand_computed_and_in_the_accuracy_unit():
    from lab.metrics import wilson_interval
    from lab.report import accuracy_with_interval, with_interval

    # p = 0.761 on n = 1000: centre (p + z²/2n)/(1 + z²/n), half z·sqrt(p(1-p)/n + z²/4n²)/(1 + z²/n)
    lo, hi = wilson_interval(0.761, 1000)
    assert lo == pytest.approx(0.73360, abs=1e-5) and hi == pytest.approx(0.78640, abs=1e-5)
    assert wilson_interval(76.1, 1000, percent=True) == pytest.approx((73.360, 78.640), abs=1e-3)
    assert wilson_interval(1.0, 10) == pytest.approx((0.72246, 1.0), abs=1e-5)   # never above 1, never 1 wide
    assert wilson_interval(0.0, 10)[0] == 0.0
    assert accuracy_with_interval(76.1, 1000) == "76.1 [73.4, 78.6]"
    assert with_interval(float("nan"), 0, 1) == "n/a"
    assert with_interval(74.04, float("nan"), float("nan")) == "74.0 [no interval]"   # one seed: no interval
    for bad in (dict(accuracy=1.2, n=10), dict(accuracy=0.5, n=0), dict(accuracy=50, n=10)):
        with pytest.raises(ValueError):
            wilson_interval(bad["accuracy"], bad["n"])
