"""One notebook executed by papermill, in a process of its own: ``python -m lab.report._execute``.

:func:`lab.report.pipeline.render_one` starts this process with the notebook's environment (its
figures folder, profile, thread count: the kernel inherits it, so notebooks rendered side by side
never see each other's, and the caller's ``os.environ`` is left alone) and a JSON spec on stdin.
Everything here is public API: :func:`papermill.execute_notebook` with its documented arguments;
nbclient's ``on_notebook_start`` / ``on_cell_start`` / ``on_cell_complete`` hooks
(``NotebookClient`` traits, which papermill's engine passes through) feeding
:class:`lab.report.pipeline.Progress`; jupyter_client's ``AsyncKernelManager``, made here and
handed to papermill (``km``) so that its kernel is shut down however execution ends, with CurveZMQ
transport encryption through its ``transport_encryption`` config trait where jupyter_client and
pyzmq offer it.

What comes back, on the original stdout, one JSON object a line: ``{"line": ...}`` for a progress
line, then ``{"result": {...}}`` (``ok``; else ``error`` and, for a failing cell, ``exec_count``
and ``source``). This process's own stdout and stderr, and so the kernel's (its warnings, its
"KeyboardInterrupt caught in kernel" when shut down), go to the log file the spec names, never to
the terminal.

SIGTERM (what the caller sends on Ctrl-C, or when it is killed itself) unwinds papermill; the
kernel is killed and its connection file removed (:func:`shutdown`). The process also ends that
way when its caller goes away.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading


def kernel_config():
    """The traitlets config of the notebook's kernel manager: CurveZMQ transport encryption
    (``transport_encryption="auto"``: where the kernelspec declares it) when jupyter_client (>= 8.10)
    and pyzmq support it, else empty."""
    from jupyter_client import KernelManager
    from traitlets.config import Config

    cfg = Config()
    if "transport_encryption" in KernelManager.class_trait_names():
        import zmq

        if zmq.has("curve"):
            cfg.KernelManager.transport_encryption = "auto"
    return cfg


def hooks(progress, running: list) -> dict:
    """nbclient's cell hooks reporting to ``progress`` (a :class:`lab.report.pipeline.Progress`, or
    None): nbclient calls ``on_cell_start`` for every cell as execution reaches it (a markdown
    cell's heading becomes a line) and ``on_cell_complete`` after each code cell. ``running`` gets
    the notebook being executed (``on_notebook_start`` hands it over), to be written if execution
    stops without papermill writing it."""

    def on_notebook_start(notebook, **_):
        running[:] = [notebook]
        if progress:
            progress.n_cells = len(notebook.cells)

    def on_cell_start(cell, cell_index, **_):
        if progress:
            progress.cell_start(cell, cell_index)

    def on_cell_complete(cell, cell_index, **_):
        if progress:
            progress.cell_complete(cell_index)

    return {"on_notebook_start": on_notebook_start, "on_cell_start": on_cell_start,
            "on_cell_complete": on_cell_complete}


def execute(spec: dict, send) -> dict:
    """Run papermill on ``spec`` (input, output, parameters, kernel, cwd, timeouts); ``send(line)``
    gets the progress lines. Returns the outcome (see the module's doc)."""
    import papermill
    from jupyter_client import AsyncKernelManager
    from papermill.exceptions import PapermillExecutionError

    from lab.report.pipeline import Progress

    progress = Progress(spec["name"], send, slow=spec.get("slow", 10.0), every=spec.get("every", 30.0)) \
        if spec.get("progress", True) else None
    running: list = []
    # the kernel manager is ours (jupyter_client's public class, handed to papermill as ``km``), so
    # its kernel is shut down here however execution ends: also when stopped while it starts
    km = AsyncKernelManager(kernel_name=spec["kernel"], config=kernel_config())
    stopped = False
    try:
        # request_save_on_cell_execute=False: papermill writes the notebook when it ends and when a
        # cell fails, not before and after every cell (~0.15 s a write for a report-sized notebook)
        papermill.execute_notebook(
            spec["input"], spec["output"], parameters=spec["parameters"], language="python",
            kernel_name=spec["kernel"], cwd=spec["cwd"], progress_bar=False, log_output=False,
            request_save_on_cell_execute=False, start_timeout=spec["start_timeout"],
            execution_timeout=spec["timeout"], km=km, **hooks(progress, running))
        return {"ok": True}
    except PapermillExecutionError as exc:
        return {"ok": False, "exec_count": exc.exec_count, "source": exc.source,
                "error": f"{exc.ename}: {exc.evalue}"}
    except KeyboardInterrupt:
        stopped = True
        return {"ok": False, "error": "KeyboardInterrupt: stopped", "interrupted": True}
    except Exception as exc:  # noqa: BLE001 - dead kernel, timeout, bad notebook: reported, not raised
        _write(running, spec["output"])      # what ran until then, with papermill's marks
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if progress:
            progress.close()
        shutdown(km, now=stopped)


def shutdown(km, now: bool = False) -> None:
    """Shut the kernel of ``km`` down (asked to stop, killed after jupyter_client's wait; ``now``:
    killed at once) and remove its connection file; nothing when it never started."""
    from jupyter_core.utils import run_sync

    try:
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=now)
        else:
            km.cleanup_connection_file()
    except Exception:  # noqa: BLE001 - already gone: its process exits with this one's (ipykernel's parent poller)
        pass


def _write(running: list, path: str) -> None:
    """The notebook papermill was executing (a cell timed out, the kernel died), written to ``path``."""
    import nbformat

    if running:
        try:
            nbformat.write(running[0], path)
        except Exception:  # noqa: BLE001 - the caller then shows the source notebook with the error
            pass


def _stop(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)     # once: the kernel's shutdown is not cut short
    raise KeyboardInterrupt


def _watch_parent(parent: int) -> None:
    """Ends this process as SIGTERM does when the process that started it is gone."""
    import time

    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    spec = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)   # not inherited by the kernel
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    lock = threading.Lock()

    def send(obj) -> None:
        with lock:
            out.write(json.dumps(obj) + "\n")

    signal.signal(signal.SIGTERM, _stop)
    threading.Thread(target=_watch_parent, args=(spec["parent"],), daemon=True).start()
    result = execute(spec, lambda line: send({"line": line}))
    send({"result": result})
    out.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)     # the kernel is shut down and the result sent: skip the interpreter's teardown
