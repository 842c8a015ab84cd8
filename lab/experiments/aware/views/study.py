"""Notebook 04 over the shipped study (:mod:`lab.experiments.aware.study.shipped`): load it, say where it
came from, whether it is complete and whether the code changed since; then the stability–plasticity
plane with every method's learning-rate front, the comparisons read off the fronts (paired by
seed, 95 % t-intervals), the ablation groups as short fronts, the paper's findings as computed
verdicts, the precision check and the continual sequence. Views compute nothing the tables do not
hold: they select, label and draw. The check that the code still reproduces a run is ``lab aware check``.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np



def _fmt(estimate, lo, hi, digits: int = 1, *, signed: bool = False) -> str:
    """``'76.1 [73.4, 78.6]'`` (``signed``: ``'+2.1 [-0.4, +4.6]'``); ``'[no interval]'`` with one seed."""
    def f(x):
        return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
    try:
        e, a, b = float(estimate), float(lo), float(hi)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(e):
        return "n/a"
    if not (math.isfinite(a) and math.isfinite(b)):
        return f"{f(e)} [no interval]"
    return f"{f(e)} [{f(a)}, {f(b)}]"

REFERENCE = "methods/aware"      # main AWARe: rho 0.3, activation-global, q/k/v + projector, 200 upstream samples
# how a row of findings.csv is read (the rule lives in study/tables.py: finding_verdict, EQUIVALENCE_R = 5)
VERDICT_RULE = ("Each claim is read off the fronts as upstream retention at matched downstream accuracy: the mean, over the "
                "downstream levels that every seed of both fronts reaches, of the paired per-seed difference. Where two "
                "fronts share no such level, a claim that one beats the other is read the other way, as downstream "
                "accuracy (in points) at matched retention. *Reproduced*: the 95 % interval lies on the claim's side of "
                "zero (for \"almost as good\": wholly within ±5 R points); *contradicted*: on the other side (beyond "
                "±5); *no difference detected*: it spans zero.")
GROUP_TITLES = {"methods": "methods", "rule": "selection rule", "rho": "rho (fraction of rows frozen)",
                "targets": "target layers", "calibration": "calibration set", "calib_size": "calibration size"}
NAMES = {REFERENCE: "AWARe (rho 0.3)", "methods/full": "full fine-tuning", "methods/lora": "LoRA",
         "methods/dora": "DoRA", "methods/rho=0": "q/k/v + projector, nothing frozen", "methods/zero-shot": "zero-shot",
         "rule/activation-balanced": "activation, per layer", "rule/weight-norm": "weight norm", "rule/random": "random rows",
         "targets/qkv": "q/k/v only", "targets/qkv+projector+mlp": "q/k/v + projector + MLP",
         "calibration/proxy": "proxy calibration set", "rho/rho=0": "rho 0"}
COLORS = {REFERENCE: "#d62728", "methods/full": "#1f77b4", "methods/lora": "#2ca02c", "methods/dora": "#9467bd",
          "methods/rho=0": "#8c564b"}
PROTOCOL_NAMES = {"full": "full fine-tuning", "aware (paper: upstream saliency)": "AWARe (paper's protocol)",
                  "aware + replay saliency (extension)": "AWARe + replay saliency (extension)"}
# the paper's own figures (arXiv:2608.11758), quoted for comparison; the lab measures its own protocol
PAPER = (("IconQA retention R", "98.4 %", "LLaVA-1.5-7B, 3 epochs on IconQA; R over OKVQA, OCRVQA, GQA, TextVQA"),
         ("continual average gain", "+3.18 points over 5 tasks", "MLLM-DCL, vs the best baseline"),
         ("parameters updated", "~17.5 %", "rho 0.3 on q/k/v + projector of a 7B model"))


def scale_str(x) -> str:
    """A learning-rate scale as a reader writes it: 1/27, 1/3, 1, 3."""
    x = float(x)
    if x < 1 and abs(1 / x - round(1 / x)) < 1e-6:
        return f"1/{round(1 / x)}"
    return f"{x:g}"


def name(vid: str) -> str:
    """A variant id in words."""
    if vid in NAMES:
        return NAMES[vid]
    group, _, label = vid.partition("/")
    if group == "rho":
        return f"rho {label.split('=')[1]}"
    if group == "calib_size":
        return f"{label.split('=')[1]} calibration samples"
    return label


def repo_root() -> Path:
    return Path(__file__).resolve().parents[4]


# the columns the views read from each table (a table without them is refused, naming the file)
COLUMNS = {"runs.csv": ("variant", "group", "label", "method", "scale", "lr", "seed", "downstream", "R", "R_probe"),
           "fronts.csv": ("variant", "group", "scale", "lr", "lr_projector", "seeds", "downstream", "downstream_lo",
                          "downstream_hi", "R", "R_lo", "R_hi", "learned"),
           "comparisons.csv": ("comparison", "a", "b", "read", "level", "seeds", "direction"),
           "findings.csv": ("finding", "claim", "a", "b", "read", "seeds", "diff", "lo", "hi", "verdict"),
           "baselines.csv": ("set", "reference", "acc", "n")}


def load_study(path="results/aware") -> dict:
    """Every table of a study folder, its manifest, and ``changed``: computing source files that
    differ from the ones the study was produced with (empty: the code is the study's).

    Verified first (:mod:`lab._manifest`): the manifest is a JSON object naming files of its own
    folder only, with the sha256 of every table it lists, and each table matches it; a CSV must
    have the columns the views read (:data:`COLUMNS`), and a study the manifest calls complete a
    non-empty summary. Anything wrong is one line naming the file."""
    import pandas as pd

    from lab import _manifest
    from lab.experiments.aware.study.provenance import changed_sources

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
                f, columns=COLUMNS.get(name, ()), rows=name == "fronts.csv" and man.get("complete") is True)
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
    from lab.experiments.aware.run.minillava import cache_root

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


def _shown(path) -> str:
    """A study folder as a reader would type it: relative to the repository when inside it."""
    try:
        return Path(path).resolve().relative_to(repo_root()).as_posix()
    except ValueError:
        return str(path)


def _spent(r: dict) -> tuple[str, str, str]:
    """A manifest's ``runs`` (:func:`lab.experiments.aware.study.shipped.cost`) in words: summed run time,
    wall clock with a run going, and the machines the runs recorded."""
    return f"{r['run_s'] / 3600:.1f} h", f"{r['machine_s'] / 3600:.1f} h", "; ".join(r.get("machines") or ["?"])


def run_cost(m: dict) -> str:
    """What the study's runs cost, from its manifest (``runs``: :func:`lab.experiments.aware.study.shipped.cost`),
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
    versions = r.get("code_versions") or []
    if len(versions) > 1:
        words += (f"; recorded by {len(versions)} versions of the computing sources ("
                  + ", ".join(f"`{v['sha256']}` {v['runs']}" for v in versions) + " runs, oldest first)")
    if m.get("tables_only"):
        words += f"; this regeneration of the tables itself took {m.get('wall_s', 0):.0f} s"
    return words


def provenance(study: dict, *, code_check: bool = True) -> str:
    """Markdown: command, date, machine, compute time, source hash, seeds, how complete the study is —
    and a loud line when the code changed."""
    m = study["manifest"]
    cfg = m["config"]
    regen = (m.get("regenerations") or [None])[-1]
    written = (f"tables written {m['finished']}" if not regen else
               f"started {m.get('started', '?')}, tables last regenerated from its runs {regen['finished']}")
    lines = [f"**Study** `{_shown(study['path'])}` — command `{m['command']}`; {written}; "
             f"{len(study.get('runs', ()))} test runs finished, {run_cost(m)}; sources sha256 "
             f"`{m['sources']['sha256'][:12]}`. Test seeds {cfg['seeds']} (the methods' fronts; the first "
             f"{cfg['ablation_seeds']} for the ablation variants); tuning seeds {cfg['tune_seeds']}, never test seeds, "
             f"choose each ablation variant's {cfg['keep']} scales on {cfg['n_val']} + {cfg['n_val']} validation "
             f"questions. Scales {', '.join(scale_str(x) for x in cfg['scales'])} of each method's base recipe; "
             f"{cfg['steps']} steps x {cfg['batch_size']} questions per run in {cfg['precision']}; test sets of "
             f"{cfg['n_eval']} downstream, {cfg['n_easy_eval']} easy-VQA and {cfg['n_probe']} probe questions.",
             f"Intervals: {m['intervals']}."]
    if not m.get("complete", True):
        lines.append("**⚠ The study is not complete yet**: the tables below cover the runs finished so far. "
                     "`lab aware study` resumes it, running only what is missing; `lab aware study --status` lists "
                     "what is left.")
    if code_check and study["changed"]:
        lines.append(f"**⚠ The code changed since these tables were written** — {len(study['changed'])} computing "
                     f"source file(s) differ from the manifest: {', '.join(study['changed'])}. `lab aware check` "
                     "re-runs a finished run and says whether it still gives the same answers.")
    elif code_check:
        lines.append("The computing sources match the manifest's hash.")
    return "\n\n".join(lines)


def baselines(study: dict):
    """What a model that learned nothing scores on each evaluation set (and each easy-VQA kind), and the
    model before fine-tuning."""
    b = study.get("baselines")
    if b is None or not len(b):
        return _empty("no baselines table in this study")
    b = b.assign(reference=b.reference.str.replace(r" \(.*\)$", "", regex=True))
    out = b.pivot_table(index="set", columns="reference", values="acc", sort=False).reset_index()
    out.columns.name = None
    n = b.groupby("set", sort=False).n.first()
    out.insert(1, "questions", [int(n[x]) for x in out.set])
    if "in_R" in b:
        flag = b.groupby("set", sort=False).in_R.first()
        out["an upstream skill in R?"] = ["yes" if flag.get(x) is True else "no: the base model does not know it"
                                         if flag.get(x) is False else "" for x in out.set]
    return out.rename(columns={"set": "question set"}).round(3)


def _empty(note: str):
    import pandas as pd

    return pd.DataFrame({"note": [note]})


def _floor(study) -> float:
    b = study.get("baselines")
    if b is None or not len(b):
        return float("nan")
    d = b[b.set.str.startswith("downstream")]
    return float(d[d.reference.isin(["most common answer", "zero-shot"])].acc.max())


# ---------------------------------------------------------------- the plane
def plane(study: dict, variants=None, *, title: str = "", seeds_note: bool = True, height: int = 560):
    """The stability–plasticity plane: downstream accuracy (x) against upstream multimodal retention R
    (y, %), one line per method through its learning-rate scales (mean over seeds), each point with its
    95 % t-intervals on both axes; the downstream floor and R = 100 % dashed."""
    import plotly.graph_objects as go

    f = study.get("fronts")
    fig = go.Figure()
    if f is None or not len(f):
        return fig.update_layout(title="no finished front run yet", height=240)
    variants = variants or [v for v in COLORS if v in set(f.variant)]
    for vid in variants:
        g = f[f.variant == vid].sort_values("scale")
        if not len(g):
            continue
        fig.add_trace(go.Scatter(
            x=g.downstream, y=g.R, mode="lines+markers", name=name(vid), line=dict(color=COLORS.get(vid)),
            error_x=dict(type="data", symmetric=False, array=g.downstream_hi - g.downstream,
                         arrayminus=g.downstream - g.downstream_lo, thickness=1),
            error_y=dict(type="data", symmetric=False, array=g.R_hi - g.R, arrayminus=g.R - g.R_lo, thickness=1),
            customdata=np.stack([g.scale, g.lr, g.lr_projector, g.seeds], -1),
            hovertemplate=(name(vid) + "<br>scale ×%{customdata[0]:.3g} (rate %{customdata[1]:.2g}, projector "
                           "%{customdata[2]:.2g})<br>downstream %{x:.3f}, R %{y:.1f} %<br>%{customdata[3]} seeds"
                           "<extra></extra>")))
    fl = _floor(study)
    if np.isfinite(fl):
        fig.add_vline(x=fl, line_dash="dot", line_color="grey",
                      annotation_text="floor: most common answer / zero-shot", annotation_position="bottom right")
    fig.add_hline(y=100, line_dash="dot", line_color="grey", annotation_text="R = 100 % (nothing forgotten)",
                  annotation_position="top left")
    fig.update_layout(title=title or "Learning against forgetting: each method's learning-rate front",
                      xaxis_title="downstream accuracy (fashion questions, fraction right)",
                      yaxis_title="upstream multimodal retention R (%)", height=height,
                      legend=dict(orientation="h", y=-0.18), margin=dict(t=60))
    return fig


def fronts_table(study: dict, group: str | None = "methods"):
    """Each variant's points: scale, rates, downstream accuracy and R with their 95 % intervals, the
    text probe's R apart, and whether the point learned the task."""
    f = study.get("fronts")
    if f is None or not len(f):
        return _empty("no finished run yet")
    if group:
        f = f[f.group == group]
    out = {"variant": [name(v) for v in f.variant], "scale": [scale_str(x) for x in f.scale],
           "rate (LM or adapter)": [f"{x:.2g}" for x in f.lr], "projector rate": [f"{x:.2g}" for x in f.lr_projector],
           "seeds": f.seeds.astype(int),
           "downstream accuracy [95 %]": [_fmt(a, b, c, 3) for a, b, c in zip(f.downstream, f.downstream_lo, f.downstream_hi)],
           "R, multimodal (%) [95 %]": [_fmt(a, b, c, 1) for a, b, c in zip(f.R, f.R_lo, f.R_hi)],
           "R, text probe (%) [95 %]": [_fmt(a, b, c, 1) for a, b, c in zip(f.R_probe, f.R_probe_lo, f.R_probe_hi)],
           "learned?": ["yes" if x else "one seed: not judged" if n < 2 else "no" for x, n in zip(f.learned, f.seeds)]}
    import pandas as pd

    return pd.DataFrame(out)


def kinds_table(study: dict, group: str = "methods"):
    """R per easy-VQA kind (yes/no, shape, colour) and of the text probe, per variant and scale."""
    from lab.experiments.aware.study.fronts import KINDS

    f = study.get("fronts")
    if f is None or not len(f):
        return _empty("no finished run yet")
    f = f[f.group == group]
    import pandas as pd

    out = {"variant": [name(v) for v in f.variant], "scale": [scale_str(x) for x in f.scale]}
    for k in KINDS:
        c = f"R:{k}"
        if c in f:
            out[f"R, {k} (%)"] = [_fmt(a, b, d, 1) for a, b, d in zip(f[c], f[f"{c}_lo"], f[f"{c}_hi"])]
    out["R, text probe (%)"] = [_fmt(a, b, d, 1) for a, b, d in zip(f.R_probe, f.R_probe_lo, f.R_probe_hi)]
    return pd.DataFrame(out)


# ---------------------------------------------------------------- comparisons along the fronts
def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _level(x, read):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "mean over the shared levels"
    return f"downstream {x:g}" if read == "retention" else f"R {x:g} %"


def comparisons(study: dict, names=None, read: str = "retention"):
    """Paired differences read off the fronts: ``read="retention"``: R (points) at matched downstream
    accuracy; ``"downstream"``: downstream accuracy at matched R. One row per comparison and level."""
    c = study.get("comparisons")
    if c is None or not len(c):
        return _empty("no comparison yet: the fronts have not finished on a shared seed")
    c = c[c.read == read]
    if names is not None:
        c = c[c.comparison.isin(names)]
    import pandas as pd

    unit, d = (" pts", 1) if read == "retention" else ("", 3)
    rows = []
    for r in c.to_dict("records"):
        if not _finite(r.get("diff")):
            rows.append({"comparison": f"{name(r['a'])} − {name(r['b'])}", "read at": "", "seeds": int(r["seeds"]),
                         "difference [95 %]": "", "reading": r["direction"]})
            continue
        rows.append({"comparison": f"{name(r['a'])} − {name(r['b'])}", "read at": _level(r["level"], read),
                     "seeds": int(r["seeds"]), "difference [95 %]": _fmt(r["diff"], r["lo"], r["hi"], d, signed=True) + unit,
                     "reading": r["direction"]})
    return pd.DataFrame(rows)


def difference_figure(study: dict, names, *, title: str = ""):
    """R difference (points, a − b) at each matched downstream level with its 95 % interval; zero dashed."""
    import plotly.graph_objects as go

    c = study.get("comparisons")
    fig = go.Figure()
    if c is None or not len(c):
        return fig.update_layout(title="no comparison yet", height=240)
    if "diff" not in c:
        return fig.update_layout(title="no comparison yet", height=240)
    c = c[(c.read == "retention") & c.level.notna() & c.comparison.isin(names)]
    for i, (nm, g) in enumerate(c.groupby("comparison", sort=False)):
        g = g.sort_values("level")
        x = g.level.astype(float) + (i - (len(names) - 1) / 2) * 0.006
        fig.add_trace(go.Scatter(x=x, y=g["diff"], mode="markers+lines",
                                 name=f"{name(g.a.iloc[0])} − {name(g.b.iloc[0])}",
                                 error_y=dict(type="data", symmetric=False, array=g.hi - g["diff"],
                                              arrayminus=g["diff"] - g.lo),
                                 hovertemplate="downstream %{x:.2f}: %{y:+.1f} pts<extra></extra>"))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title=title or "Retention difference at matched downstream accuracy",
                      xaxis_title="matched downstream accuracy", yaxis_title="R difference (points), 95 % interval",
                      height=420, legend=dict(orientation="h", y=-0.25))
    return fig


def group_plane(study: dict, group: str, *, title: str = ""):
    """An ablation group: main AWARe's front on the ablation seeds against each variant's short front
    (its best scales on the tuning seeds), mean over the same seeds, with 95 % intervals."""
    import plotly.graph_objects as go

    runs = study.get("runs")
    if runs is None or not len(runs):
        return go.Figure().update_layout(title="no finished run yet", height=240)
    seeds = study["manifest"]["config"]["seeds"][: study["manifest"]["config"]["ablation_seeds"]]
    vids = [REFERENCE] + [v for v in dict.fromkeys(runs[runs.group == group].variant)]
    if group == "rho" and "methods/rho=0" in set(runs.variant):
        vids.insert(1, "methods/rho=0")
    fig = go.Figure()
    from lab import stats

    palette = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
    for i, vid in enumerate(dict.fromkeys(vids)):
        g = runs[(runs.variant == vid) & runs.seed.isin(seeds)]
        pts = []
        for sc, gs in g.groupby("scale"):
            if gs.seed.nunique() < len(seeds):
                continue
            dm, dl, dh = stats.t_interval(gs.downstream)
            rm, rl, rh = stats.t_interval(gs.R)
            pts.append((sc, dm, dl, dh, rm, rl, rh))
        if not pts:
            continue
        p = np.array(pts)
        fig.add_trace(go.Scatter(x=p[:, 1], y=p[:, 4], mode="lines+markers", name=name(vid),
                                 line=dict(color=palette[i % len(palette)], width=3 if vid == REFERENCE else 1.5),
                                 error_x=dict(type="data", symmetric=False, array=p[:, 3] - p[:, 1],
                                              arrayminus=p[:, 1] - p[:, 2], thickness=1),
                                 error_y=dict(type="data", symmetric=False, array=p[:, 6] - p[:, 4],
                                              arrayminus=p[:, 4] - p[:, 5], thickness=1),
                                 hovertemplate=name(vid) + ": downstream %{x:.3f}, R %{y:.1f} %<extra></extra>"))
    fl = _floor(study)
    if np.isfinite(fl):
        fig.add_vline(x=fl, line_dash="dot", line_color="grey")
    fig.add_hline(y=100, line_dash="dot", line_color="grey")
    fig.update_layout(title=title or f"{GROUP_TITLES.get(group, group).capitalize()}: short fronts against AWARe's",
                      xaxis_title="downstream accuracy", yaxis_title="upstream multimodal retention R (%)", height=460,
                      legend=dict(orientation="h", y=-0.22))
    return fig


def findings(study: dict):
    """The paper's four findings and AWARe against each baseline, as verdicts with their numbers."""
    f = study.get("findings")
    if f is None or not len(f):
        return _empty("no finding computed yet")
    import pandas as pd

    rows = []
    for r in f.itertuples():
        ok = _finite(r.diff)
        rows.append({"claim": r.finding, "compared": f"{name(r.a)} − {name(r.b)}", "seeds": int(r.seeds),
                     "read off the fronts": r.read,
                     "difference (points) [95 %]": _fmt(r.diff, r.lo, r.hi, 1, signed=True) if ok else "",
                     "verdict": r.verdict})
    return pd.DataFrame(rows)


def precision(study: dict):
    """bf16 against float32 at the same runs: paired differences and answers alike."""
    p = study.get("precision")
    if p is None or not len(p):
        return _empty("the float32 twins have not run yet")
    import pandas as pd

    rows = []
    for r in p.itertuples():
        if r.metric.startswith("answered alike"):
            rows.append({"variant": name(r.variant), "scale": scale_str(r.scale), "measure": r.metric,
                         "seeds": int(r.seeds), "bf16 − float32 [95 %]": f"{100 * r.diff:.1f} % of questions"})
        else:
            d = 3 if r.metric == "downstream" else 1
            rows.append({"variant": name(r.variant), "scale": scale_str(r.scale),
                         "measure": {"downstream": "downstream accuracy", "R": "R, multimodal (%)",
                                     "R_probe": "R, text probe (%)"}.get(r.metric, r.metric),
                         "seeds": int(r.seeds), "bf16 − float32 [95 %]": _fmt(r.diff, r.lo, r.hi, d, signed=True)
                         + f" ({r.direction})"})
    return pd.DataFrame(rows)


_PRECISION_MEASURES = {"downstream": "downstream accuracy", "R": "multimodal R", "R_probe": "text-probe R"}


def _moved(p, metrics) -> "pd.DataFrame":
    """The float32-twin checks of ``metrics`` whose interval tells bf16 from float32."""
    rows = p[p.metric.isin(list(metrics))]
    return rows[~rows.direction.eq("no difference detected")]


def precision_summary(study: dict) -> str:
    """One paragraph on whether bf16 moved the front, computed from the paired float32 twins: which
    (method, scale, measure) the intervals tell apart from zero, set against the smallest method
    difference the comparisons detect (a shift of that size could decide a verdict)."""
    p = study.get("precision")
    if p is None or not len(p):
        return "The float32 twins have not run yet: whether bf16 moves the front is not measured."
    checks, moved = p[p.metric.isin(list(_PRECISION_MEASURES))], _moved(p, _PRECISION_MEASURES)
    seeds = int(checks.seeds.min()) if len(checks) else 0
    head = (f"bf16 against float32 on the same {seeds} seeds: {len(checks) - len(moved)} of {len(checks)} paired "
            "checks (method x scale x measure) show no difference detected")
    if not len(moved):
        return head + "; at these seeds bf16 does not move the fronts."
    unit = lambda m: "" if m == "downstream" else " pts"  # noqa: E731
    shifts = "; ".join(f"{name(r.variant)} at scale {scale_str(r.scale)}, {_PRECISION_MEASURES[r.metric]} "
                       f"{_fmt(r.diff, r.lo, r.hi, 3 if r.metric == 'downstream' else 1, signed=True)}{unit(r.metric)} "
                       f"(bf16 {r.direction})" for r in moved.itertuples())
    text = f"{head}; these do not: {shifts}."
    c = study.get("comparisons")
    r_moved = moved[moved.metric.eq("R")]
    if c is not None and len(c) and len(r_moved) and {"level", "read", "diff", "lo", "hi"} <= set(c.columns):
        mean = c[c.level.isna() & c.read.eq("retention")]     # each comparison's mean over the shared levels
        detected = mean[(mean.lo > 0) | (mean.hi < 0)]
        if len(detected):
            small = detected.loc[detected["diff"].abs().idxmin()]
            big = r_moved.loc[r_moved["diff"].abs().idxmax()]
            # overlapping magnitudes: the shift's far end reaches the method difference's near end
            reaches = max(abs(big.lo), abs(big.hi)) >= min(abs(small.lo), abs(small.hi))
            text += (" Every compared run is bf16, so methods are set bf16 beside bf16; still, the largest R shift, "
                     f"{_fmt(big['diff'], big.lo, big.hi, 1, signed=True)} pts, "
                     + (f"overlaps in size the smallest method difference detected along the fronts "
                        f"({small['comparison']}: {_fmt(small['diff'], small.lo, small.hi, 1, signed=True)} pts): a "
                        "verdict of that size may depend on the precision, unless both methods shift alike."
                        if reaches else
                        f"is smaller than every method difference detected along the fronts (the smallest: "
                        f"{small['comparison']}, {_fmt(small['diff'], small.lo, small.hi, 1, signed=True)} pts)."))
    return text


def tuning(study: dict):
    """The tuning seeds' validation runs (never test seeds): each variant's scales ranked."""
    t = study.get("tuning")
    if t is None or not len(t):
        return _empty("no tuning run yet")
    import pandas as pd

    return pd.DataFrame({"variant": [name(v) for v in t.variant], "scale": [scale_str(x) for x in t.scale],
                         "rate": [f"{x:.2g}" for x in t.lr], "tuning seeds": t.seeds.astype(int),
                         "validation downstream": t.val_downstream.round(3), "validation R (%)": t.val_R.round(1),
                         "validation H": t.val_H.round(1), "rank": t["rank"].astype(int),
                         "tested": ["yes" if k else "" for k in t.kept]})


# ---------------------------------------------------------------- continual
def continual_learned(study: dict):
    t = study.get("continual_learned")
    if t is None or not len(t):
        return _empty("the continual sequences have not run yet")
    import pandas as pd

    return pd.DataFrame({"protocol": [PROTOCOL_NAMES.get(p, p) for p in t.protocol], "stage": t.stage + 1,
                         "task learned at this stage": t.task,
                         "accuracy [95 %]": [_fmt(a, b, c, 3) for a, b, c in zip(t.acc, t.lo, t.hi)],
                         "floor (most common / chance)": t.floor.round(3),
                         "learned?": ["yes" if x else "no" for x in t.learned]})


def continual_table(study: dict):
    s = study.get("continual_summary")
    if s is None or not len(s):
        return _empty("the continual sequences have not run yet")
    names = {"Avg": "Avg (mean over stages)", "Last": "Last (after the last stage)", "BWT": "BWT (backward transfer)",
             "R_after": "R after the sequence (%)", "R_probe_after": "R, text probe (%)"}
    out = s.pivot_table(index="protocol", columns="metric", values="estimate", sort=False)
    import pandas as pd

    rows = []
    for p, g in s.groupby("protocol", sort=False):
        row = {"protocol": PROTOCOL_NAMES.get(p, p), "seeds": int(g.seeds.iloc[0])}
        for r in g.itertuples():
            d = 1 if r.metric.startswith("R") else 3
            row[names.get(r.metric, r.metric)] = _fmt(r.estimate, r.lo, r.hi, d)
        rows.append(row)
    del out
    return pd.DataFrame(rows)


def continual_comparisons(study: dict):
    c = study.get("continual_comparisons")
    if c is None or not len(c):
        return _empty("the continual sequences have not run yet")
    import pandas as pd

    return pd.DataFrame({"compared": [f"{PROTOCOL_NAMES.get(a, a)} − {PROTOCOL_NAMES.get(b, b)}" for a, b in zip(c.a, c.b)],
                         "metric": c.metric, "seeds": c.seeds.astype(int),
                         "difference [95 %]": [_fmt(d, lo, hi, 1 if m.startswith("R") else 3, signed=True)
                                               for d, lo, hi, m in zip(c["diff"], c.lo, c.hi, c.metric)],
                         "reading": c.direction})


# ---------------------------------------------------------------- category labels on the x axis
# (lab.report.readable fits titles and legends; these check and wrap a figure's x categories)
TICK_GAP_PX = 8      # room kept free between two neighbouring category labels


def _category_room(fig: dict, width: float | None) -> tuple[list[str], float, float]:
    """(the x axis' categories, the px each gets, the tick font size) when ``fig`` is drawn ``width``
    px wide (its own width, else the report's): the plot area (plotly's default margins, 80 px each
    side, unless set) shared evenly among the categories."""
    from lab.report.readable import FONT_SIZE, REPORT_WIDTH

    layout = fig.get("layout") or {}
    w = float(layout.get("width") or width or REPORT_WIDTH)
    margin = layout.get("margin") or {}
    plot_w = w - float(margin.get("l", 80)) - float(margin.get("r", 80))
    cats: list[str] = []
    for t in fig.get("data") or []:
        if t.get("type", "scatter") in ("bar", "scatter", "box") and t.get("x") is not None and \
                not isinstance(t.get("x"), dict) and all(isinstance(x, str) for x in t["x"]):
            cats += [x for x in t["x"] if x not in cats]
    size = float(((layout.get("xaxis") or {}).get("tickfont") or {}).get("size")
                 or (layout.get("font") or {}).get("size") or FONT_SIZE)
    return cats, (plot_w / len(cats) if cats else plot_w), size


def category_tick_problems(fig, width: float | None = None) -> list[str]:
    """Category labels on the x axis that would run into their neighbours when ``fig`` (a Figure
    or its dict) is drawn ``width`` px wide (:data:`lab.report.readable.REPORT_WIDTH` by default):
    a label line wider than the room its category gets (plotly then turns every label on a slant,
    into whatever lies under the axis — often the legend). Empty: they fit side by side."""
    from lab.report.readable import text_width

    d = fig.to_dict() if hasattr(fig, "to_dict") else fig
    cats, room, size = _category_room(d, width)
    out = []
    for c in cats:
        for line in c.split("<br>"):
            if text_width(line, size) > room - TICK_GAP_PX:
                out.append(f"x label {line!r} is {text_width(line, size):.0f} px wide; {room - TICK_GAP_PX:.0f} px "
                           f"per category fit ({len(cats)} categories)")
    return out


def wrap_category(label: str, room: float, size: float = 12) -> str:
    """``label`` broken at spaces (``<br>``) into lines that each fit ``room`` px (a single word wider
    than that stays whole; :func:`category_tick_problems` names it)."""
    from lab.report.readable import wrap

    return "<br>".join(wrap(label, room - TICK_GAP_PX, size))


def continual_figure(study: dict, *, title: str = "", width: float | None = None):
    """Accuracy on each stage's new task, per protocol, with 95 % intervals and the task's floor.

    The x labels (``stage k: task``) are wrapped to the room each stage gets at ``width`` px (the
    report's, :data:`lab.report.readable.REPORT_WIDTH`, by default) and never turned on a slant, so
    they neither collide nor run into the legend under them (:func:`category_tick_problems`)."""
    import plotly.graph_objects as go

    from lab.report.readable import REPORT_WIDTH, text_width

    t = study.get("continual_learned")
    fig = go.Figure()
    if t is None or not len(t):
        return fig.update_layout(title="the continual sequences have not run yet", height=240)
    margin = dict(l=60, r=20, t=80)
    stages = list(dict.fromkeys(zip(t.stage, t.task)))
    room = ((width or REPORT_WIDTH) - margin["l"] - margin["r"]) / len(stages)
    label = {st: wrap_category(f"stage {st[0] + 1}: {st[1]}", room) for st in stages}
    for p, g in t.groupby("protocol", sort=False):
        fig.add_trace(go.Bar(x=[label[st] for st in zip(g.stage, g.task)], y=g.acc, name=PROTOCOL_NAMES.get(p, p),
                             error_y=dict(type="data", symmetric=False, array=g.hi - g.acc, arrayminus=g.acc - g.lo)))
    fl = t.groupby("task", sort=False).floor.first()
    for i, (_, k) in enumerate(stages):
        fig.add_shape(type="line", x0=i - 0.45, x1=i + 0.45, y0=fl[k], y1=fl[k], line=dict(dash="dot", color="grey"))
    # under the plot: the labels' lines, then the legend (its rows as they pack into the figure's width)
    lines = max(lab.count("<br>") + 1 for lab in label.values())
    names = [PROTOCOL_NAMES.get(p, p) for p in dict.fromkeys(t.protocol)]
    rows, x = 1, 0.0
    for n in names:
        w = text_width(n) + 44
        if x and x + w > (width or REPORT_WIDTH) - 20:
            rows, x = rows + 1, 0.0
        x += w
    margin["b"] = 24 + 16 * lines + 22 * rows
    fig.update_layout(barmode="group", title=title or "Continual sequence: each new task learned, against its floor",
                      yaxis_title="accuracy on the stage's task", yaxis_range=[0, 1], height=340 + margin["b"],
                      margin=margin, xaxis=dict(tickangle=0, automargin=False),
                      legend=dict(orientation="h", x=0, xanchor="left", y=0, yanchor="bottom", yref="container"))
    return fig


# ---------------------------------------------------------------- words
def headline(study: dict) -> dict:
    """The index card: the paired headline read off the fronts, and the paper's findings' verdicts."""
    f = study.get("findings")
    out = {}
    if f is not None and len(f):
        for r in f.itertuples():
            if r.a == REFERENCE and r.b.startswith("methods/"):
                key = f"AWARe − {name(r.b)}: R at matched downstream accuracy (points)"
                ok = _finite(r.diff)
                out[key] = (_fmt(r.diff, r.lo, r.hi, 1, signed=True) + f" — {r.verdict}") if ok else r.verdict
        for r in f.itertuples():
            if not r.b.startswith("methods/"):
                out[f"paper: {r.finding} ({name(r.b)})"] = r.verdict
    return out


def takeaway(study: dict) -> str:
    """A plain-language summary computed from the verdicts."""
    f = study.get("findings")
    if f is None or not len(f):
        return "No comparison has finished yet: the fronts are still running."
    base = f[f.a.eq(REFERENCE) & f.b.str.startswith("methods/")]
    words = []
    for r in base.itertuples():
        if not _finite(r.diff):
            words.append(f"against {name(r.b)}: {r.verdict}")
            continue
        sign = "more" if r.diff > 0 else "less"
        words.append(f"against {name(r.b)}, AWARe keeps {abs(r.diff):.1f} points {sign} upstream retention at the same "
                     f"downstream accuracy ({_fmt(r.diff, r.lo, r.hi, 1, signed=True)}, {int(r.seeds)} seed{'s' if r.seeds != 1 else ''}: "
                     f"{'no difference detected' if r.verdict == 'no difference detected' else r.verdict})")
    text = "Read along the learning-rate fronts, " + "; ".join(words) + "."
    paper = f[~f.b.str.startswith("methods/")]
    if len(paper):
        from lab.experiments.aware.study.tables import RETENTION_READ

        said = paper.verdict.where(paper["read"].eq(RETENTION_READ),
                                   paper.verdict + " (read as downstream accuracy at matched retention: the fronts "
                                                   "share no downstream range)")
        counts = said.groupby(paper.finding, sort=False).agg(lambda v: ", ".join(dict.fromkeys(v)))
        text += " The paper's findings: " + "; ".join(f"{k} — {v}" for k, v in counts.items()) + "."
    p = study.get("precision")
    if p is not None and len(p):
        r, moved = p[p.metric.eq("R")], _moved(p, ["R"])
        text += (f" bf16 against float32 (section 6): multimodal R moved at {len(moved)} of the {len(r)} points "
                 "checked" + (" — " + "; ".join(f"{name(x.variant)} at scale {scale_str(x.scale)}, "
                                                f"{_fmt(x.diff, x.lo, x.hi, 1, signed=True)} pts"
                                                for x in moved.itertuples()) if len(moved) else "") + ".")
    return text


def paper_table():
    import pandas as pd

    return pd.DataFrame(PAPER, columns=["the paper's figure", "value", "its protocol"])


README_HEADING = "## What the offline AWARe default measures"


def readme_section(study: dict) -> str:
    """The README section on the AWARe study: what it is, how to run, resume and check it, and where
    its generated tables are (``results/aware/README.md``)."""
    m = study["manifest"]
    cfg = m["config"]
    state = ("It is complete: every planned run finished." if m.get("complete", True) else
             "Right now it is in progress: the tables cover the runs finished so far, and `lab aware study --status` "
             "says how far it is.")
    scales = ", ".join(scale_str(x) for x in cfg["scales"])
    parts = [README_HEADING, "",
             f"The shipped study traces each method's *learning-rate front* on the mini-LLaVA: `{cfg['task']}` questions, "
             f"{cfg['steps']} steps x {cfg['batch_size']}, the method's base recipe (its language-model or adapter "
             f"rate and the projector's) scaled by {scales}, each on {len(cfg['seeds'])} test seeds; every ablation "
             f"variant runs its {cfg['keep']} best scales (chosen on tuning seeds {cfg['tune_seeds']}, never test "
             f"seeds) on {cfg['ablation_seeds']} test seeds. Methods are compared where their fronts meet: upstream "
             "retention at matched downstream accuracy, paired by seed with 95 % t-intervals. The generated tables are "
             f"in `results/aware/README.md`; notebook 04 draws them. {state}" + _readme_headline(study), "",
             "```bash",
             "lab aware study --status          # what is finished and what is left (nothing runs)",
             "lab aware study --executor ray    # resume on every core: only the missing runs run",
             "lab aware study --tables-only     # the tables and results/aware/README.md from the finished runs",
             "lab aware check                   # re-run one finished run here and compare every answer",
             "```", "",
             "Every finished run is one JSON file in `results/aware/runs/`, named by a hash of everything that "
             "changes its numbers (data, method, rates, seed, precision, recipe), so an interrupted study loses at most "
             "the runs in flight." + _readme_cost(m), "", ""]
    return "\n".join(parts)   # ends with a blank line: the README's next section starts apart


def _readme_headline(study: dict) -> str:
    """The methods' verdicts in one sentence (empty before any is computed)."""
    f = study.get("findings")
    if f is None or not len(f):
        return ""
    rows = [r for r in f.itertuples() if r.a == REFERENCE and r.b.startswith("methods/") and _finite(r.diff)]
    if not rows:
        return ""
    return (" The claim that AWARe retains more, read as AWARe minus each method, upstream retention at matched "
            "downstream accuracy (points, 95 % t-interval, "
            f"{int(rows[0].seeds)} seeds): " + "; ".join(f"{name(r.b)} {_fmt(r.diff, r.lo, r.hi, 1, signed=True)}, {r.verdict}"
                                                         for r in rows) + ".")


def _readme_cost(m: dict) -> str:
    r = m.get("runs")
    if not r or not r.get("count"):
        return ""
    run_h, wall_h, where = _spent(r)
    so_far = " so far" if not m.get("complete", True) else ""
    words = (f" Its {r['count']} runs{so_far} took {run_h} of summed run time and {wall_h} of wall clock "
             f"with at least one running, on {where}")
    if r.get("budget_s"):
        words += f" (budget {r['budget_s'] / 3600:.0f} h of the machine)"
    return words + "."


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
    parts = ["# The shipped AWARe study", "",
             "Generated by `lab aware study` from the runs in `runs/` (one JSON file per finished run, keyed by "
             "everything that changes it); regenerate the tables with `lab aware study --tables-only`, resume the "
             "study with `lab aware study`, list what is missing with `lab aware study --status`.", "",
             provenance(study, code_check=False), "", "## Floors", "", _md(baselines(study)), "",
             "## The methods' learning-rate fronts", "", _md(fronts_table(study, "methods")), "",
             "## Retention per upstream skill", "", _md(kinds_table(study, "methods")), "",
             "## Comparisons read off the fronts", "", "R difference at matched downstream accuracy:", "",
             _md(comparisons(study, read="retention")), "", "Downstream difference at matched R:", "",
             _md(comparisons(study, read="downstream")), "",
             "## Verdicts", "", VERDICT_RULE, "", _md(findings(study)), "", "## Ablation variants' short fronts", "",
             _md(fronts_table(study, None).pipe(lambda d: d[~d.variant.isin([name(v) for v in COLORS])]
                                                if "variant" in d else d)), "",
             "## bf16 against float32", "", _md(precision(study)), "", precision_summary(study), "",
             "## Continual sequence", "", _md(continual_learned(study)), "", _md(continual_table(study)), "",
             _md(continual_comparisons(study)), "",
             "## Tuning seeds (validation runs)", "", _md(tuning(study)), ""]
    return "\n".join(parts)
