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
