"""AWARe metrics on hand-made inputs."""
import math

import pytest
import torch

from lab.aware import metrics as M


def test_r_e_h():
    assert M.retention(0.8, 0.6) == pytest.approx(75.0)
    assert math.isnan(M.retention(0.0, 0.5))
    assert M.efficiency(0.45, 0.5) == pytest.approx(90.0)
    assert M.h_score(75.0, 90.0) == pytest.approx(2 * 75 * 90 / 165)
    assert M.h_score(0.0, 0.0) == 0.0
    # paper's IconQA summary: R 98.4, E 108.4 -> H 103.2
    assert M.h_score(98.4, 108.4) == pytest.approx(103.2, abs=0.05)
    assert M.mean_retention({"a": 0.5, "b": 0.8}, {"a": 0.25, "b": 0.8}) == pytest.approx(75.0)


def test_continual_metrics():
    acc = [[0.9], [0.6, 0.8], [0.3, 0.5, 0.7]]
    assert M.stage_averages(acc) == pytest.approx([0.9, 0.7, 0.5])
    assert M.last(acc) == pytest.approx(0.5)
    assert M.average_over_stages(acc) == pytest.approx(0.7)
    assert M.bwt(acc) == pytest.approx(((0.3 - 0.9) + (0.5 - 0.8)) / 2)
    assert math.isnan(M.bwt([[0.5]]))  # undefined with one stage (lab.metrics)
    with pytest.raises(ValueError):
        M.stage_averages([[0.5], []])


def test_mask_overlap():
    a = {"l": torch.tensor([1, 1, 0, 0], dtype=torch.bool)}
    b = {"l": torch.tensor([1, 0, 1, 0], dtype=torch.bool)}
    o = M.mask_overlap(a, b)
    assert o["jaccard"] == pytest.approx(1 / 3) and o["overlap"] == pytest.approx(0.5)
    assert M.mask_overlap(a, a)["jaccard"] == 1.0
