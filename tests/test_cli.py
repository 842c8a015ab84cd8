import subprocess
import sys

import pytest

from lab import cli


def run(*args):
    return subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_subcommand():
    out = run("--help").stdout
    for sub in ("backbones", "datasets", "features", "tosca", "aware", "report", "jupyter"):
        assert sub in out


def test_backbones_lists_availability(capsys):
    assert cli.main(["backbones"]) == 0
    out = capsys.readouterr().out
    assert "efficientnet_lite0" in out and "vit_tiny_patch16_224 (UNTRAINED)" in out
    assert "vit_base_patch16_224.augreg_in21k" in out


def test_datasets_lists_default_and_licences(capsys):
    assert cli.main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "fashion_mnist_mini (default)" in out and "MIT" in out and "cub200" in out


@pytest.mark.parametrize("args,msg", [(["--backbone", "nope"], "valid backbones"), (["--dataset", "nope"], "valid datasets"),
                                      (["--resolution", "7"], "resolution")])
def test_features_bad_input_is_a_clear_error(args, msg, capsys):
    assert cli.main(["features", *args]) == 2
    assert msg in capsys.readouterr().err


def test_features_builds_then_hits_cache_also_with_the_weights_given_explicitly(tmp_path, monkeypatch):
    """The first call extracts, the same call again is a cache hit, and ``--weights FILE`` loads
    through the backbone's own loader: the packaged file given explicitly is the same weights (the
    same cache key) as the default."""
    from lab import backbones

    path = backbones._lite0_file()
    if path is None:
        pytest.skip("packaged efficientnet_lite0 weights not installed")
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    args = ["features", "--dataset", "fashion_mnist_mini", "--resolution", "32", "--splits", "test", "--quiet"]
    first = run(*args)
    assert first.returncode == 0, first.stderr
    assert "extracted" in first.stdout and "images/s" in first.stdout
    second = run(*args)
    assert second.returncode == 0 and "cache hit" in second.stdout, second.stderr
    third = run(*args, "--weights", str(path))
    assert third.returncode == 0 and "cache hit" in third.stdout, third.stderr


def test_errors_are_one_line_without_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["tosca", "--epochs", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lab tosca: error: argument --epochs") and "usage" not in err


def test_lab_help_lists_every_command_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys, io, contextlib\nfrom lab import cli\nbuf = io.StringIO()\n"
            "try:\n    with contextlib.redirect_stdout(buf):\n        cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); print(buf.getvalue())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("NO-TORCH"), out[:200]
    for name in ("backbones", "datasets", "features", "tosca", "aware", "report", "jupyter"):
        assert f"    {name}" in out


# --- a CLI that answers at once: no torch for --help and usage errors ------------------------------
def _subcommands() -> list[list[str]]:
    """Every subcommand path of `lab` (['tosca'], ['aware', 'finetune'], ...), from the parser itself."""
    import argparse

    out = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append([*path, name])
                    walk(sub, [*path, name])

    walk(cli.build_parser(), [])
    return out + [["tosca", "study"]]       # lab tosca study: its own parser, dispatched by lab.cli.main


# usage errors that must answer without torch: argparse's own (bad choices, types, unknown flags)
# and the first checks of each handler
NO_TORCH_ERRORS = [
    ["nope"], ["--bogus"], ["backbones", "--bogus"],
    ["tosca", "--method", "nope"], ["tosca", "--routing", "nope"], ["tosca", "--epochs", "x"],
    ["tosca", "--epochs", "0"], ["tosca", "--lr", "nan"], ["tosca", "--dataset", "nope"],
    ["tosca", "--engine", "cuda_graph"], ["tosca", "--seeds", "1", "1"],
    ["aware", "nope"], ["aware", "finetune", "--method", "nope"], ["aware", "finetune", "--rule", "nope"],
    ["aware", "finetune", "--size", "huge"], ["aware", "ablate", "--groups", "nope"], ["aware", "study", "--preset", "x"],
    ["aware", "finetune", "--rho", "2"], ["aware", "finetune", "--seed", "-1"], ["aware", "finetune", "--lr", "1e30"],
    ["aware", "finetune", "--steps", "0"], ["aware", "finetune", "--save", ""],
    ["report", "--params", "huge"], ["report", "--timeout", "-1"],
    ["features", "--splits", "val"], ["features", "--batch-size", "0"], ["jupyter", "--port", "-1"],
]


def test_every_subcommand_help_and_usage_error_imports_no_torch():
    """`lab <command> --help` for every subcommand, and the usage errors above, in one fresh
    interpreter: after each, torch (3-5 s to import on a slow machine) is not loaded. Not a timed
    test: benchmarks/bench_cli.py measures the times."""
    import json

    cases = [[*path, "--help"] for path in _subcommands()] + NO_TORCH_ERRORS
    code = ("import contextlib, io, json, sys\nfrom lab import cli\nout = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try:\n            rc = cli.main(argv)\n        except SystemExit as exc:\n            rc = exc.code\n"
            "    out.append([argv, rc, 'torch' in sys.modules])\n"
            "    if 'torch' in sys.modules:\n        break\n"
            "print(json.dumps(out))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout.strip().splitlines()[-1])
    torch_at = [argv for argv, _, torch in results if torch]
    assert not torch_at, f"`lab {' '.join(torch_at[0])}` imported torch"
    assert len(results) == len(cases)
    for argv, rc, _ in results:
        assert rc == (0 if argv[-1] == "--help" else 2), (argv, rc)


def test_static_names_match_the_registries():
    """lab._names (the parsers' choices, read without importing torch) lists exactly what the
    registries hold, in their order, with the same info."""
    from lab import _names, backbones, data
    from lab.aware.masking import RULES, rule_names
    from lab.aware.methods import METHODS, method_names
    from lab.experiments.aware.run.context import SIZES
    from lab.experiments.aware.study.plan import PRESETS
    from lab.experiments.aware.run.tasks import TEMPLATES
    from lab.experiments.tosca import _base, methods
    from lab.tosca import luca, routing

    # the built-in entries only: an installed plugin adds names the static tables cannot know
    builtin = methods.METHODS.builtin_names()
    assert list(_names.TOSCA_METHODS) == [n for n in methods.list_methods() if n in builtin]
    assert all(_names.TOSCA_METHODS.info(n) == methods.METHODS.info(n) for n in builtin)
    assert _names.TOSCA_MODES == tuple(_base.MODES)
    assert _names.TOSCA_FLOWS == tuple(luca.FLOWS)
    assert tuple(_names.ROUTINGS) == tuple(routing.ROUTERS.builtin_names())
    assert _names.DEFAULT_ROUTINGS == tuple(routing.ROUTINGS)
    assert tuple(_names.AWARE_METHODS) == tuple(n for n in method_names() if n in METHODS.builtin_names())
    assert tuple(_names.AWARE_RULES) == tuple(n for n in rule_names() if n in RULES.builtin_names())
    assert _names.AWARE_TASKS == tuple(TEMPLATES)
    assert _names.AWARE_SIZES == tuple(SIZES)
    assert _names.AWARE_PRESETS == tuple(PRESETS)      # the report's "aware_presets" choices
    assert _names.DEFAULT_BACKBONE == backbones.DEFAULT_BACKBONE
    assert _names.DEFAULT_DATASET == data.DEFAULT_DATASET
    assert _names.PREPROCESS == tuple(backbones.PREPROCESS)
    assert _names.PRECISIONS == tuple(backbones.PRECISIONS)


def test_a_reader_that_leaves_early_gets_no_error_line():
    """`lab plugins | head -1`: when the reader closes the pipe, lab stops without a message."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "lab", "plugins"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()   # the reader is gone before lab writes a line
    _, err = p.communicate(timeout=120)
    assert err.decode().strip() == "" and p.returncode in (0, 141)
