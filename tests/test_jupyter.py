"""`lab jupyter`: JupyterLab on 127.0.0.1 with a token, the project's kernel, notebooks/."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from _report_helpers import hard_timeout
from lab import jupyter


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab")
    jupyter.register(parser.add_subparsers())
    return parser.parse_args(["jupyter", *argv])


def test_command_binds_localhost_with_a_fresh_token_and_the_notebooks_root(tmp_path):
    argv, env, url = jupyter.build_command(parse("--root-dir", str(tmp_path)))
    assert "--ip=127.0.0.1" in argv and "--no-browser" in argv
    assert f"--ServerApp.root_dir={tmp_path.resolve()}" in argv
    token = env["JUPYTER_TOKEN"]
    assert len(token) >= 24 and token in url and not any(token in a for a in argv)  # not in `ps`
    assert url.startswith("http://127.0.0.1:")
    assert ("--allow-root" in argv) == (os.geteuid() == 0)
    _, env2, _ = jupyter.build_command(parse("--root-dir", str(tmp_path)))
    assert env2["JUPYTER_TOKEN"] != token


def test_extra_arguments_pass_through(tmp_path):
    argv, _, _ = jupyter.build_command(parse("--root-dir", str(tmp_path), "--port", "8999", "--",
                                             "--ServerApp.log_level=WARN"))
    assert "--port=8999" in argv and "--ServerApp.log_level=WARN" in argv
    # the lock-down comes after the pass-through arguments (later wins) and holds the token privately
    i = argv.index("--ServerApp.log_level=WARN")
    conf = next(a for a in argv[i:] if a.startswith("--config="))
    assert argv[-len(jupyter.LOCKED):] == list(jupyter.LOCKED)
    path = conf.split("=", 1)[1]
    assert (os.stat(path).st_mode & 0o777) == 0o600 and "IdentityProvider.token" in open(path).read()


def test_ui_notebook_starts_notebook7_on_the_same_terms(tmp_path):
    lab_argv, _, lab_url = jupyter.build_command(parse("--root-dir", str(tmp_path), "--port", "8999"))
    argv, env, url = jupyter.build_command(parse("--root-dir", str(tmp_path), "--port", "8999", "--ui", "notebook"))
    assert argv[1:3] == ["-m", "notebook"] and lab_argv[1:3] == ["-m", "jupyterlab"]
    same = lambda a: [x for x in a[3:] if not x.startswith("--config=")]  # noqa: E731  (a private file each)
    assert same(argv) == same(lab_argv)  # same address, port, root folder, kernel, lock-down
    assert url == f"http://127.0.0.1:8999/tree?token={env['JUPYTER_TOKEN']}" and "/lab?token=" in lab_url


def test_ui_without_its_package_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "notebook" else real(n, *a))
    with pytest.raises(SystemExit, match=r"--ui notebook needs the 'notebook' package; install it with"):
        jupyter.build_command(parse("--root-dir", str(tmp_path), "--ui", "notebook"))


def test_help_says_how(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    assert "127.0.0.1" in out and "token" in out and "--allow-root" in out and "Notebook 7" in out


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


@pytest.mark.slow
@hard_timeout(180)
def test_server_starts_and_requires_the_token(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "x.ipynb").write_text(json.dumps(
        {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    port = jupyter._free_port(8950)
    log = open(tmp_path / "jupyter.log", "wb")  # a file, not a pipe nobody reads (a full pipe blocks)
    # a user config that would switch the token off and open the origins: lab jupyter still locks it
    conf = tmp_path / "jupyter-config"
    conf.mkdir()
    (conf / "jupyter_server_config.py").write_text("c.IdentityProvider.token = ''\nc.ServerApp.allow_origin_pat = '.*'\n"
                                                   "c.ServerApp.ip = '0.0.0.0'\n")
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "jupyter", "--port", str(port), "--token", "t0k",
                             "--root-dir", str(root)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "JUPYTER_CONFIG_DIR": str(conf)})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}: "
                            f"{(tmp_path / 'jupyter.log').read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("JupyterLab did not answer within 60 s")
            time.sleep(0.5)
            try:
                if _get(f"{base}/api/status?token=t0k")[0] == 200:
                    break
            except OSError:
                continue
        assert _get(f"{base}/api/status")[0] == 403
        assert _get(f"{base}/api/contents")[0] == 403
        specs = json.loads(_get(f"{base}/api/kernelspecs?token=t0k")[1])
        if "continual-lab" in specs["kernelspecs"]:
            assert specs["default"] == "continual-lab"
        contents = json.loads(_get(f"{base}/api/contents?token=t0k")[1])
        assert [c["name"] for c in contents["content"]] == ["x.ipynb"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
