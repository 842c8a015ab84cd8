"""Notebook 05's comparison (lab.experiments.tosca.compare): verdicts from paired intervals over seeds,
a router registered in a cell evaluated beside the built-ins, the template's router without installing
it, and the panel that re-draws from computed results."""
from __future__ import annotations

import math
import sys

import pandas as pd
import pytest
import torch
from scipy import stats

from lab.experiments.tosca import compare as C
from lab.experiments.tosca._synthetic import synthetic_data
from lab.experiments.tosca.run import RunConfig
from lab.tosca.routing import ROUTERS, register


# --- verdicts on hand-made numbers ---------------------------------------------------------------------
@pytest.mark.parametrize("mean,half,expected", [
    (3.0, 1.0, "better"), (-3.0, 1.0, "worse"),
    (1.0, 2.0, "no difference detected"), (-1.0, 2.0, "no difference detected"),
    (2.0, 2.0, "no difference detected"),          # an interval touching zero still spans it
    (0.0, 0.0, "no difference detected"),          # identical on every seed
    (5.0, float("nan"), "no interval"), (float("nan"), 1.0, "no interval"),
])
def test_verdict(mean, half, expected):
    assert C.verdict(mean, half) == expected


def _hand_made() -> C.Comparison:
    """Three seeds; 'mine' beats 'low' on every seed, loses to 'high' on every seed, and swings around 'tie'."""
    values = {"mine": [80.0, 82.0, 84.0], "low": [70.0, 71.0, 72.0], "tie": [81.0, 80.0, 86.0],
              "high": [90.0, 93.0, 95.0]}
    rows = [{"seed": seed, "router": r, "source": "__main__" if r == "mine" else "built-in",
             "role": "yours" if r == "mine" else "built-in", "avg_inc_acc": v[i], "last_acc": v[i],
             "routing_accuracy_last": v[i] - 10, "routing_accuracy_mean": v[i] - 10, "train_s": 0.0}
            for r, v in values.items() for i, seed in enumerate((1, 2, 3))]
    return C.Comparison(pd.DataFrame(rows), ("mine",), ("low", "tie", "high"), config=None)


def test_paired_differences_and_their_verdicts_on_hand_made_numbers():
    comp = _hand_made()
    d = C.differences(comp, "mine", ["low", "tie", "high"], metrics=("last_acc",)).set_index("against")
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)        # differences 10, 11, 12: sd 1
    assert d.loc["low", "diff"] == pytest.approx(11.0) and d.loc["low", "ci95"] == pytest.approx(half)
    assert d.loc["low", "lo"] == pytest.approx(11.0 - half) and d.loc["low", "seeds"] == 3
    assert d.verdict.to_dict() == {"low": "better", "tie": "no difference detected", "high": "worse"}
    assert d.loc["tie", "lo"] < 0 < d.loc["tie", "hi"]        # differences -1, 2, -2: the interval spans zero
    # the words are computed from those verdicts
    title = C.headline(d.reset_index(), "last_acc")
    assert title.startswith("mine − built-in (A_B, 3 seeds, paired): ")
    assert "better than low" in title and "worse than high" in title and "no difference detected with tie" in title
    text = C.sentences(C.differences(comp, "mine", ["low", "tie"]))
    assert "**mine vs low**: A_B higher by 11.0 ± 2.5 points (better)" in text
    assert "**mine vs tie**: A_B: no difference detected (−0.3 ± " in text
    table = C.difference_table(C.differences(comp, "mine", ["tie"]))
    assert table.loc[0, "A_B difference"].endswith("(no difference detected)")
    summary = C.summary_table(comp).set_index("router")
    assert summary.loc["mine", "from"] == "this notebook" and summary.loc["mine", "A_B (%)"] == "82.0 ± 5.0"
    assert "better than low" in C.findings(comp, ["low", "tie", "high"])


def test_one_seed_has_no_interval_and_no_verdict():
    comp = _hand_made()
    comp.runs = comp.runs[comp.runs.seed == 1]
    d = C.differences(comp, "mine", ["low"], metrics=("last_acc",))
    assert d.verdict.tolist() == ["no interval"] and math.isnan(d.ci95.iloc[0])


def test_unknown_routers_and_metrics_are_named():
    comp = _hand_made()
    with pytest.raises(KeyError, match="'nope' was not evaluated"):
        C.differences(comp, "mine", ["nope"])
    with pytest.raises(KeyError, match="unknown metric"):
        comp.per_seed("mine", "accuracy")


# --- a router registered in a cell, beside the built-ins -----------------------------------------------
@pytest.fixture
def cell_router():
    name = "test-prototype-check"

    @register(name, rule="each module's top-1 class; the one nearest its class mean")
    def prototype_check(logits, ctx):
        f = torch.nn.functional.normalize(ctx.features.float(), dim=1)
        mu = torch.nn.functional.normalize(ctx.class_means.float(), dim=1)
        return (f @ mu.T).gather(1, logits.argmax(-1).T).T.argmax(0)

    yield name
    ROUTERS.unregister(name)


def _data(seed):
    return synthetic_data(num_tasks=3, dim=16, noise=2.5, seed=seed)


def test_a_cell_registered_router_is_evaluated_beside_the_built_ins(cell_router, tmp_path):
    builtins = ["per-sample", "ncm", "oracle"]
    comp = C.run_seeds([cell_router], builtins, seeds=[3, 4], config=RunConfig(epochs=1), data=_data,
                       runs_root=tmp_path, log=None)
    runs = comp.runs
    assert set(runs.router) == {cell_router, *builtins} and comp.seeds == [3, 4]
    assert runs.groupby("seed").router.nunique().tolist() == [4, 4]          # every router on every seed
    mine = runs[runs.router == cell_router]
    assert set(mine.source) == {__name__} and set(mine.role) == {"yours"}      # where it came from
    assert set(runs[runs.router != cell_router].source) == {"built-in"}
    assert (runs[runs.router == "oracle"].routing_accuracy_last == 100).all()   # routing accuracy in %
    assert runs.train_s.groupby(runs.seed).nunique().eq(1).all()                # one trained TOSCA per seed
    d = C.differences(comp, cell_router, ["per-sample", "ncm"])
    assert set(d.against) == {"per-sample", "ncm"} and len(d) == 2 * len(C.METRICS)
    assert set(d.verdict) <= set(C.VERDICTS)
    assert C.summary_table(comp).router.tolist() == [cell_router, *builtins]
    fig = C.difference_figure(d)
    lines = fig.layout.title.text.split("<br>")     # the headline, one verdict per line: none cut off
    assert "<br>".join(lines).replace("):<br>", "): ").replace("<br>", "; ") == C.headline(d)
    assert len(lines) >= 2 and all(len(s) < 90 for s in lines)
    C.means_figure(comp)


def test_run_seeds_checks_everything_before_training(cell_router, monkeypatch):
    import lab.experiments.tosca.run as R

    monkeypatch.setattr(R, "run", lambda *a, **k: pytest.fail("trained before the checks"))
    for kwargs, match in [(dict(seeds=[1]), "at least two seeds"), (dict(seeds=[1, 1]), "at least two seeds"),
                          (dict(seeds=[1, 2], builtins=["nope"]), "unknown routing 'nope'"),
                          (dict(seeds=[1, 2], builtins=[cell_router]), "both as yours and as a built-in"),
                          (dict(seeds=[1, 2], config=RunConfig(method="simplecil")), "must be 'tosca'")]:
        kwargs = {"builtins": ["ncm"], **kwargs}
        with pytest.raises(ValueError, match=match):
            C.run_seeds([cell_router], kwargs.pop("builtins"), data=_data, log=None, **kwargs)
    with pytest.raises(ValueError, match="at least one router"):
        C.run_seeds([], ["ncm"], seeds=[1, 2], data=_data, log=None)


# --- the template plugin's router, without installing it -----------------------------------------------
@pytest.fixture
def template_router(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))      # example_plugin adds the template's folder
    assert "margin" not in ROUTERS
    yield
    if "margin" in ROUTERS:
        ROUTERS.unregister("margin")
    for m in [m for m in sys.modules if m == "lab_plugin_example" or m.startswith("lab_plugin_example.")]:
        del sys.modules[m]


def test_the_template_router_is_used_without_installing_it(template_router, tmp_path):
    with pytest.raises(FileNotFoundError, match="no lab_plugin_example/margin.py"):
        C.example_plugin("margin", folder=tmp_path)
    line = C.example_plugin("margin")
    assert "registered from" in line and "(not installed)" in line and "margin" in ROUTERS
    assert ROUTERS.source("margin") == "lab_plugin_example.margin"
    assert "already registered" in C.example_plugin("margin")      # a second call (a cell re-run) adds nothing
    comp = C.run_seeds(["margin"], ["per-sample"], seeds=[0, 1], config=RunConfig(epochs=1), data=_data,
                       runs_root=tmp_path, log=None)
    assert set(comp.runs.router) == {"margin", "per-sample"}


# --- the panel: redraws from the computed results ------------------------------------------------------
def test_the_panel_redraws_from_computed_results_without_training(monkeypatch):
    pytest.importorskip("ipywidgets")
    from lab.widgets import PLOTLY_MIME, RouterComparePanel

    monkeypatch.setattr(C, "run_seeds", lambda *a, **k: pytest.fail("the panel trained"))
    p = RouterComparePanel(_hand_made(), against=["low"])
    assert p.refreshes == 1 and p.result["verdicts"] == {"low": "better"}
    assert "better than low" in p.status.value
    titles = [o["data"][PLOTLY_MIME]["layout"]["title"]["text"] for o in p.output.outputs]
    assert titles[0].startswith("mine − built-in (A_B") and len(titles) == 3
    p.controls["against"].value = ("low", "tie", "high")
    assert p.refreshes == 2 and p.error is None
    assert p.result["verdicts"] == {"low": "better", "tie": "no difference detected", "high": "worse"}
    assert "worse than high" in p.status.value and len(p.result["table"]) == 3
    p.controls["metric"].value = "routing_accuracy_last"
    assert p.refreshes == 3 and "routing accuracy" in p.output.outputs[0]["data"][PLOTLY_MIME]["layout"]["title"]["text"]
    p.controls["against"].value = ()
    assert p.error is None and "pick at least one" in p.status.value
    p.reset_button.click()
    assert p.values() == {"candidate": "mine", "against": ("low",), "metric": "last_acc"}
    with pytest.raises(ValueError, match="'nope' was not evaluated"):
        RouterComparePanel(_hand_made(), against=["nope"])
