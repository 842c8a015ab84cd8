"""The exercises (lab.exercises): every notebook has a few of each kind, every solution passes its own
checker and a wrong answer fails, on hand-made objects shaped as the notebooks' own; the checker never
shows the answer; the notebooks that carry their exercise cells state each prompt as registered and
pass the objects the answer reads. (Each exercise is also checked on a notebook's real data: a
`lab report --solutions` run fails a notebook whose exercise rejects its own solution, see
test_report_readable.)"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch

from lab import exercises as E

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {p.stem[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
WITH_CELLS = ("00", "01", "02", "03", "04", "05")   # every notebook: its exercise cells are in place


# --- hand-made objects, shaped as each notebook's --------------------------------------------------
def _nb00():
    from lab import probes

    g = torch.Generator().manual_seed(0)
    means = 3 * torch.randn(4, 8, generator=g)
    ytr, yte = torch.arange(200) % 4, torch.arange(80) % 4
    train = SimpleNamespace(features=means[ytr] + torch.randn(200, 8, generator=g), labels=ytr)
    test = SimpleNamespace(features=means[yte] + 1.5 * torch.randn(80, 8, generator=g), labels=yte)
    protos = probes.prototypes(train.features, train.labels)
    pred = probes.prototype_predict(protos, test.features)
    per_class = probes.per_class_accuracy(pred, test.labels, ["T-shirt/top", "Trouser", "Pullover", "Dress"])
    return dict(bb=SimpleNamespace(feature_dim=1280), train=train, test=test, protos=protos, per_class=per_class,
                accuracy=float((pred == test.labels).float().mean()))


def _nb01():
    stages = ["stem", "stage1", "stage2", "head"]
    probe = pd.DataFrame({"stage": stages, "depth": range(4), "dim": [16, 24, 40, 1280],
                          "linear_probe": [0.4, 0.7, 0.82, 0.8], "prototype": [0.3, 0.6, 0.7, 0.72]})
    cka = pd.DataFrame(np.array([[1, .8, .5, .31], [.8, 1, .7, .5], [.5, .7, 1, .8], [.31, .5, .8, 1]]),
                       index=stages, columns=stages)
    drift = pd.DataFrame({"stage": stages * 2 + ["decision point"] * 2,
                          "method": ["full fine-tuning"] * 4 + ["TOSCA"] * 4 + ["full fine-tuning", "TOSCA"],
                          "cka": [.99, .95, .9, .6, 1, 1, 1, 1, .6, .3]})
    adapt = pd.DataFrame({"method": ["full fine-tuning", "TOSCA"], "trained parameters": [3_400_000, 160_000]})
    return dict(probe=probe, cka=cka, drift=drift, adapt=adapt)


def _nb02():
    summary = pd.DataFrame({"method (routing)": ["tosca (per-sample)", "tosca (oracle)", "simplecil (single)"],
                            "last_acc": [61.2, 80.4, 70.0]})
    tosca_matrix = pd.DataFrame([[90.0, 80.0, 70.5], [np.nan, 88.0, 75.0], [np.nan, np.nan, 85.0]])
    by_order = pd.DataFrame({"order": ["class-ordered", "shuffled"] * 2, "batch_size": [1, 1, 48, 48],
                             "accuracy": [61.2, 61.2, 75.0, 30.1]})
    off = pd.DataFrame({"task_i": [0, 1], "task_j": [1, 0], "jaccard": [0.12, 0.10]})
    return dict(summary=summary, tosca_matrix=tosca_matrix, by_order=by_order, off=off)


def _nb03():
    sys.path.insert(0, str(ROOT / "tests" / "experiments" / "aware"))
    from test_aware_views import study   # hand-made saliency profiles of the views' tests
    from lab.experiments.aware.study import profile_tables as tables

    s = study()
    reference = s.labels[0]
    selections = {"global": s.select(reference, 0.3), "balanced": s.select(reference, 0.3, "activation-balanced")}
    agreement, _ = tables.calibration_agreement(s, 0.3, reference)
    return dict(study=s, reference=reference, selections=selections, agreement=agreement)


def _nb04():
    runs = pd.DataFrame([{"variant": f"methods/{m}", "method": m, "seed": seed, "scale": scale,
                          "downstream": 0.3 + 0.1 * k, "R": r - 10 * k - seed, "R_easy_vqa": r - 15 * k,
                          "R_probe": 100 + k}
                         for m, r in (("full", 95.0), ("lora", 97.0)) for seed in (1, 0)
                         for k, scale in enumerate((1 / 9, 1 / 3, 1.0, 3.0))])
    baselines = pd.DataFrame({"set": ["downstream (fashion)", "downstream (fashion)", "easy_vqa"],
                              "reference": ["most common answer", "zero-shot", "most common answer"],
                              "acc": [0.1275, 0.1025, 0.368]})
    return dict(study={"runs": runs, "baselines": baselines})


def _nb05():
    from lab.experiments.tosca import compare
    from lab.experiments.tosca.run import RunConfig

    rng = np.random.default_rng(0)
    routers = ["prototype-check", "per-sample", "energy", "ncm", "oracle"]
    base = {"prototype-check": 72, "per-sample": 60, "energy": 61, "ncm": 71, "oracle": 90}
    rows = [{"seed": s, "router": r, "source": "built-in", "role": "yours" if r == "prototype-check" else "built-in",
             "avg_inc_acc": base[r] + 5 + rng.normal(), "last_acc": base[r] + rng.normal(),
             "routing_accuracy_last": base[r] - 5 + rng.normal()} for s in (1993, 1994, 1995) for r in routers]
    comp = compare.Comparison(pd.DataFrame(rows), ("prototype-check",), tuple(routers[1:]), RunConfig())
    mine = "prototype-check"
    return dict(comp=comp, mine=mine, diffs={mine: compare.differences(comp, mine, ["per-sample", "energy", "ncm"])})


DATA = {"00": _nb00, "01": _nb01, "02": _nb02, "03": _nb03, "04": _nb04, "05": _nb05}


@pytest.fixture(scope="module")
def data():
    cache = {}

    def get(nb: str) -> dict:
        if nb not in cache:
            cache[nb] = DATA[nb]()
        return cache[nb]

    return get


# --- the registry ------------------------------------------------------------------------------------
def test_every_notebook_has_three_to_five_exercises_of_every_kind():
    for nb in NOTEBOOKS:
        ids = E.list_exercises(nb)
        assert 3 <= len(ids) <= 5, (nb, ids)
        assert {E.get(i).kind for i in ids} == set(E.KINDS), f"{nb}: a value to compute, a prediction, a reading"
        assert all(E.get(i).notebook == NOTEBOOKS[nb].stem for i in ids)
    assert E.list_exercises()[:2] == ["00.1", "00.2"] and "10.1" not in E.list_exercises()


def test_unknown_exercise_lists_the_valid_ones():
    with pytest.raises(KeyError, match="valid: 00.1, 00.2"):
        E.get("09.9")


def test_a_missing_object_is_named():
    with pytest.raises(TypeError, match=r"needs train, test .*train=train, test=test"):
        E.solution("00.3")


@pytest.mark.parametrize("id", E.list_exercises())
def test_the_solution_passes_its_checker_and_a_wrong_answer_fails(id, data, capsys):
    d = data(id[:2])
    right = E.solution(id, **d)
    assert E.is_right(id, right, **d)
    assert not E.is_right(id, E.wrong_answer(id, **d), **d)
    assert not E.is_right(id, None, **d)
    ex = E.get(id)
    if isinstance(right, str):
        assert right in ex.valid(**d), (right, ex.valid(**d))          # the answer is one of the options shown
        assert E.is_right(id, f"  {right.upper()} ", **d)               # case and spaces do not matter
    else:
        assert E.is_right(id, str(right), **d)                          # typed as text, still a number
        assert np.isfinite(float(right))


@pytest.mark.parametrize("id", E.list_exercises())
def test_the_checker_never_shows_the_answer(id, data, capsys, monkeypatch):
    monkeypatch.delenv("LAB_REPORT_SOLUTIONS", raising=False)
    d = data(id[:2])
    right = E.solution(id, **d)
    for answer in (None, E.wrong_answer(id, **d), right, "not a number"):
        E.check(id, answer, **d)
    said = capsys.readouterr().out
    assert said.count("Right.") == 1 and said.count("Not yet.") == 2 and "no answer yet" in said
    shown = E._shown(right, E.get(id))
    if isinstance(right, str):   # a line may name the answer only beside every other option (a hint's "more or less")
        opts = E.get(id).valid(**d)
        named = lambda w, ln: re.search(rf"\b{re.escape(w)}\b", ln, re.I)  # noqa: E731
        for ln in said.splitlines():
            if "Right." not in ln and named(right, ln):
                assert all(named(o, ln) for o in opts), ln
    else:
        assert shown.split()[0] not in said, said


def test_solutions_show_only_in_a_solutions_run(data, capsys, monkeypatch):
    d = data("00")
    monkeypatch.setenv("LAB_REPORT_SOLUTIONS", "1")
    E.check("00.1", None, **d)
    assert "Solution 00.1: 1,280 numbers." in capsys.readouterr().out
    monkeypatch.setenv("LAB_REPORT_SOLUTIONS", "0")
    E.check("00.1", None, **d)
    assert "Solution" not in capsys.readouterr().out


def test_a_solutions_run_fails_an_exercise_that_rejects_its_own_solution(monkeypatch):
    @E.register("00.9", notebook="00_quickstart", kind="read", prompt="p", hint="h", tol=-1.0)  # nothing passes
    def _broken(bb):
        return 1.0

    try:
        monkeypatch.setenv("LAB_REPORT_SOLUTIONS", "1")
        with pytest.raises(AssertionError, match="00.9"):
            E.check("00.9", None, bb=None)
    finally:
        del E._EXERCISES["00.9"]


# --- the notebooks ----------------------------------------------------------------------------------
def _cells(nb: str):
    return nbformat.read(NOTEBOOKS[nb], as_version=4).cells


@pytest.mark.parametrize("nb", WITH_CELLS)
def test_the_notebook_states_each_prompt_and_checks_with_the_objects_it_needs(nb):
    cells = _cells(nb)
    for id in E.list_exercises(nb):
        ex = E.get(id)
        i = next((k for k, c in enumerate(cells) if c.cell_type == "markdown"
                  and c.source.strip() == E.prompt_markdown(id)), None)
        assert i is not None, f"{nb}: no markdown cell states exercise {id} as registered"
        code = cells[i + 1]
        assert code.cell_type == "code" and "exercise" in code.metadata.get("tags", [])
        call = re.search(rf'exercises\.check\("{re.escape(id)}", (\w+)((?:, \w+=\w+)*)\)', code.source)
        assert call, code.source
        assert re.search(rf"^{call.group(1)} = None\b", code.source, re.M), "the answer starts as None"
        passed = dict(kv.split("=") for kv in call.group(2).split(", ")[1:])
        assert passed == {n: n for n in ex.needs}, (id, passed, ex.needs)


@pytest.mark.parametrize("nb", WITH_CELLS)
def test_exercises_come_last_before_the_headline_numbers(nb):
    cells = _cells(nb)
    first = next(k for k, c in enumerate(cells) if c.source.startswith("## Exercises"))
    assert "report.record" in cells[-1].source and first < len(cells) - 1     # the headline cell is the last
    assert all("## " not in c.source for c in cells[first + 1:] if c.cell_type == "markdown")
