"""The scenario runner and `lab tosca`: tables, run dirs, resume, concurrency, input validation."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lab.experiments.tosca._synthetic import synthetic_data
from lab.experiments.tosca.methods import ToscaMethod, list_methods
from lab.experiments.tosca.run import RunConfig, run

FAST = dict(epochs=2)


@pytest.fixture(scope="module")
def data():
    return synthetic_data(num_tasks=3, dim=16, noise=2.5, seed=1)


def test_run_writes_tidy_tables_and_summary(data, tmp_path):
    res = run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    d = res.run_dir
    assert d.parent == tmp_path / "tosca"
    for name in ("summary", "stages", "matrix", "tasks", "epochs"):
        assert (d / f"{name}.parquet").exists()
    assert sorted(p.name for p in (d / "modules").glob("*.safetensors")) == [f"task{t:03d}.safetensors" for t in range(3)]
    info = json.loads((d / "summary.json").read_text())
    assert info["config"]["method"] == "tosca" and info["seed"] == 1993 and "torch" in info["versions"]
    assert set(info["seconds"]) == {"extraction", "training", "evaluation", "total"}
    assert info["routings"] == ["per-sample", "per-batch", "oracle"] and info["per_batch_size"] == 48
    assert len(info["trainable_params_per_task"]) == 3
    assert info["trainable_params_total"] == sum(info["trainable_params_per_task"])
    s = pd.read_parquet(d / "summary.parquet")
    assert list(s.routing) == ["per-sample", "per-batch", "oracle"]
    assert (s.routing_accuracy_last[s.routing == "oracle"] == 1.0).all()
    st = res.stages
    assert len(st) == 9 and st.head_scale.notna().all()
    assert set(st[st.routing == "per-batch"].per_batch_size) == {48}
    assert res.headline()["routing"] == "per-sample"


@pytest.mark.parametrize("method", ["simplecil", "finetune", "joint"])
def test_baselines_run_in_the_same_harness(method, data, tmp_path):
    res = run(RunConfig(method=method, **FAST), data=data, runs_root=tmp_path, progress=False)
    assert list(res.summary.routing) == ["single"]
    assert 0 <= res.summary.last_acc.iloc[0] <= 100
    if method == "simplecil":
        assert res.info["trainable_params_total"] == 0


def test_finetune_forgets_and_joint_does_not(tmp_path):
    d = synthetic_data(num_tasks=3, dim=16, noise=3.0, seed=2)
    ft = run(RunConfig(method="finetune", epochs=5), data=d, runs_root=tmp_path, progress=False)
    jt = run(RunConfig(method="joint", epochs=5), data=d, runs_root=tmp_path, progress=False)
    assert ft.summary.forgetting.iloc[0] > jt.summary.forgetting.iloc[0]


def test_same_seed_same_numbers(data, tmp_path):
    a = run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    b = run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    assert a.run_dir != b.run_dir
    pd.testing.assert_frame_equal(a.summary, b.summary)
    pd.testing.assert_frame_equal(a.matrix, b.matrix)


def test_resume_after_interruption_gives_the_same_numbers(data, tmp_path, monkeypatch):
    full = run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    real = ToscaMethod.learn_task

    def crash_at_task_2(self, t, *a, **k):
        if t == 2:
            raise KeyboardInterrupt("simulated interruption")
        return real(self, t, *a, **k)

    monkeypatch.setattr(ToscaMethod, "learn_task", crash_at_task_2)
    with pytest.raises(KeyboardInterrupt):
        run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    partial = max((tmp_path / "tosca").iterdir(), key=lambda p: p.stat().st_mtime)
    assert (partial / "stages" / "stage001.json").exists() and not (partial / "stages" / "stage002.json").exists()
    assert not (partial / "summary.json").exists() and not (partial / ".lock").exists()
    monkeypatch.setattr(ToscaMethod, "learn_task", real)
    resumed = run(RunConfig(**FAST), data=data, runs_root=tmp_path, resume=partial, progress=False)
    assert resumed.run_dir == partial
    pd.testing.assert_frame_equal(full.summary, resumed.summary)
    pd.testing.assert_frame_equal(full.matrix, resumed.matrix)
    # a different config cannot resume that directory
    with pytest.raises(ValueError, match="config differs"):
        run(RunConfig(epochs=3), data=data, runs_root=tmp_path, resume=partial, progress=False)


def test_corrupt_module_file_is_retrained_on_resume(data, tmp_path):
    res = run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    f = res.run_dir / "modules" / "task002.safetensors"
    f.write_bytes(f.read_bytes()[:-8] + b"garbage!")
    with pytest.warns(UserWarning, match="retraining from task 2"):
        again = run(RunConfig(**FAST), data=data, runs_root=tmp_path, resume=res.run_dir, progress=False)
    pd.testing.assert_frame_equal(res.summary, again.summary)


def test_every_stored_file_records_its_run_and_a_foreign_one_is_refused_on_resume(data, tmp_path):
    from lab.experiments.tosca.run import config_hash

    res = run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    d = res.run_dir
    for t in range(3):
        for f in (d / "modules" / f"task{t:03d}.safetensors", d / "stages" / f"stage{t:03d}.json"):
            owner = json.loads((f.parent / (f.name + ".owner")).read_text())
            assert (owner["seed"], owner["task"], owner["config_sha256"]) == (res.config.seed, t, config_hash(res.config))
    other = run(RunConfig(**FAST, seed=7), data=data, runs_root=tmp_path, progress=False)
    mine = {n: (d / "stages" / n).read_bytes() for n in ("stage001.json", "stage001.json.owner")}
    for n in mine:                                   # another seed's stage copied in
        (d / "stages" / n).write_bytes((other.run_dir / "stages" / n).read_bytes())
    with pytest.raises(ValueError, match=r"stage001.json belongs to another run \(seed 7, task 1"):
        run(RunConfig(**FAST), data=data, runs_root=tmp_path, resume=d, progress=False)
    for n, b in mine.items():
        (d / "stages" / n).write_bytes(b)
    (d / "stages" / "stage002.json.owner").unlink()   # a stage without its record (an older run): retrained
    with pytest.warns(UserWarning, match="retraining from task 2"):
        again = run(RunConfig(**FAST), data=data, runs_root=tmp_path, resume=d, progress=False)
    pd.testing.assert_frame_equal(res.summary, again.summary)
    assert (d / "stages" / "stage002.json.owner").exists()


_WORKER = """
import sys, torch
torch.set_num_threads(1)
from lab.experiments.tosca._synthetic import synthetic_data
from lab.experiments.tosca.run import RunConfig, run
res = run(RunConfig(epochs=1), data=synthetic_data(num_tasks=2, dim=8, seed=3), runs_root=sys.argv[1], progress=False)
print(res.run_dir)
"""


def test_concurrent_runs_do_not_collide(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]  # same second, same name, same config
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    dirs = {o.strip().splitlines()[-1] for o in outs}
    assert len(dirs) == 2
    for d in dirs:
        assert (Path(d) / "summary.json").exists() and len(list((Path(d) / "modules").glob("*.safetensors"))) == 2


def test_a_run_dir_in_use_is_refused(data, tmp_path):
    res = run(RunConfig(**FAST), data=data, runs_root=tmp_path, progress=False)
    (res.run_dir / ".lock").write_text(str(os.getppid()))  # a live process that is not us
    with pytest.raises(RuntimeError, match="in use by process"):
        run(RunConfig(**FAST), data=data, runs_root=tmp_path, resume=res.run_dir, progress=False)


@pytest.mark.parametrize("kw,match", [
    (dict(method="ewc"), "valid methods: .*tosca"),
    (dict(routing="best"), "valid routings: per-sample, per-batch, oracle"),
    (dict(mode="fast"), "valid modes: cached, augment"),
    (dict(l1=-0.1), "l1 must be a finite number >= 0"),
    (dict(flow="x"), "valid flows"),
    (dict(epochs=0), "epochs"),
])
def test_bad_config_fails_on_construction(kw, match):
    with pytest.raises((ValueError, KeyError), match=match):
        RunConfig(**kw)


@pytest.mark.parametrize("kw,match", [
    (dict(init=0, inc=3), "not a multiple of inc=3"),
    (dict(init=12, inc=2), "exceeds the 10 classes"),
    (dict(datasets=("nope",)), "nope"),
    (dict(backbone="resnet9000"), "valid backbones"),
])
def test_bad_scenario_fails_before_any_work(kw, match, tmp_path):
    with pytest.raises((ValueError, KeyError), match=match):
        run(RunConfig(**kw), runs_root=tmp_path, progress=False)
    assert not (tmp_path / "tosca").exists()  # nothing half-written


def test_list_methods():
    assert list_methods() == ["tosca", "simplecil", "ncm", "fecam", "ranpac", "finetune", "joint", "layerwise_adapter"]


def test_cli_help_documents_everything(capsys):
    from lab.cli import main

    with pytest.raises(SystemExit):
        main(["tosca", "--help"])
    out = capsys.readouterr().out
    for opt in ("--dataset", "--backbone", "--init", "--inc", "--seed", "--routing", "--method", "--mode", "--epochs",
                "--l1", "--resume", "per-batch", "layerwise_adapter", "augment"):
        assert opt in out


def test_cli_rejects_bad_input_cleanly(capsys, tmp_path):
    from lab.cli import main

    assert main(["tosca", "--inc", "3", "--runs-dir", str(tmp_path), "--quiet"]) == 2
    assert "not a multiple of inc=3" in capsys.readouterr().err
    assert main(["tosca", "--l1", "-1", "--quiet"]) == 2


def test_nan_loss_stops_the_run_naming_task_and_epoch(tmp_path):
    d = synthetic_data(num_tasks=3, dim=16, seed=6)
    d.train_x[(d.train_task == 1).nonzero()[0, 0], 0] = float("nan")
    from lab.tosca.learner import NonFiniteLoss

    with pytest.raises(NonFiniteLoss, match=r"task 1, epoch 0"):
        run(RunConfig(**FAST), data=d, runs_root=tmp_path, progress=False)
    (rd,) = (tmp_path / "tosca").iterdir()
    assert "task 1, epoch 0" in json.loads((rd / "error.json").read_text())["error"]
    assert (rd / "stages" / "stage000.json").exists() and not (rd / "stages" / "stage001.json").exists()
    assert not (rd / "summary.json").exists() and not list(rd.rglob("*.tmp"))


def test_progress_bars_over_tasks_and_epochs(data, tmp_path, capsys):
    run(RunConfig(epochs=1), data=data, runs_root=tmp_path, progress=True)
    err = capsys.readouterr().err
    assert "tosca tasks" in err and "task 2 epochs" in err


def test_summary_warns_when_the_head_scale_ends_non_positive(data, tmp_path):
    from lab.experiments.tosca.cli import format_summary

    res = run(RunConfig(head_scale_param="free", **FAST), data=data, runs_root=tmp_path, progress=False)
    assert res.config.tosca_config().head_scale_param == "free" and res.info["config"]["head_scale_param"] == "free"
    assert "warning" not in format_summary(res)  # σ > 0 here
    res.info["head_scale_per_task"][-1] = -2.0   # where a free σ ended on real features (mnist_5k, L1 1e-2)
    warn = [line for line in format_summary(res).splitlines() if line.startswith("warning")]
    assert len(warn) == 1 and "σ ended at -2 <= 0" in warn[0] and "head_scale_param='positive'" in warn[0]
