"""A sweep's variant file (``lab tosca --seeds ... --l1 ...``: ``<sweep>/variants/<key>.json``, one
variant's rows) that is empty, damaged or not this variant's is refused by name — one line that says
what is wrong with which file and how to go on — never taken as a finished variant: a sweep that took
``[]`` as done would return fewer seeds than it was asked for. Nothing in the sweep's folder changes
when a file is refused; once the file is removed, the resumed sweep runs that variant again and returns
every seed (lab/executors.py, lab/experiments/tosca/sweep.py).

One real sweep (MNIST-5k at 64 px, cached features, two seeds of one epoch) serves the table; each row
damages a copy of it and resumes it through the command line's entry point.
"""
from __future__ import annotations

import json
import random
import shutil

import pandas as pd
import pytest

from _report_helpers import hard_timeout

SCENARIO = ["--dataset", "mnist_5k", "--resolution", "64", "--inc", "5", "--epochs", "1",
            "--routings", "per-sample", "oracle", "--quiet"]
FIX = "remove it and the variant runs again"
pytestmark = hard_timeout(900)


def _rows(text: str) -> list[dict]:
    return json.loads(text)


# (what, the damage: own file's text and the other seed's -> new text, a fragment of the refusal)
DAMAGE = [
    ("an empty list", lambda own, other: "[]", "holds no rows (an empty list): it is not a finished variant"),
    ("an empty file", lambda own, other: "", "not a readable result ("),
    ("cut short mid-write", lambda own, other: own[: len(own) // 2], "not a readable result ("),
    ("random bytes", lambda own, other: random.Random(0).randbytes(300).decode("latin-1"), "not a readable result ("),
    ("a JSON null", lambda own, other: "null", "is not a variant's rows (a JSON null, not an array)"),
    ("an object around the rows", lambda own, other: json.dumps({"rows": _rows(own)}),
     "is not a variant's rows (a JSON object, not an array)"),
    ("the other seed's rows", lambda own, other: other, "its rows are not one per routing (oracle, per-sample) of "
                                                        "tosca on mnist_5k, seed 1, L1 0.0005"),
    ("one routing's row lost", lambda own, other: json.dumps(_rows(own)[:1]), "its rows are not one per routing"),
    ("a row of another L1", lambda own, other: json.dumps([{**r, "l1": 0.1} for r in _rows(own)]),
     "its rows are not one per routing"),
    ("a metric lost", lambda own, other: json.dumps([{k: v for k, v in r.items() if k != "avg_inc_acc"}
                                                     for r in _rows(own)]), "a row lacks a number for avg_inc_acc"),
    ("a metric as text", lambda own, other: json.dumps([{**r, "last_acc": "62.0"} for r in _rows(own)]),
     "a row lacks a number for last_acc"),
]


@pytest.fixture(scope="module")
def lab_main():
    from lab.cli import main

    return main


@pytest.fixture(scope="module")
def sweep(lab_main, tmp_path_factory):
    """A finished two-seed sweep's folder (its own runs dir)."""
    root = tmp_path_factory.mktemp("sweep")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_RUNS_DIR", str(root))
        assert lab_main(["tosca", *SCENARIO, "--seeds", "1", "2"]) == 0
    (folder,) = (root / "tosca-sweep").iterdir()
    assert len(list((folder / "variants").glob("*.json"))) == 2
    return folder


def _copy(sweep, tmp_path):
    out = tmp_path / "sweep"
    shutil.copytree(sweep, out)
    own = next((out / "variants").glob("tosca-s1-*.json"))
    other = next((out / "variants").glob("tosca-s2-*.json"))
    return out, own, other


def _files(folder) -> dict:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("what,damage,fragment", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_or_empty_variant_file_is_refused_by_name(what, damage, fragment, sweep, lab_main, capsys,
                                                            tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    out, own, other = _copy(sweep, tmp_path)
    own.write_bytes(damage(own.read_text(), other.read_text()).encode("latin-1"))
    before = _files(out)
    capsys.readouterr()
    assert lab_main(["tosca", "--resume", str(out)]) == 2, what
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"lab tosca: error: {own}: {fragment}") and err[0].endswith(FIX), (what, err[0])
    assert _files(out) == before, f"{what}: the refused sweep changed its folder"          # nothing ran


def test_after_the_refused_file_is_removed_the_sweep_returns_every_seed(sweep, lab_main, capsys, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    out, own, _ = _copy(sweep, tmp_path)
    own.write_text("[]")
    assert lab_main(["tosca", "--resume", str(out)]) == 2
    own.unlink()                                            # what the line says to do
    capsys.readouterr()
    assert lab_main(["tosca", "--resume", str(out)]) == 0
    assert capsys.readouterr().out.count("skipped") == 1    # the other seed was kept
    runs = pd.read_parquet(out / "runs.parquet")
    assert sorted(runs.seed.unique()) == [1, 2] and len(runs) == 2 * 2
    assert (pd.read_parquet(out / "summary.parquet").seeds == 2).all()
    assert len(_rows(own.read_text())) == 2                 # written again, whole


def test_the_executor_never_stores_a_result_its_check_refuses(tmp_path):
    """The same check guards a fresh result: an empty one is not written, so it cannot be taken as done."""
    from lab import executors

    jobs = [executors.Job(f"j{i}", _rows_of, i) for i in range(2)]

    def check(rows, n):
        return None if rows else "holds no rows (an empty list)"

    assert executors.run(jobs[1:], results_dir=tmp_path, check=check) == [[{"i": 0}]]
    with pytest.raises(RuntimeError, match=r"^variant j0: its result holds no rows \(an empty list\); nothing was "
                                           r"stored$"):
        executors.run(jobs, results_dir=tmp_path, check=check)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j1.json"]
    (tmp_path / "j1.json").write_text("[]")
    with pytest.raises(ValueError, match=rf"^{tmp_path}/j1.json: holds no rows \(an empty list\); {FIX}$"):
        executors.run(jobs[1:], results_dir=tmp_path, check=check)


def _rows_of(n):
    """``n`` rows (job 0: none)."""
    return [{"i": j} for j in range(n)]
