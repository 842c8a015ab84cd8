"""Runs a tracker can read: ``--track mlflow`` (or ``$LAB_TRACK=mlflow``) logs a finished command to
MLflow: its run folder's config as parameters, the numbers the command read from its tables as
metrics (final values and per-step series), one child run per variant and seed, and the folder's
tables as artifacts, under an experiment named by the command ("lab tosca", "lab aware finetune",
...). See docs/tracking.md.

    track = tracking.start(args.track, "lab tosca", root=args.runs_dir)   # before any work
    res = run(cfg, ...)                                                   # the run, untouched
    tracking.log_run(track, res.run_dir, lambda: tracked.run(res))        # after it: one line

One generic adapter, :func:`log_run`: the command hands it its finished run folder and what it
read from it (each experiment says what in its own ``tracked`` module); tracking knows no
experiment and imports none. Tracking only observes: it reads after the run. Without ``--track``
the :class:`Tracker` is a no-op and mlflow is never imported (``import lab`` and ``lab --help`` do
not import it either). :func:`start` checks, before any work, that mlflow imports (one line naming
``pip install -e '.[track]'`` when it does not) and that the store opens.

The store: ``$MLFLOW_TRACKING_URI`` when set (a server, ``sqlite:///...`` with SQLAlchemy
installed, a folder), else a local file store ``<runs root>/mlruns`` (``$LAB_RUNS_DIR`` or
``./runs``; no server). ``mlflow ui --backend-store-uri runs/mlruns`` shows it.
"""
from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

CHOICES = ("mlflow", "none")
ENV = "LAB_TRACK"
INSTALL = "pip install -e '.[track]'"
TABLE_SUFFIXES = (".parquet", ".csv", ".json", ".md")   # a run folder's files logged as artifacts


def add_argument(parser) -> None:
    """``--track {mlflow,none}`` (default: ``$LAB_TRACK``, else none)."""
    parser.add_argument("--track", default=None, choices=CHOICES,
                        help=f"log parameters, metrics and tables to MLflow (default ${ENV}, else none; needs the "
                             f"track extra: {INSTALL}; store: $MLFLOW_TRACKING_URI or RUNS_ROOT/mlruns; "
                             f"docs/tracking.md)")


def chosen(value: str | None = None) -> str:
    """The tracker asked for: ``value`` (the flag), else ``$LAB_TRACK``, else ``'none'``."""
    if value:
        return value
    env = os.environ.get(ENV, "").strip()
    if env and env not in CHOICES:
        from lab._validate import bad

        raise bad(f"${ENV}", env, f"must be one of {', '.join(CHOICES)}")
    return env or "none"


def start(value: str | None, experiment: str, root=None) -> "Tracker":
    """The tracker of one command (``value``: its ``--track``), opened before any work: the no-op
    :class:`Tracker`, or :class:`MLflowTracker` (mlflow imported, its store open). Under several
    launched processes ($WORLD_SIZE > 1) only rank 0 opens the store; the others check the import."""
    if chosen(value) == "none":
        return Tracker()
    if _rank() != 0:
        _mlflow()
        return Tracker()
    return MLflowTracker(experiment, root)


def _rank() -> int:
    """This process's rank among launched ones ($RANK under $WORLD_SIZE > 1), else 0."""
    try:
        return int(os.environ.get("RANK") or 0) if int(os.environ.get("WORLD_SIZE") or 1) > 1 else 0
    except ValueError:
        return 0


class Tracker:
    """Tracks nothing (the default): :meth:`log` does nothing, :meth:`watch` returns its function."""

    enabled = False

    def log(self, name, *, params=None, metrics=None, series=None, folder=None, files=None, tags=None,
            parent=None) -> str | None:
        """One run: ``params`` {name: value}, ``metrics`` {name: number} (final values), ``series``
        {name: [(step, number), ...]}, ``folder`` (its top-level tables become artifacts), ``files``
        {artifact name: dict} (JSON artifacts), ``tags``, ``parent`` (a run id: a child run).
        Returns the run id (``None`` here)."""
        return None

    def watch(self, fn):
        """``fn`` wrapped so that what each call returns is also kept (here: ``fn`` itself)."""
        return fn


def _mlflow():
    try:
        import mlflow
    except ImportError as exc:
        raise ImportError(f"--track mlflow: MLflow is not installed in this environment ({exc}); install the "
                          f"track extra: {INSTALL}") from None
    return mlflow


def store_uri(root=None) -> str:
    """Where runs go: ``$MLFLOW_TRACKING_URI``, else the local file store ``<runs root>/mlruns``."""
    from lab import runs

    return os.environ.get("MLFLOW_TRACKING_URI") or (runs.runs_root(root).resolve() / "mlruns").as_uri()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    return text[:400] or type(exc).__name__


class MLflowTracker(Tracker):
    """Logs to an MLflow store through :class:`mlflow.MlflowClient` (no global active run)."""

    enabled = True

    def __init__(self, experiment: str, root=None):
        _mlflow()
        from mlflow import MlflowClient

        self.uri = store_uri(root)
        self.folder = file_store(self.uri)
        if self.folder is not None:
            # MLflow 3 keeps its folder store in maintenance mode and asks for this opt-in; the lab's
            # default store is such a folder (no server, no database package)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            check_store(self.folder)        # before any work: a store that no longer reads back is named
        self.experiment, self.started, self.steps = experiment, _now(), []
        # a server that does not answer is found in seconds, not after MLflow's minutes of retries
        quick = {k: v for k, v in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20"))
                 if k not in os.environ}
        os.environ.update(quick)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            exp = self.client.get_experiment_by_name(experiment)
            if exp is None:
                try:
                    self.experiment_id = self.client.create_experiment(experiment)
                except Exception:       # made meanwhile by another process
                    exp = self.client.get_experiment_by_name(experiment)
                    if exp is None:
                        raise
            if exp is not None:
                if exp.lifecycle_stage == "deleted":
                    raise RuntimeError(f"the experiment {experiment!r} is deleted there; restore it (mlflow "
                                       f"experiments restore --experiment-id {exp.experiment_id}) or remove it "
                                       f"for good (mlflow gc)")
                self.experiment_id = exp.experiment_id
        except Exception as exc:
            import importlib.util

            db = self.uri.split(":", 1)[0].split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql")
            why = ("it is a database store, which needs SQLAlchemy and Alembic (mlflow-skinny leaves them out): "
                   "pip install mlflow, or sqlalchemy alembic") if db and importlib.util.find_spec("sqlalchemy") is None \
                else _one_line(exc)
            raise RuntimeError(f"--track mlflow: the tracking store {self.uri} does not open: {why}") from None
        finally:
            for k in quick:
                os.environ.pop(k, None)

    def log(self, name, *, params=None, metrics=None, series=None, folder=None, files=None, tags=None,
            parent=None) -> str:
        from mlflow.entities import Metric, Param

        import lab

        now = _now()
        tags = {"lab.version": lab.__version__, **({"lab.run_dir": str(folder)} if folder else {}),
                **({"mlflow.parentRunId": parent} if parent else {}), **(tags or {})}
        rid = None
        try:
            rid = self.client.create_run(self.experiment_id, start_time=now if parent else self.started,
                                         tags={k: str(v) for k, v in tags.items()}, run_name=str(name)).info.run_id
            ms = [Metric(key(k), float(v), now, 0) for k, v in (metrics or {}).items() if finite(v)]
            ms += [Metric(key(k), float(v), now, int(step)) for k, points in (series or {}).items()
                   for step, v in points if finite(v)]
            ps = [Param(k, v) for k, v in {key(k): _param(v) for k, v in flatten(params or {}).items()}.items()]
            self.client.log_batch(rid, metrics=ms, params=ps)
            for artifact, obj in (files or {}).items():
                self.client.log_dict(rid, obj, artifact)
            for f in tables(folder):
                self.client.log_artifact(rid, str(f))
        except BaseException as exc:
            from lab import _io

            if _io.is_disk_full(exc):
                raise self._full(rid, folder, metrics, series, params, files) from exc
            if rid is not None:
                try:
                    self.client.set_terminated(rid, "FAILED")
                except Exception:
                    pass
            if isinstance(exc, Exception):      # the run itself finished: say so, in one line
                raise RuntimeError(f"--track mlflow: the run finished{f' (results in {folder})' if folder else ''}, "
                                   f"but logging it to {self.uri} failed: {_one_line(exc)}") from exc
            raise
        self.client.set_terminated(rid, "FINISHED")
        return rid

    def _full(self, rid, folder, metrics, series, params, files):
        """The store filled while logging run ``rid``: the partly logged run goes (a folder store:
        its folder; another store: deleted through the client), and one line says what it needed."""
        import json
        import shutil

        from lab import _io

        if rid is not None and self.folder is not None:
            shutil.rmtree(self.folder / str(self.experiment_id) / rid, ignore_errors=True)
        elif rid is not None:
            try:
                self.client.delete_run(rid)
            except Exception:
                pass
        # MLflow's folder store writes a file per metric, parameter and tag: each takes at least a block
        try:
            block = os.statvfs(self.folder).f_bsize if self.folder is not None else 1
        except OSError:
            block = 4096
        up = lambda n: -(-n // block) * block  # noqa: E731
        keys = {**{k: 1 for k in metrics or {}}, **{k: len(v) for k, v in (series or {}).items()}}
        needed = (sum(up(f.stat().st_size) for f in tables(folder)) + sum(up(40 * n) for n in keys.values())
                  + up(1) * (len(flatten(params or {})) + 12) + up(len(json.dumps(files or {}, default=str))))
        where = self.folder if self.folder is not None else self.uri
        free, mount = _io.free_space(where) if self.folder is not None else (None, where)
        done = f" (results in {folder})" if folder else ""
        return _io.DiskFull(f"--track mlflow: the run finished{done}, but the tracking store {where} filled up while "
                            f"logging it: it needs about {_io.size_text(needed)}, {_io.size_text(free)} free on "
                            f"{mount}; the partly logged run was removed, the store reads back as before")

    def watch(self, fn):
        def watched(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.steps.append(out)
            return out

        return watched


# --- helpers (no mlflow) ------------------------------------------------------------------------
def file_store(uri: str) -> Path | None:
    """The folder of a local MLflow file store (a ``file:`` URI or a plain path), else None."""
    if uri.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    return Path(uri) if "://" not in uri else None


_RUN_ID = re.compile(r"[0-9a-f]{32}")


def check_store(folder: Path) -> None:
    """A local MLflow file store reads back: every experiment's and run's ``meta.yaml`` is a YAML
    mapping with its id, every metric file holds ``timestamp value step`` lines. Otherwise (a write
    cut short, by a full disk or a killed process) a RuntimeError names the file and what to remove;
    MLflow itself would skip or misread it without a word."""
    if not folder.is_dir():
        return
    for exp in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "models"):
        _check_meta(folder, exp, exp / "meta.yaml", "experiment_id")
        for run in sorted(p for p in exp.iterdir() if p.is_dir() and _RUN_ID.fullmatch(p.name)):
            _check_meta(folder, run, run / "meta.yaml", "run_id")
            metrics = run / "metrics"
            for f in sorted(metrics.rglob("*")) if metrics.is_dir() else ():
                if f.is_file() and not _metric_lines(f):
                    _unreadable(folder, run, f, "not a metric history (timestamp value step per line)")


def _check_meta(folder: Path, what: Path, meta: Path, key: str) -> None:
    import yaml

    try:
        data = yaml.safe_load(meta.read_text())
    except FileNotFoundError:
        _unreadable(folder, what, meta, "missing")
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        _unreadable(folder, what, meta, "not readable YAML")
    if not (isinstance(data, dict) and data.get(key) is not None):
        _unreadable(folder, what, meta, "empty" if not data else f"without its {key}")


def _metric_lines(f: Path) -> bool:
    try:
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) not in (2, 3):
                return False
            int(parts[0]), float(parts[1]), [int(p) for p in parts[2:]]
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return True


def _unreadable(folder: Path, what: Path, f: Path, why: str):
    kind = "run" if what.parent != folder else "experiment"
    raise RuntimeError(f"--track mlflow: the tracking store {folder} does not read back: {f} is {why} (a write cut "
                       f"short, e.g. by a full disk); remove that {kind} (rm -r {what}) or choose another store "
                       f"($MLFLOW_TRACKING_URI)")


def _now() -> int:
    return int(time.time() * 1000)


def finite(v) -> bool:
    try:
        return not isinstance(v, str) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def key(name) -> str:
    """A metric or parameter name MLflow accepts: letters, digits, ``_ - . : /`` and spaces, no empty
    or ``.``/``..`` path parts, at most 250 characters (``+`` and the like become ``_``)."""
    parts = [re.sub(r"[^\w.\- :]", "_", p) for p in str(name).split("/") if p]
    return "/".join("_" if p in (".", "..") else p for p in parts)[:250] or "_"


def _param(v) -> str:
    if isinstance(v, (list, tuple)):
        import json

        v = json.dumps(list(v), default=str)
    return str(v)[:6000]


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dicts as one level: ``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def tables(folder) -> list[Path]:
    """The top-level tables of a run folder (parquet, CSV, JSON, Markdown; no modules, no caches)."""
    if folder is None or not Path(folder).is_dir():
        return []
    return sorted(f for f in Path(folder).iterdir() if f.is_file() and f.suffix in TABLE_SUFFIXES
                  and not f.name.startswith("."))


def _missing(v) -> bool:
    """None or NaN (a baseline's empty ``flow`` column in a CSV): left out of names and parameters."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def _name(keys, row) -> str:
    return "/".join(_part(k, row[k]) for k in keys if k in row and not _missing(row[k]))


def _part(k: str, v) -> str:
    """A key's value as a name part: a number carries its column's name ("l1 0.0005", "seed 1993")."""
    import numbers

    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return str(v)
    return f"{k} {int(v)}" if isinstance(v, numbers.Integral) or k == "seed" else f"{k} {float(v):g}"


def numeric(df) -> list[str]:
    import pandas as pd

    return [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]


def table_metrics(df, keys, values=None, prefix: str = "") -> dict:
    """One metric per row and value column: ``<key values>/<column>`` (e.g. "per-sample/avg_inc_acc")."""
    if df is None or not len(df):
        return {}
    values = [c for c in (values or numeric(df)) if c in df.columns and c not in keys]
    out = {}
    for row in df.to_dict("records"):
        name = _name(keys, row)
        out.update({f"{prefix}{name}/{c}": row[c] for c in values})
    return out


def log_children(track: Tracker, df, by, parent: str, spread: str | None = None) -> None:
    """One child run of ``parent`` per group of ``df`` by ``by`` (a variant x seed): its ``by`` values
    and its constant text columns as parameters, its numbers as metrics (per ``spread`` value, e.g.
    per routing, when a group has one row each)."""
    if df is None or not len(df):
        return
    by = [c for c in by if c in df.columns]
    nums = [c for c in numeric(df) if c not in by and c != spread]
    for values, g in df.groupby(by, sort=False, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        params = dict(zip(by, values))
        params.update({c: g[c].iloc[0] for c in g.columns if c not in params and c not in nums and c != spread
                       and g[c].nunique(dropna=False) == 1})
        params = {k: v for k, v in params.items() if not _missing(v)}
        rows = g.to_dict("records")
        metrics = {(f"{r[spread]}/{c}" if spread else c): r[c] for r in rows for c in nums}
        track.log(" ".join(_part(k, params[k]) for k in by if k in params), params=params, metrics=metrics,
                  parent=parent)


# --- the adapter every command calls -------------------------------------------------------------
CONFIG = "config.json"          # a run folder's settings: the run's parameters unless given
MANIFEST = "manifest.json"      # a study's record: its command becomes the tag lab.command
CONFIG_SKIP = ("timings", "versions", "align")   # bookkeeping in a config, not settings


def log_run(track: Tracker, folder=None, record=None, *, name=None, params=None, metrics=None, series=None,
            children=None, files=None, tags=None) -> str | None:
    """Log one finished command as one run (nothing without a tracker); returns its id.

    ``record``: a function called only when tracking, returning any of the keyword arguments below
    (each experiment's ``tracked`` module has one per command), so an untracked command reads nothing.

    ``folder``: its run folder (``None`` for a command that writes none): it names the run (unless
    ``name``), its ``config.json`` gives the parameters (unless ``params``; :data:`CONFIG_SKIP`
    left out), its ``manifest.json``'s command the tag ``lab.command``, its top-level tables become
    artifacts. ``metrics`` {name: number}, ``series`` {name: [(step, number), ...]}: the numbers the
    command read from its results; ``children``: ``(table, by)`` or ``(table, by, spread)``, one
    child run per group (:func:`log_children`); ``files`` {artifact name: dict}; ``tags``."""
    if not track.enabled:
        return None
    from lab._io import read_json

    if record is not None:
        return log_run(track, folder, **{"name": name, "params": params, "metrics": metrics, "series": series,
                                         "children": children, "files": files, "tags": tags, **record()})
    folder = Path(folder) if folder is not None else None
    if params is None:
        cfg = read_json(folder / CONFIG) if folder is not None and (folder / CONFIG).is_file() else {}
        params = {k: v for k, v in cfg.items() if k not in CONFIG_SKIP}
    tags = dict(tags or {})
    if folder is not None and (folder / MANIFEST).is_file() and "lab.command" not in tags:
        tags["lab.command"] = read_json(folder / MANIFEST).get("command", "")
    rid = track.log(name or (folder.name if folder is not None else "run"), params=params, metrics=metrics,
                    series=series, folder=folder, files=files, tags=tags)
    if children is not None:
        table, by, *spread = children
        log_children(track, table, by, rid, spread=spread[0] if spread else None)
    return rid
