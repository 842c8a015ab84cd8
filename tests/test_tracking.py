"""Runs a tracker can read (lab/tracking.py, docs/tracking.md): ``--track mlflow`` logs a run's
parameters, per-task / per-step metrics and its folder's tables to MLflow, read back here through
MLflow's own API from a store in a temporary folder. Without MLflow (hidden from the interpreter by
a meta-path blocker, as if it were not installed) ``--track mlflow`` costs one line and exit 2
before any work, and nothing imports mlflow unless a tracker is asked for.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))
INSTALL = "pip install -e '.[track]'"

# A sitecustomize on PYTHONPATH that makes `import mlflow` fail as for a package that is not there
HIDE_MLFLOW = '''\
import sys


class _NoMlflow:
    """`import mlflow` (and its submodules) raise ModuleNotFoundError, as when it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoMlflow())
'''


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_TRACK", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE")}
    return {**env, **extra}


@pytest.fixture
def no_mlflow(tmp_path) -> dict:
    """The environment of a subprocess in which mlflow cannot be imported."""
    shim = tmp_path / "hide-mlflow"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(HIDE_MLFLOW)
    env = _env(PYTHONPATH=os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", "import mlflow"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and "ModuleNotFoundError: No module named 'mlflow'" in p.stderr, p.stderr
    return env


def test_import_lab_and_help_never_import_mlflow():
    code = ("import contextlib, io, sys\nimport lab, lab.tracking\nfrom lab import cli\n"
            "for argv in (['--help'], ['tosca', '--help'], ['tosca', 'study', '--help'], ['aware', 'finetune', '--help'],"
            " ['aware', 'study', '--help']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "        try:\n            cli.main(argv)\n        except SystemExit:\n            pass\n"
            "    assert argv == ['--help'] or '--track {mlflow,none}' in out.getvalue(), argv\n"
            "print('MLFLOW' if 'mlflow' in sys.modules else 'NO-MLFLOW')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "NO-MLFLOW", p.stdout


def test_track_mlflow_without_mlflow_is_one_line_before_any_work(no_mlflow, tmp_path):
    """Each tracked command, mlflow not importable: exit 2, ONE stderr line naming the install, no
    run folder, no store (the flag and $LAB_TRACK alike)."""
    runs = tmp_path / "runs"
    cases = [
        (["tosca", "--track", "mlflow", "--runs-dir", str(runs)], {}),
        (["tosca", "--seeds", "1", "2", "--runs-dir", str(runs)], {"LAB_TRACK": "mlflow"}),   # a sweep
        (["tosca", "study", "--seeds", "1", "--epochs", "1", "--out", str(runs / "study"), "--track", "mlflow"], {}),
        (["aware", "ablate", "--size", "smoke", "--run-dir", str(runs / "ablate")], {"LAB_TRACK": "mlflow"}),
        (["aware", "study", "--preset", "smoke", "--out", str(runs / "aware-study"), "--track", "mlflow"], {}),
    ]

    def one(case):
        argv, extra = case
        return subprocess.run([LAB, *argv], capture_output=True, text=True, timeout=240, cwd=ROOT,
                              env={**no_mlflow, "LAB_RUNS_DIR": str(runs), **extra})

    with ThreadPoolExecutor(len(cases)) as pool:
        done = list(pool.map(one, cases))
    for (argv, _), p in zip(cases, done):
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        assert p.returncode == 2, (argv, p.returncode, p.stderr[-2000:])
        assert len(lines) == 1 and "Traceback" not in p.stderr, (argv, p.stderr[-2000:])
        assert "MLflow is not installed" in lines[0] and INSTALL in lines[0], (argv, lines[0])
        assert lines[0].startswith(f"lab {' '.join(a for a in argv[:2] if not a.startswith('-'))}: error: "), lines[0]
        assert not p.stdout.strip(), (argv, p.stdout)
    left = sorted(str(f.relative_to(runs)) for f in runs.rglob("*")) if runs.exists() else []
    assert left == [], f"written before the error: {left}"


def test_a_bad_LAB_TRACK_is_one_line(tmp_path, capsys, monkeypatch):
    from lab import cli

    monkeypatch.setenv("LAB_TRACK", "wandb")
    assert cli.main(["tosca", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "$LAB_TRACK wandb: must be one of mlflow, none" in err, err
    assert not list(tmp_path.iterdir())


def test_without_track_nothing_is_opened(monkeypatch, tmp_path):
    from lab import tracking

    monkeypatch.delenv("LAB_TRACK", raising=False)
    t = tracking.start(None, "lab tosca", root=tmp_path)
    assert not t.enabled and t.log("x", metrics={"a": 1}) is None
    f = object()
    assert t.watch(f) is f
    # nothing is read without a tracker: not the folder, not the command's record
    assert tracking.log_run(t, tmp_path / "missing", lambda: 1 / 0) is None
    assert not list(tmp_path.iterdir())


# --- with the real MLflow -------------------------------------------------------------------------
@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A local store in tmp_path, read through mlflow's own API (its folder store needs the opt-in
    MLflow 3 asks for; the lab sets it for its own process)."""
    mlflow = pytest.importorskip("mlflow")
    store = tmp_path / "store"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(store))
    mlflow.set_tracking_uri(str(store))
    yield store
    mlflow.set_tracking_uri(None)


def test_the_default_store_is_under_the_runs_root_and_logs_series_tables_and_children(tmp_path, monkeypatch):
    """No $MLFLOW_TRACKING_URI: the store is RUNS_ROOT/mlruns (a folder, no server); a run holds its
    parameters, final metrics, step series, the folder's tables (nothing else) and child runs."""
    mlflow = pytest.importorskip("mlflow")
    import pandas as pd

    from lab import tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "runs"
    folder = root / "tosca" / "a-run"
    (folder / "modules").mkdir(parents=True)
    (folder / "modules" / "task000.safetensors").write_bytes(b"x")
    (folder / ".lock").write_text("1\n")
    (folder / "summary.json").write_text("{}")
    pd.DataFrame({"a": [1]}).to_csv(folder / "runs.csv", index=False)
    t = tracking.start("mlflow", "lab test", root=root)
    assert t.enabled and t.uri == (root / "mlruns").resolve().as_uri()
    rid = t.log("a-run", params={"cfg": {"lr": 0.1, "datasets": ["x", "y"]}},
                metrics={"acc": 0.5, "bad": float("nan")}, series={"mnist_5k+fashion/A_b": [(0, 1.0), (1, 2.0)]},
                folder=folder)
    table = pd.DataFrame({"seed": [1, 1, 2, 2], "routing": ["r1", "r2", "r1", "r2"], "acc": [1.0, 2.0, 3.0, 4.0],
                          "method": ["tosca"] * 4})
    tracking.log_children(t, table, ["seed"], rid, spread="routing")
    mlflow.set_tracking_uri((root / "mlruns").as_uri())
    try:
        df = mlflow.search_runs(experiment_names=["lab test"])
        client = mlflow.MlflowClient()
        run = client.get_run(rid)
        assert run.data.params["cfg.lr"] == "0.1" and run.data.params["cfg.datasets"] == '["x", "y"]'
        assert run.data.metrics == {"acc": 0.5, "mnist_5k_fashion/A_b": 2.0}          # NaN left out
        assert [(m.step, m.value) for m in client.get_metric_history(rid, "mnist_5k_fashion/A_b")] == [(0, 1.0), (1, 2.0)]
        assert sorted(a.path for a in client.list_artifacts(rid)) == ["runs.csv", "summary.json"]
        kids = df[df["tags.mlflow.parentRunId"] == rid].sort_values("params.seed")
        assert list(kids["params.seed"]) == ["1", "2"] and list(kids["params.method"]) == ["tosca", "tosca"]
        assert list(kids["metrics.r2/acc"]) == [2.0, 4.0] and set(df.status) == {"FINISHED"}
    finally:
        mlflow.set_tracking_uri(None)


def test_aware_finetune_logs_the_loss_per_step(mlflow_store):
    """What `lab aware finetune` logs, from the row run_variant returns and the trainer's log (the
    trainer is watched, not changed: the same function, its result passed on as it is)."""
    import argparse

    import mlflow

    from lab import tracking
    from lab.experiments.aware.study import tracked
    from lab.experiments.aware.run.context import SIZES

    t = tracking.start("mlflow", "lab aware finetune")
    log = {"losses": [3.0, 2.5, 2.25], "step_seconds": [0.1, 0.1, 0.2]}
    train = t.watch(lambda *a, **k: log)
    assert train(1, x=2) is log
    args = argparse.Namespace(method="aware", task="fashion", rho=0.3, rule="activation-global", targets="qkv+projector",
                              calib="upstream", seed=0, size="smoke", model=None, device=None)
    row = {"group": "cli", "method": "aware", "seed": 0, "downstream": 0.5, "up_easy_vqa": 0.4, "R": 90.0,
           "rho": 0.3, "R_probe": float("nan")}
    rid = tracking.log_run(t, None, lambda: tracked.finetune(args, SIZES["smoke"], row, {"easy_vqa": 0.45}, t.steps))
    run = mlflow.MlflowClient().get_run(rid)
    assert run.data.params["rho"] == "0.3" and run.data.params["train.steps"] == str(SIZES["smoke"].train.steps)
    assert run.data.metrics["downstream"] == 0.5 and run.data.metrics["before/easy_vqa"] == 0.45
    hist = mlflow.MlflowClient().get_metric_history(rid, "loss")
    assert [(m.step, m.value) for m in hist] == [(0, 3.0), (1, 2.5), (2, 2.25)]
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(rid)] == ["result.json"]


def test_aware_ablate_and_study_log_a_summary_run_with_one_child_per_variant_and_seed(mlflow_store, tmp_path):
    """What `lab aware ablate` and `lab aware study` log through the one adapter (tracking.log_run), from
    the tables they return (hand-made here, in their columns) and the folder they wrote: the
    parameters of the ablation are its folder's config.json."""
    import mlflow
    import pandas as pd

    from lab import tracking
    from lab.experiments.aware.study import tracked

    rows = [{"group": "methods", "variant": v, "method": v, "seed": s, "task": "fashion", "downstream": d,
             "up_easy_vqa": 0.4, "up_probe": 0.5, "R": 90.0 + s, "E": 50.0, "H": 64.0, "trainable_frac": 0.1}
            for v, d in (("full", 0.8), ("aware", 0.7)) for s in (0, 1)]
    folder = tmp_path / "ablate"
    folder.mkdir()
    (folder / "config.json").write_text('{"task": "fashion", "seeds": [0, 1], "timings": {"total_s": 1}}')
    (folder / "masks_methods_aware.safetensors").write_bytes(b"x")
    out = {"results": pd.DataFrame(rows), "run_dir": folder, "timings": {"total_s": 12.5}}
    rid = tracking.log_run(tracking.start("mlflow", "lab aware ablate"), folder, lambda: tracked.ablate(out))
    client = mlflow.MlflowClient()
    run = client.get_run(rid)
    assert run.data.params == {"task": "fashion", "seeds": "[0, 1]"}
    assert run.data.metrics["methods/aware/R"] == 90.5 and run.data.metrics["timings/total_s"] == 12.5
    assert [a.path for a in client.list_artifacts(rid)] == ["config.json"]
    kids = mlflow.search_runs(experiment_names=["lab aware ablate"], filter_string=f"tags.mlflow.parentRunId = '{rid}'")
    assert sorted(kids["tags.mlflow.runName"]) == ["methods aware seed 0", "methods aware seed 1",
                                                  "methods full seed 0", "methods full seed 1"]
    assert set(kids["metrics.downstream"]) == {0.7, 0.8} and set(kids["params.task"]) == {"fashion"}

    study = tmp_path / "study"
    study.mkdir()
    pd.DataFrame(rows).to_csv(study / "runs.csv", index=False)
    summary = pd.DataFrame({"variant": ["methods/aware"], "metric": ["R"], "estimate": [90.5], "lo": [90.0], "hi": [91.0]})
    res = {"runs": pd.DataFrame(rows), "summary": summary, "out": study,
           "manifest": {"command": "lab aware study --preset smoke", "config": {"seeds": [0, 1]}, "wall_s": 3.0,
                        "complete": True}}
    rid = tracking.log_run(tracking.start("mlflow", "lab aware study"), study, lambda: tracked.study(res, "smoke"))
    run = client.get_run(rid)
    assert run.data.params == {"config.seeds": "[0, 1]", "preset": "smoke", "complete": "True"}
    assert run.data.metrics == {"methods/aware/R/estimate": 90.5, "methods/aware/R/lo": 90.0,
                                "methods/aware/R/hi": 91.0, "wall_s": 3.0}
    assert run.data.tags["lab.command"] == "lab aware study --preset smoke"
    assert len(mlflow.search_runs(experiment_names=["lab aware study"])) == 1 + 4


@pytest.mark.slow
def test_lab_tosca_track_mlflow_logs_params_per_task_metrics_and_tables(mlflow_store, tmp_path):
    """A real `lab tosca --track mlflow` (the untrained ViT-Tiny at 32 px, 2 tasks, 1 epoch each)
    into a store named by $MLFLOW_TRACKING_URI; read back with mlflow.search_runs and the client:
    the numbers are the run folder's own."""
    import mlflow
    import pandas as pd

    runs = tmp_path / "runs"
    p = subprocess.run([LAB, "tosca", "--backbone", "vit_tiny_patch16_224", "--resolution", "32", "--inc", "5",
                        "--epochs", "1", "--quiet", "--runs-dir", str(runs), "--track", "mlflow"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=_env(MLFLOW_TRACKING_URI=str(mlflow_store)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert not p.stderr.strip(), p.stderr[-3000:]            # tracking prints nothing
    (folder,) = (runs / "tosca").iterdir()
    assert not (runs / "mlruns").exists()                    # the store is $MLFLOW_TRACKING_URI's

    df = mlflow.search_runs(experiment_names=["lab tosca"])
    assert len(df) == 1
    r = df.iloc[0]
    assert r.status == "FINISHED" and r["tags.mlflow.runName"] == folder.name and r["tags.lab.run_dir"] == str(folder)
    assert r["params.method"] == "tosca" and r["params.epochs"] == "1" and r["params.resolution"] == "32"
    assert r["params.backbone"] == "vit_tiny_patch16_224" and r["params.datasets"] == '["fashion_mnist_mini"]'

    summary = pd.read_parquet(folder / "summary.parquet").set_index("routing")
    stages = pd.read_parquet(folder / "stages.parquet")
    assert r["metrics.avg_inc_acc"] == pytest.approx(summary.loc["per-sample", "avg_inc_acc"])   # the headline
    assert r["metrics.oracle/last_acc"] == pytest.approx(summary.loc["oracle", "last_acc"])
    client = mlflow.MlflowClient()
    per_task = [(m.step, m.value) for m in client.get_metric_history(r.run_id, "per-sample/A_b")]
    want = stages[stages.routing == "per-sample"].sort_values("stage")
    assert per_task == [(int(s), pytest.approx(a)) for s, a in zip(want.stage, want.A_b)] and len(per_task) == 2
    task0 = client.get_metric_history(r.run_id, "oracle/accuracy/task 0")
    assert [m.step for m in task0] == [0, 1]                 # task 0's accuracy after each stage
    assert [m.step for m in client.get_metric_history(r.run_id, "train/loss")] == [0, 1]   # 2 tasks x 1 epoch
    arts = sorted(a.path for a in client.list_artifacts(r.run_id))
    assert arts == ["config.json", "epochs.parquet", "matrix.parquet", "stages.parquet", "summary.json",
                    "summary.parquet", "tasks.parquet"]
