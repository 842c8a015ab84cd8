"""The method registry (one contract: every entry built alike, plus a toy entry), the cheap
baselines on separable features, RunConfig <-> ToscaConfig <-> `lab tosca`, and the study's sweep."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lab.experiments.tosca import methods as Me
from lab.experiments.tosca._synthetic import synthetic_data
from lab.experiments.tosca.run import RunConfig
from lab.tosca.learner import ToscaConfig

CACHED = [n for n in Me.list_methods() if not Me.METHODS.info(n)["needs_backbone"]]


@pytest.fixture
def toy_method():
    """A toy entry added by the test: predicts the first class of the last task, always."""
    name = "toy-constant"

    @Me.register(name, trains=False)
    class Toy(Me.Method):
        def learn_task(self, t, classes, data, on_epoch=None):
            self.classes = classes[-1] + 1

        def logits(self, data, idx):
            n = len(data.test_y[idx])
            return torch.zeros(1, n, self.classes)

        def task_tensors(self, t):
            return {"classes": torch.tensor([self.classes])}

        def restore_task(self, t, tensors, classes, data):
            self.classes = int(tensors["classes"][0])

    yield name
    Me.METHODS._entries.pop(name), Me.METHODS._info.pop(name)


@pytest.mark.parametrize("name", [*CACHED, "toy"])
def test_every_cached_method_honours_the_contract(name, toy_method):
    name = toy_method if name == "toy" else name
    data = synthetic_data(num_tasks=3, dim=16, noise=1.0, seed=4)
    info = Me.METHODS.info(name)
    assert set(info) == {"role", "routed", "needs_backbone", "trains", "luca", "cosine_head", "augments", "headline"}
    m = Me.fit(Me.create(name, data.dim, ToscaConfig(epochs=2, seed=0)), data)
    idx = torch.arange(len(data.test_y))
    logits = m.logits(data, idx)
    C = data.task_classes[-1][-1] + 1
    assert logits.shape == ((data.num_tasks if info["routed"] else 1), len(idx), C)
    assert (m.route_context(data, idx) is not None) == info["routed"]
    assert isinstance(m.trainable_parameters(data.num_tasks - 1), int)
    assert m.head_scale() is None or isinstance(m.head_scale(), float)
    # save every stage, restore into a fresh instance: the same logits
    fresh = Me.create(name, data.dim, ToscaConfig(epochs=2, seed=0))
    for t, classes in enumerate(data.task_classes):
        fresh.restore_task(t, m.task_tensors(t), classes, data)
    assert torch.allclose(fresh.logits(data, idx), logits, atol=1e-5)


@pytest.mark.parametrize("name", ["simplecil", "ncm", "fecam", "ranpac"])
def test_cheap_baselines_learn_separable_classes(name):
    data = synthetic_data(num_tasks=3, dim=16, noise=1.0, seed=5, n_train=60)
    m = Me.fit(Me.create(name, data.dim, ToscaConfig(seed=0)), data)
    acc = float((m.logits(data, slice(None))[0].argmax(1) == data.test_y).float().mean())
    assert acc > 0.9, (name, acc)


def test_ranpac_ridge_is_chosen_from_its_grid_and_solves_the_ridge_system():
    from lab.experiments.tosca.baselines import RIDGES, RanPAC

    data = synthetic_data(num_tasks=2, dim=8, seed=6)
    m = Me.fit(RanPAC(data.dim, ToscaConfig(seed=0)), data)
    lam = float(m.state["ridge"][0])
    assert any(abs(lam - r) <= 1e-9 * r for r in RIDGES)
    G, Q = m.state["G"], m.state["Q"]
    Wo = torch.linalg.solve(G + lam * torch.eye(len(G), dtype=G.dtype), Q)
    assert torch.allclose(m.state["Wo"].double(), Wo, rtol=1e-3, atol=1e-6)


def test_fecam_tukey_and_normalised_covariance():
    from lab.experiments.tosca.baselines import tukey

    assert torch.allclose(tukey(torch.tensor([4.0, -9.0, 0.0])), torch.tensor([2.0, -3.0, 0.0]))


def test_methods_are_built_alike_and_capabilities_are_registry_info():
    with pytest.raises(ValueError, match="needs the backbone"):
        Me.create("layerwise_adapter", 8, ToscaConfig())
    with pytest.raises(ValueError, match="unknown mode"):
        Me.create("tosca", 8, ToscaConfig(), mode="nope")
    assert Me.METHODS.info("tosca") == {"role": "method", "routed": True, "needs_backbone": False, "trains": True,
                                        "luca": True, "cosine_head": True, "augments": True, "headline": None}
    assert not Me.METHODS.info("simplecil")["trains"] and Me.METHODS.info("simplecil")["role"] == "baseline"
    with pytest.raises(ValueError, match="unknown role"):
        Me.register("toy-role", role="reference")


def test_run_config_carries_every_tosca_field_and_the_cli_reaches_it():
    from lab import cli
    from lab.experiments.tosca.cli import config_from_args

    tosca_fields = {f.name for f in dataclasses.fields(ToscaConfig)}
    assert tosca_fields <= {f.name for f in dataclasses.fields(RunConfig)}
    cfg = RunConfig(momentum=0.5, weight_decay=1e-4, eta_min=1e-6, head_scale=2.0, threads=0,
                    head_init="uniform", luca_init="xavier")
    assert cfg.tosca_config() == ToscaConfig(momentum=0.5, weight_decay=1e-4, eta_min=1e-6, head_scale=2.0,
                                             threads=0, head_init="uniform", luca_init="xavier")
    parser = cli.build_parser()
    args = parser.parse_args(["tosca", "--momentum", "0.5", "--weight-decay", "1e-4", "--eta-min", "1e-6",
                              "--head-scale", "2", "--threads", "0", "--head-init", "uniform",
                              "--luca-init", "xavier", "--routings", "ncm", "energy"])
    got = config_from_args(args)
    assert got.tosca_config() == cfg.tosca_config() and got.routings == ("ncm", "energy")
    dests = {a.dest for a in parser._subparsers._group_actions[0].choices["tosca"]._actions}
    assert tosca_fields <= dests  # every method field has its argument


def test_run_config_validates_like_tosca_config():
    with pytest.raises(ValueError, match="momentum"):
        RunConfig(momentum=-1)
    with pytest.raises(ValueError, match="valid routings"):
        RunConfig(routings=("nope",))


def test_run_evaluates_the_requested_routers(tmp_path):
    from lab.experiments.tosca.run import run

    data = synthetic_data(num_tasks=2, dim=8, seed=7)
    res = run(RunConfig(epochs=1, routing="ncm", routings=("per-sample", "mahalanobis")), data=data,
              runs_root=tmp_path, progress=False)
    assert list(res.summary.routing) == ["per-sample", "ncm", "mahalanobis"]
    assert res.info["headline_routing"] == "ncm"


def test_ridge_settings_reach_the_router_and_leave_other_hashes_alone(tmp_path, monkeypatch):
    """--ridge-dim/--ridge-lambda reach the RidgeRouter the ``ridge`` router uses; a config that does not
    set them hashes as before the fields existed (cached runs and sweeps stay valid)."""
    from lab.experiments.tosca import run as R
    from lab.tosca import ridge

    assert "ridge_dim" not in RunConfig().to_dict() and "ridge_lambda" not in RunConfig().to_dict()
    built = []
    real = ridge.RidgeRouter.__init__

    def spy(self, dim, proj_dim=ridge.PROJ_DIM, **kw):
        built.append((proj_dim, kw.get("lam")))
        real(self, dim, proj_dim, **kw)

    monkeypatch.setattr(ridge.RidgeRouter, "__init__", spy)
    data = synthetic_data(num_tasks=2, dim=8, seed=7)
    res = R.run(RunConfig(epochs=1, routings=("ridge",), ridge_dim=64, ridge_lambda=10.0), data=data,
                runs_root=tmp_path, progress=False)
    assert built == [(64, 10.0)] and "ridge" in list(res.summary.routing)
    with pytest.raises(ValueError, match="ridge among|'ridge' among"):
        RunConfig(ridge_dim=64)                      # no ridge router to set


def test_study_variants_are_a_pure_product_of_frozen_configs():
    from lab.experiments.tosca import study

    base = RunConfig(epochs=1)
    v = study.variants(base, scenarios=["a", "b+c"], seeds=[1, 2], baselines=["ncm"], flows=(),
                       inits=[("reference", "reference"), ("uniform", "xavier")], routings=["per-sample"])
    assert len(v) == 2 * 2 * (2 + 1) and v == study.variants(base, scenarios=["a", "b+c"], seeds=[1, 2],
                                                            baselines=["ncm"], routings=["per-sample"], flows=(),
                                                            inits=[("reference", "reference"), ("uniform", "xavier")])
    assert {c.datasets for c in v} == {("a",), ("b", "c")}
    with pytest.raises(dataclasses.FrozenInstanceError):
        v[0].seed = 3
    # the flow ablation (reference init) on the first scenario only, by default
    v = study.variants(base, scenarios=["a", "b+c"], seeds=[1, 2], baselines=["ncm"], routings=["per-sample"])
    flows = [(c.datasets, c.flow, c.head_init, c.luca_init) for c in v if c.method == "tosca" and c.flow != "tosca"]
    assert sorted(flows) == sorted([(("a",), f, "reference", "reference") for f in study.ABLATION_FLOWS] * 2)
    assert len(v) == 2 * (len(study.INITS) + 3 + 1) + 2 * (len(study.INITS) + 1)


def test_headline_seeds_run_only_the_reference_tosca_and_the_baselines():
    from lab.experiments.tosca import study

    base = RunConfig(epochs=1)
    v = study.variants(base, scenarios=["a", "b+c"], seeds=[1, 2], baselines=["ncm"], routings=["per-sample"],
                       headline_seeds=[2, 3, 4])
    extra = [(c.datasets, c.seed, c.method, c.flow, c.head_init, c.luca_init) for c in v if c.seed > 2]
    assert sorted(extra) == sorted((d, s, m, "tosca", "reference", "reference") for d in (("a",), ("b", "c"))
                                   for s in (3, 4) for m in ("tosca", "ncm"))
    assert len(v) == len(study.variants(base, scenarios=["a", "b+c"], seeds=[1, 2], baselines=["ncm"],
                                        routings=["per-sample"])) + len(extra)
    # the defaults: the headline's 50 seeds only when the command line names no seeds
    for argv, seeds, head in (([], list(study.SEEDS), list(study.HEADLINE_SEEDS)), (["--seeds", "7"], [7], []),
                              (["--seeds", "7", "--headline-seeds", "8"], [7], [8])):
        args = study.parser().parse_args(argv)
        study.resolve_seeds(args)
        assert (args.seeds, args.headline_seeds) == (seeds, head)
    assert set(study.SEEDS) <= set(study.HEADLINE_SEEDS) and len(study.HEADLINE_SEEDS) == 50


def test_a_study_variant_leaves_no_run_folder_behind(tmp_path):
    """Each variant's run folder (tables, saved modules) goes once its rows are read: a 590-variant
    study kept them all and filled the disk."""
    from lab.experiments.tosca import study
    from lab.experiments.tosca._synthetic import synthetic_data

    data = synthetic_data(num_tasks=2, dim=8, seed=7)
    root = tmp_path / "not-yet"          # made by the variant (a Ray node need not have the driver's folder)
    rows = study.run_one(RunConfig(epochs=1, method="ranpac"), root, data=data)
    rows += study.run_one(RunConfig(epochs=1, routings=("per-sample", "oracle")), root, data=data)
    assert {r["method"] for r in rows} == {"ranpac", "tosca"} and len(rows) == 3
    assert list(root.iterdir()) == []


def test_t_interval_by_hand():
    from lab.experiments.tosca.study import t_interval

    mean, half = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302652729911275 * 1.0 / 3 ** 0.5)
    assert t_interval([5.0])[1] != t_interval([5.0])[1]  # NaN with one seed


def test_study_replaces_its_folder_as_a_whole(tmp_path, monkeypatch, capsys):
    """A study is written into a new folder beside --out and swapped in: a failure while writing leaves
    the old study exactly as it was (finished variants kept for the rerun); a finished one carries the folder's other files along; a study made
    with other settings (here: another baseline) is refused without --replace."""
    import hashlib

    from lab.experiments.tosca import study

    out = tmp_path / "study"
    argv = ["--scenarios", "fashion_mnist_mini", "--seeds", "1993", "--epochs", "1", "--resolution", "32",
            "--flow-scenarios", "--executor", "local", "--out", str(out)]

    def digests():
        return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(out.rglob("*")) if p.is_file()}

    assert study.main([*argv, "--baselines"]) == 0
    (out / "efficiency_time.csv").write_text("another command's table\n")
    before = digests()
    assert study.main([*argv, "--baselines", "ncm"]) == 2       # other settings, no --replace
    assert "--replace" in capsys.readouterr().err and digests() == before

    def disk_full(rows):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(study, "summarise", disk_full)
    assert study.main([*argv, "--baselines", "ncm", "--replace"]) == 2
    now = digests()         # finished variants are kept (the rerun skips them); nothing else changed
    assert {k: now[k] for k in before} == before, "a failed write changed the old study"
    assert all(k.startswith("variants/") for k in set(now) - set(before))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"], "the half-written folder was left behind"

    monkeypatch.undo()
    assert study.main([*argv, "--baselines", "ncm", "--replace"]) == 0
    after = digests()
    assert after["efficiency_time.csv"] == before["efficiency_time.csv"]
    assert {k for k in before if k.startswith("variants/")} <= set(after)
    from lab._io import read_json

    m = read_json(out / "manifest.json")
    assert m["baselines"] == ["ncm"] and m["sha256"] == {k: after[k] for k in ("runs.csv", "summary.csv")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"]


def test_lab_tosca_study_runs_on_ray_by_default_where_it_is_installed(monkeypatch):
    from lab import executors
    from lab.experiments.tosca.cli import with_default_executor

    monkeypatch.setattr(executors, "has_ray", lambda: True)
    assert with_default_executor(["--seeds", "1"], cpus=2) == ["--seeds", "1", "--executor", "ray"]
    assert with_default_executor(["--seeds", "1"], cpus=1) == ["--seeds", "1"]          # one core: in this process
    for named in (["--executor", "local"], ["--executor=local"], ["--address", "auto"]):
        assert with_default_executor(named, cpus=2) == named                          # the user's choice stands
    monkeypatch.setattr(executors, "has_ray", lambda: False)
    assert with_default_executor(["--seeds", "1"], cpus=2) == ["--seeds", "1"]          # no Ray: local
