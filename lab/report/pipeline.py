"""`lab report`: execute each notebook with papermill, export offline HTML, rebuild the index.

Per notebook ``NAME.ipynb`` the output folder gets (each written atomically, temp file + rename):

* ``NAME.ipynb`` — the executed notebook (papermill metadata + ours under ``continual-lab.report``)
* ``NAME.html`` — nbconvert's lab template minus every CDN script (see ``lab/templates/offline``)
* ``NAME_figures/*.png`` — what the notebook passed to :func:`lab.report.save_png`
* ``index.html`` / ``index.json`` — rebuilt after every notebook from the executed notebooks
* ``assets/plotly-VERSION.min.js`` — plotly.js, written once; every page loads it from there
  (:func:`write_plotlyjs`), so a page holds its figures' data only and still needs no network
* ``glossary.html`` — ``docs/glossary.md`` (:mod:`lab.report.glossary`); every page links to it
* with ``solutions``: ``solutions/NAME.html`` (and ``.ipynb``) — the same run with each exercise's
  solution shown (:mod:`lab.exercises`); the pages beside the index never hold a solution

No page names a folder of the machine it was built on (:mod:`lab.report._paths`).

Each notebook is executed by :func:`papermill.execute_notebook` in a process of its own
(:mod:`lab.report._execute`, started by :func:`execute`): its kernel inherits that process's
environment (the notebook's figures folder, profile and thread count), its progress comes back
through nbclient's cell hooks, and its kernel's own output goes to a log file, not the terminal.
The HTML is nbconvert's :class:`~nbconvert.HTMLExporter` with this package's template. No papermill,
nbclient or jupyter_client internals are touched (tests/test_report_public_api.py checks).

A failing notebook is still written and exported (papermill marks the failing cell), the others
still run, and :func:`render` reports it; `lab report` then exits non-zero. Ctrl-C stops every
notebook's process (each shuts its kernel down) and raises :class:`Interrupted`, which names the
notebooks not rendered yet; `lab report` prints the command that renders them.

Nothing waits forever: the kernel gets :data:`KERNEL_START_TIMEOUT_S` to start and each cell
:data:`DEFAULT_CELL_TIMEOUT_S` (``--timeout`` changes it); a PNG export gets
:data:`lab.report.notebook.PNG_TIMEOUT_S`. Before any notebook runs, :func:`render` asks kaleido's
own browser discovery whether there is a Chrome/Chromium; without one it says so in one line,
renders the HTML reports without PNGs and notes it in ``index.html``. While a notebook runs,
a line per markdown section (and per cell running longer than :data:`SLOW_CELL_S`) shows where
it is, with the elapsed time; the run ends with a table of wall times.
"""
from __future__ import annotations

import datetime as _dt
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lab.report import _paths, _widgets
from lab.report import glossary as _glossary
from lab.report import notebook as _nbh
from lab.report._fs import readable, repo_root, write_text
from lab.report._math import MathToMathML
from lab.report import params as _params

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
TEMPLATE = "offline"
DEFAULT_KERNEL = "continual-lab"
FIGURES_SUFFIX = "_figures"
KERNEL_START_TIMEOUT_S = 120
DEFAULT_CELL_TIMEOUT_S = 7200.0  # generous (the report-sized sweeps take minutes), but finite
SLOW_CELL_S = 10.0  # a cell running longer than this gets a progress line now and then
HEARTBEAT_S = 30.0
ASSETS = "assets"
SOLUTIONS = "solutions"   # the folder `lab report --solutions` writes the solution pages to
_EXTERNAL_RE = re.compile(
    r"<(script|link|img|iframe|source|embed|video|audio)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)",
    re.IGNORECASE)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`render`: the notebooks that were finished (``done``, their pages written)
    and those that were not (``left``), in ``out_dir``."""

    def __init__(self, done: list[str], left: list[str], out_dir: Path):
        super().__init__(f"{len(done)} of {len(done) + len(left)} notebooks rendered")
        self.done, self.left, self.out_dir = done, left, out_dir


@dataclass
class Result:
    """What happened to one notebook."""
    name: str
    ok: bool
    seconds: float
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None          # "ValueError: boom" (or why it could not run at all)
    failed_cell: int | None = None    # execution count of the failing cell ("In [n]")
    failed_source: str | None = None
    warnings: list[str] = field(default_factory=list)


def discover(notebooks_dir: Path, only: list[str] | None = None) -> list[Path]:
    """Notebooks to render, sorted; ``only`` takes names with or without ``.ipynb``."""
    found = sorted(p for p in Path(notebooks_dir).glob("*.ipynb") if not p.name.startswith("."))
    if not only:
        return found
    by_name = {p.stem: p for p in found}
    missing = [n for n in only if n.removesuffix(".ipynb") not in by_name]
    if missing:
        raise _params.ParamsError(f"no notebook named {missing} in {notebooks_dir}; available: {sorted(by_name)}")
    return [by_name[n] for n in sorted({n.removesuffix(".ipynb") for n in only})]


def kernel_name(preferred: str = DEFAULT_KERNEL) -> str:
    """``preferred`` when installed (``make setup`` installs it), else ``python3``."""
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    if preferred in specs:
        return preferred
    logging.getLogger(__name__).warning(
        "kernel %r is not installed (python -m ipykernel install --sys-prefix --name %s); using python3",
        preferred, preferred)
    return "python3"


class Progress:
    """Lines that say where a running notebook is: each markdown heading reached, and every
    :data:`HEARTBEAT_S` a line for a cell running longer than :data:`SLOW_CELL_S`.

    Fed by nbclient's cell hooks in the notebook's process (:func:`lab.report._execute.hooks`:
    ``cell_start``/``cell_complete``); the heartbeat runs in a daemon thread that :meth:`close`
    stops (joined with a timeout).
    """

    def __init__(self, name: str, log: Callable[[str], None], *, slow: float = SLOW_CELL_S,
                 every: float = HEARTBEAT_S) -> None:
        import threading

        self.name, self.log, self.slow, self.every = name, log, slow, every
        self.t0 = time.perf_counter()
        self.n_cells = 0
        self._cell: tuple[int, str, float] | None = None  # (index, first line, start)
        self._last_beat = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"progress-{name}", daemon=True)
        self._thread.start()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _line(self, text: str) -> None:
        self.log(f"      {self.elapsed():7.1f} s  {text}")

    def cell_start(self, cell, index: int) -> None:
        where = f"cell {index + 1}/{self.n_cells}"
        if cell.cell_type == "markdown":
            heading = next((ln.lstrip("#").strip() for ln in cell.source.splitlines()
                            if ln.startswith("#")), None)
            if heading:
                self._line(f"{where}  {_TAG.sub('', heading)}")
            return
        first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")
        with self._lock:
            self._cell, self._last_beat = (index, first[:70], time.perf_counter()), 0.0

    def cell_complete(self, index: int) -> None:
        with self._lock:
            cell, self._cell = self._cell, None
        if cell and cell[0] == index and time.perf_counter() - cell[2] >= self.slow:
            self._line(f"cell {index + 1}/{self.n_cells} done in {time.perf_counter() - cell[2]:.1f} s")

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                cell = self._cell
                now = time.perf_counter()
                if not cell or now - cell[2] < self.slow or now - self._last_beat < self.every:
                    continue
                self._last_beat = now
            self._line(f"cell {cell[0] + 1}/{self.n_cells} running for {now - cell[2]:.0f} s: {cell[1]}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


_TAG = re.compile(r"<[^>]+>")


WORKER_STOP_S = 20.0   # after SIGTERM, how long a notebook's process gets to shut its kernel down
_WORKERS: set = set()            # the notebook processes running now (subprocess.Popen)
_WORKERS_LOCK = None
_STOPPING = None                 # set once the run is interrupted: no notebook is exported after it


def _state():
    global _WORKERS_LOCK, _STOPPING
    import threading

    if _WORKERS_LOCK is None:
        _WORKERS_LOCK, _STOPPING = threading.Lock(), threading.Event()
    return _WORKERS_LOCK, _STOPPING


def execute(spec: dict, env: dict[str, str], log: Callable[[str], None] | None = None) -> dict:
    """Execute one notebook with papermill in its own process (:mod:`lab.report._execute`), its
    kernel with this process's environment plus ``env``; ``log`` gets its progress lines as they
    come. Returns the outcome: ``{"ok": True}``, else ``error`` (and ``exec_count``, ``source`` of
    the failing cell). Interrupted (Ctrl-C, SIGTERM here), the process is asked to stop (its
    kernel shut down) before the exception goes on."""
    import json
    import subprocess
    import sys

    lock, stopping = _state()
    outcome: dict = {"ok": False, "error": "RuntimeError: the notebook's process ended without a result"}
    with lock:
        if stopping.is_set():
            raise KeyboardInterrupt
        proc = subprocess.Popen([sys.executable, "-m", "lab.report._execute"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, **env},
                                text=True, start_new_session=True)   # Ctrl-C is ours to pass on
        _WORKERS.add(proc)
    try:
        proc.stdin.write(json.dumps({**spec, "parent": os.getpid()}))
        proc.stdin.close()
        for raw in proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "line" in msg and log is not None:
                log(msg["line"])
            elif "result" in msg:
                outcome = msg["result"]
        proc.wait()
    finally:
        if proc.poll() is None:
            stop_worker(proc)
        with lock:
            _WORKERS.discard(proc)
    if stopping.is_set() or outcome.get("interrupted"):
        raise KeyboardInterrupt
    return outcome


def stop_worker(proc) -> None:
    """SIGTERM a notebook's process, give it :data:`WORKER_STOP_S` to shut its kernel down, then kill it."""
    import subprocess

    try:
        proc.terminate()
        proc.wait(timeout=WORKER_STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


def stop_all() -> None:
    """Stop every notebook still running in this process (an interrupted render), each kernel shut down."""
    lock, stopping = _state()
    with lock:
        stopping.set()
        live = list(_WORKERS)
    for proc in live:
        try:
            proc.terminate()
        except OSError:
            pass
    for proc in live:
        stop_worker(proc)


def _meta(out) -> dict:
    return (out.get("metadata") or {}).get(_params.METADATA_KEY) or {}


def is_solution(out) -> bool:
    """An output that shows an exercise's solution (:mod:`lab.exercises` marks it)."""
    return bool(_meta(out).get("solution"))


def without_solutions(nb):
    """A copy of ``nb`` with no output that shows a solution (what a student may see)."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("outputs"):
            cell["outputs"] = [o for o in cell["outputs"] if not is_solution(o)]
    return nb


_NAV_CSS = ("<style>.lab-nav{font:14px system-ui,sans-serif;padding:.4rem 1rem;border-bottom:1px solid #d0d7de;"
            "background:#f6f8fa}.lab-nav a{margin-right:1.2rem}</style>")


def _nav(prefix: str, solutions: bool) -> str:
    what = " · <b>solutions</b> (for the teacher)" if solutions else ""
    return (f"{_NAV_CSS}<nav class='lab-nav'><a href='{prefix}index.html'>← all reports</a>"
            f"<a href='{prefix}{_glossary.PAGE}'>glossary</a>{what}</nav>")


def export_html(nb, *, prefix: str = "", solutions: bool = False,
                paths: list[tuple[str, str]] | None = None) -> tuple[str, list[str]]:
    """Offline HTML for an executed notebook node, and the off-machine references left in it.

    ``prefix``: the way from the page to the reports folder (``""`` beside the index, ``"../"`` in
    ``solutions/``): plotly.js (written by :func:`write_plotlyjs`), the glossary and the index are
    linked through it. ``solutions``: keep the outputs that show exercise solutions (dropped
    otherwise). ``paths``: folders to replace (:func:`lab.report._paths.replacements`)."""
    import copy

    from nbconvert import HTMLExporter

    from lab.report.readable import humanize_html_headers

    nb = copy.deepcopy(nb) if solutions else without_solutions(nb)
    math = MathToMathML()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = math.protect(cell.source)
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            src = _meta(out).get(_nbh.PLOTLYJS_KEY)
            if src:  # plotly.js: a script tag to the copy beside the reports, from this page
                out["data"] = {"text/html": _nbh.plotlyjs_tag(prefix + src)}
            elif _widgets.WIDGET_MIME in data:  # cannot draw offline: final text or a note
                out["data"] = {"text/html": _widgets.static_html(data[_widgets.WIDGET_MIME], nb.metadata)}
            elif isinstance(data.get("text/markdown"), str):
                data["text/markdown"] = math.protect(data["text/markdown"])
    nb.metadata.pop("widgets", None)  # the state only feeds a CDN widget manager
    exporter = HTMLExporter(template_name=TEMPLATE, extra_template_basedirs=[str(TEMPLATES)])
    body, _ = exporter.from_notebook_node(nb)
    body = math.restore(_nbh.strip_plotly_mathjax(body))  # (mathjax: figures shown without setup_notebook())
    body = humanize_html_headers(_glossary.relink(body, prefix))
    body = re.sub(r"(<body\b[^>]*>)", lambda m: m.group(1) + _nav(prefix, solutions), body, count=1)
    if paths:
        body = _paths.scrub(body, paths)
    external = sorted({m.group(2) for m in _EXTERNAL_RE.finditer(body)})
    warnings = [f"requests {url} (will not load offline)" for url in external]
    if math.missing_converter:
        warnings.append("formulas shown as TeX source: install latex2mathml to render them")
    return body, warnings


def plotlyjs_name() -> str:
    """Where plotly.js goes, relative to the reports folder (its version in the name)."""
    from plotly.offline import get_plotlyjs_version

    return f"{ASSETS}/plotly-{get_plotlyjs_version()}.min.js"


def write_plotlyjs(out_dir: Path) -> str:
    """plotly.js (the copy plotly ships: offline) into ``out_dir``, once: written when missing or
    different. Returns its path relative to ``out_dir``."""
    from plotly.offline import get_plotlyjs

    name = plotlyjs_name()
    path = Path(out_dir) / name
    text = get_plotlyjs()
    if not path.is_file() or path.stat().st_size != len(text.encode("utf-8")):
        path.parent.mkdir(parents=True, exist_ok=True)
        readable(path.parent)
        write_text(path, text)
    return name


def _publish_dir(staging: Path, dest: Path) -> None:
    """Replace ``dest`` by ``staging`` (two renames; the old copy is removed afterwards).

    An empty ``staging`` (no PNGs this run) just removes ``dest``.
    """
    from lab._io import swap_dir

    if any(staging.iterdir()):
        for f in staging.iterdir():
            readable(f)
        swap_dir(readable(staging), dest)
    else:
        swap_dir(None, dest)


def _failure(nb) -> tuple[int | None, str | None, str | None]:
    """(execution count, source, "Name: value") of the cell papermill marked as failed."""
    for cell in nb.cells:
        if cell.get("metadata", {}).get("papermill", {}).get("exception"):
            err = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
            text = f"{err['ename']}: {err['evalue']}" if err else None
            return cell.get("execution_count"), cell.get("source"), text
    return None, None, None


def _load_for_report(running: Path, src: Path, error: str | None):
    """The executed notebook; else (it never ran) the source; else a stub that shows ``error``."""
    import nbformat

    for path in (running, src):
        try:
            if path.stat().st_size:
                return nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - unreadable: fall through to the next candidate
            continue
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(f"# {src.stem}\n\nCould not run: `{error}`"))
    return nb


def render_one(src: Path, out_dir: Path, *, profile: str = "report", overrides: dict | None = None,
               png: bool = True, kernel: str | None = None, timeout: float | None = None,
               notes: list[str] | None = None, log: Callable[[str], None] | None = None,
               threads: int | None = None, solutions: bool = False) -> Result:
    """Execute and export one notebook into ``out_dir``; never raises for a notebook's own error.

    ``timeout``: seconds a cell may run (default :data:`DEFAULT_CELL_TIMEOUT_S`); ``notes``:
    lines about the run kept with the notebook and shown at the top of the index (e.g. why PNGs
    were skipped); ``log``: where the progress lines go (none when not given); ``threads``: the
    kernel's OpenMP threads (``OMP_NUM_THREADS``, torch's default thread count) when the caller
    shares the cores between notebooks and the user has not set it; ``solutions``: the exercises
    show their solutions, written to ``out_dir/solutions/NAME.html`` and ``.ipynb`` (the notebook and
    page beside the index never hold them).
    """
    import nbformat

    from lab._io import atomic_write
    from lab.report.index import read_metrics

    src, name = Path(src), Path(src).stem
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = Result(name, True, 0.0)
    try:
        result.params = _params.resolve(src, profile, overrides)
    except Exception as exc:  # noqa: BLE001 - bad JSON or parameters: a failed card, not a crash
        result.ok, result.error = False, f"{type(exc).__name__}: {exc}"
    # Our PID is in both names: a later run removes what a killed one left (clean_stale).
    staging = Path(tempfile.mkdtemp(prefix=f".{name}{FIGURES_SUFFIX}.{os.getpid()}-", dir=out_dir))
    fd, running = tempfile.mkstemp(prefix=f".{name}.running-{os.getpid()}-", suffix=".ipynb", dir=out_dir)
    os.close(fd)
    running = Path(running)
    kernel_log = running.with_suffix(".log")
    try:
        env = {_nbh.FIGURES_ENV: str(staging), _nbh.PNG_ENV: "1" if png else "0",
               _nbh.PROFILE_ENV: profile, "TQDM_DISABLE": os.environ.get("TQDM_DISABLE", "1"),
               _nbh.PLOTLYJS_ENV: write_plotlyjs(out_dir), _nbh.SOLUTIONS_ENV: "1" if solutions else "0"}
        if threads and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(threads)
        if result.ok:
            spec = {"name": name, "input": str(src), "output": str(running), "parameters": result.params,
                    "kernel": kernel or kernel_name(), "cwd": str(src.parent), "log": str(kernel_log),
                    "start_timeout": KERNEL_START_TIMEOUT_S, "timeout": timeout or DEFAULT_CELL_TIMEOUT_S,
                    "progress": log is not None, "slow": SLOW_CELL_S, "every": HEARTBEAT_S}
            outcome = execute(spec, env, log)
            if not outcome.get("ok"):
                result.ok, result.error = False, outcome.get("error")
                result.failed_cell, result.failed_source = outcome.get("exec_count"), outcome.get("source")
        executed = time.perf_counter() - start
        if log:
            log(f"      {executed:7.1f} s  exporting HTML")
        nb = _load_for_report(running, src, result.error)
        if not result.ok and result.failed_source is None:
            cell, source, err = _failure(nb)
            if source is not None:
                result.failed_cell, result.failed_source = cell, source
                result.error = result.error or err
        pm = nb.metadata.get("papermill")
        if pm:  # papermill recorded our temp path; a reader knows the notebook by its name
            pm["input_path"], pm["output_path"] = f"notebooks/{src.name}", f"{name}.ipynb"
        result.metrics = read_metrics(nb)
        paths = _paths.replacements(out_dir)
        html, result.warnings = export_html(nb, paths=paths)
        result.seconds = time.perf_counter() - start
        nb.metadata.setdefault(_params.METADATA_KEY, {})["report"] = {
            "profile": profile, "ok": result.ok, "seconds": round(result.seconds, 2),
            "execute_seconds": round(executed, 2), "params": result.params, "error": result.error,
            "failed_cell": result.failed_cell, "failed_source": result.failed_source,
            "warnings": result.warnings, "notes": list(notes or []),
            "rendered_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        # The executed notebook goes last: the index is read from it.
        _publish_dir(staging, out_dir / f"{name}{FIGURES_SUFFIX}")
        if solutions:
            folder = out_dir / SOLUTIONS
            folder.mkdir(exist_ok=True)
            write_text(folder / f"{name}.html", export_html(nb, prefix="../", solutions=True, paths=paths)[0])
            write_text(folder / f"{name}.ipynb", _paths.scrub(nbformat.writes(nb), paths))
        write_text(out_dir / f"{name}.html", html)
        student = _paths.scrub(nbformat.writes(without_solutions(nb)), paths)
        atomic_write(out_dir / f"{name}.ipynb", lambda p: readable(p).write_text(student, encoding="utf-8"))
        return result
    finally:
        running.unlink(missing_ok=True)
        kernel_log.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)


_STAGING_RE = re.compile(r"^\.[^/]+?(?:\.running-|" + re.escape(FIGURES_SUFFIX) + r"\.)(\d+)-")


def clean_stale(out_dir: Path) -> list[Path]:
    """Remove the hidden staging files and folders that a killed ``lab report`` left in ``out_dir``
    (those whose PID is no longer alive; a live run's staging is left alone). Returns what went."""
    from lab.runs import pid_alive

    gone = []
    for path in Path(out_dir).glob(".*"):
        m = _STAGING_RE.match(path.name)
        if m and not pid_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            gone.append(path)
    return gone


def after(src: Path) -> list[str]:
    """The notebooks ``src`` should start after (its metadata's ``continual-lab.after``: e.g. those
    that fill a cache it reads, so two kernels do not compute the same thing side by side)."""
    import json

    meta = json.loads(Path(src).read_text()).get("metadata", {}).get(_params.METADATA_KEY, {}) or {}
    names = meta.get("after", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _params.ParamsError(f"{Path(src).name}: metadata.{_params.METADATA_KEY}.after must be a list of "
                                  "notebook names")
    return [n.removesuffix(".ipynb") for n in names]


def default_jobs() -> int:
    """Notebooks rendered side by side: two where there are two cores or more (each kernel then gets
    half the cores), else one."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def _schedule(sources: list[Path], jobs: int, start: Callable[[Path], Any], finish: Callable[[Path, Any], None],
              deps: dict[Path, list[str]] | None = None):
    """Run ``start(src)`` for every notebook, at most ``jobs`` at a time, a notebook only once those
    it declares (``deps``, default :func:`after` of each) have finished (names outside ``sources`` do
    not hold it back), in the order given otherwise; ``finish`` gets each result in this thread as it
    arrives.

    Side by side, each ``start`` runs in a daemon thread (the notebook itself is its own kernel
    process) and this thread waits on a queue, so Ctrl-C or SIGTERM reaches it at once and the
    process can exit without waiting for a running notebook."""
    import queue
    import threading

    if jobs <= 1:
        for src in sources:
            finish(src, start(src))
        return
    names = {s.stem for s in sources}
    deps = deps if deps is not None else {s: after(s) for s in sources}
    needs = {s: set(deps[s]) & names for s in sources}
    arrived: queue.Queue = queue.Queue()

    def work(src: Path) -> None:
        try:
            arrived.put((src, start(src), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, raised there
            arrived.put((src, None, exc))

    pending, running, done = list(sources), set(), set()
    while pending or running:
        ready = [s for s in pending if needs[s] <= done] or ([] if running else pending[:1])  # a cycle: in order
        for src in ready[:jobs - len(running)]:
            pending.remove(src)
            running.add(src)
            threading.Thread(target=work, args=(src,), name=f"lab-report-{src.stem}", daemon=True).start()
        src, res, exc = arrived.get()
        running.discard(src)
        done.add(src.stem)
        if exc is not None:
            raise exc
        finish(src, res)


def _remove_own_staging(out_dir: Path) -> None:
    """This process's hidden staging in ``out_dir`` (a notebook interrupted while running beside
    another: its thread never reaches its own clean-up)."""
    for path in Path(out_dir).glob(".*"):
        m = _STAGING_RE.match(path.name)
        if m and int(m.group(1)) == os.getpid():
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def render(notebooks_dir: str | Path | None = None, out_dir: str | Path | None = None, *,
           profile: str = "report", only: list[str] | None = None, overrides: dict | None = None,
           png: bool = True, kernel: str | None = None, timeout: float | None = None,
           jobs: int | None = None, solutions: bool = False, log: Callable[[str], None] = print) -> list[Result]:
    """Render every notebook in ``notebooks_dir`` (default ``<repo>/notebooks``) into ``out_dir``.

    Bad input (unknown ``only`` names, unknown parameters) raises :class:`ParamsError` before
    any notebook runs. Notebook failures do not raise: check ``Result.ok``. With ``png`` and no
    browser for kaleido (:func:`lab.report.notebook.find_browser`), PNGs are skipped with one
    ``log`` line and a note in the index. ``jobs`` notebooks run side by side (default
    :func:`default_jobs`), each kernel with ``cores // jobs`` threads, a notebook only after those
    its metadata names (:func:`after`); the results come back in the notebooks' order.
    ``solutions``: also write each notebook's exercises with their solutions into
    ``out_dir/solutions/`` (:func:`render_one`), with an index of them there.
    """
    from lab.report.index import write_index

    root = repo_root()
    notebooks_dir = Path(notebooks_dir) if notebooks_dir else root / "notebooks"
    out_dir = Path(out_dir) if out_dir else root / "reports"
    sources = discover(notebooks_dir, only)
    if not sources:
        raise _params.ParamsError(f"no notebooks in {notebooks_dir}")
    deps = {}
    for src in sources:  # fail fast on bad parameters, before any kernel starts
        _params.resolve(src, profile, overrides)
        deps[src] = after(src)
    jobs = max(1, min(jobs or default_jobs(), len(sources)))
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    notes = []
    if png and _nbh.find_browser() is None:
        notes.append(_nbh.no_browser_note())
        log(notes[0])
        png = False
    kernel = kernel or kernel_name()
    if out_dir.is_dir():
        for path in clean_stale(out_dir):
            log(f"removed {path.name}: staging left by a killed run")
    if jobs > 1:
        log(f"{jobs} notebooks at a time, {threads} thread(s) each")
    out_dir.mkdir(parents=True, exist_ok=True)
    _glossary.write(out_dir)
    results: dict[Path, Result] = {}
    t0 = time.perf_counter()

    def start(src: Path) -> Result:
        tag = f"{src.stem}: " if jobs > 1 else ""
        log(f"[{sources.index(src) + 1}/{len(sources)}] {src.name} ({profile} parameters, kernel {kernel}) ...")
        return render_one(src, out_dir, profile=profile, overrides=overrides, png=png, kernel=kernel,
                          timeout=timeout, notes=notes, log=(lambda line: log(tag + line.lstrip())) if tag else log,
                          threads=threads, solutions=solutions)

    def finish(src: Path, res: Result) -> None:
        results[src] = res
        numbers = "  ".join(f"{k}={_nbh._format(v)}" for k, v in res.metrics.items())
        who = f"{src.stem}: " if jobs > 1 else ""
        log(f"      {who}{'ok' if res.ok else 'FAILED'} in {res.seconds:.1f} s  {numbers}".rstrip())
        for w in res.warnings:
            log(f"      {who}warning: {w}")
        write_index(out_dir, notebooks_dir)
        if solutions:
            write_solutions_index(out_dir, notebooks_dir)

    _state()[1].clear()
    try:
        _schedule(sources, jobs, start, finish, deps)
    except BaseException as exc:
        stop_all()                      # every kernel shut down before the process goes on
        _remove_own_staging(out_dir)
        if isinstance(exc, KeyboardInterrupt):
            done = [s.stem for s in sources if s in results]
            raise Interrupted(done, [s.stem for s in sources if s not in results], out_dir) from None
        raise
    ordered = [results[s] for s in sources]
    if solutions:
        log(f"solutions: {out_dir / SOLUTIONS / 'index.html'} (hand out {out_dir} without that folder)")
    log(wall_time_table(ordered, wall=time.perf_counter() - t0 if jobs > 1 else None))
    return ordered


def write_solutions_index(out_dir: Path, notebooks_dir: Path | None = None) -> Path:
    """``solutions/index.html``: a link to each notebook's solution page (for the teacher)."""
    import html as _html

    folder = Path(out_dir) / SOLUTIONS
    names = sorted(p.stem for p in folder.glob("*.html") if p.name != "index.html")
    items = "".join(f"<li><a href='./{_html.escape(n)}.html'>{_html.escape(n)}</a></li>" for n in names)
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>continual-lab: solutions</title>"
            f"</head><body style='font:15px system-ui,sans-serif;margin:2rem'>{_nav('../', True)}"
            f"<h1>Exercise solutions</h1><p>Each notebook's report with every exercise's solution under its "
            f"checker. The reports one folder up hold none: hand out that folder without this one.</p>"
            f"<ul>{items}</ul></body></html>")
    return write_text(folder / "index.html", page)


def wall_time_table(results: list[Result], wall: float | None = None) -> str:
    """Per-notebook status and wall time, and the total, as a plain-text table; ``wall``: the
    elapsed time of notebooks rendered side by side (less than the sum)."""
    width = max([len(r.name) for r in results] + [len("notebook"), len("elapsed (side by side)")])
    lines = ["", f"{'notebook':<{width}}  status  wall time", f"{'-' * width}  ------  ---------"]
    lines += [f"{r.name:<{width}}  {'ok' if r.ok else 'FAILED':<6}  {r.seconds:7.1f} s" for r in results]
    lines.append(f"{'total':<{width}}  {'':<6}  {sum(r.seconds for r in results):7.1f} s")
    if wall is not None:
        lines.append(f"{'elapsed (side by side)':<{width}}  {'':<6}  {wall:7.1f} s")
    return "\n".join(lines)
