"""The shipped AWARe study, one command: ``lab aware study`` (:func:`run_study`).

The pipeline flows one way — config and plan (:mod:`.plan`) -> runs (:mod:`.runner`, each written to
``<study>/runs/<key>.json`` as it finishes, skipped when the study is started again) -> tables
(:mod:`.tables`) -> views (:mod:`lab.experiments.aware.views.study`: notebook 04, ``results/aware/README.md``, the
README section). Provenance (code hashes, machine) is :mod:`.provenance`.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from lab.experiments.aware.study.plan import (BUDGETS, CONTINUAL, NOTES, PRESETS, Job, StudyConfig, job_key,  # noqa: F401
                                              main_method, method_variant, reference_method, variant_id, variants)
from lab.experiments.aware.study.provenance import (STUDY_COMPUTING, changed_sources, machine, run_account,  # noqa: F401
                                                    source_hashes, time_spread)


def status(env, out: Path) -> str:
    """Which runs of the plan are finished in ``out/runs``: reads run files, trains and scores nothing."""
    from lab.experiments.aware.study import runner

    runs_dir = Path(out) / "runs"
    res = runner.collect(env, out)
    n = {"fronts": len(res["fronts"]), "precision": len(res["precision"]), "tuning": len(res["tune"]),
         "tests": len(res["test"]) - len(res["fronts"]), "continual": len(res["continual"])}
    lines = [f"study {out}: data fingerprint {env.fingerprint}; {len(list(runs_dir.glob('*.json')))} run files"]
    for part, done in n.items():
        miss = res["missing"][part]
        lines.append(f"  {part:<10} {done} finished, {miss} missing" + (" (tests wait for their variant's tuning)"
                                                                         if part == "tests" and miss else ""))
    if res["kept"]:
        lines.append("  kept scales (tuning seeds): " + "; ".join(f"{k} {', '.join(f'{x:.3g}' for x in v)}"
                                                              for k, v in res["kept"].items() if not k.startswith("methods/")))
    lines.append("complete" if res["complete"] else "not complete: `lab aware study` runs what is missing")
    return "\n".join(lines)


def _original_provenance(out: Path, cfg) -> dict | None:
    """The manifest of the study already in ``out`` when it was made with ``cfg`` (its command,
    dates, machine and timings must survive a ``--tables-only`` regeneration), else None."""
    import json

    from lab._io import read_json

    f = Path(out) / "manifest.json"
    try:
        m = read_json(f) if f.is_file() else None
    except Exception:
        return None
    if not isinstance(m, dict) or m.get("config") != json.loads(json.dumps(asdict(cfg))):
        return None
    return m


def cost(cfg, res: dict, *, tables_only: bool, wall_s: float, kept_original: bool = False) -> tuple[dict, str]:
    """What this command did and what the study's runs cost: ``(fields, sentence)`` for the manifest.
    The command's own wall time (``wall_s``: seconds when it only regenerates the tables) is told apart
    from the runs' (each distinct run once), set against the preset's budget (:data:`BUDGETS`), with
    whether anything was cut and how much one job's time varied from run to run."""
    recs = list({r.get("key"): r for ph in ("fronts", "precision", "tune", "test", "continual")
                 for r in res.get(ph, [])}.values())
    acc = run_account(recs)
    preset = next((k for k, v in PRESETS.items() if v == cfg), None)
    budget = BUDGETS.get(preset)
    spread = {}
    # runs of one variant at scale 1: the same job, seed aside (full fine-tuning and AWARe)
    for vid in (method_variant(reference_method()), method_variant(main_method())):
        sp = time_spread([r for r in res.get("fronts", []) if r.get("variant") == vid and r.get("scale") == 1.0])
        if sp:
            spread[vid] = sp
    complete = bool(res.get("complete", True))
    h = lambda x: f"{x / 3600:.1f} h"  # noqa: E731
    words = [(f"These tables were regenerated from the {acc['count']} finished runs in runs/, running none "
              f"({wall_s:.0f} s; the last entry of `regenerations` describes it; `command`, `started`, `finished`, "
              "`wall_s` and `machine` are the study's own)." if kept_original else
              f"These tables were regenerated from the {acc['count']} finished runs in runs/, running none "
              f"({wall_s:.0f} s; the `command`, `wall_s` and `machine` fields describe this regeneration)." if tables_only
              else f"This command ran what was missing and wrote the tables in {h(wall_s)} (`wall_s`; `machine`: "
              "where the tables were written)."),
             f"The study's runs: {acc['count']} runs, {h(acc['run_s'])} of summed run time (`compute_s`, each "
             f"distinct run once), {h(acc['machine_s'])} of the machine's wall clock with at least one running "
             f"({h(acc['concurrent_s'])} of it with two or more at once), from {acc['first_started']} to "
             f"{acc['last_finished']}, on {'; '.join(acc['machines']) or 'an unrecorded machine'}."]
    if len(acc.get("code_versions") or {}) > 1:
        words.append(f"The runs were recorded by {len(acc['code_versions'])} versions of the computing sources ("
                     + ", ".join(f"`{v['sha256']}`: {v['runs']} runs" for v in acc["code_versions"])
                     + ", oldest first): the study resumed across changes to the code; `lab aware check --run KEY` "
                     "re-runs a finished run with today's code and compares every answer.")
    if budget:
        ratio = acc["machine_s"] / budget
        words.append(f"Budget {h(budget)} of the machine: the runs used {h(acc['machine_s'])} ({ratio:.1f}x), "
                     + ("over budget." if ratio > 1 else "within budget."))
    words.append("Nothing was cut: every run the configuration plans (each group, seed, step and test question) "
                  "finished." if complete else
                  "Not complete: some planned runs have not finished (`lab aware study --status` lists them).")
    if spread:
        words.append("The same job's run time varied from run to run with what else the cores were running: " + ", ".join(
            f"{v}'s {d['n']} test runs took {d['min_s']:,.0f}-{d['max_s']:,.0f} s ({d['max_s'] / d['min_s']:.1f}x)"
            for v, d in spread.items()) + ".")
    fields = {**acc, "budget_s": budget, "over_budget": bool(budget and acc["machine_s"] > budget),
              "cut": [] if complete else None, "headline_test_seconds": spread}
    return fields, " ".join(words)


def run_study(cfg, out: str | Path, *, command: str = "", cache_dir=None, device: str | None = None,
              progress: bool = True, log=print, executor: str = "local", address: str | None = None,
              workers: int | None = None, status_only: bool = False, tables_only: bool = False) -> dict:
    """Tune, test, run the continual sequence (:mod:`lab.experiments.aware.study.runner`: every finished run
    is kept in ``out/runs`` at once), then compute the tables with intervals and write them and
    ``manifest.json`` into ``out`` (each file atomically)."""
    import datetime

    t_start = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = Path(out)
    if status_only:     # reads run files only: no model, no data
        return {"status": status(light_env(cfg, out, device), out)}
    with study_lock(out):
        return _run_locked(cfg, out, command=command, cache_dir=cache_dir, device=device, progress=progress, log=log,
                           executor=executor, address=address, workers=workers, tables_only=tables_only,
                           t_start=t_start, started=started)


def light_env(cfg, out: Path, device: str | None = None):
    """An :class:`~lab.experiments.aware.study.runner.Env` for reading a study's run files without a model:
    its fingerprint, and the base model's answers when the study stored them."""
    from lab._io import read_json
    from lab.experiments.aware.study import runner
    from lab.experiments.aware.study.plan import data_fingerprint

    dev = device or "cpu"
    if device is None:
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            import torch

            dev = "cuda" if torch.cuda.is_available() else "cpu"
    fp = data_fingerprint(cfg, dev)
    f = Path(out) / "saliency" / f"{fp}-base-answers.json"
    base = read_json(f) if f.is_file() else {}
    return runner.Env(None, None, cfg, base, {}, fp, source_hashes()["sha256"])


class StudyBusy(RuntimeError):
    """Another process is running a study in the same folder."""


def study_lock(out: Path):
    """An exclusive lock on ``out/.study.lock`` for the whole command: a second ``lab aware study`` on
    the same folder stops at once with one line instead of racing the first one's files."""
    import contextlib
    import fcntl
    import os

    @contextlib.contextmanager
    def held():
        Path(out).mkdir(parents=True, exist_ok=True)
        f = open(Path(out) / ".study.lock", "a+")
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                who = f.read().strip() or "another process"
                raise StudyBusy(f"{out}: another `lab aware study` ({who}) is writing this study folder; wait for it "
                                "to finish (or stop it), or give another --out") from None
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()}")
            f.flush()
            yield
        finally:
            f.close()
    return held()


def _run_locked(cfg, out: Path, *, command, cache_dir, device, progress, log, executor, address, workers,
                tables_only, t_start, started) -> dict:
    import datetime

    from lab._io import write_json
    from lab.experiments.aware.study import runner
    from lab.experiments.aware.views.study import seed_caches

    seed_caches(out, cache_dir)    # the study's own aligned projector, where this cache lacks it
    env = runner.build_env(cfg, cache_dir=cache_dir, device=device, progress=progress, store=out / "saliency")
    kw = dict(executor=executor, address=address, workers=workers, log=log if progress else None)
    res = runner.run_all(env, out, **kw) if not tables_only else runner.collect(env, out)
    from lab.experiments.aware.study import tables as study_tables

    tables = study_tables.build(env, res)
    from lab._io import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():      # each file atomically; finished runs stay in out/runs
        if name == "answers":
            atomic_write(out / "answers.parquet", lambda p, df=df: df.to_parquet(p, index=False))
        else:
            atomic_write(out / f"{name}.csv", lambda p, df=df: df.to_csv(p, index=False))
    from lab.experiments.aware.study.profiles import Study

    if env.saliency:   # saliency + row norms at the top: notebook 04's mask panel re-selects rows from them
        Study.from_context(env.ctx, env.saliency).save(out)
    listed = sorted(f"{k}.csv" if k != "answers" else "answers.parquet" for k in tables)
    listed += sorted(p.name for p in out.glob("*.safetensors"))
    old = out / "manifest.json"
    if old.exists():      # files an earlier version of this study listed and this one does not write: stale
        from lab._io import read_json

        try:
            for name in set(read_json(old).get("tables", [])) - set(listed):
                for f in (out / Path(name).name, out / (Path(name).name + ".sha256")):
                    if f.is_file():
                        f.unlink()
        except Exception:   # an unreadable old manifest: leave the folder as it is
            pass
    from lab import _manifest

    wall_s = time.perf_counter() - t_start
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    original = _original_provenance(out, cfg) if tables_only else None
    runs, spent = cost(cfg, res, tables_only=tables_only, wall_s=wall_s, kept_original=original is not None)
    manifest = {
        "command": command, "tables_only": bool(tables_only), "config": asdict(cfg), "started": started,
        "finished": now,
        "wall_s": wall_s, "timings": res.get("timings", {}),
        "compute_s": runs["run_s"], "runs": runs,     # every distinct run once (see cost)
        "machine": machine(), "sources": source_hashes(), "fingerprint": env.fingerprint,
        "intervals": __import__("lab.stats", fromlist=["KIND"]).KIND,
        "note": next((v for k, v in NOTES.items() if PRESETS.get(k) == cfg), "A custom configuration.") + " " + spent,
        "tuning_seeds": list(cfg.tune_seeds), "test_seeds": list(cfg.seeds),
        "operating_points": res.get("points", {}), "kept_scales": {k: list(v) for k, v in res.get("kept", {}).items()},
        "tables": listed,
        "sha256": _manifest.digests(out, listed),   # every table's sha256: load_study checks them
        "complete": bool(res.get("complete", True)),
    }
    if original is not None:   # a regeneration keeps the study's own provenance and records itself beside it
        regen = {"command": command, "finished": now, "wall_s": wall_s, "machine": machine()}
        manifest.update({k: original[k] for k in ("command", "started", "finished", "wall_s", "machine", "timings")
                         if k in original})
        manifest["tables_only"] = False
        manifest["regenerations"] = [*original.get("regenerations", []), regen]
    write_json(out / "manifest.json", manifest)
    from lab.experiments.aware.views import study as study_views

    text = study_views.results_readme(study_views.load_study(out))
    atomic_write(out / "README.md", lambda p: p.write_text(text, encoding="utf-8"))
    return {**tables, "manifest": manifest, "out": out}
