"""Plugins by entry point (docs/plugins.md): the template package in examples/ adds a TOSCA router
and an AWARe selection rule that the lab finds, lists, checks and runs; broken plugins cost one line.

Nothing is installed into the venv: a temporary folder holds each test package's ``.dist-info``
(METADATA and entry_points.txt, as pip would write them), and ``PYTHONPATH`` (subprocesses) or
``sys.path`` (this process, undone afterwards) makes it visible to ``importlib.metadata``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from lab import plugins

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "continual-lab-plugin-example"
DIST = "continual-lab-plugin-example"
BROKEN = "continual-lab-broken"
LAB = str(Path(sys.executable).with_name("lab"))


def _dist_info(site: Path, name: str, groups: dict[str, dict[str, str]]) -> None:
    d = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (d / "entry_points.txt").write_text("".join(
        f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items()))


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, list[str]]:
    """sys.path entries: the template (its own pyproject's entry points) and a broken package (one
    entry point whose module does not exist, one whose rule breaks the contract)."""
    base = tmp_path_factory.mktemp("plugins")
    groups = tomllib.loads((TEMPLATE / "pyproject.toml").read_text())["project"]["entry-points"]
    _dist_info(base / "template", DIST, groups)
    broken = base / "broken"
    _dist_info(broken, BROKEN, {"continual_lab.routers": {"missing": "lab_broken_plugin.nope"},
                                "continual_lab.aware_rules": {"bad": "lab_broken_plugin.rule"}})
    (broken / "lab_broken_plugin").mkdir()
    (broken / "lab_broken_plugin" / "__init__.py").write_text("")
    (broken / "lab_broken_plugin" / "rule.py").write_text(
        "from lab.aware.masking import RULES\n\n\n"
        "@RULES.register('two-arguments')   # no saliency info, and no weights/seed keywords\n"
        "def rule(scores, rho):\n    return {}\n")
    return {"template": [str(base / "template"), str(TEMPLATE)], "broken": [str(broken)]}


def _lab(argv, sites_, *which, timeout=300, **env) -> subprocess.CompletedProcess:
    path = [p for w in which for p in sites_[w]]
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([LAB, *argv], capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


def test_lab_plugins_lists_every_entry_with_its_package(sites):
    p = _lab(["plugins"], sites, "template")
    assert p.returncode == 0 and "skipped" not in p.stderr, p.stderr
    rows = _rows(p.stdout)
    assert ["router", "margin", DIST] in rows and ["aware", "rule", "activation-x-weight", DIST] in rows
    assert ["router", "per-sample", "built-in"] in rows and ["aware", "method", "lora", "built-in"] in rows
    for group in plugins.GROUPS.values():
        assert group in p.stdout


def test_broken_plugins_cost_one_line_each_and_the_rest_works(sites):
    p = _lab(["plugins"], sites, "template", "broken")
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, p.stderr
    missing = next(line for line in lines if "missing = lab_broken_plugin.nope" in line)
    assert BROKEN in missing and "continual_lab.routers" in missing and "ModuleNotFoundError" in missing
    bad = next(line for line in lines if "bad = lab_broken_plugin.rule" in line)
    assert BROKEN in bad and "continual_lab.aware_rules" in bad and "breaks the contract" in bad
    rows = _rows(p.stdout)
    assert ["router", "margin", DIST] in rows and ["aware", "rule", "activation-x-weight", DIST] in rows
    assert not any("two-arguments" in r for r in rows)        # the entry of the broken rule was removed


def test_lab_help_stays_free_of_plugins_and_torch(sites):
    code = ("import contextlib, io, sys\nfrom lab import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        cli.main(['--help'])\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'lab_plugin_example', 'lab_broken_plugin') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sites["template"] + sites["broken"])}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.stdout.strip() == "[]" and not p.stderr, (p.stdout, p.stderr)


@pytest.mark.slow
def test_the_plugin_router_runs_in_lab_tosca(sites, tmp_path):
    """The untrained ViT-Tiny at 32 px on fashion_mnist_mini, one epoch per task: seconds once the
    features are cached (the first run extracts them: ~1-2 min on a busy 2-core machine)."""
    p = _lab(["tosca", "--backbone", "vit_tiny_patch16_224", "--resolution", "32", "--inc", "5", "--epochs", "1",
              "--routings", "per-sample", "margin", "oracle", "--routing", "margin", "--quiet",
              "--runs-dir", str(tmp_path)], sites, "template", timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = _rows(p.stdout)
    margin = next(r for r in rows if r[:2] == ["tosca", "margin"])
    assert 0 <= float(margin[-1]) <= 1                        # its routing accuracy
    assert ["tosca", "oracle"] == next(r for r in rows if r[1:2] == ["oracle"])[:2]


def test_the_aware_command_line_accepts_the_plugin_rule(sites):
    """The rule name passes the parser (a plugin name, not a static choice); the next check fails."""
    p = _lab(["aware", "finetune", "--rule", "activation-x-weight", "--rho", "1.5"], sites, "template", timeout=120)
    assert p.returncode == 2 and "--rho 1.5: must be a number in [0, 1]" in p.stderr, p.stderr
    p = _lab(["aware", "finetune", "--rule", "not-a-rule"], sites, "template", timeout=120)
    assert p.returncode == 2 and "argument --rule: invalid choice: 'not-a-rule'" in p.stderr, p.stderr
    # `lab aware ablate --rules`: checked in the handler (plugin names exist once entry points load)
    p = _lab(["aware", "ablate", "--rules", "activation-x-weight", "--seeds", "-1"], sites, "template", timeout=120)
    assert p.returncode == 2 and "--seeds -1: must be an integer >= 0" in p.stderr, p.stderr
    p = _lab(["aware", "ablate", "--rules", "not-a-rule"], sites, "template", timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert ("--rules not-a-rule: unknown AWARe rule; valid rules: activation-balanced, weight-norm, random, "
            "activation-x-weight") in p.stderr, p.stderr


def test_the_plugin_rule_is_a_row_of_the_study_tables(sites, tmp_path):
    """`lab aware study --add-rules` puts the plugin rule in the rule group beside the built-in rules,
    and the study's tables (its rule group's short fronts and its comparisons with main AWARe) carry it."""
    import pandas as pd

    out = tmp_path / "study"
    p = _lab(["aware", "study", "--preset", "smoke", "--add-rules", "activation-x-weight", "--out", str(out),
              "--quiet"], sites, "template", timeout=900, OMP_NUM_THREADS="1", LAB_CACHE_DIR=str(tmp_path / "cache"))
    assert p.returncode == 0, p.stderr[-2000:]
    fronts = pd.read_csv(out / "fronts.csv")
    rules = set(fronts[fronts.group == "rule"].variant)
    assert {f"rule/{r}" for r in ("activation-x-weight", "activation-balanced", "weight-norm", "random")} <= rules
    comparisons = pd.read_csv(out / "comparisons.csv")
    assert comparisons.b.eq("rule/activation-x-weight").any()
    p = _lab(["aware", "study", "--preset", "smoke", "--out", str(out), "--quiet"], sites, "template", timeout=120)
    assert p.returncode == 2 and "another configuration" in p.stderr, p.stderr   # without the rule: another study


@pytest.mark.slow
def test_the_contract_tests_run_over_plugin_entries(sites):
    """The lab's own contract tests are parametrised by the registries' names: with the plugin
    visible they hold its entries to the same contract (how a plugin author tests a plugin)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sites["template"])}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "tests/aware/test_aware_registries.py", "tests/tosca/test_routers_and_init.py",
                        "-k", "activation-x-weight or margin"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert p.returncode == 0 and "2 passed" in p.stdout, p.stdout[-3000:]


# --- in this process ----------------------------------------------------------------------------------
@pytest.fixture
def template(sites, monkeypatch):
    """The template's entry points visible here; every trace removed afterwards."""
    for path in reversed(sites["template"]):
        monkeypatch.syspath_prepend(path)
    plugins.rescan()
    yield
    plugins.forget(DIST)
    for name in [m for m in sys.modules if m == "lab_plugin_example" or m.startswith("lab_plugin_example.")]:
        del sys.modules[name]
    monkeypatch.undo()
    plugins.rescan()


def test_every_entry_passes_its_kinds_contract_check(template):
    """The checks a plugin's entries meet at load time accept every built-in entry too. Each registry
    carries its own group and contract; the static table of groups (read without importing a
    registry) is a copy of theirs."""
    found = set()
    for kind, name, source in plugins.entries():
        reg = plugins.registry(kind)
        assert reg.group == plugins.KINDS[kind].group and plugins.kind_of(reg) == kind
        assert callable(reg.contract)
        reg.contract(name, reg.get(name), reg.info(name))
        found.add((kind, name, source))
    assert {("router", "margin", DIST), ("aware rule", "activation-x-weight", DIST)} <= found


def test_the_plugin_entries_honour_the_lab_contract_tests(template, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "aware"))
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "tosca"))
    from test_aware_registries import _check_method, test_every_rule_honours_the_contract
    from test_routers_and_init import _trained, test_every_router_honours_the_contract

    from lab.experiments.tosca._synthetic import synthetic_data

    test_every_rule_honours_the_contract("activation-x-weight")
    _check_method("aware", rule="activation-x-weight")            # AWARe fine-tunes with the plugin's rule
    data = synthetic_data(num_tasks=3, dim=16, noise=1.0, seed=2)
    test_every_router_honours_the_contract("margin", (data, _trained(data)), None)


def test_the_plugin_rule_runs_in_an_ablation_sweep(template, monkeypatch, tmp_path):
    """The rule group of `lab aware ablate --rules activation-x-weight`'s sweep (the Size its command
    line builds), on the tiny random mini-LLaVA of its tests; the plugin rule is a row of its table."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "experiments" / "aware"))
    from test_aware_ablate import WORDS, toy

    from lab import cli
    from lab.experiments.aware.run import ablate
    from lab.experiments.aware import cli as aware_cli
    from lab.experiments.aware.run.context import Context
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.tasks import Task
    from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

    args = cli.build_parser().parse_args(["aware", "ablate", "--size", "smoke", "--rules", "activation-x-weight"])
    aware_cli._check_rules(args)
    tok = tiny_tokenizer(WORDS)
    size = replace(aware_cli._size(args), n_calib=8, calib_sizes=(), rhos=(0.3,), methods=("full",),
                   continual_methods=())
    assert size.rules == ("activation-x-weight",)
    ctx = Context(tiny_minillava(tok, 8), ChatEncoder(tok, 4), Task("easy_vqa", toy(16, 0), toy(8, 1)),
                  Task("probe", None, toy(6, 2, text=True)), {"fashion": Task("fashion", toy(16, 3), toy(8, 6))},
                  size, {("upstream", 8): toy(8, 9), ("proxy", 8): toy(8, 10)})
    res = ablate.sweep(ctx, groups=("rule",), run_dir=tmp_path, progress=False)["results"]
    mine = res[(res.group == "rule") & (res.variant == "activation-x-weight")].iloc[0]
    assert mine.rule == "activation-x-weight" and 0 < mine.trainable_frac < 1 and mine.H == mine.H
    assert (tmp_path / "masks_rule_activation-x-weight.safetensors").exists()
    table = ablate.summary(res)                                  # what `lab aware ablate` prints
    assert {"activation-global", "activation-x-weight"} <= set(table[table.group == "rule"].variant)


def test_the_template_is_gone_afterwards():
    from lab.aware.masking import rule_names
    from lab.tosca.routing import list_routings

    assert "margin" not in list_routings() and "activation-x-weight" not in rule_names()


def test_a_router_defined_in_a_notebook_cell_registers_routes_and_reregisters():
    """Plain decorator use from a notebook (module ``__main__``); running the cell again replaces it."""
    import torch

    from lab.tosca import routing as R

    cell = ("from lab.tosca.routing import register\n\n"
            "@register('cell-last', rule='always the newest module')\n"
            "def last(logits, ctx):\n    return torch.full((logits.shape[1],), logits.shape[0] - 1)\n")
    try:
        for _ in range(2):                                        # the cell, run twice
            exec(cell, {"__name__": "__main__", "torch": torch})
        logits = torch.randn(3, 5, 6)
        r = R.route(logits, "cell-last", task_ids=torch.tensor([2, 2, 0, 1, 2]))
        assert r.choice.tolist() == [2] * 5 and r.routing_accuracy == pytest.approx(0.6)
        assert R.ROUTERS.source("cell-last") == "__main__"
        with pytest.raises(ValueError, match="registered twice"):  # another function may not take the name
            R.register("cell-last")(lambda logits, ctx: logits.argmax(0))
    finally:
        R.ROUTERS.unregister("cell-last")


def test_names_for_the_command_line_accept_plugin_entries_only_when_they_exist(template):
    """``plugins.Names``: static built-in names for argparse choices; other names go to the registry."""
    routers = plugins.Names("router", ("per-sample", "oracle"))
    assert "per-sample" in routers and "margin" in routers and "nope" not in routers
    assert list(routers)[:2] == ["per-sample", "oracle"]
    assert "margin" in list(routers) and "margin" in routers.names()   # the registry is imported by now
    methods = plugins.Names("tosca method", ("tosca",), info={"tosca": {"routed": True}})
    plugins.registry("tosca method")
    assert methods.info("tosca") == {"routed": True} and methods.info("ncm")["routed"] is False
