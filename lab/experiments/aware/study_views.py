"""Notebook 04 over the shipped study (:mod:`lab.experiments.aware.shipped`): load it, say where it
came from and whether the code changed since, show every group with 95 % intervals, and re-run a
small part of it live to check that it still holds.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from lab.report.notebook import with_interval as _fmt   # one format for an estimate and its 95 % interval

METRIC_NAMES = {"R": "R (upstream retained, %)", "E": "E (downstream vs full FT, %)", "H": "H (harmonic mean)",
                "downstream": "downstream accuracy", "up_easy_vqa": "easy-VQA accuracy", "up_probe": "probe accuracy"}
GROUP_TITLES = {"methods": "methods", "rule": "selection rule", "rho": "rho", "targets": "targets",
                "calibration": "calibration set", "calib_size": "calibration size"}
REFERENCE = "methods/aware"      # main AWARe: rho 0.3, activation-global, q/k/v + projector, 200 upstream samples
# who is compared, in words, per headline comparison of lab.experiments.aware.shipped.HEADLINE
PAIR_NAMES = {"AWARe vs full fine-tuning": ("AWARe", "full fine-tuning"), "AWARe vs LoRA": ("AWARe", "LoRA"),
              "AWARe vs DoRA": ("AWARe", "DoRA"), "activation vs weight-norm": ("activation selection", "weight-norm selection"),
              "activation vs random": ("activation selection", "random selection"),
              "weight-norm vs random": ("weight-norm selection", "random selection"),
              "global vs balanced": ("global selection", "balanced selection"),
              "rho 0.3 vs 0.1": ("rho 0.3", "rho 0.1"), "rho 0.3 vs 0.5": ("rho 0.3", "rho 0.5"),
              "q/k/v+projector vs +MLP": ("q/k/v+projector targets", "q/k/v+projector+MLP targets"),
              "q/k/v+projector vs q/k/v": ("q/k/v+projector targets", "q/k/v targets"),
              "upstream vs proxy calibration": ("upstream calibration", "proxy calibration")}
PROTOCOL_NAMES = {"full": "full fine-tuning", "aware (paper: upstream saliency)": "AWARe (paper's protocol)",
                  "aware + replay saliency (extension)": "AWARe + replay saliency (this project's extension)"}


def verdicts(study: dict):
    """The headline comparisons with their verdicts in words, recomputed from each difference's
    estimate and interval (:func:`lab.experiments.aware.intervals.verdict`)."""
    from lab.experiments.aware import intervals as I

    c = study["comparisons"].copy()
    out = []
    for r in c.itertuples():
        k, unit = (100, " pts") if r.metric == "downstream" else (1, "")   # accuracy differences in points
        out.append(I.verdict(*PAIR_NAMES.get(r.comparison, (r.a, r.b)),
                             {"estimate": k * r.estimate, "lo": k * r.lo, "hi": k * r.hi}, r.metric, unit))
    c["verdict"] = out
    return c


def continual_verdicts(study: dict):
    from lab.experiments.aware import intervals as I

    c = study["continual_comparisons"].copy()
    out = []
    for r in c.itertuples():
        scale, unit = (1, "") if r.metric == "R_after" else (100, " pts")
        out.append(I.verdict(PROTOCOL_NAMES.get(r.a, r.a), PROTOCOL_NAMES.get(r.b, r.b),
                             {"estimate": scale * r.estimate, "lo": scale * r.lo, "hi": scale * r.hi},
                             "R after the sequence" if r.metric == "R_after" else r.metric, unit))
    c["verdict"] = out
    return c


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def load_study(path="results/aware") -> dict:
    """Every table of a study folder, its manifest, and ``changed``: computing source files that
    differ from the ones the study was produced with (empty: the code is the study's)."""
    import pandas as pd

    from lab._io import read_csv, read_json
    from lab.experiments.aware.shipped import changed_sources

    path = _study_dir(path)
    if not (path / "manifest.json").exists():
        raise FileNotFoundError(f"{path} holds no study (no manifest.json); run `lab aware study --out {path}`")
    man = read_json(path / "manifest.json")
    out = {"path": path, "manifest": man, "changed": changed_sources(man)}
    for name in man["tables"]:
        f = path / name
        if name.endswith((".csv", ".parquet")):
            out[Path(name).stem] = pd.read_parquet(f) if name.endswith(".parquet") else read_csv(f)
    return out


SHIPPED_CACHE = "cache"   # <study>/cache/<part>/<key>.safetensors: cache entries shipped with a study


def _study_dir(path) -> Path:
    """A study folder as given, or relative to the repository when it is not found from here."""
    path = Path(path)
    return repo_root() / path if not path.is_absolute() and not path.exists() else path


def shipped_cache_entries(study_dir) -> list[Path]:
    """The cache entries shipped in a study folder (``cache/<part>/<key>.safetensors``), sorted."""
    return sorted((Path(study_dir) / SHIPPED_CACHE).glob("*/*.safetensors"))


def seed_caches(study="results/aware", cache_dir=None) -> list[Path]:
    """Copy the cache entries shipped with a study (its aligned projector,
    ``<study>/cache/projectors/<key>.safetensors``) into the AWARe cache where that key is missing,
    each checked against its sha256 first. The file name is the projector's cache key (the alignment
    recipe, the language model, every training question and the visual tokens' source), so the
    setup uses it exactly where it would otherwise align that same projector (~4 min on one CPU
    thread): a fresh machine then runs the study's own projector. Never overwrites an entry.
    Returns the entries written."""
    from lab._io import CorruptFile, load_tensors, save_tensors
    from lab.experiments.aware.minillava import cache_root

    written = []
    for src in shipped_cache_entries(_study_dir(study)):
        dest = cache_root(cache_dir) / src.parent.name / src.name
        if dest.exists():
            continue
        try:
            tensors, meta = load_tensors(src)
        except CorruptFile as e:
            import warnings

            warnings.warn(f"shipped cache entry {src} fails its check ({e}); it is not used", stacklevel=2)
            continue
        save_tensors(dest, tensors, meta)
        written.append(dest)
    return written


def panel_run(study: dict) -> dict:
    """The study in the shape :meth:`lab.widgets.aware.AblationPanel.from_run` reads: per-seed rows
    (main AWARe repeated in every ablation group, as its reference) and the folder with the saliency."""
    import pandas as pd

    runs = study["runs"].rename(columns={"variant": "variant_id"}).rename(columns={"label": "variant"})
    main = runs[runs.variant_id == REFERENCE]
    extra = [main.assign(group=g, variant=_display_label({"variant": REFERENCE, "label": "aware"}, g), shared=True)
             for g in GROUP_TITLES if g != "methods" and (runs.group == g).any()]
    return {"results": pd.concat([runs, *extra], ignore_index=True), "run_dir": study["path"]}


def provenance(study: dict) -> str:
    """Markdown: command, date, machine, wall time, source hash — and a loud line when the code changed."""
    m = study["manifest"]
    mach = m.get("machine", {})
    lines = [f"**Shipped study** `{study['path']}` — command `{m['command']}`; finished {m['finished']}; "
             f"wall time {m['wall_s'] / 60:.0f} min (compute incl. cached runs {m['timings'].get('compute_s', m['wall_s']) / 60:.0f} min) "
             f"on {mach.get('cpu', '?')} ({mach.get('torch_threads', '?')} torch thread(s), {mach.get('device', '?')}); "
             f"sources sha256 `{m['sources']['sha256'][:12]}`; seeds {m['config']['seeds']}; "
             f"{m['sizes']['steps']} steps x {m['config']['batch_size']}, {m['sizes']['n_eval']} downstream / "
             f"{m['sizes']['n_easy_eval']} easy-VQA / {m['sizes']['n_probe']} probe test questions.",
             f"Intervals: {m['intervals']}. Learning rates: {m['tuning']}."]
    if study["changed"]:
        lines.append(f"**⚠ The code changed since this study was produced** — {len(study['changed'])} computing "
                     f"source file(s) differ from the manifest: {', '.join(study['changed'])}. Its numbers describe "
                     f"the code at the manifest's hash; re-run `{m['command']}` to refresh them.")
    else:
        lines.append("The computing sources (`lab/aware`, `lab/experiments/aware`) match the manifest's hash.")
    return "\n\n".join(lines)


def group_rows(study: dict, group: str):
    """The group's variants, the main AWARe run first as the reference of every ablation group."""
    s = study["summary"]
    if group == "methods":
        return s[s.group == "methods"]
    ref = s[s.variant == REFERENCE].assign(group=group)
    rows = s[s.group == group]
    import pandas as pd

    out = pd.concat([ref, rows], ignore_index=True)
    if group == "rho":
        out["_k"] = [0.3 if v == REFERENCE else float(lbl.split("=")[1]) for v, lbl in zip(out.variant, out.label)]
        out = out.sort_values("_k", kind="stable").drop(columns="_k")
    return out


def _display_label(row, group: str) -> str:
    if row["variant"] != REFERENCE or group == "methods":
        return row["label"]
    return {"rule": "activation-global", "rho": "rho=0.3", "targets": "qkv+projector", "calibration": "upstream",
            "calib_size": "n=200"}.get(group, "aware") + " (main)"


def table(study: dict, group: str, metrics=("downstream", "R", "E", "H"), digits: int = 1):
    """One row per variant: each metric as ``estimate [95 % interval]``, the chosen lr, the trainable share."""
    import pandas as pd

    g = group_rows(study, group)
    rows = {}
    for (v, lbl), d in g.groupby(["variant", "label"], sort=False):
        r = {"variant": _display_label({"variant": v, "label": lbl}, group), "lr": d.lr.iloc[0],
             "trainable %": 100 * d.trainable_frac.iloc[0]}
        for m in metrics:
            x = d[d.metric == m]
            dg = 3 if m in ("downstream", "up_easy_vqa", "up_probe") else digits
            r[m] = _fmt(*x[["estimate", "lo", "hi"]].iloc[0], digits=dg) if len(x) else "n/a"
        rows[v] = r
    return pd.DataFrame(list(rows.values()))


def bars(study: dict, group: str, metrics=("R", "E", "H"), title: str = ""):
    """R/E/H per variant with 95 % interval whiskers."""
    import plotly.graph_objects as go

    g = group_rows(study, group)
    fig = go.Figure()
    for m in metrics:
        d = g[g.metric == m]
        labels = [_display_label(r, group) for r in d.to_dict("records")]
        fig.add_bar(name=m, x=labels, y=d.estimate, error_y=dict(type="data", symmetric=False,
                                                               array=d.hi - d.estimate, arrayminus=d.estimate - d.lo),
                    hovertemplate=m + " %{y:.1f}<extra>%{x}</extra>")
    fig.update_layout(barmode="group", title=title or f"{GROUP_TITLES.get(group, group)}: R, E, H (95 % intervals)",
                      yaxis_title="percent", height=420)
    fig.add_hline(y=100, line_dash="dot", line_color="grey")
    return fig


def rho_figure(study: dict, title: str = ""):
    """R, E, H against rho with 95 % interval bands."""
    import plotly.graph_objects as go

    g = group_rows(study, "rho")
    g = g.assign(rho=[0.3 if v == REFERENCE else float(lbl.split("=")[1]) for v, lbl in zip(g.variant, g.label)])
    fig = go.Figure()
    for m in ("R", "E", "H"):
        d = g[g.metric == m].sort_values("rho")
        fig.add_scatter(x=d.rho, y=d.estimate, mode="lines+markers", name=m,
                        error_y=dict(type="data", symmetric=False, array=d.hi - d.estimate, arrayminus=d.estimate - d.lo))
    fig.update_layout(title=title or "R, E and H over rho (95 % intervals)", xaxis_title="rho (fraction of target rows frozen)",
                      yaxis_title="percent", height=420)
    return fig


def tradeoff(study: dict, title: str = ""):
    """E against R for every variant (95 % intervals both ways)."""
    import plotly.graph_objects as go

    s = study["summary"]
    piv = s.pivot_table(index=["variant", "label", "group"], columns="metric", values=["estimate", "lo", "hi"], sort=False)
    fig = go.Figure()
    for grp in dict.fromkeys(s.group):
        d = piv[piv.index.get_level_values("group") == grp]
        if not len(d):
            continue
        e, r = d["estimate"]["E"], d["estimate"]["R"]
        fig.add_scatter(x=e, y=r, mode="markers+text", name=grp, text=d.index.get_level_values("label"),
                        textposition="top center",
                        error_x=dict(type="data", symmetric=False, array=d["hi"]["E"] - e, arrayminus=e - d["lo"]["E"]),
                        error_y=dict(type="data", symmetric=False, array=d["hi"]["R"] - r, arrayminus=r - d["lo"]["R"]))
    fig.update_layout(title=title or "What each variant keeps (R) and learns (E), 95 % intervals",
                      xaxis_title="E (%)", yaxis_title="R (%)", height=500)
    return fig


def comparisons(study: dict, names=None):
    """The headline differences (a − b) with intervals and the verdict computed from them."""
    c = verdicts(study)
    if names is not None:
        c = c[c.comparison.isin(names)]
    out = c[["comparison", "metric"]].copy()
    out["a − b [95 %]"] = [_fmt(e, lo, hi, 3 if m == "downstream" else 1) for e, lo, hi, m in zip(c.estimate, c.lo, c.hi, c.metric)]
    out["verdict"] = c.verdict.values
    return out.reset_index(drop=True)


def tuning(study: dict):
    """The validation scores of every candidate rate, and the chosen one, per variant."""
    t = study["tuning"]
    cols = ["variant", "lr", "val_downstream", "val_R", "val_E", "val_H", "chosen"]
    return t[cols].round(3)


def continual_table(study: dict):
    import pandas as pd

    cs = study["continual_summary"]
    rows = []
    for p, d in cs.groupby("protocol", sort=False):
        r = {"protocol": p}
        for m in ("Avg", "Last", "BWT", "R_after"):
            x = d[d.metric == m]
            r[m] = _fmt(*x[["estimate", "lo", "hi"]].iloc[0], digits=1 if m == "R_after" else 3) if len(x) else "n/a"
        rows.append(r)
    return pd.DataFrame(rows)


def continual_comparisons(study: dict):
    c = continual_verdicts(study)
    out = c[["a", "b", "metric"]].copy()
    out["a − b [95 %]"] = [_fmt(e, lo, hi, 1 if m == "R_after" else 3) for e, lo, hi, m in zip(c.estimate, c.lo, c.hi, c.metric)]
    out["verdict"] = c.verdict.values
    return out


def continual_figure(study: dict, title: str = ""):
    """Accuracy on each task after each stage, mean over seeds, one panel per protocol."""
    import plotly.express as px

    df = study["continual"]
    df = df[~df.task.str.startswith("upstream:")]
    g = df.groupby(["label", "stage", "stage_task", "task"], sort=False).acc.mean().reset_index()
    g["after stage"] = [f"{s + 1}: {t}" for s, t in zip(g.stage, g.stage_task)]
    fig = px.line(g, x="after stage", y="acc", color="task", facet_col="label", markers=True, range_y=(0, 1.02),
                  title=title or "Continual sequence: accuracy on each task after each stage (mean over seeds)")
    fig.for_each_annotation(lambda a: a.update(text=a.text.partition("=")[2]))
    fig.update_layout(height=400, yaxis_title="accuracy")
    return fig


def noise(study: dict):
    """How wide the intervals are: per metric, the median and largest 95 % interval width over variants."""
    s = study["summary"]
    w = s.assign(width=s.hi - s.lo).groupby("metric").width.agg(["median", "max"])
    return w.rename(columns={"median": "median 95% width", "max": "widest"}).round(3)


def readme_table(study: dict) -> str:
    """The README's Markdown table of the study (every number with its 95 % interval)."""
    s = study["summary"].set_index(["variant", "metric"])
    f = lambda v, m, d=1: _fmt(*s.loc[(v, m), ["estimate", "lo", "hi"]], digits=d) if (v, m) in s.index else "n/a"  # noqa: E731
    lines = ["| variant | lr | downstream acc | R | E | H | trainable |", "|---|---|---|---|---|---|---|"]
    for v in dict.fromkeys(study["summary"].variant):
        d = study["summary"][study["summary"].variant == v].iloc[0]
        name = "**AWARe** (main)" if v == REFERENCE else v
        lr = "-" if not np.isfinite(d.lr) else f"{d.lr:g}"
        lines.append(f"| {name} | {lr} | {f(v, 'downstream', 3)} | {f(v, 'R')} | {f(v, 'E')} | {f(v, 'H')} | "
                     f"{100 * d.trainable_frac:.1f} % |")
    return "\n".join(lines)


def readme_continual(study: dict) -> str:
    lines = ["| continual protocol | Avg | Last | BWT | R after |", "|---|---|---|---|---|"]
    for r in continual_table(study).to_dict("records"):
        lines.append(f"| {r['protocol']} | {r['Avg']} | {r['Last']} | {r['BWT']} | {r['R_after']} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- live check
def live_check(study: dict, *, n_questions: int | None = None, cache_dir=None, device: str | None = None,
               progress: bool = False) -> dict:
    """Re-run full fine-tuning and main AWARe on the study's tuning seed at their shipped rates,
    answering the first ``n_questions`` of each test set, and compare with the shipped study:
    ``agreement`` (same answers as the shipped run on those questions), the live R of each and the
    live AWARe − full R difference against the shipped 95 % intervals. ``ok`` is False when a live
    number falls outside its shipped interval."""
    import pandas as pd

    from lab.experiments.aware import shipped
    from lab.experiments.aware.context import setup
    from lab.experiments.aware.finetune import evaluate
    from lab.experiments.aware.tasks import Task

    man = study["manifest"]
    conf = dict(man["config"])
    conf = {k: tuple(v) if isinstance(v, list) else v for k, v in conf.items()}
    conf["grids"] = tuple((m, tuple(x)) for m, x in man["config"]["grids"])
    cfg = shipped.StudyConfig(**conf)
    seed = cfg.tune_seed
    from lab.experiments.aware.ablate import tasks_for

    # the study's own tasks (the tiny model's vocabulary is built from them, so the same model results)
    ctx = setup(cfg.to_size(), tiny=cfg.tiny, tasks_needed=tasks_for(None, cfg.task), cache_dir=cache_dir, device=device,
                progress=progress)
    sub = lambda qa: qa.subset(range(min(n_questions or len(qa), len(qa))))  # noqa: E731
    from dataclasses import replace

    ctx = replace(ctx, easy=Task(ctx.easy.name, ctx.easy.train, sub(ctx.easy.test)),
                  probe=Task(ctx.probe.name, ctx.probe.train, sub(ctx.probe.test)),
                  down={cfg.task: Task(cfg.task, ctx.down[cfg.task].train, sub(ctx.down[cfg.task].test))})
    vs = {shipped.variant_id(v): v for v in shipped.variants(cfg)}
    want = ["methods/full", REFERENCE]
    from lab.experiments.aware.ablate import profile_calibrations

    sal = profile_calibrations(ctx, [vs[REFERENCE]], progress=progress)
    b = ctx.size.eval_batch
    base = {"easy_vqa": evaluate(ctx.base, ctx.easy.test, ctx.enc, batch_size=b)["correct"],
            "probe": evaluate(ctx.base, ctx.probe.test, ctx.enc, batch_size=b)["correct"]}
    env = shipped.Env(ctx, None, cfg.task, base, sal, "live")
    ans = study["answers"]
    rows, live_R = [], {}
    for vid in want:
        rec = shipped.run_job(env, shipped.Job(vs[vid], man["chosen_lr"].get(vid), seed, ("test",)), progress=progress)
        agree, n = 0, 0
        for st, a in rec["answers"].items():
            ref = ans[(ans.variant == vid) & (ans.seed == seed) & (ans.set == st)].sort_values("question").correct.to_numpy()
            agree += int((np.asarray(a) == ref[: len(a)]).sum())
            n += len(a)
        r = np.mean([100 * np.mean(rec["answers"][k]) / max(np.mean(base[k]), 1e-9) for k in ("easy_vqa", "probe")])
        live_R[vid] = r
        ship = study["summary"].set_index(["variant", "metric"]).loc[(vid, "R")]
        same_seed = study["runs"].set_index(["variant", "seed"]).R.get((vid, seed), np.nan)
        rows.append({"check": f"R of {vid.split('/')[1]}", "live": r, f"shipped seed {seed}": same_seed,
                     "shipped": ship.estimate, "lo": ship.lo, "hi": ship.hi, "inside": bool(ship.lo <= r <= ship.hi),
                     "same answers": f"{agree}/{n}"})
    c = study["comparisons"]
    c = c[(c.comparison == "AWARe vs full fine-tuning") & (c.metric == "R")].iloc[0]
    d = live_R[REFERENCE] - live_R["methods/full"]
    rr = study["runs"].set_index(["variant", "seed"]).R
    rows.append({"check": "R: aware − full", "live": d,
                 f"shipped seed {seed}": rr.get((REFERENCE, seed), np.nan) - rr.get(("methods/full", seed), np.nan),
                 "shipped": c.estimate, "lo": c.lo, "hi": c.hi,
                 "inside": bool(c.lo <= d <= c.hi), "same answers": ""})
    table = pd.DataFrame(rows)
    return {"table": table, "ok": bool(table.inside.all()), "n_questions": n_questions, "seed": seed}


def live_verdict(check: dict) -> str:
    t = check["table"]
    same = [x for x in t["same answers"] if x]
    agree = sum(int(x.split("/")[0]) for x in same), sum(int(x.split("/")[1]) for x in same)
    exact = (f" The live runs gave the shipped runs' answers on {agree[0]} of {agree[1]} test questions"
             + (" (an exact re-run)." if agree[0] == agree[1] else " — not an exact re-run: the code or the machine "
                "differs from the study's."))
    return _live_words(check) + exact


def _live_words(check: dict) -> str:
    t = check["table"]
    if check["ok"]:
        return (f"Live check (seed {check['seed']}, {check['n_questions'] or 'all'} test questions per set): every live "
                f"number lies inside the shipped study's 95 % interval.")
    bad = t[~t.inside]
    return ("**⚠ LIVE CHECK DISAGREES WITH THE SHIPPED STUDY** — outside the shipped 95 % interval: "
            + "; ".join(f"{r.check}: live {r.live:.1f} vs shipped {r.shipped:.1f} [{r.lo:.1f}, {r.hi:.1f}]"
                        for r in bad.itertuples())
            + ". Either the code changed (see the provenance line) or this small live run is an outlier; re-run the study.")


def headline(study: dict) -> dict:
    """The headline metrics for ``lab.report.record``, each as ``'estimate [95 % interval]'`` (the
    report index shows no number without its interval)."""
    s = study["summary"].set_index(["variant", "metric"])
    out = {}
    for v, key in ((REFERENCE, "aware"), ("methods/full", "full"), ("methods/lora", "lora"), ("methods/dora", "dora")):
        for m in ("R", "E", "H"):
            if (v, m) in s.index and not (key == "full" and m == "E"):
                out[f"{key}_{m}"] = _fmt(*s.loc[(v, m), ["estimate", "lo", "hi"]])
    c = study["comparisons"]
    for m in ("R", "H"):
        x = c[(c.comparison == "AWARe vs full fine-tuning") & (c.metric == m)]
        if len(x):
            out[f"aware_minus_full_{m}"] = _fmt(*x[["estimate", "lo", "hi"]].iloc[0])
    return out


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


README_HEADING = "## What the offline AWARe default measures"
README_CLAIMS = (("AWARe vs full fine-tuning", ("R", "H")), ("AWARe vs LoRA", ("H",)), ("AWARe vs DoRA", ("H",)),
                 ("activation vs weight-norm", ("R", "H")), ("activation vs random", ("R", "H")),
                 ("rho 0.3 vs 0.1", ("H",)), ("rho 0.3 vs 0.5", ("H",)), ("q/k/v+projector vs +MLP", ("R", "H")),
                 ("upstream vs proxy calibration", ("H",)))


def readme_section(study: dict) -> str:
    """The README section on the AWARe default, written from the shipped study: its tables with
    intervals and the headline verdicts (``tests/experiments/aware/test_shipped_study.py`` keeps the
    README equal to this)."""
    m = study["manifest"]
    cfg, mach = m["config"], m.get("machine", {})
    before = study["upstream_before"].set_index("skill")
    down = before[before.index.str.startswith("downstream")].iloc[0]
    c = verdicts(study).set_index(["comparison", "metric"])
    claims = [f"- {c.loc[(name, met), 'verdict']}" for name, mets in README_CLAIMS for met in mets
              if (name, met) in c.index]
    cc = continual_verdicts(study)
    cont = [f"- Continual sequence, {r.verdict}" for r in cc.itertuples() if r.metric in ("Avg", "BWT")]
    s = study["summary"].set_index(["variant", "metric"])
    checks = []
    if ("methods/full", "R") in s.index:
        fr, fd = s.loc[("methods/full", "R")], s.loc[("methods/full", "downstream")]
        checks.append(f"Full fine-tuning {'forgets' if fr.hi < 100 else 'is not shown to forget'} (R "
                      f"{_fmt(fr.estimate, fr.lo, fr.hi)}) and "
                      + (f"learned the task (downstream {_fmt(fd.estimate, fd.lo, fd.hi, 3)}, above the most common "
                         f"answer's {down.reference_acc:.2f})" if fd.lo > down.reference_acc else
                         f"is not shown to have learned the task in {cfg['steps']} steps (downstream "
                         f"{_fmt(fd.estimate, fd.lo, fd.hi, 3)} vs the most common answer's {down.reference_acc:.2f}), "
                         "so E and H compare methods that have not clearly learned it") + ".")
    parts = [
        README_HEADING, "",
        f"`{m['command']}` ({len(cfg['seeds'])} seeds, {cfg['steps']} steps x {cfg['batch_size']} on `{cfg['task']}`, "
        f"a learning rate tuned for every variant on validation questions; {m['wall_s'] / 60:.0f} min on "
        f"{mach.get('cpu', '?')} with {mach.get('torch_threads', '?')} torch thread(s)) wrote the tables and "
        f"`manifest.json` (exact command, sha256 of the `lab/aware` and `lab/experiments/aware` sources, date, "
        f"machine, wall time) in `results/aware/`. Every number is the mean over seeds with its 95 % interval: "
        f"{m['intervals']}. R: upstream retention (easy-VQA and a text probe), E: downstream vs full fine-tuning, "
        f"H: their harmonic mean. Before fine-tuning: easy-VQA {before.loc['easy_vqa', 'acc']:.2f} (majority answer "
        f"{before.loc['easy_vqa', 'reference_acc']:.2f}), probe {before.loc['probe', 'acc']:.2f} (chance 0.25); the "
        f"downstream test set's most common answer {down.reference_acc:.2f}.",
        "", readme_table(study), "", readme_continual(study), "", *checks, *([""] if checks else []),
        "Read as differences with 95 % intervals (computed, not written by hand):", "", *claims, *cont, "",
        f"What was reduced to make the study fit its machine: {m.get('note', '')} Notebook 04 shows every group, "
        "the tuning candidates and a live re-run of part of the study.", "", *_shipped_cache_line(study), ""]
    return "\n".join(parts)


def _shipped_cache_line(study: dict) -> list[str]:
    entries = [p.relative_to(study["path"]).as_posix() for p in shipped_cache_entries(study["path"])]
    if not entries:
        return []
    return [f"Shipped beside the tables, outside the manifest: {', '.join(f'`{e}`' for e in entries)}, the study's "
            "aligned projector under its cache key. Notebooks 03 and 04 copy it into an empty cache "
            "(`study_views.seed_caches`, sha256 checked, never overwriting), so a fresh machine skips the "
            "projector alignment and runs the study's own projector.", ""]


def readme_block(text: str) -> str:
    """The README's current AWARe section (from its heading to the next ``## `` heading)."""
    start = text.index(README_HEADING)
    end = text.find("\n## ", start + len(README_HEADING))
    return text[start:end + 1 if end >= 0 else len(text)]
