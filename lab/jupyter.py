"""`lab jupyter`: JupyterLab on 127.0.0.1 with a fresh token, the project's kernel, notebooks/.

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
DESCRIPTION = """\
Start JupyterLab bound to 127.0.0.1 (never to other interfaces) with a freshly generated token,
the 'continual-lab' kernel as the default and notebooks/ as the root folder. The URL with the
token is printed; open it in a browser on this machine, or tunnel the port first, e.g.
  ssh -L 8888:127.0.0.1:8888 user@host
Runs with --allow-root when started as root. Arguments after '--' go to JupyterLab unchanged.
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
    """(argv, environment, URL) to launch JupyterLab; the token travels in the environment."""
    from lab.report.pipeline import repo_root

    root = Path(args.root_dir) if args.root_dir else repo_root() / "notebooks"
    if not root.is_dir():
        raise SystemExit(f"lab jupyter: {root} is not a folder")
    port = args.port if args.port else _free_port(8888)
    token = args.token or secrets.token_urlsafe(24)
    argv = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root.resolve()}", "--no-browser"]
    if _kernel_installed(args.kernel):
        argv.append(f"--MappingKernelManager.default_kernel_name={args.kernel}")
    else:
        print(f"lab jupyter: kernel {args.kernel!r} is not installed; using python3. Install it with\n"
              f"  {sys.executable} -m ipykernel install --sys-prefix --name {args.kernel}", file=sys.stderr)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    argv += [a for a in args.extra if a != "--"]
    # JUPYTER_TOKEN keeps the token out of `ps` output; jupyter_server reads it at start.
    env = {**os.environ, "JUPYTER_TOKEN": token}
    return argv, env, f"http://127.0.0.1:{port}/lab?token={token}"


def _cmd(args: argparse.Namespace) -> int:
    argv, env, url = build_command(args)
    if args.dry_run:
        print(" ".join(argv))
        print(url)
        return 0
    root = next(a.split("=", 1)[1] for a in argv if a.startswith("--ServerApp.root_dir="))
    print(f"JupyterLab: {url}\n(root folder {root}; Ctrl-C to stop)", flush=True)
    os.execve(sys.executable, argv, env)  # replace this process: Ctrl-C goes straight to Jupyter
    return 0  # not reached


def register(subparsers) -> None:
    """Add the ``jupyter`` subcommand to the ``lab`` CLI."""
    p = subparsers.add_parser("jupyter", help="start JupyterLab on 127.0.0.1 with a token and the project's kernel",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0, help="port (default: first free one from 8888)")
    p.add_argument("--token", help="use this token instead of a generated one")
    p.add_argument("--root-dir", metavar="DIR", help="folder JupyterLab opens (default: <repo>/notebooks)")
    p.add_argument("--kernel", default=DEFAULT_KERNEL, help="default kernel (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the command and URL, start nothing")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="arguments after '--' go to JupyterLab")
    p.set_defaults(func=_cmd)
