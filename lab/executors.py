"""Where a sweep's variants run: one after another in this process (``local``) or one Ray task each
(``ray``: a local Ray instance sized to this machine, or the cluster at ``address``).

A sweep hands :func:`run` a list of :class:`Job`: a module-level function, the variant's frozen
(immutable) config and the resources one run of it needs. Both executors call ``fn(config, *shared)``
(``shared``: read-only inputs every variant needs, put into Ray's object store once) and write each
result once, as ``<results_dir>/<key>.json``, as soon as it arrives; a variant whose file is already
there is skipped and its stored result used, so a killed sweep started again with the same
``results_dir`` runs only what is missing. A stored file that cannot be read, or that the sweep's
``check`` refuses (e.g. an empty list where a variant's rows belong), is never taken as done: the
sweep stops before running anything, with one line naming the file (remove it and the variant runs
again); a fresh result the ``check`` refuses is not stored. Each file is written whole or not at all
(:func:`lab._io.atomic_write`), so a sweep stopped by Ctrl-C or SIGTERM leaves no half-written one. Results are JSON values (tidy rows: dicts of numbers and
strings) and come back through the same JSON round trip under either executor, so the tables a sweep
merges from them are identical. Ray is optional (``pip install -e '.[scale]'``).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Job:
    """One variant: ``fn(config, *shared)`` returns its JSON-able result."""

    key: str                         # unique within the sweep, file-name safe: the result's file name
    fn: Callable[..., Any]           # a module-level function (Ray pickles it by reference)
    config: Any                      # the variant, a frozen dataclass
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self):
        if not self.key or "/" in self.key or self.key.startswith("."):
            raise ValueError(f"job key {self.key!r}: must be a non-empty file name")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"job {self.key}: resources must be >= 0")


def check(executor: str, address: str | None = None) -> None:
    """The one check of ``--executor`` / ``--address`` (before any work)."""
    check_executor(executor, address)


def check_executor(executor: str, address: str | None = None) -> None:
    """:func:`check` (under a second name: :func:`run`'s ``check`` is a result check)."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    if address is not None and executor != "ray":
        raise ValueError(f"address {address!r} joins a Ray cluster: it needs executor 'ray'")
    if executor == "ray" and not has_ray():
        raise ValueError("executor 'ray' needs Ray: pip install -e '.[scale]' (or pip install ray)")


def has_ray() -> bool:
    """Whether Ray is installed, without importing it (~2 s): a bad command line answers at once."""
    import importlib.util

    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):      # a blocked or broken entry in sys.modules
        return False


def add_arguments(parser, kept: str, unit: str = "variant") -> None:
    """A command's ``--executor`` / ``--address``; ``kept`` says where finished ones (``unit``: what one Ray task runs) are kept."""
    parser.add_argument("--executor", default="local", choices=list(EXECUTORS),
                        help=f"local: one {unit} after another (default); ray: one Ray task per {unit} (pip install -e "
                             f"'.[scale]'); finished {unit}s are kept in {kept}")
    parser.add_argument("--address", default=None,
                        help="join the Ray cluster at this address (e.g. auto or HOST:6379; with --executor ray; "
                             "default: a local Ray on this machine's cores)")


def check_arguments(args) -> None:
    """``args.executor`` / ``args.address`` of a command line: one line naming the bad one (the
    command's usage error); nothing is started."""
    from lab import _validate as V

    if args.address is not None and args.executor != "ray":
        raise V.bad("--address", args.address, "joins a Ray cluster: needs --executor ray")
    if args.address is not None and not args.address.strip():
        raise V.bad("--address", args.address, "give auto, HOST:PORT or ray://HOST:PORT")
    if args.executor == "ray" and not has_ray():
        raise V.bad("--executor", "ray", "needs Ray: pip install -e '.[scale]' (or pip install ray)")


def _jsonable(x):
    """numpy scalars and arrays as Python numbers and lists (everything else as JSON takes it)."""
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"a job result must be JSON data, got {type(x).__name__}")


def _roundtrip(result) -> str:
    return json.dumps(result, default=_jsonable, allow_nan=True)


def _store(results_dir: Path | None, key: str, text: str):
    if results_dir is not None:
        from lab._io import atomic_write

        atomic_write(results_dir / f"{key}.json", lambda p: p.write_text(text + "\n"))
    return json.loads(text)


FIX = "remove it and the variant runs again"


def _read_stored(f: Path, j: Job, verify) -> Any:
    """A stored result, readable (else :class:`lab._io.CorruptFile`) and accepted by ``verify`` (else
    ValueError), each one line naming ``f``."""
    from lab._io import CorruptFile, read_json

    try:
        result = read_json(f)
    except (CorruptFile, UnicodeDecodeError) as exc:
        why = " ".join(str(exc).removeprefix(f"{f}: ").split())[:200]
        raise CorruptFile(f"{f}: not a readable result ({why}); {FIX}") from None
    why = verify(result, j.config) if verify is not None else None
    if why:
        raise ValueError(f"{f}: {why}; {FIX}")
    return result


def run(jobs: Sequence[Job], *, executor: str = "local", address: str | None = None, shared: tuple = (),
        results_dir: str | os.PathLike | None = None, workers: int | None = None,
        log: Callable[[str], None] | None = None, check: Callable[[Any, Any], str | None] | None = None) -> list:
    """Every job's result, in ``jobs`` order. ``workers``: CPUs of a local Ray instance (default:
    this machine's); ignored with ``address``. ``log`` gets one line per finished (or skipped) job.
    ``check(result, config)``: what is wrong with a job's result (``None``: nothing), applied to every
    stored result before anything runs and to every fresh one before it is stored."""
    verify = check
    check_executor(executor, address)
    keys = [j.key for j in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError("job keys must be unique")
    results_dir = Path(results_dir) if results_dir is not None else None
    out: dict[str, Any] = {}
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        for j in jobs:
            f = results_dir / f"{j.key}.json"
            if f.is_file():
                out[j.key] = _read_stored(f, j, verify)
                if log:
                    log(f"  {j.key}: done earlier, skipped")
    todo = [j for j in jobs if j.key not in out]
    if todo:
        (_run_local if executor == "local" else _run_ray)(todo, shared, results_dir, out, address, workers, log,
                                                          verify)
    return [out[k] for k in keys]


def _checked(j: Job, text: str, verify) -> str:
    """A fresh result's JSON text, once ``verify`` accepts it (else RuntimeError: nothing stored)."""
    why = verify(json.loads(text), j.config) if verify is not None else None
    if why:
        raise RuntimeError(f"variant {j.key}: its result {why}; nothing was stored")
    return text


def _run_local(todo, shared, results_dir, out, address, workers, log, verify=None):
    for i, j in enumerate(todo):
        t0 = time.perf_counter()
        out[j.key] = _store(results_dir, j.key, _checked(j, _roundtrip(j.fn(j.config, *shared)), verify))
        if log:
            log(f"  [{i + 1}/{len(todo)}] {j.key}: {time.perf_counter() - t0:.1f} s")


def _call(fn, config, *shared):
    """The Ray task: the job's function, its result already as JSON text (what the driver stores)."""
    return _roundtrip(fn(config, *shared))


def _start_ray(address, workers) -> None:
    """``ray.init`` (a local instance, or the cluster at ``address``) that leaves this process's SIGTERM
    handler as it was: Ray's own ends the driver with ``sys.exit``, so a long command stopped by
    ``kill`` would leave without the line that resumes it (Ctrl-C and SIGTERM must end it alike). A
    Ray that does not start is one line (RuntimeError), not Ray's traceback."""
    import signal
    import threading

    import ray

    kw = {"address": address} if address else {"num_cpus": workers or os.cpu_count() or 1, "include_dashboard": False}
    main = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(**kw, log_to_driver=False, configure_logging=False)
    except (ConnectionError, ValueError):
        raise
    except Exception as exc:      # e.g. "The current node timed out during startup" on a busy machine
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise RuntimeError(f"{where} did not start: {' '.join(str(exc).split())[:300]}") from None
    finally:
        if main and term is not None:
            signal.signal(signal.SIGTERM, term)


def _run_ray(todo, shared, results_dir, out, address, workers, log, verify=None):
    import ray

    started = not ray.is_initialized()
    try:
        if started:      # inside the try: a Ctrl-C while Ray starts still shuts down what it started
            _start_ray(address, workers)
        shared_refs = [ray.put(s) for s in shared]          # once, not once per variant
        task = ray.remote(_call)
        pending = {task.options(num_cpus=j.num_cpus, num_gpus=j.num_gpus, name=j.key, max_retries=0)
                   .remote(j.fn, j.config, *shared_refs): j for j in todo}
        t0, done = time.perf_counter(), 0
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                j = pending.pop(ready[0])
                try:
                    text = ray.get(ready[0])
                except Exception as exc:
                    raise RuntimeError(f"variant {j.key} failed on Ray: {exc}") from exc
                out[j.key] = _store(results_dir, j.key, _checked(j, text, verify))
                done += 1
                if log:
                    log(f"  [{done}/{len(todo)}] {j.key}: done at {time.perf_counter() - t0:.1f} s")
        except BaseException:     # a failure, Ctrl-C or SIGTERM: the rest stops (on a joined cluster too)
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:     # noqa: BLE001 - already finished or gone
                    pass
            raise
    finally:
        if started:
            ray.shutdown()


def resources(device: str | None, num_cpus: float = 1.0) -> dict:
    """``{num_cpus, num_gpus}`` a variant declares: one GPU when it runs on CUDA."""
    on_gpu = str(device or "cpu").startswith("cuda")
    return {"num_cpus": float(num_cpus), "num_gpus": 1.0 if on_gpu else 0.0}


def key(label: str, config) -> str:
    """A file-name-safe job key: ``label`` plus a short hash of the config's fields (a changed config
    is a new variant, never mistaken for a finished one)."""
    import hashlib
    import re
    from dataclasses import asdict, is_dataclass

    data = asdict(config) if is_dataclass(config) else config
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9_.@+=-]+", "_", label).strip("._") or "job"
    return f"{safe}-{digest}"

