"""Notebook 04 over the shipped study (:mod:`lab.experiments.aware.shipped`): load it, say where it
came from, whether it is complete and whether the code changed since; show first whether each
variant learned the task, then every group with 95 % intervals and the paper's findings as computed
verdicts. The check that the code still reproduces the study's runs is ``lab aware check``.
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
# who is compared, in words, per headline comparison of lab.experiments.aware.study_tables.HEADLINE
PAIR_NAMES = {"AWARe vs full fine-tuning": ("AWARe", "full fine-tuning"), "AWARe vs LoRA": ("AWARe", "LoRA"),
              "AWARe vs DoRA": ("AWARe", "DoRA"), "activation vs weight-norm": ("activation selection", "weight-norm selection"),
              "activation vs random": ("activation selection", "random selection"),
              "weight-norm vs random": ("weight-norm selection", "random selection"),
              "global vs balanced": ("global selection", "balanced selection"),
              "rho 0.3 vs 0.1": ("rho 0.3", "rho 0.1"), "rho 0.3 vs 0.5": ("rho 0.3", "rho 0.5"),
              "q/k/v+projector vs +MLP": ("q/k/v+projector targets", "q/k/v+projector+MLP targets"),
              "q/k/v+projector vs q/k/v": ("q/k/v+projector targets", "q/k/v targets"),
              "upstream vs proxy calibration": ("upstream calibration", "proxy calibration"),
              "LoRA vs DoRA": ("LoRA", "DoRA"), "AWARe vs nothing frozen (rho 0)": ("AWARe", "rho 0 (nothing frozen)")}
PROTOCOL_NAMES = {"full": "full fine-tuning", "aware (paper: upstream saliency)": "AWARe (paper's protocol)",
                  "aware + replay saliency (extension)": "AWARe + replay saliency (this project's extension)"}


VARIANT_NAMES = {REFERENCE: "AWARe", "methods/full": "full fine-tuning", "methods/lora": "LoRA", "methods/dora": "DoRA"}


def verdicts(study: dict):
    """The headline comparisons with their verdicts in words, recomputed from each difference's
    estimate and interval (:func:`lab.experiments.aware.intervals.verdict`)."""
    from lab.experiments.aware import intervals as I

    c = study["comparisons"].copy()
    out = []
    for r in c.itertuples():
        if str(r.verdict).startswith(f"{r.metric}: not compared"):
            out.append(r.verdict)
            continue
        out.append(I.metric_verdict(*PAIR_NAMES.get(r.comparison, (r.a, r.b)),
                                    {"estimate": r.estimate, "lo": r.lo, "hi": r.hi}, r.metric))
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


# the columns the views read from each table (a table without them is refused, naming the file)
COLUMNS = {"runs.csv": ("variant", "group", "label", "method", "seed", "lr", "downstream", "R", "E", "H"),
           "summary.csv": ("variant", "group", "label", "method", "lr", "trainable_frac", "seeds", "learned",
                           "diverged", "metric", "estimate", "lo", "hi"),
           "comparisons.csv": ("comparison", "a", "b", "metric", "seeds", "estimate", "lo", "hi", "detected",
                               "verdict"),
           "learned.csv": ("variant", "downstream", "lo", "hi", "floor", "learned", "seeds"),
           "baselines.csv": ("set", "reference", "acc", "n"),
           "tuning.csv": ("variant", "method", "lr", "seed", "diverged", "chosen")}


def load_study(path="results/aware") -> dict:
    """Every table of a study folder, its manifest, and ``changed``: computing source files that
    differ from the ones the study was produced with (empty: the code is the study's).

    Verified first (:mod:`lab._manifest`): the manifest is a JSON object naming files of its own
    folder only, with the sha256 of every table it lists, and each table matches it; a CSV must
    have the columns the views read (:data:`COLUMNS`), and a study the manifest calls complete a
    non-empty summary. Anything wrong is one line naming the file."""
    import pandas as pd

    from lab import _manifest
    from lab.experiments.aware.provenance import changed_sources

    path = _study_dir(path)
    if not (path / "manifest.json").exists():
        raise FileNotFoundError(f"{path} holds no study (no manifest.json); run `lab aware study --out {path}`")
    mpath = path / "manifest.json"
    fix = f"regenerate its tables: `lab aware study --tables-only --out {path}`"
    man = _manifest.read(mpath, fix=fix)
    tables = _manifest.names(man, "tables", mpath)
    files = _manifest.verify(path, man, mpath, tables, fix=fix)
    out = {"path": path, "manifest": man, "changed": changed_sources(man)}
    for name in tables:
        f = files[name]
        if name.endswith(".parquet"):
            try:
                out[Path(name).stem] = pd.read_parquet(f)
            except Exception as exc:   # pyarrow raises several types on a bad file
                raise _manifest.BadShipped(f"{f}: not a readable parquet table ({type(exc).__name__})") from None
        elif name.endswith(".csv"):
            out[Path(name).stem] = _manifest.read_csv_table(
                f, columns=COLUMNS.get(name, ()), rows=name == "summary.csv" and man.get("complete") is True)
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


def _shown(path) -> str:
    """A study folder as a reader would type it: relative to the repository when inside it."""
    try:
        return Path(path).resolve().relative_to(repo_root()).as_posix()
    except ValueError:
        return str(path)


def _spent(r: dict) -> tuple[str, str, str]:
    """A manifest's ``runs`` (:func:`lab.experiments.aware.shipped.cost`) in words: summed run time,
    wall clock with a run going, and the machines the runs recorded."""
    return f"{r['run_s'] / 3600:.1f} h", f"{r['machine_s'] / 3600:.1f} h", "; ".join(r.get("machines") or ["?"])


def run_cost(m: dict) -> str:
    """What the study's runs cost, from its manifest (``runs``: :func:`lab.experiments.aware.shipped.cost`),
    told apart from the command that wrote the tables (a ``--tables-only`` regeneration takes seconds)."""
    r, mach = m.get("runs"), m.get("machine", {})
    if not r:   # an older manifest: its compute_s may count a run shared by two phases twice
        return (f"{m.get('compute_s', 0) / 3600:.1f} h of run time on {mach.get('cpu', '?')} "
                f"({mach.get('cpu_count', '?')} cores)")
    run_h, wall_h, where = _spent(r)
    words = f"{r['count']} distinct runs: {run_h} of summed run time, {wall_h} of wall clock with at least one running, on {where}"
    if r.get("budget_s"):
        words += (f" (budget {r['budget_s'] / 3600:.0f} h: {'over' if r['machine_s'] > r['budget_s'] else 'within'}, "
                  f"{r['machine_s'] / r['budget_s']:.1f}x; {'nothing cut' if r.get('cut') == [] else 'incomplete'})")
    if m.get("tables_only"):
        words += f"; this regeneration of the tables itself took {m.get('wall_s', 0):.0f} s"
    return words


def provenance(study: dict, *, code_check: bool = True) -> str:
    """Markdown: command, date, machine, compute time, source hash, how complete the study is — and a
    loud line when the code changed."""
    m = study["manifest"]
    cfg, mach = m["config"], m.get("machine", {})
    lines = [f"**Study** `{_shown(study['path'])}` — command `{m['command']}`; tables written {m['finished']}; "
             f"{len(study.get('runs', ())) } test runs and {len(study.get('tuning', ()))} tuning candidates finished, "
             f"{run_cost(m)}; sources sha256 `{m['sources']['sha256'][:12]}`; seeds "
             f"{cfg['seeds']} (methods group; {cfg.get('ablation_seeds', len(cfg['seeds']))} for the other groups"
             + (f"; {', '.join(v.split('/')[-1] for v in cfg['headline'])} also on {cfg['headline_seeds']}"
                if cfg.get("headline_seeds") else "") + "); "
             f"{cfg['steps']} steps x {cfg['batch_size']} questions per run; test sets of {cfg['n_eval']} downstream, "
             f"{cfg['n_easy_eval']} easy-VQA and {cfg['n_probe']} probe questions; {cfg['n_val']} + {cfg['n_val']} "
             "validation questions choose each variant's rate.",
             f"Intervals: {m['intervals']}."]
    if not m.get("complete", True):
        lines.append("**⚠ The study is not complete yet**: the tables below cover the runs finished so far "
                     "(a group or variant that is missing has not run yet). `lab aware study` resumes it, running "
                     "only what is missing; `lab aware study --status` lists what is left.")
    if not code_check:
        pass
    elif study["changed"]:
        lines.append(f"**⚠ The code changed since these tables were written** — {len(study['changed'])} computing "
                     f"source file(s) differ from the manifest: {', '.join(study['changed'])}. `lab aware check` "
                     "re-runs a finished run and says whether it still gives the same answers.")
    else:
        lines.append("The computing sources (`lab/aware`, `lab/experiments/aware`) match the manifest's hash.")
    if not code_check:
        lines.append("`lab aware check` re-runs a finished run and says whether this code still gives its answers.")
    return "\n\n".join(lines)


def baselines(study: dict):
    """What a model that learned nothing scores on each evaluation set, and the model before fine-tuning."""
    b = study.get("baselines")
    if b is None or not len(b):
        return _empty("no baselines table in this study")
    b = b.assign(reference=b.reference.str.replace(r" \(.*\)$", "", regex=True))   # "chance (K options)" -> "chance"
    out = b.pivot_table(index="set", columns="reference", values="acc", sort=False).reset_index()
    out.columns.name = None
    n = b.groupby("set", sort=False).n.first()
    out.insert(1, "questions", [int(n[x]) for x in out.set])
    return out.round(3)


def _empty(note: str):
    import pandas as pd

    return pd.DataFrame({"note": [note]})


def learned(study: dict):
    """Did each variant learn the downstream task? Its downstream accuracy with its 95 % interval
    against the floor max(most common answer, zero-shot); E and H are ranked only where it did."""
    t = study.get("learned")
    if t is None or not len(t):
        return _empty("no test runs finished yet")
    out = t[["variant", "seeds"]].copy()
    out["downstream [95 %]"] = [_fmt(e, lo, hi, 3) for e, lo, hi in zip(t.downstream, t.lo, t.hi)]
    out["floor"] = t.floor.round(3)
    out["learned?"] = ["diverged" if d else "yes" if ok else "no" for ok, d in zip(t.learned, t.diverged)]
    return out


def learned_sentence(study: dict) -> str:
    t = study.get("learned")
    if t is None or not len(t):
        return "No test run has finished yet, so nothing can be compared."
    yes, no = t[t.learned], t[~t.learned]
    floor = float(t.floor.iloc[0])
    words = [f"{len(yes)} of {len(t)} variants learned the downstream task (downstream accuracy's 95 % lower "
             f"bound above the floor {floor:.3f}, the larger of the most common answer and zero-shot)"]
    if len(no):
        words.append(f"not: {', '.join(no.variant)} — their E and H are not ranked")
    return "; ".join(words) + "."


def planned_variants(study: dict) -> dict[str, list[str]]:
    """Per group, the variant ids the study's plan holds (from its manifest's config; empty when the
    config is not one this code can read), so a view can say which variants have not run yet."""
    import dataclasses

    from lab.experiments.aware import plan

    cfg = study["manifest"].get("config", {})
    names = {f.name for f in dataclasses.fields(plan.StudyConfig)}

    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    try:
        vs = plan.variants(plan.StudyConfig(**{k: tup(v) for k, v in cfg.items() if k in names}))
    except Exception:   # an older or foreign config: the views then only say what has finished
        return {}
    out: dict[str, list[str]] = {}
    for v in vs:
        out.setdefault(v.group, []).append(plan.variant_id(v))
    return out


def group_status(study: dict, group: str) -> dict:
    """What of ``group`` has finished: ``planned`` and ``finished`` variant ids (test runs in the
    summary), ``missing`` (planned, no test run yet), ``tuning`` (its finished tuning candidates)."""
    s = study["summary"]
    finished = list(dict.fromkeys(s[s.group == group].variant)) if len(s) else []
    planned = planned_variants(study).get(group, finished)
    t = study.get("tuning")
    tuned = int(t.variant.str.startswith(group + "/").sum()) if t is not None and len(t) else 0
    return {"planned": planned, "finished": finished, "missing": [v for v in planned if v not in finished],
            "tuning": tuned}


def group_note(study: dict, group: str) -> str:
    """One sentence: how much of ``group`` has run (``''`` when every planned variant has)."""
    st = group_status(study, group)
    name = GROUP_TITLES.get(group, group)
    if not st["missing"]:
        return ""
    short = lambda v: v.partition("/")[2]  # noqa: E731
    tuned = f"; {st['tuning']} of its tuning candidates finished" if st["tuning"] else ""
    if not st["finished"]:
        n, listed = len(st["planned"]), ", ".join(map(short, st["planned"]))
        which = f"its variant ({listed}) has no test run" if n == 1 else f"none of its {n} variants ({listed}) has a test run"
        return f"the {name} group has not run yet: {which}{tuned}"
    return (f"{name}: {len(st['finished'])} of {len(st['planned'])} variants tested; not run yet: "
            f"{', '.join(map(short, st['missing']))}")


def _wrap(text: str, width: int = 80) -> str:
    """Plotly annotations do not wrap: break a sentence into lines (``<br>``) of at most ``width`` characters."""
    import textwrap

    return "<br>".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def _not_run_figure(note: str, title: str = "", height: int = 220):
    """A placeholder figure whose title and centred text say what has not run yet."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=_wrap(note), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14))
    return fig.update_layout(title=title or note[:1].upper() + note[1:], height=height,
                             xaxis_visible=False, yaxis_visible=False)


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


def _trainable(study: dict, variant: str) -> str:
    """The variant's trainable parameter count (millions) and its LoRA/DoRA rank: the count AWARe's is
    matched to (``trainable %`` is of each model's own total, which adapters enlarge)."""
    runs = study.get("runs")
    if runs is None or "trainable" not in getattr(runs, "columns", ()):
        return "n/a"
    d = runs[runs.variant == variant]
    if not len(d):
        return "n/a"
    rank = int(d.lora_rank.iloc[0]) if "lora_rank" in d.columns and np.isfinite(d.lora_rank.iloc[0]) else 0
    return f"{d.trainable.iloc[0] / 1e6:.2f} M" + (f" (rank {rank})" if rank else "")


def table(study: dict, group: str, metrics=("downstream", "R_easy_vqa", "R_probe", "R", "E", "H"), digits: int = 1):
    """One row per variant: each metric as ``estimate [95 % interval]``, the chosen lr, the trainable
    share and count (with the LoRA/DoRA rank)."""
    import pandas as pd

    g = group_rows(study, group)
    if not len(g) or not (g.group == group).any() or (group != "methods" and len(g.variant.unique()) < 2):
        return _empty(f"the {GROUP_TITLES.get(group, group)} group has not run yet")
    rows = {}
    for (v, lbl), d in g.groupby(["variant", "label"], sort=False):
        lr = d.lr.iloc[0]
        r = {"variant": _display_label({"variant": v, "label": lbl}, group),
             "lr": "-" if not np.isfinite(lr) else f"{lr:.1e}", "trainable %": round(100 * d.trainable_frac.iloc[0], 1),
             "trainable": _trainable(study, v)}
        for m in metrics:
            x = d[d.metric == m]
            dg = 3 if m in ("downstream", "up_easy_vqa", "up_probe") else digits
            if len(x) and m in ("E", "H") and not bool(x.learned.iloc[0]):
                r[m] = "not ranked (did not learn)"
            else:
                r[m] = _fmt(*x[["estimate", "lo", "hi"]].iloc[0], digits=dg) if len(x) else "n/a"
        r["seeds"] = int(d.seeds.iloc[0])
        rows[v] = r
    return pd.DataFrame(list(rows.values()))


def finding_line(study: dict, group: str) -> str:
    """The paper's finding that ``group`` tests, with its computed verdict (``findings.csv``), in one
    short line for a figure's title; "" when the group tests none or the finding is not in the tables."""
    from lab.experiments.aware.study_tables import FINDINGS

    f = study.get("findings")
    if f is None or not len(f):
        return ""
    verdict = dict(zip(f.finding, f.verdict))
    for finding, _, parts in FINDINGS:
        if finding in verdict and {b.split("/", 1)[0] for _, b, _ in parts} == {group}:
            return f"the paper: {finding} — {verdict[finding]} (H, section 7)"
    return ""


def _titled(fig, title: str, line: str):
    """``title`` with the group's finding verdict as a smaller second line (room made for it)."""
    if line:
        title = f"{title}<br><sup>{line}</sup>"
        fig.update_layout(margin=dict(t=max(110, (fig.layout.margin.t or 0) + 30)))
    return fig.update_layout(title=title)


def bars(study: dict, group: str, metrics=("R", "E", "H"), title: str = ""):
    """R/E/H per variant with 95 % interval whiskers (percent, one decimal on hover); a group that
    has not run yet is a placeholder saying so, and a partly run one names what is missing."""
    import plotly.graph_objects as go

    name = GROUP_TITLES.get(group, group)
    g = group_rows(study, group)
    note = group_note(study, group)
    if not len(g) or not (g.group == group).any() or (group != "methods" and len(g.variant.unique()) < 2):
        return _not_run_figure(note or f"the {name} group has not run yet", title=f"{name}: not run yet")
    fig = go.Figure()
    for m in metrics:
        d = g[(g.metric == m) & g.estimate.notna()]
        labels = [_display_label(r, group) for r in d.to_dict("records")]
        fig.add_bar(name=m, x=labels, y=d.estimate, error_y=dict(type="data", symmetric=False,
                                                               array=d.hi - d.estimate, arrayminus=d.estimate - d.lo),
                    customdata=np.stack([d.lo, d.hi], axis=-1) if len(d) else None,
                    hovertemplate=m + " %{y:.1f}% [%{customdata[0]:.1f}, %{customdata[1]:.1f}]<extra>%{x}</extra>")
    fig.update_layout(barmode="group", yaxis_title="percent", yaxis_ticksuffix="%", height=420)
    if note:   # partly run: say what is missing under the title
        fig.add_annotation(text=_wrap(note, 110), showarrow=False, x=0, y=1.0, xref="paper", yref="paper", yanchor="bottom",
                           xanchor="left", font=dict(size=11, color="#57606a"))
        fig.update_layout(margin=dict(t=120))
    fig.add_hline(y=100, line_dash="dot", line_color="grey")
    return _titled(fig, title or f"{name}: R, E, H (95 % intervals)", "" if title else finding_line(study, group))


def rho_figure(study: dict, title: str = ""):
    """R, E, H against rho with 95 % interval whiskers (a placeholder while the rho group has not run)."""
    import plotly.graph_objects as go

    g = group_rows(study, "rho")
    if not len(g) or not (g.variant != REFERENCE).any():   # only the main run (every group's reference)
        return _not_run_figure(group_note(study, "rho") or "the rho group has not run yet", title="rho: not run yet")
    g = g.assign(rho=[0.3 if v == REFERENCE else float(lbl.split("=")[1]) for v, lbl in zip(g.variant, g.label)])
    fig = go.Figure()
    for m in ("R", "E", "H"):
        d = g[(g.metric == m) & g.estimate.notna()].sort_values("rho")
        fig.add_scatter(x=d.rho, y=d.estimate, mode="lines+markers", name=m,
                        error_y=dict(type="data", symmetric=False, array=d.hi - d.estimate, arrayminus=d.estimate - d.lo),
                        customdata=np.stack([d.lo, d.hi], axis=-1) if len(d) else None,
                        hovertemplate=f"rho %{{x:g}}: {m} %{{y:.1f}}% [%{{customdata[0]:.1f}}, %{{customdata[1]:.1f}}]"
                                      "<extra></extra>")
    fig.update_layout(xaxis_title="rho (fraction of target rows frozen)",
                      yaxis_title="percent", yaxis_ticksuffix="%", height=420)
    note = group_note(study, "rho")
    if note:
        fig.add_annotation(text=_wrap(note, 110), showarrow=False, x=0, y=1.0, xref="paper", yref="paper", yanchor="bottom",
                           xanchor="left", font=dict(size=11, color="#57606a"))
        fig.update_layout(margin=dict(t=120))
    return _titled(fig, title or "R, E and H over rho (95 % intervals)", "" if title else finding_line(study, "rho"))


GROUP_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "cross", "x", "star", "pentagon", "hexagon")


def tradeoff(study: dict, title: str = ""):
    """E against R for every variant (95 % intervals both ways). No text labels on the points (close
    variants such as LoRA and DoRA would print over each other): every variant is a legend entry,
    grouped by its ablation group (one colour per group, one symbol per variant), and its hover text
    gives R, E and H with their intervals."""
    import plotly.express as px
    import plotly.graph_objects as go

    s = study["summary"]
    s = s[s.metric.isin(["R", "E", "H"]) & s.estimate.notna()]
    fig = go.Figure()
    piv = s.pivot_table(index=["variant", "label", "group"], columns="metric", values=["estimate", "lo", "hi"], sort=False)
    if not len(s) or "E" not in piv["estimate"] or "R" not in piv["estimate"]:
        why = ("no test run has finished yet" if not len(study["summary"]) else
               "no variant has both R and E yet (E is ranked only for variants that learned)")
        return _not_run_figure(why, title="What each variant keeps (R) and learns (E): nothing to show yet")
    piv = piv[piv["estimate"][["E", "R"]].notna().all(axis=1)]
    palette = px.colors.qualitative.D3
    for gi, grp in enumerate(dict.fromkeys(s.group)):
        d = piv[piv.index.get_level_values("group") == grp]
        for vi, ((v, lbl, _), r) in enumerate(d.iterrows()):
            e, rr = r[("estimate", "E")], r[("estimate", "R")]
            h = r.get(("estimate", "H"), float("nan"))
            hl, hh = r.get(("lo", "H"), float("nan")), r.get(("hi", "H"), float("nan"))
            hover = (f"<b>{v}</b><br>E {e:.1f}% [{r[('lo', 'E')]:.1f}, {r[('hi', 'E')]:.1f}]"
                     f"<br>R {rr:.1f}% [{r[('lo', 'R')]:.1f}, {r[('hi', 'R')]:.1f}]"
                     + (f"<br>H {h:.1f} [{hl:.1f}, {hh:.1f}]" if np.isfinite(h) else ""))
            main = v == REFERENCE
            fig.add_scatter(x=[e], y=[rr], mode="markers", name=lbl + (" (main)" if main else ""),
                            legendgroup=grp, legendgrouptitle_text=GROUP_TITLES.get(grp, grp),
                            marker=dict(color=palette[gi % len(palette)], size=14 if main else 10,
                                        symbol=GROUP_SYMBOLS[vi % len(GROUP_SYMBOLS)],
                                        line=dict(width=2 if main else 1, color="black" if main else "white")),
                            error_x=dict(type="data", symmetric=False, array=[r[("hi", "E")] - e],
                                         arrayminus=[e - r[("lo", "E")]], thickness=1),
                            error_y=dict(type="data", symmetric=False, array=[r[("hi", "R")] - rr],
                                         arrayminus=[rr - r[("lo", "R")]], thickness=1),
                            hovertext=[hover], hovertemplate="%{hovertext}<extra></extra>")
    fig.update_layout(title=title or "What each variant keeps (R) and learns (E), 95 % intervals",
                      xaxis_title="E (%)", yaxis_title="R (%)", xaxis_ticksuffix="%", yaxis_ticksuffix="%",
                      height=520, legend=dict(groupclick="toggleitem", tracegroupgap=6))
    return fig


def comparisons(study: dict, names=None):
    """The headline differences (a − b) with intervals and the verdict computed from them."""
    if not len(study.get("comparisons", ())):
        return _empty("no comparison yet: the variants compared have not run")
    c = verdicts(study)
    if names is not None:
        c = c[c.comparison.isin(names)]
    out = c[["comparison", "metric"]].copy()
    out["a − b [95 %]"] = [_fmt(e, lo, hi, 3 if m == "downstream" else 1) for e, lo, hi, m in zip(c.estimate, c.lo, c.hi, c.metric)]
    out["verdict"] = c.verdict.values
    return out.reset_index(drop=True)


def tuning(study: dict):
    """The validation scores of every candidate rate, and the chosen one, per variant."""
    t = study.get("tuning")
    if t is None or not len(t):
        return _empty("no tuning run finished yet")
    cols = ["variant", "lr", "val_downstream", "val_R", "val_E", "val_H", "chosen", "edge"]
    out = t[[c for c in cols if c in t.columns]].copy().sort_values(["variant", "lr"], kind="stable")
    out["lr"] = [f"{x:.1e}" for x in out.lr]
    out["val_downstream"] = out.val_downstream.round(3)
    for c in ("val_R", "val_E", "val_H"):
        out[c] = out[c].round(1)
    return out.reset_index(drop=True)


def findings(study: dict):
    """The paper's four findings, each a computed verdict with its paired interval."""
    f = study.get("findings")
    if f is None or not len(f):
        return _empty("no findings yet: their groups have not run")
    return f[["finding", "verdict", "evidence", "rule"]]


def continual_table(study: dict):
    import pandas as pd

    cs = study.get("continual_summary")
    if cs is None or not len(cs):
        return _empty("the continual sequence has not run yet")
    rows = []
    for p, d in cs.groupby("protocol", sort=False):
        r = {"protocol": p}
        for m in ("Avg", "Last", "BWT", "R_after"):
            x = d[d.metric == m]
            r[m] = _fmt(*x[["estimate", "lo", "hi"]].iloc[0], digits=1 if m == "R_after" else 3) if len(x) else "n/a"
        rows.append(r)
    return pd.DataFrame(rows)


def continual_comparisons(study: dict):
    if not len(study.get("continual_comparisons", ())):
        return _empty("the continual sequence has not run yet")
    c = continual_verdicts(study)
    out = c[["a", "b", "metric"]].copy()
    out["a − b [95 %]"] = [_fmt(e, lo, hi, 1 if m == "R_after" else 3) for e, lo, hi, m in zip(c.estimate, c.lo, c.hi, c.metric)]
    out["verdict"] = c.verdict.values
    return out


CONTINUAL_METRICS = {"Avg": "Avg", "Last": "Last", "BWT": "BWT", "R_after": "R after"}


def continual_findings(study: dict):
    """The continual sequence's paired differences as one short table: a row per pair of protocols,
    a column per metric, each cell ``difference [95 % interval]`` and one word (accuracy metrics in
    points, R after in R points)."""
    import pandas as pd

    from lab.experiments.aware.intervals import spans_zero

    cc = study.get("continual_comparisons")
    if cc is None or not len(cc):
        return _empty("the continual sequence has not run yet")
    rows = {}
    for r in cc.itertuples():
        k = 1 if r.metric == "R_after" else 100
        key = (r.a, r.b)
        row = rows.setdefault(key, {"compared (a − b)": f"{PROTOCOL_NAMES.get(r.a, r.a)} − {PROTOCOL_NAMES.get(r.b, r.b)}"})
        e, lo, hi = k * r.estimate, k * r.lo, k * r.hi
        if not np.isfinite(e):
            row[CONTINUAL_METRICS.get(r.metric, r.metric)] = "not measured"
            continue
        word = "no difference detected" if spans_zero(lo, hi) else ("a higher" if e > 0 else "a lower")
        row[CONTINUAL_METRICS.get(r.metric, r.metric)] = f"{e:+.1f} [{lo:+.1f}, {hi:+.1f}]: {word}"
    out = pd.DataFrame(list(rows.values()))
    cols = ["compared (a − b)"] + [c for c in CONTINUAL_METRICS.values() if c in out.columns]
    return out[cols]


FACET_NAMES = {"full": "full fine-tuning", "aware (paper: upstream saliency)": "AWARe, paper's protocol<br>(upstream saliency)",
               "aware + replay saliency (extension)": "AWARe + replay saliency<br>(this project's extension)"}


def continual_figure(study: dict, title: str = ""):
    """Accuracy on each task after each stage, mean over seeds, one panel per protocol."""
    import plotly.express as px

    df = study.get("continual")
    if df is None or not len(df):
        return _not_run_figure("the continual sequence has not run yet", title="Continual sequence: not run yet")
    df = df[~df.task.str.startswith("upstream:")]
    g = df.groupby(["label", "stage", "stage_task", "task"], sort=False).acc.mean().reset_index()
    g["after stage"] = [f"{s + 1}: {t}" for s, t in zip(g.stage, g.stage_task)]
    g["protocol"] = [FACET_NAMES.get(x, x) for x in g.label]   # two short lines each: facet titles never collide
    fig = px.line(g, x="after stage", y="acc", color="task", facet_col="protocol", markers=True, range_y=(0, 1.02),
                  title=title or "Continual sequence: accuracy on each task after each stage (mean over seeds)",
                  hover_data={"acc": ":.3f", "protocol": False})
    fig.for_each_annotation(lambda a: a.update(text=a.text.partition("=")[2]))
    fig.update_layout(height=430, yaxis_title="accuracy", margin=dict(t=110))
    return fig


def noise(study: dict):
    """How wide the intervals are: per metric, the median and largest 95 % interval width over variants."""
    s = study["summary"]
    if not len(s):
        return _empty("no test runs finished yet")
    s = s[s.estimate.notna()]
    w = s.assign(width=s.hi - s.lo).groupby("metric").width.agg(["median", "max"])
    import pandas as pd

    # accuracies (0-1) with three decimals, R/E/H (percent, H points) with one
    acc = [m in ("downstream", "up_easy_vqa", "up_probe") or not m.startswith(("R", "E", "H")) for m in w.index]
    fmt = lambda xs: [f"{x:.3f}" if a else f"{x:.1f}" for x, a in zip(xs, acc)]  # noqa: E731
    return pd.DataFrame({"unit": ["accuracy (0-1)" if a else "H points" if m == "H" else "percent"
                                  for m, a in zip(w.index, acc)],
                         "median 95% width": fmt(w["median"]), "widest": fmt(w["max"])}, index=w.index)


def readme_table(study: dict) -> str:
    """The README's Markdown table of the study (every number with its 95 % interval)."""
    s = study["summary"].set_index(["variant", "metric"])
    f = lambda v, m, d=1: (_fmt(*s.loc[(v, m), ["estimate", "lo", "hi"]], digits=d)  # noqa: E731
                           if (v, m) in s.index and np.isfinite(s.loc[(v, m), "estimate"]) else "n/a")
    lines = ["| variant | seeds | lr | downstream acc | R easy-VQA | R probe | R | E | H | trainable |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for v in dict.fromkeys(study["summary"].variant):
        d = study["summary"][study["summary"].variant == v].iloc[0]
        name = "**AWARe** (main)" if v == REFERENCE else v
        lr = "-" if not np.isfinite(d.lr) else f"{d.lr:.1e}"
        lines.append(f"| {name} | {d.seeds} | {lr} | {f(v, 'downstream', 3)} | {f(v, 'R_easy_vqa')} | {f(v, 'R_probe')} | "
                     f"{f(v, 'R')} | {f(v, 'E')} | {f(v, 'H')} | {100 * d.trainable_frac:.1f} % |")
    return "\n".join(lines)


def readme_continual(study: dict) -> str:
    lines = ["| continual protocol | Avg | Last | BWT | R after |", "|---|---|---|---|---|"]
    for r in continual_table(study).to_dict("records"):
        lines.append(f"| {r['protocol']} | {r['Avg']} | {r['Last']} | {r['BWT']} | {r['R_after']} |")
    return "\n".join(lines)


def headline(study: dict) -> dict:
    """The headline numbers for ``lab.report.record``, labelled with their units, each as
    ``'estimate [95 % interval]'`` (the report index shows no number without its interval)."""
    s = study["summary"].set_index(["variant", "metric"]) if len(study["summary"]) else None
    out = {}
    for v, name in VARIANT_NAMES.items():
        for m, unit, d in (("downstream", "accuracy", 3), ("R", "%", 1), ("H", "", 1)):
            if s is not None and (v, m) in s.index and np.isfinite(s.loc[(v, m), "estimate"]):
                out[f"{name}: {m}{f' ({unit})' if unit else ''}"] = _fmt(*s.loc[(v, m), ["estimate", "lo", "hi"]], digits=d)
    f = study.get("findings")
    if f is not None:
        for r in f.itertuples():
            out[f"paper finding: {r.finding}"] = r.verdict
    return out


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


README_HEADING = "## What the offline AWARe default measures"
README_CLAIMS = ("AWARe vs full fine-tuning", "AWARe vs LoRA", "AWARe vs DoRA", "LoRA vs DoRA",
                 "AWARe vs nothing frozen (rho 0)")


def readme_section(study: dict) -> str:
    """The README section on the AWARe study: what it is, how to run, resume and check it, and where
    its generated tables are (``results/aware/README.md``). Its numbers live only there, so the README
    never goes stale as runs land."""
    m = study["manifest"]
    cfg = m["config"]
    state = ("complete" if m.get("complete", True) else
             "in progress: the tables cover the runs finished so far, and `lab aware study --status` says how far it is")
    parts = [README_HEADING, "",
             f"The shipped study fine-tunes the mini-LLaVA on `{cfg['task']}` questions for {cfg['steps']} steps x "
             f"{cfg['batch_size']} at each variant's own learning rate (at least three candidates, chosen on "
             f"validation questions, a grid extended past an edge choice), {len(cfg['seeds'])} seeds for the methods "
             f"group" + (f" ({len(cfg['seeds']) + len(cfg['headline_seeds'])} for "
                         f"{' and '.join(VARIANT_NAMES.get(v, v) for v in cfg['headline'])})"
                         if cfg.get("headline_seeds") else "") +
             f" and {cfg['ablation_seeds']} for the other groups, and scores {cfg['n_eval']} downstream, "
             f"{cfg['n_easy_eval']} easy-VQA and {cfg['n_probe']} probe questions per run. Its generated tables — "
             "whether each variant learned the task, R per upstream skill, E, H and the paper's four findings as "
             "verdicts, all with 95 % intervals — are in `results/aware/README.md`; notebook 04 renders them. "
             f"Right now it is {state}.", "",
             "```bash",
             "lab aware study --status          # what is finished and what is left (nothing runs)",
             "lab aware study --executor ray    # resume on every core: only the missing runs run",
             "lab aware study --tables-only     # the tables and results/aware/README.md from the finished runs",
             "lab aware check                   # re-run one finished run here and compare every answer",
             "```", "",
             "Every finished run is one JSON file in `results/aware/runs/`, named by a hash of everything that "
             "changes its numbers (data, method, rate, seed, recipe), so an interrupted study loses at most the runs "
             "in flight." + _readme_cost(m), "",
             *_readme_findings(study),
             *_shipped_cache_line(study), ""]
    return "\n".join(parts)


def _readme_cost(m: dict) -> str:
    """What the shipped study's runs cost, from its manifest (nothing when it does not say)."""
    r = m.get("runs")
    if not r or not r.get("count"):
        return ""
    run_h, wall_h, where = _spent(r)
    words = (f" Its {r['count']} runs (tuning included) took {run_h} of summed run time and {wall_h} of wall clock "
             f"with at least one running, on {where}")
    if r.get("budget_s"):
        over = r["machine_s"] > r["budget_s"]
        words += (f": {r['machine_s'] / r['budget_s']:.1f}x the {r['budget_s'] / 3600:.0f}-hour budget"
                  + (" (nothing was cut)" if r.get("cut") == [] else ""))
        if over and r.get("headline_test_seconds"):
            words += ("; the same job's run time varied with what else the cores were running (" + ", ".join(
                f"{VARIANT_NAMES.get(v, v)}'s test runs {d['min_s'] / 60:.0f}-{d['max_s'] / 60:.0f} min"
                for v, d in r["headline_test_seconds"].items()) + ")")
    return words + "."


def _readme_findings(study: dict) -> list[str]:
    """The paper's four findings as the study's verdicts, each with its paired H intervals."""
    f = study.get("findings")
    if f is None or not len(f):
        return []
    return ["The paper's four findings, as verdicts computed from paired H differences with 95 % intervals "
            "(*reproduced*, *contradicted* or *not detected*; notebook 04, section 7):", "",
            *[f"- {r.finding}: **{r.verdict}** — {r.evidence}" for r in f.itertuples()], ""]


def _shipped_cache_line(study: dict) -> list[str]:
    entries = [p.relative_to(study["path"]).as_posix() for p in shipped_cache_entries(study["path"])]
    if not entries:
        return []
    return [f"Shipped beside the tables, outside the manifest: {', '.join(f'`{e}`' for e in entries)}, the study's "
            "aligned projector under its cache key. `lab aware study`, `lab aware check` and notebook 03 copy it into "
            "an empty cache (`study_views.seed_caches`, sha256 checked, never overwriting), so a fresh machine skips "
            "the projector alignment and resumes the study with its own projector.", ""]


def readme_block(text: str) -> str:
    """The README's current AWARe section (from its heading to the next ``## `` heading)."""
    start = text.index(README_HEADING)
    end = text.find("\n## ", start + len(README_HEADING))
    return text[start:end + 1 if end >= 0 else len(text)]


def _md(df) -> str:
    """A DataFrame as a Markdown table (no index)."""
    if not len(df):
        return "(none yet)"
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join("" if (isinstance(x, float) and math.isnan(x)) else str(x) for x in r) + " |")
    return "\n".join(lines)


def results_readme(study: dict) -> str:
    """``results/aware/README.md``: the study's tables, generated (``lab aware study`` writes it)."""
    m = study["manifest"]
    parts = ["# The shipped AWARe study", "",
             "Generated by `lab aware study` from the runs in `runs/` (one JSON file per finished run, keyed by "
             "everything that changes it); regenerate the tables with `lab aware study --tables-only`, resume the "
             "study with `lab aware study`, list what is missing with `lab aware study --status`.", "",
             provenance(study, code_check=False), "", "## Floors", "", _md(baselines(study)), "",
             "## Did each variant learn the downstream task?", "", learned_sentence(study), "", _md(learned(study)), ""]
    for g, title in GROUP_TITLES.items():
        parts += [f"## {title}", "", _md(table(study, g)), ""]
    parts += ["## Paired differences", "", _md(comparisons(study)), "",
              "## The paper's findings", "", _md(findings(study)), "",
              "## Continual sequence", "", _md(continual_table(study)), "", _md(continual_comparisons(study)), "",
              "## Learning-rate candidates (validation)", "", _md(tuning(study)), ""]
    return "\n".join(parts)
