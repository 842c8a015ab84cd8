"""The AWARe study's tables, computed from its runs (never written ahead of them).

One interval rule (:mod:`lab.stats`): a 95 % t-interval over per-seed values, differences paired by
seed. The methods are compared along their learning-rate fronts (:mod:`.fronts`): upstream
retention R at matched downstream accuracy, and downstream accuracy at matched R, read per seed at
levels every seed of both reaches, so no single learning-rate choice decides a verdict. Every
ablation variant's short front (its best scales on the tuning seeds) is compared the same way with
main AWARe's front on the same test seeds. A point *learned* the task when its downstream
accuracy's lower bound is above ``max(most common answer, zero-shot)`` (over seeds, and over all its
answers pooled); the matched levels start
well above that floor, so every compared point learned.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from lab import stats
from lab.aware.methods import main_method, method_variant, reference_method, table_columns
from lab.experiments.aware.study import fronts as F

REFERENCE = method_variant(main_method())          # methods/aware: every ablation's reference
_FULL = method_variant(reference_method())         # methods/full: what E is relative to
_LORA, _DORA = method_variant("lora"), method_variant("dora")
EQUIVALENCE_R = 5.0   # R points: "almost as good" (the proxy finding) means the interval lies within +-5
# (name, a, b): the methods compared along their fronts on the methods' test seeds
METHOD_PAIRS = (
    ("AWARe vs full fine-tuning", REFERENCE, _FULL),
    ("AWARe vs LoRA", REFERENCE, _LORA),
    ("AWARe vs DoRA", REFERENCE, _DORA),
    ("AWARe vs nothing frozen (rho 0)", REFERENCE, "methods/rho=0"),
    ("LoRA vs DoRA", _LORA, _DORA),
    ("LoRA vs full fine-tuning", _LORA, _FULL),
)
# the paper's four findings: (finding, claim, [(a, b)]): claim "higher" — a retains more than b at matched
# downstream accuracy; "equivalent" — within +-EQUIVALENCE_R
FINDINGS = (
    ("selection by activation beats weight norm and random", "higher",
     [(REFERENCE, "rule/weight-norm"), (REFERENCE, "rule/random")]),
    ("rho = 0.3 is the best trade-off (vs 0.1 and 0.5)", "higher",
     [(REFERENCE, "rho/rho=0.1"), (REFERENCE, "rho/rho=0.5")]),
    ("q/k/v + projector beats adding the MLP blocks", "higher", [(REFERENCE, "targets/qkv+projector+mlp")]),
    ("a generic (proxy) calibration set is almost as good as upstream data", "equivalent",
     [(REFERENCE, "calibration/proxy")]),
)


def _acc(a) -> float:
    return float(np.mean(a)) if len(a) else math.nan


def floors(env) -> dict:
    """The downstream floor a point must beat: max(most common answer, zero-shot)."""
    majority = env.ctx.down[env.cfg.task].test.majority_rate()
    zs = _acc(env.base_answers["down"])
    return {"majority": majority, "zero_shot": zs, "floor": max(majority, zs)}


def baselines_table(env):
    """``set, reference, acc, n``: most common answer, chance and zero-shot per set, and per easy-VQA kind."""
    import pandas as pd

    ctx, task = env.ctx, env.cfg.task
    qa = {"down": ctx.down[task].test, "easy_vqa": ctx.easy.test, "probe": ctx.probe.test}
    names = {"down": f"downstream ({task})", "easy_vqa": "easy-VQA (all kinds)", "probe": "text probe"}
    rows = []
    for st, q in qa.items():
        rows.append({"set": names[st], "reference": "most common answer", "acc": q.majority_rate(), "n": len(q)})
        rows.append({"set": names[st], "reference": f"chance ({len(q.options[0])} options)", "acc": q.chance_rate(),
                     "n": len(q)})
        rows.append({"set": names[st], "reference": "zero-shot", "acc": _acc(env.base_answers[st]), "n": len(q)})
    kinds = F.easy_kinds(ctx.easy.test.answers)
    base = np.asarray(env.base_answers["easy_vqa"])
    skills = skills_of(env)
    for k in F.kind_floors(ctx.easy.test):
        m = kinds == k["kind"]
        name = f"easy-VQA: {k['kind']}"
        in_r = k["kind"] in skills
        rows.append({"set": name, "reference": "most common answer", "acc": k["most_common"], "n": k["n"], "in_R": in_r})
        rows.append({"set": name, "reference": "chance (among its own answers)", "acc": k["chance"], "n": k["n"],
                     "in_R": in_r})
        rows.append({"set": name, "reference": "zero-shot", "acc": _acc(base[m]), "n": k["n"], "in_R": in_r})
    return pd.DataFrame(rows)


def skills_of(env) -> tuple[str, ...]:
    """The easy-VQA kinds R averages over: those the base model knows (:func:`fronts.upstream_skills`)."""
    return F.upstream_skills(env.ctx.easy.test, env.base_answers["easy_vqa"])


def runs_table(env, records: list[dict]):
    """One row per test run: its variant, rates, seed, precision and every metric (:func:`fronts.run_metrics`)."""
    import pandas as pd

    from lab.experiments.aware.study.plan import variant_id, variants

    cfg = env.cfg
    vinfo = {variant_id(v): v for v in variants(cfg)}
    kinds = F.easy_kinds(env.ctx.easy.test.answers)
    skills = skills_of(env)
    rows = []
    for r in records:
        if r["variant"] not in vinfo or "down" not in r["answers"]:
            continue
        v = vinfo[r["variant"]]
        m = F.run_metrics(r["answers"], env.base_answers, kinds, skills=skills)
        rows.append({"variant": r["variant"], "group": v.group, "label": v.label, "method": v.spec.method,
                     **table_columns(v.spec, v.calib, v.calib_n or cfg.n_calib),
                     "scale": r.get("scale"), "lr": r.get("lr"), "lr_projector": r.get("lr_projector"),
                     "seed": int(r["seed"]), "precision": r.get("precision", cfg.precision),
                     "n_down": len(r["answers"]["down"]), **m,
                     "trainable_frac": r["trainable"] / r["total"] if r.get("total") else 0.0,
                     "diverged": bool(r.get("diverged")), "final_loss": r.get("final_loss"),
                     "train_s": r.get("train_s"), "seconds": r.get("seconds")})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    order = {vid: i for i, vid in enumerate(vinfo)}       # the plan's order, whatever order the runs came in
    df["_o"] = df.variant.map(order)
    return df.sort_values(["_o", "scale", "seed", "precision"]).drop(columns="_o").reset_index(drop=True)


def fronts_table(runs, floor: float):
    """Per variant and scale, over its test seeds: mean and 95 % t-interval of downstream accuracy, R,
    R of the text probe and each easy-VQA kind's R; ``learned``: downstream's lower bound above ``floor``
    by both yardsticks, the t-interval over seeds and the Wilson interval of all its seeds' answers pooled
    (so seeds that happen to agree exactly do not make a zero-width interval pass a floor by one answer)."""
    from lab.metrics import wilson_interval
    import pandas as pd

    rows = []
    metrics = ["downstream", "R", "R_probe", "R_easy_vqa", *(f"R:{k}" for k in F.KINDS)]
    for (vid, scale), g in runs.groupby(["variant", "scale"], dropna=False, sort=False):
        row = {"variant": vid, "group": g.group.iloc[0], "label": g.label.iloc[0], "method": g.method.iloc[0],
               "scale": scale, "lr": g.lr.iloc[0], "lr_projector": g.lr_projector.iloc[0], "seeds": g.seed.nunique(),
               "trainable_frac": float(g.trainable_frac.mean()), "diverged": bool(g.diverged.any())}
        for m in metrics:
            if m in g:
                row[m], row[f"{m}_lo"], row[f"{m}_hi"] = stats.t_interval(g[m])
        n = int(g.n_down.sum()) if "n_down" in g else 0
        row["downstream_pooled_lo"] = wilson_interval(float(g.downstream.mean()), n)[0] if n else math.nan
        row["learned"] = (g.seed.nunique() > 1 and not row["diverged"] and bool(row["downstream_lo"] > floor)
                          and bool(row["downstream_pooled_lo"] > floor))
        rows.append(row)
    return pd.DataFrame(rows)


def seed_fronts(runs, vid: str, seeds=None) -> dict[int, list[tuple[float, float]]]:
    """``{seed: [(downstream, R), ...]}`` of variant ``vid`` in learning-rate order."""
    g = runs[runs.variant == vid].sort_values("scale")
    out = {}
    for s, gs in g.groupby("seed"):
        if seeds is None or s in seeds:
            out[int(s)] = list(zip(gs.downstream.astype(float), gs.R.astype(float)))
    return out


def compare_rows(runs, name: str, a: str, b: str, seeds) -> list[dict]:
    """Both reads of ``a`` against ``b`` on ``seeds`` (see :func:`fronts.compare`), tidy rows."""
    fa, fb = seed_fronts(runs, a, seeds), seed_fronts(runs, b, seeds)
    shared = sorted(set(fa) & set(fb))
    fa, fb = {s: fa[s] for s in shared}, {s: fb[s] for s in shared}
    out = []
    if not shared:
        return out
    for read, levels in (("retention", F.DOWN_LEVELS), ("downstream", F.R_LEVELS)):
        rows = F.compare(fa, fb, levels=levels, read=read)
        where = F.dominance(rows, a.split("/")[-1], b.split("/")[-1])
        for r in rows:
            out.append({"comparison": name, "a": a, "b": b, "read": read, **r, "dominance": where})
        if not rows:
            out.append({"comparison": name, "a": a, "b": b, "read": read, "level": None, "seeds": len(shared),
                        "direction": "not comparable: no level reached on every seed by both", "dominance": where})
    return out


RETENTION_READ = "R at matched downstream accuracy"
DOWNSTREAM_READ = "downstream accuracy (points) at matched R"


def finding_verdict(rows, claim: str, *, either_read: bool = True) -> tuple[str, float, float, float, int, str]:
    """A claim's verdict from the ``level=None`` (mean over shared levels) row of a comparison:
    ``(verdict, diff, lo, hi, seeds, read)``.

    The claim is read as retention at matched downstream accuracy. Where the two fronts share no
    downstream level on every seed (a variant whose kept rates all learn more than the other's
    smallest, say) a "higher" claim is read the other way, as downstream accuracy at matched R
    (in points, x100): a front that learns more at the same retention dominates just the same. An
    "equivalent" claim's margin is in R points, so it has no such second read; nor has a claim that
    names retention itself (``either_read=False``)."""
    def mean_row(read):
        return next((r for r in rows if r["read"] == read and _nan(r["level"]) and "diff" in r
                     and not _nan(r.get("diff"))), None)

    r, read, k = mean_row("retention"), RETENTION_READ, 1.0
    if r is None and claim == "higher" and either_read:
        r, read, k = mean_row("downstream"), DOWNSTREAM_READ, 100.0
    if r is None:
        return "not comparable (no shared downstream range)", math.nan, math.nan, math.nan, 0, RETENTION_READ
    diff, lo, hi = r["diff"] * k, r["lo"] * k, r["hi"] * k
    if claim == "equivalent":
        if _nan(lo):
            v = "not enough seeds"
        elif -EQUIVALENCE_R <= lo and hi <= EQUIVALENCE_R:
            v = "reproduced"
        elif lo > EQUIVALENCE_R or hi < -EQUIVALENCE_R:
            v = "contradicted"
        else:
            v = "no difference detected" if lo <= 0 <= hi else f"{stats.direction(lo, hi)}, within the +-{EQUIVALENCE_R:g} margin's reach"
    else:
        v = stats.verdict(lo, hi, expect=claim)
    return v, diff, lo, hi, r["seeds"], read


def _nan(x) -> bool:
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def precision_table(env, precision_recs: list[dict], test_recs: list[dict], test_runs):
    """bf16 minus float32, paired by seed, at the scales the precision check re-ran in float32, and
    the fraction of questions both precisions answered alike."""
    import pandas as pd

    fp32 = runs_table(env, precision_recs)
    rows = []
    if fp32.empty:
        return pd.DataFrame(rows)
    for (vid, scale), g in fp32.groupby(["variant", "scale"]):
        bf = test_runs[(test_runs.variant == vid) & np.isclose(test_runs.scale.astype(float), scale)]
        seeds = sorted(set(g.seed) & set(bf.seed))
        for m in ("downstream", "R", "R_probe"):
            a = [float(bf[bf.seed == s][m].iloc[0]) for s in seeds]
            b = [float(g[g.seed == s][m].iloc[0]) for s in seeds]
            d, lo, hi = stats.paired(a, b)
            rows.append({"variant": vid, "scale": scale, "metric": m, "seeds": len(seeds), "bf16": np.mean(a) if a else np.nan,
                         "fp32": np.mean(b) if b else np.nan, "diff": d, "lo": lo, "hi": hi,
                         "direction": stats.direction(lo, hi)})
        for st in ("down", "easy_vqa", "probe"):
            same = []
            for s in seeds:
                ra = next(r for r in precision_recs if r["variant"] == vid and r["seed"] == s and np.isclose(r["scale"], scale))
                rb = next((r for r in test_recs if r["variant"] == vid and r["seed"] == s
                           and r.get("scale") is not None and np.isclose(r["scale"], scale)), None)
                if rb is not None:
                    same.append(np.mean(np.asarray(ra["answers"][st]) == np.asarray(rb["answers"][st])))
            rows.append({"variant": vid, "scale": scale, "metric": f"answered alike: {st}", "seeds": len(same),
                         "bf16": np.nan, "fp32": np.nan, "diff": float(np.mean(same)) if same else np.nan,
                         "lo": np.nan, "hi": np.nan, "direction": ""})
    return pd.DataFrame(rows)


def continual_tables(cont_recs: list[dict], env):
    """Per protocol and seed: Avg, Last, BWT and R after the sequence (multimodal, over easy-VQA kinds);
    per stage, whether the stage's task was learned (its accuracy's lower bound over seeds above the
    task's most common answer and chance); paired differences between protocols."""
    import pandas as pd

    from lab.aware import metrics as M
    from lab.experiments.aware.run.continual import ORDER

    if not cont_recs:
        return pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
    kinds = F.easy_kinds(env.ctx.easy.test.answers)
    base = env.base_answers
    per = []
    stage_rows = []
    for rec in cont_recs:
        rows = rec["rows"]
        acc = [[next(r["acc"] for r in rows if r["stage"] == i and r["task"] == t) for t in ORDER[: i + 1]]
               for i in range(len(ORDER))]
        up = {r["task"].split(":", 1)[1]: r["correct"] for r in rows if r["task"].startswith("upstream:")}
        m = F.run_metrics({"down": [0], "easy_vqa": up["easy_vqa"], "probe": up.get("probe", [])}, base, kinds,
                          skills=skills_of(env))
        per.append({"protocol": rec["label"], "method": rec["method"], "seed": rec["seed"], "scale": rec.get("scale"),
                    "lr": rec.get("lr"), "Avg": M.average_over_stages(acc), "Last": M.last(acc), "BWT": M.bwt(acc),
                    "R_after": m["R"], "R_probe_after": m.get("R_probe", math.nan)})
        for r in rows:
            if not r["task"].startswith("upstream:") and r["task"] == r["stage_task"]:
                stage_rows.append({"protocol": rec["label"], "seed": rec["seed"], "stage": r["stage"], "task": r["task"],
                                   "acc": r["acc"]})
    per = pd.DataFrame(per)
    floors = {}
    for t in ORDER:
        q = env.ctx.down[t].test.subset(range(min(env.cfg.n_continual_eval, len(env.ctx.down[t].test))))
        floors[t] = max(q.majority_rate(), q.chance_rate())
    learned = []
    st = pd.DataFrame(stage_rows)
    for (proto, stage, task), g in st.groupby(["protocol", "stage", "task"], sort=False):
        m, lo, hi = stats.t_interval(g.acc)
        learned.append({"protocol": proto, "stage": int(stage), "task": task, "seeds": len(g), "acc": m, "lo": lo,
                        "hi": hi, "floor": floors[task], "learned": bool(lo > floors[task])})
    summary = []
    for proto, g in per.groupby("protocol", sort=False):
        for metric in ("Avg", "Last", "BWT", "R_after", "R_probe_after"):
            m, lo, hi = stats.t_interval(g[metric])
            summary.append({"protocol": proto, "metric": metric, "seeds": len(g), "estimate": m, "lo": lo, "hi": hi})
    comps = []
    protos = list(dict.fromkeys(per.protocol))
    pairs = [(protos[1], protos[0]), (protos[2], protos[0]), (protos[2], protos[1])] if len(protos) == 3 else []
    for a, b in pairs:
        ga, gb = per[per.protocol == a].set_index("seed"), per[per.protocol == b].set_index("seed")
        seeds = sorted(set(ga.index) & set(gb.index))
        for metric in ("Avg", "Last", "BWT", "R_after"):
            d, lo, hi = stats.paired([ga.at[s, metric] for s in seeds], [gb.at[s, metric] for s in seeds])
            comps.append({"a": a, "b": b, "metric": metric, "seeds": len(seeds), "diff": d, "lo": lo, "hi": hi,
                          "direction": stats.direction(lo, hi)})
    return per, pd.DataFrame(summary), pd.DataFrame(comps), pd.DataFrame(learned)


def build(env, res: Mapping) -> dict:
    """Every table of the study from its records (``res``: :func:`lab.experiments.aware.study.runner.run_all`
    or :func:`~lab.experiments.aware.study.runner.collect`)."""
    import pandas as pd

    cfg = env.cfg
    fl = floors(env)
    test_recs = [r for r in res.get("test", []) if r.get("scale") is not None]
    runs = runs_table(env, test_recs)
    out = {"runs": runs, "baselines": baselines_table(env)}
    out["fronts"] = fronts_table(runs, fl["floor"]) if not runs.empty else pd.DataFrame()
    comps = []
    methods_seeds = tuple(cfg.seeds)
    abl_seeds = tuple(cfg.seeds[: cfg.ablation_seeds])
    if not runs.empty:
        have = set(runs.variant)
        for name, a, b in METHOD_PAIRS:
            if a in have and b in have:
                comps += compare_rows(runs, name, a, b, methods_seeds)
        for vid in dict.fromkeys(runs.variant):
            if vid.startswith("methods/") or vid == REFERENCE:
                continue
            comps += compare_rows(runs, f"AWARe vs {vid}", REFERENCE, vid, abl_seeds)
    comps = pd.DataFrame(comps)
    out["comparisons"] = comps
    find = []
    by = {n: g.to_dict("records") for n, g in comps.groupby("comparison")} if len(comps) else {}
    ran = set(runs.variant) if not runs.empty else set()

    def verdict_of(rows, claim, a, b, either_read=True):
        missing = [x for x in (a, b) if x not in ran]
        if missing:
            return f"not run yet ({', '.join(missing)})", math.nan, math.nan, math.nan, 0, RETENTION_READ
        return finding_verdict(rows, claim, either_read=either_read)

    for finding, claim, pairs in FINDINGS:
        for a, b in pairs:
            v, d, lo, hi, k, read = verdict_of(by.get(f"AWARe vs {b}", []), claim, a, b)
            find.append({"finding": finding, "claim": claim, "a": a, "b": b, "read": read,
                         "seeds": k, "diff": d, "lo": lo, "hi": hi, "verdict": v})
    for name, a, b in METHOD_PAIRS:
        if a == REFERENCE:
            v, d, lo, hi, k, read = verdict_of(by.get(name, []), "higher", a, b, either_read=False)
            find.append({"finding": f"AWARe retains more than {name.split(' vs ', 1)[1]} at matched downstream accuracy",
                         "claim": "higher", "a": a, "b": b, "read": read, "seeds": k,
                         "diff": d, "lo": lo, "hi": hi, "verdict": v})
    out["findings"] = pd.DataFrame(find)
    out["tuning"] = pd.DataFrame(res.get("tuning_rows", []))
    out["precision"] = precision_table(env, res.get("precision", []), test_recs, runs)
    per, summ, ccomp, learned = continual_tables(res.get("continual", []), env)
    out.update({"continual": per, "continual_summary": summ, "continual_comparisons": ccomp, "continual_learned": learned})
    return {k: v for k, v in out.items() if v is not None and len(v.columns)}   # a part not run: no file
