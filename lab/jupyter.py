"""`lab jupyter`: JupyterLab (or Notebook 7 with ``--ui notebook``) on 127.0.0.1 with a fresh
token, the project's kernel, notebooks/.

Widgets need a live kernel, so this is where the notebooks' ipywidgets panels work (the offline
HTML reports show static figures only).

The server is locked by an allow-list, not a deny-list: the address, the token, the origin and
XSRF checks are set here and nothing can lift them. Arguments after '--' pass only when
:data:`SAFE` names their setting (under any class spelling: ``ServerApp``, ``NotebookApp``, ...),
with a value it accepts; the server reads no Jupyter config file but lab jupyter's own (not
``~/.jupyter``, ``$JUPYTER_CONFIG_DIR``, ``$JUPYTER_CONFIG_PATH`` nor the system's folders), and
environment variables that would move kernels elsewhere or loosen file permissions are refused.
Anything else is one line naming it; nothing starts.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
from pathlib import Path

DEFAULT_KERNEL = "continual-lab"
# --ui: (module run with `python -m`, the page the printed URL opens, the name printed)
UIS = {"lab": ("jupyterlab", "lab", "JupyterLab"),
       "notebook": ("notebook", "tree", "Notebook 7")}
EXTRA = "-- (JupyterLab arguments)"     # how messages name the arguments after '--'
NEWS_PLUGIN = "@jupyterlab/apputils-extension:announcements"   # the news pop-up ("get notified?")
DESCRIPTION = """\
Start JupyterLab (or, with --ui notebook, Notebook 7: one notebook per browser tab) bound to
127.0.0.1 (never to other interfaces) with a freshly generated token, the 'continual-lab' kernel
as the default and notebooks/ as the root folder. The URL with the token is printed; open it in
a browser on this machine, or tunnel the port first, e.g.
  ssh -L 8888:127.0.0.1:8888 user@host
Runs with --allow-root when started as root. JupyterLab's news pop-up is off.
No Jupyter config file is read (not ~/.jupyter, $JUPYTER_CONFIG_DIR, $JUPYTER_CONFIG_PATH nor
/etc/jupyter); JupyterLab's settings and workspaces folders are. Arguments after '--' go to the
server only if they are on this list (any class spelling, e.g. --ServerApp.log_level or
--NotebookApp.log_level):
  --debug, --no-browser, --log-level LEVEL, *.log_level, ServerApp.shutdown_no_activity_timeout,
  ServerApp.terminals_enabled, ServerApp.iopub_data_rate_limit, ServerApp.iopub_msg_rate_limit,
  ServerApp.rate_limit_window, MappingKernelManager.cull_idle_timeout / cull_interval /
  cull_connected / cull_busy
anything else is refused. Stop it with Ctrl-C.
"""


# --- the allow-list ------------------------------------------------------------------------------
def _level(v: str) -> str:
    if v in ("DEBUG", "INFO", "WARN", "ERROR", "CRITICAL", "0", "10", "20", "30", "40", "50"):
        return v
    raise ValueError("must be DEBUG, INFO, WARN, ERROR, CRITICAL or 0, 10, ... 50")


def _seconds(v: str) -> str:
    if v.isdigit() and int(v) <= 10 ** 9:
        return v
    raise ValueError("must be a whole number of seconds >= 0")


def _rate(v: str) -> str:
    try:
        ok = 0 <= float(v) < float("inf")
    except ValueError:
        ok = False
    if ok:
        return v
    raise ValueError("must be a finite number >= 0")


def _bool(v: str) -> str:
    if v in ("True", "False", "true", "false", "1", "0"):
        return v
    raise ValueError("must be True or False")


_APPS = ("Application", "JupyterApp", "ServerApp", "NotebookApp", "ExtensionApp", "LabServerApp", "LabApp",
         "JupyterNotebookApp")
_SERVER = ("ServerApp", "NotebookApp")      # NotebookApp: the legacy name the server still honours
_KERNELS = ("MappingKernelManager", "AsyncMappingKernelManager")
SAFE = {  # setting -> (the classes it may be given under, its value check); nothing here opens the server
    "log_level": (_APPS, _level),
    "shutdown_no_activity_timeout": (_SERVER, _seconds),
    "terminals_enabled": (_SERVER, _bool),
    "iopub_data_rate_limit": (_SERVER, _rate),
    "iopub_msg_rate_limit": (_SERVER, _rate),
    "rate_limit_window": (_SERVER, _rate),
    "cull_idle_timeout": (_KERNELS, _seconds),
    "cull_interval": (_KERNELS, _seconds),
    "cull_connected": (_KERNELS, _bool),
    "cull_busy": (_KERNELS, _bool),
}
_FLAGS = ("--debug", "--no-browser")
_ALIASES = {"log-level": "Application.log_level", "log_level": "Application.log_level"}


def _refuse(arg: str, why: str):
    from lab._validate import bad

    return bad(EXTRA, arg, why)


def passed(extra: list[str]) -> list[str]:
    """The arguments after '--' that reach the server, each as ``--Class.setting=value`` (or an
    allowed flag); the first one off the allow-list (or with a value its setting refuses) raises a
    :class:`~lab._validate.BadInput` naming it."""
    items = list(extra[1:] if extra[:1] == ["--"] else extra)
    out, i = [], 0
    while i < len(items):
        a = items[i]
        i += 1
        if a in _FLAGS:
            out.append(a)
            continue
        if not a.startswith("-"):
            raise _refuse(a, "is not an option; lab jupyter passes no files or values of its own to the server")
        name, eq, value = a.lstrip("-").partition("=")
        name = _ALIASES.get(name, name)
        cls, _, setting = name.rpartition(".")
        setting = setting.replace("-", "_")
        allowed = SAFE.get(setting)
        if not cls or allowed is None or cls not in allowed[0]:
            raise _refuse(a, "not on lab jupyter's allow-list (it sets the address, token, origin and XSRF checks "
                             "itself and passes only the settings lab jupyter --help lists)")
        if not eq:
            if i >= len(items) or items[i].startswith("-"):
                raise _refuse(a, "needs a value")
            value, a = items[i], f"{a} {items[i]}"
            i += 1
        try:
            allowed[1](value)
        except ValueError as exc:
            raise _refuse(a, str(exc)) from None
        out.append(f"--{cls}.{setting}={value}")
    return out


# environment: dropped from the server's (Jupyter's config and token variables), or refused
_KEEP_ENV = ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_PATH", "JUPYTER_PLATFORM_DIRS")
_REFUSED_ENV = {"JUPYTER_GATEWAY_URL": "it sends the kernels to another server; lab jupyter runs them here",
                "JUPYTER_ALLOW_INSECURE_WRITES": "it makes the server's files (with the token) readable by others"}


def server_environment(token: str, environ=None) -> dict[str, str]:
    """The server's environment: ``environ`` without the Jupyter variables that would point it at
    a config folder or another token, with the token, and told to read no config folder at all
    (``JUPYTER_NO_CONFIG``: not the user's, not the system's; lab jupyter's own file is the one
    the server reads). A variable that would move the kernels elsewhere or loosen the server's
    file permissions is refused."""
    environ = dict(os.environ if environ is None else environ)
    for name, why in _REFUSED_ENV.items():
        if environ.get(name, "").strip() not in ("", "0", "false", "False"):
            from lab._validate import bad

            raise bad(f"${name}", environ[name], f"{why}; unset it for lab jupyter")
    env = {k: v for k, v in environ.items()
           if not (k.startswith(("JUPYTER", "JPY_")) and k not in _KEEP_ENV)}
    env.update(JUPYTER_TOKEN=token, JUPYTER_NO_CONFIG="1")
    return env


def _extensions() -> dict[str, bool]:
    """The server extensions this Python environment enables (``<sys.prefix>/etc/jupyter/
    jupyter_server_config.d/*.json``, written by the packages installed here: JupyterLab, Notebook,
    terminals, ...): the one thing the server would read from a config folder that it needs."""
    out: dict[str, bool] = {}
    for f in sorted(Path(sys.prefix, "etc", "jupyter", "jupyter_server_config.d").glob("*.json")):
        try:
            found = json.loads(f.read_text()).get("ServerApp", {}).get("jpserver_extensions", {})
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(found, dict):
            out.update({k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, bool)})
    return out


# --- the command ---------------------------------------------------------------------------------
def _free_port(start: int, tries: int = 50) -> int:
    for port in range(start, start + tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"lab jupyter: no free port in {start}..{start + tries - 1}")


def _kernel_installed(name: str) -> bool:
    from jupyter_client.kernelspec import KernelSpecManager

    return name in KernelSpecManager().find_kernel_specs()


def _lab_dirs(environ) -> tuple[str, str]:
    """The user's JupyterLab settings and workspaces folders (application state, not server config:
    the theme and layout the user chose), as JupyterLab finds them."""
    from jupyter_core.paths import jupyter_config_dir

    base = os.path.join(jupyter_config_dir(), "lab")
    return (environ.get("JUPYTERLAB_SETTINGS_DIR") or os.path.join(base, "user-settings"),
            environ.get("JUPYTERLAB_WORKSPACES_DIR") or os.path.join(base, "workspaces"))


def build_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, URL) to launch JupyterLab or Notebook 7 (``args.ui``); the token travels
    in the environment."""
    import importlib.util

    from lab.report.pipeline import repo_root

    module, page, _ = UIS[args.ui]
    extra = passed(args.extra)               # first: a refused argument costs nothing
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"lab jupyter: --ui {args.ui} needs the {module!r} package; install it with\n"
                         f"  {sys.executable} -m pip install {module}")
    root = Path(args.root_dir) if args.root_dir else repo_root() / "notebooks"
    if not root.is_dir():
        raise SystemExit(f"lab jupyter: {root} is not a folder")
    port = args.port if args.port else _free_port(8888)
    token = args.token or secrets.token_urlsafe(24)
    env = server_environment(token)
    config = _locked_config(token, *_lab_dirs(os.environ))
    argv = [sys.executable, "-m", module, "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root.resolve()}", "--no-browser"]
    if _kernel_installed(args.kernel):
        argv.append(f"--MappingKernelManager.default_kernel_name={args.kernel}")
    else:
        print(f"lab jupyter: kernel {args.kernel!r} is not installed; using python3. Install it with\n"
              f"  {sys.executable} -m ipykernel install --sys-prefix --name {args.kernel}", file=sys.stderr)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    argv += extra
    # Last, so that nothing can lift them (the command line wins over every config file): the
    # address, the token and the origin checks, in a private (0600) config file loaded after every
    # other one, plus the same on the command line. The token stays out of `ps` output.
    argv += [f"--config={config}", *LOCKED]
    return argv, env, f"http://127.0.0.1:{port}/{page}?token={token}"


LOCKED = ("--ServerApp.allow_origin=", "--ServerApp.allow_origin_pat=",
          "--ServerApp.allow_remote_access=False", "--ServerApp.disable_check_xsrf=False",
          "--ServerApp.allow_unauthenticated_access=False")


def _locked_config(token: str, settings: str, workspaces: str) -> str:
    """A private config file (0600, in a 0700 folder of the system's temporary directory), the only
    one the server reads: the token and the lock-down settings, this environment's server
    extensions, the user's JupyterLab settings and workspaces folders, and the news pop-up off."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="lab-jupyter-")
    path = os.path.join(folder, "lab_jupyter_config.py")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"c.IdentityProvider.token = {token!r}\n"
                 "c.PasswordIdentityProvider.hashed_password = ''\n"
                 "c.ServerApp.ip = '127.0.0.1'\n"
                 "c.ServerApp.allow_origin = ''\n"
                 "c.ServerApp.allow_origin_pat = ''\n"
                 "c.ServerApp.allow_remote_access = False\n"
                 "c.ServerApp.disable_check_xsrf = False\n"
                 f"c.ServerApp.jpserver_extensions = {_extensions()!r}\n"
                 f"c.LabServerApp.user_settings_dir = {settings!r}\n"
                 f"c.LabServerApp.workspaces_dir = {workspaces!r}\n"
                 "c.LabApp.news_url = None\n"
                 "c.LabApp.check_for_updates_class = 'jupyterlab.NeverCheckForUpdate'\n"
                 + _NO_NEWS.format(plugin=NEWS_PLUGIN))
    return path


# the news pop-up's plugin is switched off in the page config of every page (JupyterLab's and
# Notebook 7's): the setting that stops it from asking, which no server option reaches
_NO_NEWS = """

def _no_news(handler, page_config):
    off = page_config.get("disabledExtensions") or []
    if isinstance(off, dict):
        off["{plugin}"] = True
    elif "{plugin}" not in off:
        off = [*off, "{plugin}"]
    page_config["disabledExtensions"] = off
    return page_config


c.ServerApp.tornado_settings = {{"page_config_hook": _no_news}}
"""


def _cmd(args: argparse.Namespace) -> int:
    argv, env, url = build_command(args)
    if args.dry_run:
        print(" ".join(argv))
        print(url)
        return 0
    root = next(a.split("=", 1)[1] for a in argv if a.startswith("--ServerApp.root_dir="))
    print(f"{UIS[args.ui][2]}: {url}\n(root folder {root}; Ctrl-C to stop)", flush=True)
    os.execve(sys.executable, argv, env)  # replace this process: Ctrl-C goes straight to Jupyter
    return 0  # not reached


def register(subparsers) -> None:
    """Add the ``jupyter`` subcommand to the ``lab`` CLI."""
    p = subparsers.add_parser("jupyter", help="start JupyterLab (or Notebook 7) on 127.0.0.1 with a token and the "
                                              "project's kernel",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0, help="port (default: first free one from 8888)")
    p.add_argument("--token", help="use this token instead of a generated one")
    p.add_argument("--root-dir", metavar="DIR", help="folder the server opens (default: <repo>/notebooks)")
    p.add_argument("--ui", choices=tuple(UIS), default="lab",
                   help="lab: JupyterLab; notebook: Notebook 7, the classic one-notebook-per-tab interface "
                        "(same server, kernels and widget panels) (default: %(default)s)")
    p.add_argument("--kernel", default=DEFAULT_KERNEL, help="default kernel (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the command and URL, start nothing")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="arguments after '--' for the server: only those on the "
                                                           "list above")
    p.set_defaults(func=_cmd)
