"""The mechanism study: its measures on hand-made inputs, the permutation null, the verdict rules on
synthetic studies, one run on synthetic features, and the shipped study (results/tosca/mechanism)
whole and consistent with its tables."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.experiments.tosca import mechanism as M
from lab.experiments.tosca import mechanism_results as MR
from lab.experiments.tosca import mechanism_views as MV
from lab.experiments.tosca._synthetic import synthetic_data

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "results" / "tosca" / "mechanism"


# --- measures ------------------------------------------------------------------------------------
def test_weight_sparsity_pools_the_weight_matrices_and_leaves_biases_apart():
    parts = [{"task": 0, "part": "adapter down", "kind": "weight", "numel": 300, "near_zero": 0.5},
             {"task": 0, "part": "calibrator up", "kind": "weight", "numel": 100, "near_zero": 1.0},
             {"task": 0, "part": "adapter up bias", "kind": "bias", "numel": 1000, "near_zero": 1.0},
             {"task": 0, "part": "LayerNorm shift", "kind": "layernorm", "numel": 1000, "near_zero": 1.0}]
    assert M.weight_sparsity(parts) == {0: pytest.approx((150 + 100) / 400)}


def test_the_study_trains_with_the_shipped_tosca_studys_engine():
    from lab.experiments.tosca.study import STUDY_ENGINE

    assert M.ENGINE == STUDY_ENGINE and M.Variant("s", 1, 0.0, 1).engine == M.ENGINE


def test_every_luca_parameter_has_a_part_and_a_kind():
    from lab.tosca.luca import LuCA

    names = {n for n, _ in LuCA(32).named_parameters()}
    assert names == set(M.PARTS)
    assert {k for _, k in M.PARTS.values()} == {"weight", "bias", "layernorm"}
    assert sum(k == "weight" for _, k in M.PARTS.values()) == 4


def test_active_sets_take_the_largest_departures_above_the_floor():
    centred = np.zeros((2, 20))
    centred[0, [3, 7]] = [0.2, -0.3]          # two clear departures
    centred[1, 5] = 0.005                      # below the 0.01 floor: not active
    sets = M.active_sets(centred, top=0.1, minimum=0.01)   # k = 2
    assert sets[0].tolist() == [3, 7] and sets[1].tolist() == []


def test_overlap_against_the_permutation_null():
    d = 200
    centred = np.zeros((3, d))
    centred[:, :20] = 0.1                      # three tasks, the same 20 dimensions, the same direction
    same = [np.arange(20)] * 3
    pairs, run = M.overlap_null(centred, same, draws=300, seed=0)
    assert run["jaccard"] == 1 and run["jaccard"] > run["jaccard_null_hi"] and run["jaccard_p_below"] == 1
    assert run["jaccard_null"] == pytest.approx(20 / (2 * d - 20), abs=0.01)   # E|A∩B| / |A∪B| for random sets
    assert run["cosine"] == pytest.approx(1) and run["cosine"] > run["cosine_null_hi"]
    assert len(pairs) == 3 and all(p["jaccard"] == 1 for p in pairs)
    disjoint = [np.arange(20 * t, 20 * (t + 1)) for t in range(3)]
    shifted = np.zeros((3, d))
    for t, s in enumerate(disjoint):
        shifted[t, s] = 0.1
    _, run = M.overlap_null(shifted, disjoint, draws=300, seed=0)
    assert run["jaccard"] == 0 and run["jaccard_p_below"] < 0.05 and run["cosine"] == pytest.approx(0)


def test_a_module_without_active_dimensions_has_no_overlap():
    centred = np.zeros((2, 50))
    centred[0, :5] = 0.2
    pairs, run = M.overlap_null(centred, [np.arange(5), np.array([], int)], draws=50, seed=0)
    assert math.isnan(pairs[0]["jaccard"]) and math.isnan(run["jaccard"]) and math.isnan(run["cosine"])


def test_one_run_on_synthetic_features_is_the_harness_run(tmp_path):
    """The study trains as `lab tosca` does: the same seed and config give the same A_B and Ā."""
    from lab.experiments.tosca.run import RunConfig, run

    data = synthetic_data(num_tasks=3, dim=32, seed=3)
    v = M.Variant("fashion_mnist_mini", seed=1993, l1=5e-4, epochs=2)   # its features: data=
    out = M.run_one(v, data=data)
    ref = run(RunConfig(epochs=2, l1=5e-4, seed=1993, routings=("per-sample",), engine=M.ENGINE), data=data, runs_root=tmp_path,
              progress=False).summary.set_index("routing").loc["per-sample"]
    assert out["run"]["A_B"] == pytest.approx(ref.last_acc) and out["run"]["avg_inc_acc"] == pytest.approx(ref.avg_inc_acc)
    assert out["run"]["routing_accuracy"] == pytest.approx(100 * ref.routing_accuracy_last)
    assert len(out["modules"]) == 3 and len(out["pairs"]) == 3 and len(out["parts"]) == 3 * len(M.PARTS)
    assert 0 <= out["run"]["weight_near_zero"] <= 1 and out["run"]["gate_departure_init"] > 0
    json.dumps(out)                                                   # what an executor stores


# --- verdicts on synthetic studies ---------------------------------------------------------------
def _study(excess_by_l1: dict, *, seeds=(1, 2, 3, 4, 5), noise=0.002, routing=None) -> MR.Mechanism:
    rng = np.random.default_rng(0)
    rows = []
    for seed in seeds:
        for l1, ex in excess_by_l1.items():
            j = 0.05 + ex + noise * rng.standard_normal()
            rows.append({"scenario": "s", "seed": seed, "l1": l1, "epochs": 20, "jaccard": j, "jaccard_null": 0.05,
                         "jaccard_null_lo": 0.045, "jaccard_null_hi": 0.055, "cosine": 0.0, "cosine_null": 0.0,
                         "active_size": 128.0, "gate_departure": 0.05, "A_B": 70.0, "old_tasks_acc": 70.0,
                         "new_task_acc": 80.0,
                         "routing_accuracy": (routing or {}).get(l1, 70.0) + rng.standard_normal()})
    runs = pd.DataFrame(rows)
    return MR.Mechanism(Path("."), {}, runs, pd.DataFrame(), pd.DataFrame(), pd.DataFrame())


def _verdict(m, part):
    c = MR.claims(m)
    return c[c.claim.str.startswith(part)].iloc[0]


def test_less_overlap_than_chance_and_than_without_l1_is_reproduced():
    m = _study({0.0: 0.0, 5e-4: -0.02})
    c = _verdict(m, "L1 makes")
    assert c.verdict == "reproduced" and c.regimes == "L1 5e-4, 20 epochs"
    assert MR.shown_regime(m, "s") == (5e-4, 20)


def test_more_overlap_than_chance_and_than_without_l1_is_contradicted():
    m = _study({0.0: 0.0, 5e-4: 0.03})
    assert _verdict(m, "L1 makes").verdict == "contradicted"
    assert MR.shown_regime(m, "s") == MR.REFERENCE        # nowhere reproduced: the reference's regime


def test_below_chance_already_without_l1_is_not_l1s_doing():
    m = _study({0.0: -0.02, 5e-4: -0.02})
    assert _verdict(m, "L1 makes").verdict == "not detected"


def test_less_overlap_with_better_routing_is_reproduced():
    m = _study({0.0: 0.0, 1e-4: -0.01, 5e-4: -0.02, 1e-3: -0.03},
               routing={0.0: 60.0, 1e-4: 65.0, 5e-4: 70.0, 1e-3: 75.0})
    co = MR.correlation_tests(m).set_index("metric")
    assert co.loc["routing_accuracy", "verdict"] == "reproduced" and -1 <= co.loc["routing_accuracy", "lo"] < 0
    assert _verdict(m, "less overlap").verdict == "reproduced"


def test_l1_text_writes_strengths_as_a_reader_does():
    assert [MR.l1_text(x) for x in (0.0, 1e-4, 5e-4, 2e-3, 0.02)] == ["0", "1e-4", "5e-4", "2e-3", "2e-2"]


def test_the_command_line_answers_bad_input_in_one_line(capsys):
    assert M.main(["--out", "/tmp/x", "--seeds", "1993"]) == 2
    assert M.main(["--out", "/tmp/x", "--l1", "5e-4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("lab tosca study mechanism: error:") for e in err)


# --- the shipped study ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    if not (SHIPPED / "manifest.json").is_file():
        pytest.skip("no shipped mechanism study")
    return MR.load(SHIPPED)


def test_shipped_study_covers_what_it_claims(shipped):
    man, runs = shipped.manifest, shipped.runs
    assert man["command"].startswith("lab tosca study mechanism") and man["wall_seconds"] > 0
    assert man["engine"] == M.ENGINE
    assert man["date"] and man["machine"]["platform"] and man["sources_sha256"]
    assert len(shipped.seeds) >= 5 and set(shipped.scenarios) == set(M.SCENARIOS)
    assert 0.0 in man["l1"] and len(man["l1"]) >= 6 and 20 in man["epochs"] and max(man["epochs"]) > 20
    assert len(runs) == man["runs"] == len(shipped.seeds) * len(man["l1"]) * len(man["epochs"]) * len(shipped.scenarios)
    for scn in shipped.scenarios:   # past where the gates die: the strongest L1 leaves no active dimension
        assert MR.dead_from(shipped, scn, max(man["epochs"])) is not None


def test_shipped_derived_files_are_the_tables_read_back(shipped):
    assert (SHIPPED / "README.md").read_text() == MV.readme(shipped), \
        "results/tosca/mechanism/README.md out of date: python -m lab.experiments.tosca.mechanism_results"
    got = pd.read_csv(SHIPPED / "verdicts.csv")
    want = MR.verdicts(shipped)
    assert got.verdict.tolist() == want.verdict.tolist()
    assert set(got.verdict.str.split(" \\(").str[0]) <= {"reproduced", "contradicted", "not detected",
                                                          "no difference detected", "not enough seeds", "higher",
                                                          "lower"}
    summary = pd.read_csv(SHIPPED / "summary.csv")
    again = MR.summary(shipped)
    assert len(summary) == len(again)
    np.testing.assert_allclose(summary["mean"], again["mean"], atol=1e-3, equal_nan=True)


def test_dead_gates_get_no_overlap_verdict():
    m = _study({0.0: 0.0, 5e-4: 0.03, 2e-2: 0.4})
    m.runs.loc[m.runs.l1 == 2e-2, "gate_departure"] = 1e-4          # below DEAD: the gates select nothing
    ov = MR.overlap_tests(m).set_index("l1")
    assert not ov.loc[2e-2, "alive"] and ov.loc[2e-2, "vs_chance"] == "not enough seeds"
    assert MR.dead_from(m, "s", 20) == 2e-2 and _verdict(m, "L1 makes").regimes == "L1 5e-4, 20 epochs"
