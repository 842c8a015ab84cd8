"""Plugins are contained (lab/plugins.py, lab/_registry.py, lab/tosca/routing.py): a plugin that
misbehaves costs one line naming its package and entry point, and every built-in keeps working.

Each misbehaving plugin is a real package installed into a throw-away environment: a temporary
folder with the package and its ``.dist-info`` (METADATA, entry_points.txt, as pip writes them) on
``PYTHONPATH`` of a real ``lab`` subprocess, run with a timeout. ``CASES`` is the table: (plugin,
command, expected exit status, the one stderr line's fragments or None for no line, what stdout
must show).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from _report_helpers import hard_timeout

ROOT = Path(__file__).resolve().parents[1]
LAB = str(Path(sys.executable).with_name("lab"))

ROUTER = '''
from lab.tosca.routing import entropy, register


@register({name!r})
def route(logits, ctx):
    return {body}
'''

# package name -> (entry points {group: {name: value}}, {module file: source})
PACKAGES = {
    # parses "its" command line at import, then rewrites sys.argv: neither reaches the lab
    "argv-reader": ({"continual_lab.routers": {"argv": "lab_out_argv"}}, {"lab_out_argv/__init__.py": textwrap.dedent("""
        import argparse
        import sys

        OPTIONS = argparse.ArgumentParser().parse_args()
        sys.argv[:] = ["hijacked", "--bogus"]
        """) + ROUTER.format(name="argv-router", body="entropy(logits).argmin(0)")}),
    # exits at import, after argparse printed its usage
    "exits": ({"continual_lab.routers": {"bye": "lab_out_exits"}}, {"lab_out_exits/__init__.py": """
        import argparse

        argparse.ArgumentParser(prog="exits").parse_args(["--nope"])
        """}),
    # an import that hangs
    "slow": ({"continual_lab.routers": {"slow": "lab_out_slow"}}, {"lab_out_slow/__init__.py": textwrap.dedent("""
        import time

        time.sleep(120)
        """) + ROUTER.format(name="slow-router", body="entropy(logits).argmin(0)")}),
    # available() raises, for a dataset and a backbone
    "raises": ({"continual_lab.datasets": {"data": "lab_out_raises.data"},
                "continual_lab.backbones": {"bb": "lab_out_raises.bb"}}, {
        "lab_out_raises/__init__.py": "",
        "lab_out_raises/data.py": """
            from lab.data.datasets import _REGISTRY


            def _available(root):
                raise OSError("the dataset server is down")


            @_REGISTRY.register("raising-data", classes=3, train=30, test=30, licence="none", image="1x1",
                                available=_available)
            def make(root):
                raise NotImplementedError
            """,
        "lab_out_raises/bb.py": """
            from lab.backbones import _REGISTRY


            def _available():
                raise RuntimeError("no weights today")


            @_REGISTRY.register("raising-backbone", default_resolution=32, resolution_range=(32, 64, 16),
                                feature_dim=8, pretrained="nowhere", untrained=False, available=_available,
                                arch=("vit_tiny_patch16_224", {"num_classes": 0}), params=1000)
            def make(resolution, weights=None):
                raise NotImplementedError
            """}),
    # re-registers built-ins: per-sample through functools.wraps (module), oracle through register(registry)
    "shadow": ({"continual_lab.routers": {"wraps": "lab_out_shadow.wraps", "fn": "lab_out_shadow.fn:register"}}, {
        "lab_out_shadow/__init__.py": "",
        "lab_out_shadow/wraps.py": """
            import functools

            import torch

            from lab.tosca import routing


            @routing.register("per-sample")
            @functools.wraps(routing._entropy_per_sample)
            def evil(logits, ctx):
                return torch.zeros(logits.shape[1], dtype=torch.long)
            """,
        "lab_out_shadow/fn.py": """
            def register(registry):
                registry.register("oracle", protocol="oracle")(lambda logits, ctx: logits[0].argmax(-1) * 0)
            """}),
    # routers whose answers are wrong: -1, past the last module, floats, a wrong shape, an exception
    "bad-routers": ({"continual_lab.routers": {f"r{i}": f"lab_out_bad.r{i}" for i in range(5)}}, {
        "lab_out_bad/__init__.py": "",
        "lab_out_bad/r0.py": ROUTER.format(name="minus-one", body="entropy(logits).argmin(0) * 0 - 1"),
        "lab_out_bad/r1.py": ROUTER.format(name="past-the-end", body="entropy(logits).argmin(0) * 0 + logits.shape[0]"),
        "lab_out_bad/r2.py": ROUTER.format(name="floats", body="entropy(logits).argmin(0).float()"),
        "lab_out_bad/r3.py": ROUTER.format(name="wrong-shape", body="entropy(logits).argmin(0)[:, None]"),
        "lab_out_bad/r4.py": ROUTER.format(name="raising", body="1 / 0"),
    }),
    # one plugin of each kind that records its import (which commands import which kind)
    "marks": ({"continual_lab.routers": {"r": "lab_out_marks.router"},
               "continual_lab.datasets": {"d": "lab_out_marks.data"},
               "continual_lab.backbones": {"b": "lab_out_marks.bb"},
               "continual_lab.aware_rules": {"a": "lab_out_marks.rule"}}, {
        "lab_out_marks/__init__.py": """
            import os


            def mark(kind):
                with open(os.environ["LAB_OUT_MARKS"], "a") as fh:
                    fh.write(kind + "\\n")
            """,
        "lab_out_marks/router.py": "from lab_out_marks import mark\nmark('router')\n"
                                   + ROUTER.format(name="marked-router", body="entropy(logits).argmin(0)"),
        "lab_out_marks/data.py": """
            from lab.data.datasets import _REGISTRY
            from lab_out_marks import mark

            mark("dataset")


            @_REGISTRY.register("marked-data", classes=3, train=30, test=30, licence="none", image="1x1",
                                available=lambda root: (False, "nowhere"))
            def make(root):
                raise NotImplementedError
            """,
        "lab_out_marks/bb.py": """
            from lab.backbones import _REGISTRY
            from lab_out_marks import mark

            mark("backbone")


            @_REGISTRY.register("marked-backbone", default_resolution=32, resolution_range=(32, 64, 16),
                                feature_dim=8, pretrained="nowhere", untrained=False,
                                available=lambda: (False, "nowhere"), arch=("vit_tiny_patch16_224", {}), params=10)
            def make(resolution, weights=None):
                raise NotImplementedError
            """,
        "lab_out_marks/rule.py": """
            from lab.aware.masking import register_rule
            from lab_out_marks import mark

            mark("aware rule")


            @register_rule("marked-rule", saliency=False)
            def rule(scores, rho, *, weights=None, seed=0):
                return {}
            """}),
}


def _install(site: Path, dist: str) -> None:
    groups, files = PACKAGES[dist]
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items()))
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))


@dataclass(frozen=True)
class Case:
    dist: str                 # the installed plugin package
    argv: tuple[str, ...]     # the lab command ({runs}: a fresh runs folder)
    code: int                 # exit status
    line: tuple[str, ...] | None   # fragments of the ONE stderr line (None: stderr stays empty)
    stdout: tuple[str, ...] = ()   # in stdout
    env: dict = field(default_factory=dict)
    bound: float = 120.0      # seconds
    marks: tuple[str, ...] | None = None   # the plugin kinds imported (the "marks" package)

    @property
    def id(self) -> str:
        return f"{self.dist}:{' '.join(self.argv)}"


def _skip(dist: str, ep: str, *why: str) -> tuple[str, ...]:
    return ("lab: plugin skipped: package " + dist, f"entry point {ep}", *why)


TOSCA = ("tosca", "--backbone", "vit_tiny_patch16_224", "--resolution", "32", "--epochs", "1", "--quiet",
         "--runs-dir", "{runs}")
CASES = [
    Case("argv-reader", ("plugins",), 0, None, ("argv-router", "argv-reader", "per-sample")),
    Case("argv-reader", ("tosca", "--routing", "argv-router", "--epochs", "0"), 2,
         ("lab tosca: error: --epochs 0: must be an integer >= 1",)),
    Case("exits", ("plugins",), 0, _skip("exits", "bye = lab_out_exits", "SystemExit(2) at import",
                                         "unrecognized arguments: --nope"), ("per-sample", "built-in")),
    Case("slow", ("plugins",), 0, _skip("slow", "slow = lab_out_slow", "its import took more than 3 s"),
         ("per-sample",), env={"LAB_PLUGIN_TIMEOUT": "3"}, bound=60),
    Case("slow", ("tosca", "--epochs", "0"), 2, ("--epochs 0: must be an integer >= 1",), bound=60),   # not imported
    Case("raises", ("datasets",), 0, None,
         ("fashion_mnist_mini", "raising-data", "available() failed: OSError: the dataset server is down")),
    Case("raises", ("backbones",), 0, None,
         ("efficientnet_lite0", "raising-backbone", "available() failed: RuntimeError: no weights today")),
    Case("shadow", ("plugins",), 0, None, ("per-sample", "oracle")),   # two lines: checked in the test
    *[Case("bad-routers", (*TOSCA, "--routing", name, "--routings", name), 2,
           ("lab tosca: error: routing " + repr(name) + " (registered by bad-routers)", why, "before training"))
      for name, why in (("minus-one", "returned module index -1; the 3 modules are 0..2"),
                        ("past-the-end", "returned module index 3; the 3 modules are 0..2"),
                        ("floats", "returned torch.float32 values; module indices must be integers"),
                        ("wrong-shape", "returned shape (6, 1), expected (6,)"),
                        ("raising", "failed on a test batch before training: ZeroDivisionError"))],
    Case("marks", ("--help",), 0, None, marks=()),
    Case("marks", ("tosca", "--epochs", "0"), 2, ("--epochs 0",), marks=()),
    Case("marks", ("tosca", "study", "--help"), 0, None, marks=()),
    Case("marks", ("tosca", "--seed", "-1"), 2, ("--seed -1",), marks=()),
    Case("marks", ("datasets",), 0, None, ("marked-data",), marks=("dataset",)),
    Case("marks", ("tosca", "--routing", "marked-router", "--epochs", "0"), 2, ("--epochs 0",), marks=("router",)),
    Case("marks", ("plugins",), 0, None, ("marked-rule",), marks=("aware rule", "backbone", "dataset", "router")),
]


def _run(case: Case, site: Path, tmp: Path) -> tuple[int, str, str, float, list[str]]:
    runs, marks = tmp / "runs", tmp / "marks.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "LAB_OUT_MARKS": str(marks), "PYTHONWARNINGS": "ignore", **case.env}
    if "LAB_PLUGIN_TIMEOUT" not in case.env:
        env.pop("LAB_PLUGIN_TIMEOUT", None)
    argv = [a.replace("{runs}", str(runs)) for a in case.argv]
    t0 = time.perf_counter()
    p = subprocess.run([LAB, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=case.bound + 60)
    seconds = time.perf_counter() - t0
    kinds = sorted(set(marks.read_text().split("\n")) - {""}) if marks.exists() else []
    return p.returncode, p.stdout, p.stderr, seconds, kinds


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("outside-plugins")
    for dist in PACKAGES:
        _install(base / "site" / dist, dist)
    jobs = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        for i, case in enumerate(CASES):
            tmp = base / f"case{i}"
            tmp.mkdir()
            jobs[case.id] = (tmp, pool.submit(_run, case, base / "site" / case.dist, tmp))
        return {key: (tmp, f.result()) for key, (tmp, f) in jobs.items()}


@hard_timeout(900)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_misbehaving_plugin_costs_one_line_and_the_built_ins_work(case, results):
    tmp, (code, out, err, seconds, kinds) = results[case.id]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == case.code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if case.dist == "shadow":      # each entry point's clash: one line each, the built-ins stay
        assert len(lines) == 2, err
        assert any("wraps = lab_out_shadow.wraps" in ln and "routing 'per-sample' is a built-in; a plugin cannot "
                   "replace it" in ln for ln in lines), err
        assert any("fn = lab_out_shadow.fn:register" in ln and "routing 'oracle' is a built-in" in ln for ln in lines)
        rows = [ln.split() for ln in out.splitlines()]
        assert ["router", "per-sample", "built-in"] in rows and ["router", "oracle", "built-in"] in rows
    elif case.line is None:
        assert not lines, err
    else:
        assert len(lines) == 1, err
        assert all(f in lines[0] for f in case.line), lines[0]
    for fragment in case.stdout:
        assert fragment in out, out[-3000:]
    assert seconds < case.bound, f"{seconds:.1f} s"
    if case.marks is not None:
        assert kinds == sorted(case.marks), kinds
    if case.dist == "bad-routers":
        assert not (tmp / "runs").exists() or not any((tmp / "runs").rglob("config.json"))   # nothing started


@hard_timeout(300)
def test_a_bad_router_fails_within_a_second_and_a_shadowed_built_in_still_routes(tmp_path):
    """In one process: the router check costs under a second (all five bad routers), and the
    built-ins the 'shadow' plugin tried to replace are the lab's own functions."""
    site = tmp_path / "site"
    for dist in ("bad-routers", "shadow"):
        _install(site, dist)
    code = textwrap.dedent("""
        import time
        from lab.experiments.tosca.run import RunConfig
        from lab.tosca import routing
        t0 = time.perf_counter()
        routing.list_routings()                     # the plugins load (not timed below)
        print("LOAD", round(time.perf_counter() - t0, 2))
        for name in ("minus-one", "past-the-end", "floats", "wrong-shape", "raising"):
            t0 = time.perf_counter()
            try:
                RunConfig(routing=name, routings=(name,))
                print("ACCEPTED", name)
            except ValueError as exc:
                print("REFUSED", name, round(time.perf_counter() - t0, 3))
        print("PER-SAMPLE", routing.ROUTERS.get("per-sample") is routing._entropy_per_sample,
              routing.ROUTERS.source("per-sample"), RunConfig(routing="per-sample").routing)
        print("ORACLE", routing.ROUTERS.get("oracle") is routing._oracle)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    refused = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("REFUSED")]
    assert len(refused) == 5 and all(float(r[2]) <= 1.0 for r in refused), p.stdout
    assert "PER-SAMPLE True built-in per-sample" in p.stdout and "ORACLE True" in p.stdout, p.stdout
