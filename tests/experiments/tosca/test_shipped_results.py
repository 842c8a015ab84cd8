"""The shipped TOSCA study (results/tosca) is whole and consistent: manifest <-> tables <-> README.

Changing what the study measures means rerunning it (the commands are in the manifests) and then
`python -m lab.experiments.tosca.results` to rewrite the README section."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lab.experiments.tosca import efficiency as E
from lab.experiments.tosca import results as R
from lab.experiments.tosca import study as S
from lab.tosca.routing import list_routings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def shipped():
    return R.load(ROOT / "results" / "tosca")


def test_manifest_names_command_sources_date_machine_and_wall_time(shipped):
    m = shipped.manifest
    assert m["command"].startswith(("lab tosca study", "python -m lab.experiments.tosca.study"))
    assert m["date"] and m["wall_seconds"] > 0 and m["machine"]["platform"]
    hashed = {p.relative_to(ROOT).as_posix() for p in [*(ROOT / "lab" / "tosca").rglob("*.py"),
                                                       *(ROOT / "lab" / "tosca").rglob("*.c"), ROOT / "lab" / "_cc.py",
                                                       *(ROOT / "lab" / "experiments" / "tosca").glob("*.py")]
              if p.name not in S.UNHASHED}
    # the accelerators moved into lab/tosca/engines/ after the study: hashed under their new paths
    moved = {f"lab/tosca/{n}" for n in ("_fused.py", "_fused.c", "_step.py", "_graph.py")}
    assert {p for p in hashed if p.startswith("lab/tosca/engines/")} >= {f"lab/tosca/engines/{n.split('/')[-1]}"
                                                                         for n in moved}
    assert set(m["sources_sha256"]) <= hashed | moved and {"lab/tosca/learner.py", "lab/experiments/tosca/run.py",
                                                           "lab/_cc.py"} <= set(m["sources_sha256"])
    assert all(len(v) == 64 for v in m["sources_sha256"].values())
    configs = shipped.runs.drop_duplicates(["scenario", "seed", "method", "flow", "head_init", "luca_init"])
    assert len(configs) == m["runs"]


def test_the_study_command_trains_with_the_shipped_engine(shipped):
    """The library trains with the plain autograd step by default; the study passes its own engine
    to every variant, the one the shipped manifest records, so rerunning its command reproduces it."""
    from lab.tosca.learner import ToscaConfig

    assert ToscaConfig().engine == "autograd"
    assert shipped.manifest["base_config"]["engine"] == S.STUDY_ENGINE == S.parser().parse_args([]).engine


def test_every_router_baseline_init_and_flow_over_at_least_three_seeds(shipped):
    """The headline (reference TOSCA under every router, every baseline) at every headline seed of
    the manifest; every other initialisation at every ablation seed."""
    runs, man = shipped.runs, shipped.manifest
    head, abl = man["headline_seeds"] or man["seeds"], man["seeds"]
    assert len(abl) >= 3 and set(shipped.scenarios) == set(S.SCENARIOS)
    assert shipped.seeds == sorted({*head, *abl}) and R.ablation_seeds(runs) == sorted(abl)
    for scn in shipped.scenarios:
        ref = runs[(runs.scenario == scn) & (runs.method == "tosca") & (runs.flow == "tosca")]
        for init in S.INITS:
            got = ref[(ref.head_init == init[0]) & (ref.luca_init == init[1])]
            want = sorted({*head, *abl}) if init == S.INITS[0] else sorted(abl)
            assert set(got.routing) == set(list_routings()), (scn, init)
            assert all(sorted(g.seed) == want for _, g in got.groupby("routing")), (scn, init)
        for b in S.BASELINES:
            assert sorted(runs[(runs.scenario == scn) & (runs.method == b)].seed) == sorted({*head, *abl}), (scn, b)
    flows = runs[(runs.scenario == shipped.scenarios[0]) & (runs.method == "tosca")].flow
    assert set(flows) == {"tosca", *S.ABLATION_FLOWS}


def test_summary_is_the_runs_summarised(shipped):
    summary = pd.read_csv(shipped.folder / "summary.csv", keep_default_na=False, na_values=[""])
    again = S.summarise(shipped.runs.to_dict("records"))
    for k in S.KEYS:
        summary[k], again[k] = summary[k].fillna("").astype(str), again[k].fillna("").astype(str)
    pd.testing.assert_frame_equal(summary.reset_index(drop=True), again.reset_index(drop=True),
                                  check_exact=False, atol=1e-3, check_dtype=False)


def test_efficiency_parameters_are_the_architectures_and_every_setting_was_timed(shipped):
    assert shipped.efficiency_manifest["command"].startswith("python -m lab.experiments.tosca.efficiency")
    params = shipped.efficiency_params.set_index("backbone")
    for bb in (E.VIT_B, E.LITE0):
        row = E.parameter_row(bb)
        for k, v in row.items():
            if k != "backbone":
                assert params.loc[bb, k] == pytest.approx(v, abs=1e-4), (bb, k)  # csv: 4 decimals
    t = shipped.efficiency_time
    assert set(t.backbone) == {E.LITE0, E.VIT_B}
    assert (t.groupby("backbone").setting.apply(set) == {*E.SETTINGS}).all()
    assert (t.step_seconds > 0).all()


def test_readme_section_is_the_shipped_tables(shipped):
    got = (shipped.folder / "README.md").read_text()
    assert got == R.readme_section(shipped), "results/tosca/README.md out of date: run " \
        "`python -m lab.experiments.tosca.results`"
    readme = (ROOT / "README.md").read_text()
    assert "results/tosca/README.md" in readme and R.README_HEADING not in readme
