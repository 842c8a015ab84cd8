"""`lab tosca --seeds ... --l1 ...`: a sweep through the command line on real cached features
(MNIST-5k at 64 px through EfficientNet-Lite0, as in the notebooks' smoke runs; two tasks of 5
classes): one variant per (seed, L1), the same numbers as the single runs, intervals over seeds, and
a resumed sweep runs only what is missing."""
from __future__ import annotations

import pandas as pd
import pytest

SCENARIO = ["--dataset", "mnist_5k", "--resolution", "64", "--inc", "5", "--epochs", "1",
            "--routings", "per-sample", "oracle", "--quiet"]
TIMING = ["seconds", "train_s"]


def _sweep(main, capsys, *argv) -> tuple[int, str]:
    rc = main(["tosca", *SCENARIO, *argv])
    return rc, capsys.readouterr().out


def _folder(out: str):
    from pathlib import Path

    return Path(out.split("sweep dir: ")[1].split(" (")[0])


@pytest.fixture(scope="module")
def lab_main():
    from lab.cli import main

    return main


def test_a_sweep_runs_every_seed_and_l1_and_matches_the_single_runs(lab_main, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path))
    rc, out = _sweep(lab_main, capsys, "--seeds", "1", "2", "--l1", "0", "1e-3")
    assert rc == 0, out
    folder = _folder(out)
    runs = pd.read_parquet(folder / "runs.parquet")
    assert len(runs) == 2 * 2 * 2 and set(runs.seed) == {1, 2} and set(runs.l1) == {0.0, 1e-3}
    assert len(list((folder / "variants").glob("*.json"))) == 4
    summary = pd.read_parquet(folder / "summary.parquet")
    assert len(summary) == 2 * 2 and (summary.seeds == 2).all()
    assert ((summary.avg_inc_acc_lo <= summary.avg_inc_acc) & (summary.avg_inc_acc <= summary.avg_inc_acc_hi)).all()
    assert "[" in out and "95 % t-interval" in out                   # every number printed with its interval

    # one of its variants, run alone, gives the same numbers
    assert lab_main(["tosca", *SCENARIO, "--seed", "2", "--l1", "1e-3", "--runs-dir", str(tmp_path / "one")]) == 0
    single_dir = capsys.readouterr().out.split("run dir: ")[1].strip()
    single = pd.read_parquet(f"{single_dir}/summary.parquet").set_index("routing")
    mine = runs[(runs.seed == 2) & (runs.l1 == 1e-3)].set_index("routing")
    for r in ("per-sample", "oracle"):
        assert mine.loc[r, "avg_inc_acc"] == pytest.approx(single.loc[r, "avg_inc_acc"], abs=1e-9)


def test_a_resumed_sweep_runs_only_the_missing_variants(lab_main, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path))
    rc, out = _sweep(lab_main, capsys, "--seeds", "3", "4")
    assert rc == 0, out
    folder = _folder(out)
    first = pd.read_parquet(folder / "runs.parquet")
    kept, lost = sorted((folder / "variants").glob("*.json"))
    lost.unlink()                                                    # as if killed before its last variant
    before = kept.stat().st_mtime_ns
    assert lab_main(["tosca", "--resume", str(folder)]) == 0         # the sweep's own settings, from sweep.json
    out = capsys.readouterr().out
    assert out.count("skipped") == 1 and kept.stat().st_mtime_ns == before and lost.exists()
    again = pd.read_parquet(folder / "runs.parquet")
    pd.testing.assert_frame_equal(first.drop(columns=TIMING), again.drop(columns=TIMING))


def test_ctrl_c_in_a_sweep_names_the_sweep_folder_to_resume(lab_main, capsys, tmp_path, monkeypatch):
    """Ctrl-C while a variant runs (inside its own run folder): the line names the sweep's folder."""
    from lab import runs
    from lab.experiments.tosca import study

    def interrupted(cfg, runs_root, data=None):
        runs.new_run_dir("tosca", "variant", root=runs_root)       # where a variant's run writes
        raise KeyboardInterrupt

    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path))
    monkeypatch.setattr(study, "run_one", interrupted)
    assert lab_main(["tosca", *SCENARIO, "--seeds", "5", "6"]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    (folder,) = (tmp_path / "tosca-sweep").iterdir()
    assert line.endswith(f"--resume {folder}") and "--seeds 5 6" in line, line
    assert not (folder / ".lock").exists()
