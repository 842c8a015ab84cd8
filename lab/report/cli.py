"""`lab report`: the project's main job (see :mod:`lab.report.pipeline`)."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Execute every notebook in notebooks/ (sorted) through papermill with its report parameters,
write the executed notebook and an HTML page that renders fully offline (plotly.js loaded from
reports/assets/, no CDN scripts) into reports/, static PNGs of key figures (kaleido + Chromium,
when present) and reports/index.html with one card per notebook: its headline numbers and wall time.

A notebook declares its parameter profiles in its metadata ("continual-lab" -> "params" ->
"report"/"smoke"); see lab.report.params. Two notebooks run side by side on a machine with two
cores or more (--jobs), each kernel with its share of the cores; a notebook that reads a cache
another one fills names it in its metadata ("continual-lab" -> "after") and starts once that one
has finished. A failing notebook is still rendered (with the failing cell marked), the others
still run, and the command exits with status 1.

plotly.js is written once, to reports/assets/, and every page loads it from there (still offline);
reports/glossary.html is docs/glossary.md, linked from every page. With --solutions the same run
also writes reports/solutions/: each notebook's page with its exercises' solutions, for the teacher
(the pages beside the index never hold a solution: hand out reports/ without that folder).
"""


TIMEOUT_MAX = 7 * 24 * 3600   # --timeout: a week


def refuse_input_folder(out, notebooks=None) -> None:
    """``--out`` never lands on what the report reads or the repository keeps: not a folder that holds
    a source notebook (the one given by ``--notebooks``, or the repository's), not inside it, not a
    tracked folder of the repository other than ``reports/`` (its results, its code, its docs). One
    line naming the folder, before any notebook runs."""
    import subprocess
    from pathlib import Path

    from lab import _validate as V
    from lab.report.pipeline import repo_root

    root = repo_root().resolve()
    dest = Path(out).expanduser().resolve()
    sources = [Path(notebooks).expanduser().resolve() if notebooks else root / "notebooks"]
    for src in sources:
        if dest == src or src in dest.parents or (dest.is_dir() and any(dest.glob("*.ipynb"))
                                                   and not (dest / "index.html").exists()):
            raise V.bad("--out", str(out), f"holds (or is inside) the source notebooks {src}: the rendered copies "
                                           "would be written over them; give another folder (default: reports/)")
    reports = root / "reports"
    if dest == root:
        raise V.bad("--out", str(out), "is the repository itself; write reports to reports/ or outside the repository")
    if root in dest.parents and dest != reports and reports not in dest.parents:
        top = dest.relative_to(root).parts[0]
        try:
            tracked = subprocess.run(["git", "-C", str(root), "ls-files", "--", f"{top}/"],
                                     capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            tracked = "unknown"
        if tracked:
            raise V.bad("--out", str(out), f"is inside the repository's tracked folder {top}/ (its code, results or "
                                           "docs); write reports to reports/ or outside the repository")


def check_args(args: argparse.Namespace) -> None:
    """Folders, timeout and kernel of `lab report`, before any notebook runs (names and parameter
    types are checked by :func:`lab.report.pipeline.render` against every notebook first)."""
    from lab import _validate as V

    if args.timeout is not None:     # an int at parse (papermill's cell timeout is whole seconds)
        V.count("--timeout", args.timeout, maximum=TIMEOUT_MAX)
    if args.jobs is not None:
        V.count("--jobs", args.jobs, maximum=64)
    if args.notebooks is not None:
        V.in_dir("--notebooks", args.notebooks)
    if args.out is not None:
        V.out_dir("--out", args.out)
        refuse_input_folder(args.out, args.notebooks)
    else:
        from lab.report.pipeline import repo_root

        V.out_dir("--out", repo_root() / "reports")
    if args.kernel is not None:
        from jupyter_client.kernelspec import KernelSpecManager

        specs = sorted(KernelSpecManager().find_kernel_specs())
        if args.kernel not in specs:
            raise V.bad("--kernel", args.kernel, f"no such Jupyter kernel; installed: {', '.join(specs)}")


def _cmd(args: argparse.Namespace) -> int:
    from lab.report.params import ParamsError, parse_override
    from lab.report.pipeline import render

    check_args(args)
    import signal

    def _terminated(signum, _frame):  # `kill`: unwind like Ctrl-C, so render's cleanup runs
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminated)
    import time

    t0 = time.perf_counter()
    try:
        overrides = dict(parse_override(p) for p in args.parameter)
        results = render(args.notebooks, args.out, profile=args.params, only=args.only,
                         overrides=overrides, png=not args.no_png, kernel=args.kernel,
                         timeout=args.timeout, jobs=args.jobs, solutions=args.solutions)
    except ParamsError as exc:
        print(f"lab report: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:     # every kernel is shut down by now
        print(interrupted_line(args, exc), file=sys.stderr, flush=True)
        return 130
    failed = [r for r in results if not r.ok]
    for r in failed:
        where = f" at In [{r.failed_cell}]" if r.failed_cell is not None else ""
        print(f"\nFAILED {r.name}{where}: {r.error}", file=sys.stderr)
        if r.failed_source:
            print("  " + r.failed_source.replace("\n", "\n  "), file=sys.stderr)
    out = args.out or "reports"
    total = time.perf_counter() - t0
    print(f"\n{len(results) - len(failed)}/{len(results)} notebooks ok in {total:.0f} s; "
          f"open {out}/index.html")
    return 1 if failed else 0


def resume_command(args: argparse.Namespace, left: list[str]) -> str:
    """The `lab report` command that renders only the notebooks in ``left``, with the same options."""
    import shlex

    cmd = ["lab", "report"]
    for flag, value in (("--notebooks", args.notebooks), ("--out", args.out), ("--kernel", args.kernel),
                        ("--timeout", args.timeout), ("--jobs", args.jobs)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.params != "report":
        cmd += ["--params", args.params]
    for p in args.parameter:
        cmd += ["-p", p]
    cmd += ["--no-png"] * bool(args.no_png) + ["--solutions"] * bool(args.solutions)
    for name in left:
        cmd += ["--only", name]
    return shlex.join(cmd)


def interrupted_line(args: argparse.Namespace, exc: BaseException) -> str:
    """The one line an interrupted `lab report` prints: what was written, and how to render the rest."""
    left = getattr(exc, "left", None)
    if not left:
        return "lab report: interrupted"
    done = getattr(exc, "done", [])
    return (f"lab report: interrupted; {len(done)} of {len(done) + len(left)} notebooks rendered into "
            f"{args.out or 'reports'}; render the rest with: {resume_command(args, left)}")


def register(subparsers) -> None:
    """Add the ``report`` subcommand to the ``lab`` CLI."""
    p = subparsers.add_parser(
        "report", help="render every notebook into offline HTML reports (the main job)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="NAME",
                   help="render only this notebook (name with or without .ipynb; repeatable)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: <repo>/reports)")
    p.add_argument("--params", choices=("report", "smoke"), default="report",
                   help="parameter profile: report-sized (default) or the tests' smoke size")
    p.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                   help="override one parameter in every rendered notebook (VALUE read as JSON "
                        "when it parses, else as a string; repeatable)")
    p.add_argument("--notebooks", metavar="DIR", help="folder of notebooks (default: <repo>/notebooks)")
    p.add_argument("--no-png", action="store_true", help="skip the static PNG figures (faster)")
    p.add_argument("--kernel", metavar="NAME",
                   help="Jupyter kernel (default: continual-lab, else python3)")
    p.add_argument("--timeout", type=int, metavar="SECONDS",
                   help=f"fail a cell that runs longer than this many whole seconds, 1..{TIMEOUT_MAX} "
                        f"(default: 7200)")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="notebooks rendered side by side, each kernel with cores/N threads (default: 2 on "
                        "2 or more cores, else 1); a notebook starts after those its metadata names")
    p.add_argument("--solutions", action="store_true",
                   help="also write each notebook with its exercises' solutions into OUT/solutions/ "
                        "(for the teacher; the reports beside the index never show them)")
    p.set_defaults(func=_cmd)
