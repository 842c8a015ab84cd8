"""Sweeps on Ray with 2 local workers give the tables of the local executor; a killed sweep resumes.

One Ray instance (2 CPUs) serves the module. The kill test runs a second driver in a subprocess that
joins it by ``address`` (as a sweep joins a cluster), and kills that driver after its first variant
lands: Ray drops a dead driver's tasks, and the sweep started again skips what had finished.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

ray = pytest.importorskip("ray", reason="the scale extra: pip install -e '.[scale]'")

from lab import executors  # noqa: E402
from lab.experiments.tosca import study  # noqa: E402
from lab.experiments.tosca._synthetic import synthetic_data  # noqa: E402
from lab.experiments.tosca.run import RunConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMING = ["seconds", "train_s", "step_s"]     # wall-clock columns: the only ones allowed to differ


@pytest.fixture(scope="module")
def two_workers():
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers cannot import tests/
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


def _tosca_configs(seeds=(1, 2)):
    base = RunConfig(epochs=2, routings=("per-sample", "oracle"))
    return [c for c in study.variants(base, scenarios=["synthetic"], seeds=seeds, baselines=["ncm"],
                                      inits=study.INITS[:2], routings=("per-sample", "oracle"))
            if c.flow == "tosca"]


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    drop = [c for c in TIMING if c in a]
    pd.testing.assert_frame_equal(a.drop(columns=drop), b.drop(columns=drop), check_exact=True)


def test_tosca_sweep_on_ray_gives_the_local_tables(two_workers, tmp_path):
    data = synthetic_data(num_tasks=3, dim=16, noise=2.5, seed=1)
    configs = _tosca_configs()
    lines = []
    local = study.run_all(configs, tmp_path / "a", executor="local", results_dir=tmp_path / "local", data=data,
                          log=lambda s: None)
    remote = study.run_all(configs, tmp_path / "b", executor="ray", results_dir=tmp_path / "ray", data=data,
                           log=lines.append)
    assert len(lines) == len(configs) and all("done at" in s for s in lines)
    assert len(list((tmp_path / "ray").glob("*.json"))) == len(configs)      # one result file per variant
    _same(pd.DataFrame(local), pd.DataFrame(remote))
    _same(study.summarise(local), study.summarise(remote))
    assert len(local) == len(configs) * 2 - 2                                  # ncm has no routing table
    assert {r["seed"] for r in remote} == {1, 2}


def _slow_echo(config, scale):
    """A job whose result depends on its config and on the shared input."""
    time.sleep(config["sleep"])
    return {"key": config["i"], "value": config["i"] * scale}


_DRIVER = textwrap.dedent("""
    import sys
    from lab.experiments.tosca import study
    from lab.experiments.tosca._synthetic import synthetic_data
    sys.path.insert(0, {tests!r})
    from test_ray import _tosca_configs
    data = synthetic_data(num_tasks=3, dim=16, noise=2.5, seed=1)
    study.run_all(_tosca_configs(seeds=(1, 2, 3)), {root!r}, executor="ray", address={address!r},
                  results_dir={out!r}, data=data, log=lambda s: print(s, flush=True))
""")


def test_a_killed_ray_sweep_resumes_with_finished_variants_skipped(two_workers, tmp_path):
    out = tmp_path / "variants"
    code = _DRIVER.format(tests=str(Path(__file__).parent), root=str(tmp_path / "runs"), out=str(out),
                          address=two_workers)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    configs = _tosca_configs(seeds=(1, 2, 3))
    # until the first variant lands (it waits only that long; on a machine busy with other jobs the
    # driver's imports alone took over 60 s)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None and not list(out.glob("*.json")):
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)           # the driver (its session: only processes it started)
        proc.wait(timeout=30)
    first = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    assert 0 < len(first) < len(configs), f"the sweep was not caught mid-way: {len(first)} files\n{proc.stdout.read()}"
    lines = []
    data = synthetic_data(num_tasks=3, dim=16, noise=2.5, seed=1)
    resumed = study.run_all(configs, tmp_path / "runs2", executor="ray", results_dir=out, data=data,
                            log=lines.append)
    skipped = [s for s in lines if "skipped" in s]
    assert len(skipped) == len(first)                                         # finished variants not run again
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.json") if p.name in first} == first
    assert len(list(out.glob("*.json"))) == len(configs)
    fresh = study.run_all(configs, tmp_path / "runs3", executor="local", data=data, log=lambda s: None)
    _same(pd.DataFrame(fresh), pd.DataFrame(resumed))


def test_executor_runs_jobs_with_shared_inputs_and_checks_its_arguments(two_workers, tmp_path):
    jobs = [executors.Job(f"j{i}", _slow_echo, {"i": i, "sleep": 0.0}) for i in range(4)]
    assert executors.run(jobs, executor="ray", shared=(10,)) == [{"key": i, "value": 10 * i} for i in range(4)]
    assert executors.run(jobs, executor="local", shared=(10,)) == [{"key": i, "value": 10 * i} for i in range(4)]
    with pytest.raises(ValueError, match="unknown executor"):
        executors.run(jobs, executor="dask")
    with pytest.raises(ValueError, match="needs executor 'ray'"):
        executors.check("local", "auto")
    with pytest.raises(ValueError, match="unique"):
        executors.run(jobs + jobs[:1])
    with pytest.raises(ValueError, match="file name"):
        executors.Job("a/b", _slow_echo, {})
    bad = [executors.Job("bad", _slow_echo, {"i": 1})]      # KeyError 'sleep' inside the task
    with pytest.raises(RuntimeError, match="variant bad failed on Ray"):
        executors.run(bad, executor="ray", shared=(1,), results_dir=tmp_path)
    assert not (tmp_path / "bad.json").exists()
    k = executors.key("tosca seed/1", RunConfig(seed=1))
    assert k.startswith("tosca_seed_1-") and k != executors.key("tosca seed/1", RunConfig(seed=2))
    assert executors.resources("cuda:0") == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert executors.resources("cpu", 2) == {"num_cpus": 2.0, "num_gpus": 0.0}


@pytest.fixture()
def one_thread():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)           # as each Ray worker (1 CPU) runs
    yield
    torch.set_num_threads(old)


def test_aware_sweep_on_ray_gives_the_local_tables_and_masks(two_workers, one_thread, tmp_path):
    from _toy import toy_context

    from lab._io import load_tensors
    from lab.experiments.aware.run import ablate

    ctx = toy_context(rhos=(0.0, 0.3), continual_methods=())
    kw = dict(seeds=(0, 1), groups=("methods", "rho"), progress=False)
    local = ablate.sweep(ctx, run_dir=tmp_path / "local", executor="local", **kw)
    remote = ablate.sweep(ctx, run_dir=tmp_path / "ray", executor="ray", **kw)
    for name in ("results", "mask_composition", "upstream_before", "overlap"):
        _same(local[name], remote[name])
    n_jobs = len(local["results"][local["results"].get("shared") != True].drop_duplicates(["group", "variant", "seed"]))  # noqa: E712
    assert len(list((tmp_path / "ray" / "variants").glob("*.json"))) == n_jobs == 2 * len(
        [v for v in ablate.variants(ctx.size) if v.group in kw["groups"] or v.label in ("full", "aware")])
    masks = sorted(p.name for p in (tmp_path / "local").glob("masks_*.safetensors"))
    assert masks and masks == sorted(p.name for p in (tmp_path / "ray").glob("masks_*.safetensors"))
    for name in masks:
        a, b = load_tensors(tmp_path / "local" / name)[0], load_tensors(tmp_path / "ray" / name)[0]
        assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_aware_tune_on_ray_gives_the_local_tables(two_workers, one_thread, tmp_path, monkeypatch):
    from _toy import toy, toy_context

    from lab.experiments.aware.run import tune
    from lab.experiments.aware.run.tasks import Task

    ctx = toy_context()
    monkeypatch.setattr(tune, "validation_context", lambda c, task, n_val, **kw: replace(
        c, easy=Task("easy_vqa", c.easy.train, toy(n_val, 20)), probe=None,
        down={task: Task(task, c.down[task].train, toy(n_val, 21))}))
    kw = dict(grids={"full": (1e-5, 2e-5), "aware": (1e-4, 3e-4)}, seeds=(0,), n_val=5, progress=False)
    local = tune.tune(ctx, run_dir=tmp_path / "local", executor="local", **kw)
    remote = tune.tune(ctx, run_dir=tmp_path / "ray", executor="ray", **kw)
    _same(local["table"], remote["table"])
    _same(local["runs"], remote["runs"])
    assert local["chosen"] == remote["chosen"] and len(list((tmp_path / "ray" / "variants").glob("*.json"))) == 4


def test_lab_tosca_sweep_on_ray_gives_the_local_tables(two_workers, tmp_path, monkeypatch, capsys):
    """`lab tosca --seeds ... --l1 ... --executor ray` (the command line, real cached features)."""
    from lab.cli import main

    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path))
    argv = ["tosca", "--dataset", "mnist_5k", "--resolution", "64", "--inc", "5", "--epochs", "1", "--seeds", "1", "2",
            "--l1", "0", "1e-3", "--routings", "per-sample", "oracle", "--quiet"]
    tables = {}
    for executor in ("local", "ray"):
        extra = ["--executor", "ray", "--address", two_workers] if executor == "ray" else []
        assert main([*argv, *extra]) == 0
        folder = Path(capsys.readouterr().out.split("sweep dir: ")[1].split(" (")[0])
        tables[executor] = (pd.read_parquet(folder / "runs.parquet"), pd.read_parquet(folder / "summary.parquet"))
        assert len(list((folder / "variants").glob("*.json"))) == 4
    _same(tables["local"][0], tables["ray"][0])
    _same(tables["local"][1], tables["ray"][1])
