"""`lab jupyter`: JupyterLab (or Notebook 7 with ``--ui notebook``) on 127.0.0.1 with a fresh
token, the project's kernel, notebooks/.

Widgets need a live kernel, so this is where the notebooks' ipywidgets panels work (the offline
HTML reports show static figures only).
"""
from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path

DEFAULT_KERNEL = "continual-lab"
# --ui: (module run with `python -m`, the page the printed URL opens, the name printed)
UIS = {"lab": ("jupyterlab", "lab", "JupyterLab"),
       "notebook": ("notebook", "tree", "Notebook 7")}
DESCRIPTION = """\
Start JupyterLab (or, with --ui notebook, Notebook 7: one notebook per browser tab) bound to
127.0.0.1 (never to other interfaces) with a freshly generated token, the 'continual-lab' kernel
as the default and notebooks/ as the root folder. The URL with the token is printed; open it in
a browser on this machine, or tunnel the port first, e.g.
  ssh -L 8888:127.0.0.1:8888 user@host
Runs with --allow-root when started as root. Arguments after '--' go to the server unchanged.
Stop it with Ctrl-C.
"""


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


def build_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, URL) to launch JupyterLab or Notebook 7 (``args.ui``); the token travels
    in the environment."""
    import importlib.util

    from lab.report.pipeline import repo_root

    module, page, _ = UIS[args.ui]
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"lab jupyter: --ui {args.ui} needs the {module!r} package; install it with\n"
                         f"  {sys.executable} -m pip install {module}")

    root = Path(args.root_dir) if args.root_dir else repo_root() / "notebooks"
    if not root.is_dir():
        raise SystemExit(f"lab jupyter: {root} is not a folder")
    port = args.port if args.port else _free_port(8888)
    token = args.token or secrets.token_urlsafe(24)
    argv = [sys.executable, "-m", module, "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root.resolve()}", "--no-browser"]
    if _kernel_installed(args.kernel):
        argv.append(f"--MappingKernelManager.default_kernel_name={args.kernel}")
    else:
        print(f"lab jupyter: kernel {args.kernel!r} is not installed; using python3. Install it with\n"
              f"  {sys.executable} -m ipykernel install --sys-prefix --name {args.kernel}", file=sys.stderr)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    argv += [a for a in args.extra if a != "--"]
    # Last, so that neither the arguments after '--' nor any config file (the user's ~/.jupyter, a
    # jupyter_server_config.py with token = '') can lift them: the address, the token and the origin
    # checks, in a private (0600) config file loaded after every other one, plus the same on the
    # command line, which wins over all files. The token stays out of `ps` output.
    argv += [f"--config={_locked_config(token)}", *LOCKED]
    env = {**os.environ, "JUPYTER_TOKEN": token}
    return argv, env, f"http://127.0.0.1:{port}/{page}?token={token}"


LOCKED = ("--ServerApp.allow_origin=", "--ServerApp.allow_origin_pat=",
          "--ServerApp.allow_remote_access=False", "--ServerApp.disable_check_xsrf=False",
          "--ServerApp.allow_unauthenticated_access=False")


def _locked_config(token: str) -> str:
    """A private config file holding the token and the lock-down settings (removed at exit when the
    server stops; a 0600 file in a 0700 folder of the system's temporary directory)."""
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
                 "c.ServerApp.disable_check_xsrf = False\n")
    return path


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
    p.add_argument("extra", nargs=argparse.REMAINDER, help="arguments after '--' go to the server")
    p.set_defaults(func=_cmd)
