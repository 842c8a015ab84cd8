"""`lab jupyter` is locked by an allow-list (lab/jupyter.py): nothing from outside the lab opens the server.

Two tables, each run against the real command:

* ``REFUSED``: arguments after '--' off the allow-list (under every spelling: ServerApp, NotebookApp,
  LabApp, traitlets aliases, one dash, dashes for underscores, a value as the next argument) and
  environment variables that would move kernels elsewhere: `lab jupyter` exits 2 with ONE line naming
  the option, and nothing listens on the port afterwards (the server never started).
* ``HOSTILE``: what the user's Jupyter folders and environment say that `lab jupyter` ignores (config
  files that bind 0.0.0.0, open every origin, drop the token and the XSRF check, under every file name
  and class spelling, in ~/.jupyter, $JUPYTER_CONFIG_DIR and $JUPYTER_CONFIG_PATH; an empty
  $JUPYTER_TOKEN). The server starts with all of it and is probed over HTTP on 127.0.0.1: it listens
  on 127.0.0.1 only, answers no foreign origin, refuses a request without the token and a cookie
  POST without the XSRF token, and its page turns JupyterLab's news pop-up off.
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from _report_helpers import hard_timeout
from lab import jupyter

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "t0k-outside"

# (arguments after `lab jupyter --port P --token T --root-dir R`, environment, the option the line names)
REFUSED = [
    (["--", "--NotebookApp.ip=0.0.0.0"], {}, "--NotebookApp.ip=0.0.0.0"),
    (["--", "--NotebookApp.allow_origin=*"], {}, "--NotebookApp.allow_origin=*"),
    (["--", "--NotebookApp.disable_check_xsrf=True"], {}, "--NotebookApp.disable_check_xsrf=True"),
    (["--", "--ServerApp.disable_check_xsrf", "True"], {}, "--ServerApp.disable_check_xsrf"),
    (["--", "--PasswordIdentityProvider.hashed_password=sha1:x"], {}, "--PasswordIdentityProvider.hashed_password"),
    (["--", "--IdentityProvider.token="], {}, "--IdentityProvider.token="),
    (["--", "--ServerApp.tornado_settings={'headers':{'Access-Control-Allow-Origin':'*'}}"], {},
     "--ServerApp.tornado_settings="),
    (["--", "--LabApp.ip=0.0.0.0"], {}, "--LabApp.ip=0.0.0.0"),
    (["--", "-ServerApp.ip=0.0.0.0"], {}, "-ServerApp.ip=0.0.0.0"),
    (["--", "--ServerApp.allow-remote-access=True"], {}, "--ServerApp.allow-remote-access=True"),
    (["--", "--ServerApp.sock=/tmp/lab-outside.sock"], {}, "--ServerApp.sock=/tmp/lab-outside.sock"),
    (["--", "--ServerApp.jpserver_extensions={'evil': True}"], {}, "--ServerApp.jpserver_extensions="),
    (["--", "--certfile=/tmp/c.pem"], {}, "--certfile=/tmp/c.pem"),
    (["--", "--gateway-url=http://127.0.0.1:9"], {}, "--gateway-url=http://127.0.0.1:9"),
    (["--", "--collaborative"], {}, "--collaborative"),
    (["--", "x.ipynb"], {}, "x.ipynb: is not an option"),
    (["--", "--log-level=LOUD"], {}, "--log-level=LOUD: must be DEBUG"),
    (["--", "--MappingKernelManager.cull_idle_timeout=-1"], {}, "cull_idle_timeout=-1: must be a whole number"),
    (["--", "--ServerApp.log_level"], {}, "--ServerApp.log_level: needs a value"),
    (["--", "--ServerApp.log_level=WARN", "--ServerApp.ip=0.0.0.0"], {}, "--ServerApp.ip=0.0.0.0"),
    ([], {"JUPYTER_GATEWAY_URL": "http://127.0.0.1:9"}, "$JUPYTER_GATEWAY_URL http://127.0.0.1:9"),
    ([], {"JUPYTER_ALLOW_INSECURE_WRITES": "1"}, "$JUPYTER_ALLOW_INSECURE_WRITES 1"),
]

# a config that would open the server: every class spelling, every file name Jupyter reads
HOSTILE = """\
for app in ("ServerApp", "NotebookApp", "LabApp", "JupyterNotebookApp"):
    c[app].ip = "0.0.0.0"
    c[app].token = ""
    c[app].allow_origin = "*"
    c[app].disable_check_xsrf = True
    c[app].allow_remote_access = True
    c[app].tornado_settings = {"headers": {"Access-Control-Allow-Origin": "*"}}
c.IdentityProvider.token = ""
c.ServerApp.allow_unauthenticated_access = True
c.LabApp.news_url = "https://jupyterlab.github.io/assets/feed.xml"
"""
CONFIG_FILES = ("jupyter_config.py", "jupyter_server_config.py", "jupyter_lab_config.py",
                "jupyter_notebook_config.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _lab_jupyter(argv: list[str], env: dict, port: int, root: Path, timeout: float = 60) -> tuple[int | None, str]:
    """`lab jupyter` with a fixed port and token; a server that starts anyway is stopped (rc None)."""
    p = subprocess.Popen([sys.executable, "-m", "lab.cli", "jupyter", "--port", str(port), "--token", TOKEN,
                          "--root-dir", str(root), *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, **env}, cwd=ROOT)
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        return None, err


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    ports = {i: _free_port() for i in range(len(REFUSED))}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {i: pool.submit(_lab_jupyter, argv, env, ports[i], root) for i, (argv, env, _) in enumerate(REFUSED)}
        return {i: (ports[i], *f.result()) for i, f in futures.items()}


@hard_timeout(400)
@pytest.mark.parametrize("i", range(len(REFUSED)), ids=[" ".join(a) or str(e) for a, e, _ in REFUSED])
def test_an_option_off_the_allow_list_is_one_line_and_nothing_starts(i, refused):
    argv, env, named = REFUSED[i]
    port, code, err = refused[i]
    assert code is not None, f"the server started with {argv} {env}: {err[-2000:]}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("lab jupyter: error: ") and named in lines[0], lines[0]
    assert not _listening(port)


def test_the_allow_list_passes_its_settings_under_any_spelling(tmp_path):
    """The other side: what the list holds passes, normalised to one --Class.setting=value each."""
    assert jupyter.passed(["--", "--NotebookApp.log_level=WARN", "--log-level", "ERROR", "--debug",
                           "--MappingKernelManager.cull-idle-timeout", "600", "--ServerApp.terminals_enabled=False"]) == [
        "--NotebookApp.log_level=WARN", "--Application.log_level=ERROR", "--debug",
        "--MappingKernelManager.cull_idle_timeout=600", "--ServerApp.terminals_enabled=False"]
    env = jupyter.server_environment("tok", {"JUPYTER_CONFIG_DIR": "/x", "JUPYTER_CONFIG_PATH": "/y", "HOME": "/h",
                                             "JUPYTER_TOKEN": "", "JUPYTER_DATA_DIR": "/d", "JPY_API_TOKEN": "z"})
    assert env == {"HOME": "/h", "JUPYTER_DATA_DIR": "/d", "JUPYTER_TOKEN": "tok", "JUPYTER_NO_CONFIG": "1"}


# --- a real server, started amid a hostile configuration ---------------------------------------------
def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def _call(opener, url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=b"{}" if method == "POST" else None)
    try:
        with opener.open(req, timeout=20) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), b""


def _listen_addresses(port: int) -> set[str] | None:
    """The local addresses of the sockets listening on ``port`` (from /proc/net; None without it)."""
    out = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            return None
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:      # 0A: LISTEN
                out.add(addr)
    return out


def _page_config(html: bytes) -> dict:
    m = re.search(rb'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
    assert m, html[:500]
    return json.loads(m.group(1))


@pytest.mark.slow
@hard_timeout(420)
@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_a_hostile_configuration_does_not_open_the_server(ui, tmp_path):
    home, conf, confpath, root = (tmp_path / n for n in ("home", "conf", "confpath", "root"))
    for d in (home / ".jupyter", conf, confpath, root):
        d.mkdir(parents=True)
        if d != root:
            for name in CONFIG_FILES:
                (d / name).write_text(HOSTILE)
    port = _free_port()
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(conf), "JUPYTER_CONFIG_PATH": str(confpath),
           "JUPYTER_TOKEN": "", "JUPYTER_PORT": "1"}
    log = open(tmp_path / "server.log", "wb")    # a file, not a pipe nobody reads
    proc = subprocess.Popen([sys.executable, "-m", "lab.cli", "jupyter", "--ui", ui, "--port", str(port), "--token",
                             TOKEN, "--root-dir", str(root), "--", "--NotebookApp.log_level=INFO",
                             "--MappingKernelManager.cull_idle_timeout=3600"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    base, anyone = f"http://127.0.0.1:{port}", urllib.request.build_opener()   # keeps no cookies
    try:
        deadline = time.monotonic() + 120
        while not (_listening(port) and _call(anyone, f"{base}/api/status?token={TOKEN}")[0] == 200):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no server ({proc.poll()}): {(tmp_path / 'server.log').read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        # bound to 127.0.0.1 only (no 0.0.0.0, no ::)
        addresses = _listen_addresses(port)
        if addresses is not None:
            assert addresses == {"0100007F"}, addresses
        # no token: refused, whatever the origin
        assert _call(anyone, f"{base}/api/contents")[0] == 403
        assert _call(anyone, f"{base}/api/contents", headers={"Origin": "http://evil.example"})[0] == 403
        # a browser that opened the URL once holds the login and _xsrf cookies
        browser = _opener()
        code, _, html = _call(browser, f"{base}/{jupyter.UIS[ui][1]}?token={TOKEN}")
        assert code == 200
        page = _page_config(html)
        assert jupyter.NEWS_PLUGIN in page["disabledExtensions"]      # the news pop-up is off
        if ui == "lab":
            assert page["news"] == {"disabled": True}
        code, headers, _ = _call(browser, f"{base}/api/status", headers={"Origin": "http://evil.example"})
        assert "Access-Control-Allow-Origin" not in headers, headers   # no foreign origin, no wildcard
        code, headers, _ = _call(anyone, f"{base}/api/status?token={TOKEN}", headers={"Origin": "http://evil.example"})
        assert headers.get("Access-Control-Allow-Origin") != "*"
        # a cookie POST without the XSRF token is refused; with it (the control) it is accepted
        assert _call(browser, f"{base}/api/contents", "POST")[0] == 403
        assert not list(root.iterdir())
        xsrf = next(c.value for h in browser.handlers if isinstance(h, urllib.request.HTTPCookieProcessor)
                    for c in h.cookiejar if c.name == "_xsrf")
        assert _call(browser, f"{base}/api/contents", "POST", headers={"X-XSRFToken": xsrf})[0] == 201
        # the server extensions of this environment still load (read without any config folder)
        assert _call(anyone, f"{base}/api/terminals?token={TOKEN}")[0] == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
