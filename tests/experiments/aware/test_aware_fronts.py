"""Learning-rate fronts read at matched levels (lab.experiments.aware.study.fronts)."""
import math

import numpy as np

from lab.experiments.aware.study import fronts as F


def test_pareto_keeps_the_non_dominated_points_in_order():
    pts = [(0.2, 99.0), (0.5, 90.0), (0.4, 80.0), (0.8, 40.0), (0.7, 60.0), (0.6, 30.0)]
    assert F.pareto(pts) == [(0.2, 99.0), (0.5, 90.0), (0.7, 60.0), (0.8, 40.0)]


def test_retention_at_a_level_reads_the_learning_rate_path_and_stops_at_its_ends():
    pts = [(0.2, 100.0), (0.6, 80.0), (0.8, 40.0)]           # in learning-rate order
    assert math.isclose(F.retention_at(pts, 0.7), 60.0)
    assert F.retention_at(pts, 0.2) == 100.0
    assert math.isnan(F.retention_at(pts, 0.85)) and math.isnan(F.retention_at(pts, 0.1))
    # a path that turns back (a larger rate learning less) is read where it retains most
    back = [(0.2, 100.0), (0.8, 60.0), (0.6, 20.0)]
    assert math.isclose(F.retention_at(back, 0.7), 200 / 3)   # not 40, the later crossing
    assert math.isclose(F.downstream_at(pts, 60.0), 0.7)


def test_compare_pairs_by_seed_at_shared_levels_only():
    a = {s: [(0.3, 95.0 + s), (0.6, 85.0 + s), (0.8, 70.0 + s)] for s in range(3)}
    b = {s: [(0.3, 90.0 + s), (0.6, 80.0 + s), (0.7, 60.0 + s)] for s in range(3)}
    rows = F.compare(a, b, levels=(0.3, 0.6, 0.75))
    assert [r["level"] for r in rows] == [0.3, 0.6, None]       # 0.75: b never reaches it
    assert all(math.isclose(r["diff"], 5.0) for r in rows)
    # the same shift on every seed: a zero-width interval, a clear direction
    assert rows[0]["direction"] == "higher"
    assert "a above" in F.dominance(rows, "a", "b")


def test_easy_vqa_kinds_and_r_over_kinds():
    answers = ["yes", "no", "circle", "red", "triangle", "blue"]
    k = F.easy_kinds(answers)
    assert list(k) == ["yes/no", "yes/no", "shape", "colour", "shape", "colour"]
    base = {"down": [1, 0], "easy_vqa": [1, 1, 1, 1, 0, 1], "probe": [1, 1]}
    run = {"down": [1, 1], "easy_vqa": [1, 0, 1, 0, 0, 1], "probe": [1, 0]}
    m = F.run_metrics(run, base, k)
    assert m["downstream"] == 1.0
    assert m["R:yes/no"] == 50.0 and m["R:shape"] == 100.0 and m["R:colour"] == 50.0
    assert np.isclose(m["R"], (50 + 100 + 50) / 3) and m["R_probe"] == 50.0


def test_a_finding_without_a_shared_downstream_range_is_read_at_matched_retention():
    import pandas as pd

    from lab.experiments.aware.study import tables as T

    # a: learns little to much; b: its kept rates all learn more than 0.5 but never reach 0.6 on seed 2,
    # so no downstream level is shared on every seed, while retention 50-70 is: b learns less there
    rows = []
    for s in range(3):
        for scale, (d, r) in enumerate([(0.15, 98.0), (0.45, 85.0), (0.65, 70.0 + s), (0.75, 45.0)]):
            rows.append({"variant": "methods/aware", "seed": s, "scale": scale, "downstream": d, "R": r})
        for scale, (d, r) in enumerate([(0.52 + s / 100, 72.0), (0.58 + s / 100, 40.0)]):
            rows.append({"variant": "targets/x", "seed": s, "scale": scale + 1, "downstream": d, "R": r})
    comps = T.compare_rows(pd.DataFrame(rows), "AWARe vs targets/x", "methods/aware", "targets/x", (0, 1, 2))
    v, diff, lo, hi, k, read = T.finding_verdict(comps, "higher")
    assert read == T.DOWNSTREAM_READ and k == 3 and diff > 0 and lo > 0 and v == "reproduced"
    # a claim about retention itself keeps its own read: nothing to compare
    v, diff, *_, read = T.finding_verdict(comps, "higher", either_read=False)
    assert v.startswith("not comparable") and math.isnan(diff) and read == T.RETENTION_READ
    # an equivalence margin is in R points: no second read either
    assert T.finding_verdict(comps, "equivalent")[0].startswith("not comparable")
