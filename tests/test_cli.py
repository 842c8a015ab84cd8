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


def test_features_builds_then_hits_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    args = ["features", "--backbone", "vit_tiny_patch16_224", "--dataset", "fashion_mnist_mini", "--resolution", "32",
            "--splits", "test", "--quiet"]
    first = run(*args)
    assert first.returncode == 0, first.stderr
    assert "extracted" in first.stdout and "images/s" in first.stdout
    second = run(*args)
    assert "cache hit" in second.stdout
