"""A new TOSCA method is one file and one registry entry: a toy cosine-NCM baseline, written to a
module of its own and imported, is accepted by `lab tosca --method`, named among the valid methods
of a usage error, runs through the harness, and takes its place in the study's tables (as a headline
baseline, the flag its entry sets) with no other change."""
from __future__ import annotations

import importlib.util
import sys

import pandas as pd
import pytest

from lab.experiments.tosca import methods as Me

NAME = "toy_cosine_ncm"
TOY = f'''
"""A toy method: nearest class mean by cosine similarity (one file, one registry entry)."""
import torch
from torch.nn.functional import normalize

from lab.experiments.tosca.baselines import NCM
from lab.experiments.tosca.methods import register


@register("{NAME}", trains=False, headline=4)
class CosineNCM(NCM):
    @torch.no_grad()
    def logits(self, data, idx):
        return (normalize(data.test_x[idx].float(), dim=1) @ normalize(self.state["means"], dim=1).T)[None]
'''


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy_tosca_method.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_tosca_method", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield NAME
    finally:
        if NAME in Me.METHODS:
            Me.METHODS.unregister(NAME)
        sys.modules.pop(spec.name, None)


def test_the_command_line_takes_the_toy_and_lists_it(toy, tmp_path, monkeypatch, capsys):
    from lab import cli
    from lab.experiments.tosca import cli as tosca_cli

    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path))
    parser = cli.build_parser(["tosca"])
    tosca_cli.check_args(parser.parse_args(["tosca", "--method", toy, "--seed", "3"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["tosca", "--method", "nope"])
    assert toy in capsys.readouterr().err          # the usage error lists it among the valid methods
    # its registry info decides which options apply: it trains nothing and has no LuCA
    for argv, fragment in ((["--epochs", "3"], "it takes no gradient steps"),
                           (["--l1", "0", "1e-3"], "method toy_cosine_ncm has none"),
                           (["--mode", "augment"], "augment mode changes only tosca and layerwise_adapter")):
        with pytest.raises(Exception, match=fragment):
            tosca_cli.check_args(parser.parse_args(["tosca", "--method", toy, *argv]))


def test_the_harness_lists_and_runs_the_toy(toy, tmp_path):
    from lab.experiments.tosca._synthetic import synthetic_data
    from lab.experiments.tosca.run import RunConfig, run

    assert Me.list_methods()[-1] == toy           # after the built-ins
    res = run(RunConfig(method=toy, epochs=1), data=synthetic_data(num_tasks=2, dim=8, seed=7),
              runs_root=tmp_path, progress=False)
    assert res.summary.routing.tolist() == ["single"]    # not routed: one model
    assert res.summary.last_acc.iloc[0] > 50      # separable synthetic classes


def _runs(toy: str) -> pd.DataFrame:
    """Three seeds of TOSCA (per-sample and oracle), SimpleCIL and the toy; the toy is SimpleCIL + 2."""
    rows = []
    for seed, sc in zip((1, 2, 3), (80.0, 70.0, 75.0)):
        base = dict(scenario="a", seed=seed, trainable_params=100, train_s=1.0, seconds=1.0,
                    routing_accuracy_last=float("nan"), routing_accuracy_mean=float("nan"))
        for routing, acc in (("per-sample", sc + seed), ("oracle", 95.0 + seed)):
            rows.append({**base, "method": "tosca", "flow": "tosca", "head_init": "reference",
                         "luca_init": "reference", "routing": routing, "avg_inc_acc": acc + 1, "last_acc": acc,
                         "routing_accuracy_last": 80.0, "routing_accuracy_mean": 85.0})
        for m, acc in (("simplecil", sc), (toy, sc + 2.0)):
            rows.append({**base, "method": m, "flow": "", "head_init": "", "luca_init": "", "routing": "single",
                         "avg_inc_acc": acc, "last_acc": acc})
    return pd.DataFrame(rows)


def test_the_study_tables_show_the_toy(toy):
    from lab.experiments.tosca import results as R

    runs = _runs(toy)
    assert R.baselines(runs) == ["simplecil", toy] and R.routings(runs) == ["per-sample", "oracle"]
    assert R.headline_baselines(runs) == ["simplecil", toy]     # its entry's headline flag puts it there
    table = R.router_table(runs, "a").set_index("method")
    assert toy in table.index and f"A_B − {toy}" in table.columns
    assert table.loc["TOSCA (per-sample)", f"A_B − {toy}"].startswith("+0.0 ± ")   # TOSCA − toy: seed − 2
    comp = R.comparisons(runs)
    assert set(comp.b) == {"simplecil", toy}
    assert toy in R.answer(runs, "a")
    fig = R.router_figure(runs, "a")
    assert any(toy in str(getattr(t, "x", "")) or toy in str(getattr(t, "y", "")) or toy == t.name
               for t in fig.data)
