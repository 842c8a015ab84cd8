"""The AWARe study's tables, computed from its runs (never written ahead of them).

Every number carries a 95 % paired-bootstrap interval (:mod:`lab.experiments.aware.intervals`):
the same question draw for every run, and each variant's own seeds resampled (a comparison of two
variants uses the seeds both have). Before anything is compared, every variant is checked to have
*learned* the downstream task: its downstream accuracy's lower bound above the floor
``max(most common answer, zero-shot)``. E and H are reported only for variants that learned; a
comparison or finding that needs a variant which did not learn says so instead of a verdict.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from lab.experiments.aware import intervals as I
from lab.aware.methods import table_columns

SETS = ("down", "easy_vqa", "probe")
EQUIVALENCE_H = 5.0   # H points: "almost as good" (the proxy finding) means the interval lies within +-5
# (name, a, b, metrics): the headline paired differences a - b
HEADLINE = (
    ("AWARe vs full fine-tuning", "methods/aware", "methods/full", ("R", "R_easy_vqa", "R_probe", "downstream", "H")),
    ("AWARe vs LoRA", "methods/aware", "methods/lora", ("R", "downstream", "H")),
    ("AWARe vs DoRA", "methods/aware", "methods/dora", ("R", "downstream", "H")),
    ("LoRA vs DoRA", "methods/lora", "methods/dora", ("R", "downstream", "H")),
    ("AWARe vs nothing frozen (rho 0)", "methods/aware", "methods/rho=0", ("R", "downstream", "H")),
    ("activation vs weight-norm", "methods/aware", "rule/weight-norm", ("R", "E", "H")),
    ("activation vs random", "methods/aware", "rule/random", ("R", "E", "H")),
    ("global vs balanced", "methods/aware", "rule/activation-balanced", ("R", "E", "H")),
    ("rho 0.3 vs 0.1", "methods/aware", "rho/rho=0.1", ("R", "E", "H")),
    ("rho 0.3 vs 0.5", "methods/aware", "rho/rho=0.5", ("R", "E", "H")),
    ("q/k/v+projector vs +MLP", "methods/aware", "targets/qkv+projector+mlp", ("R", "E", "H")),
    ("q/k/v+projector vs q/k/v", "methods/aware", "targets/qkv", ("R", "E", "H")),
    ("upstream vs proxy calibration", "methods/aware", "calibration/proxy", ("R", "E", "H")),
)
# the paper's four findings: (finding, claim, [(a, b, metric)], kind)
FINDINGS = (
    ("selection by activation beats weight norm and random", "higher",
     [("methods/aware", "rule/weight-norm", "H"), ("methods/aware", "rule/random", "H")]),
    ("rho = 0.3 is the best trade-off (vs 0.1 and 0.5)", "higher",
     [("methods/aware", "rho/rho=0.1", "H"), ("methods/aware", "rho/rho=0.5", "H")]),
    ("q/k/v + projector beats adding the MLP blocks", "higher",
     [("methods/aware", "targets/qkv+projector+mlp", "H")]),
    ("a generic (proxy) calibration set is almost as good as upstream data", "equivalent",
     [("methods/aware", "calibration/proxy", "H")]),
)


def comparisons_of(variant_ids) -> tuple:
    """:data:`HEADLINE`, then main AWARe against every rule the study adds beyond it (a plugin's,
    ``lab aware study --add-rules``), on the same metrics as the built-in rules."""
    named = {b for _, _, b, _ in HEADLINE}
    extra = tuple((f"activation vs {v.split('/', 1)[1]}", "methods/aware", v, ("R", "E", "H"))
                  for v in variant_ids if v.startswith("rule/") and v not in named)
    return HEADLINE + extra


def _acc(a) -> float:
    return float(np.mean(a)) if len(a) else float("nan")


def question_draws(sizes: Mapping[str, int], replicates: int, rng_seed: int = 0) -> dict:
    """``{set: [B+1, n]}`` multinomial question weights (row 0: all ones), shared by every run."""
    rng = np.random.default_rng(rng_seed)
    out = {}
    for name, n in sorted(sizes.items()):
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(float)
        out[name] = np.vstack([np.ones((1, n)), w])
    return out


def draws_for(seeds, qw: Mapping, rng_seed: int = 1) -> I.Draws:
    """Seed weights for ``seeds`` (their own stream, so the question draw stays shared)."""
    seeds = tuple(sorted(int(s) for s in seeds))
    b = next(iter(qw.values())).shape[0] - 1
    rng = np.random.default_rng([rng_seed, *seeds])
    k = len(seeds)
    sw = np.vstack([np.ones((1, k)), rng.multinomial(k, np.full(k, 1.0 / k), size=b).astype(float)])
    return I.Draws(seeds, sw, qw)


def per_seed_metrics(recs: list[dict], base: Mapping[str, list], qw: Mapping) -> dict:
    """``{variant: {seed: {metric: [B+1]}}}``: accuracies, R per skill and their mean, E, H."""
    d = I.Draws((0,), np.ones((1, 1)), qw)
    acc = lambda st, c: I.accuracy(d, st, c)  # noqa: E731
    b = {st: acc(st, base[st]) for st in SETS}
    per: dict = {}
    for r in recs:
        a = {st: acc(st, r["answers"][st]) for st in SETS}
        r_e, r_p = I.retention(b["easy_vqa"], a["easy_vqa"]), I.retention(b["probe"], a["probe"])
        per.setdefault(r["variant"], {})[int(r["seed"])] = {
            "downstream": a["down"], "up_easy_vqa": a["easy_vqa"], "up_probe": a["probe"],
            "R_easy_vqa": r_e, "R_probe": r_p, "R": (r_e + r_p) / 2}
    full = per.get("methods/full", {})
    for v, seeds in per.items():
        for s, m in seeds.items():
            if s in full:
                with np.errstate(divide="ignore", invalid="ignore"):
                    m["E"] = np.where(full[s]["downstream"] > 0, 100 * m["downstream"] / full[s]["downstream"], np.nan)
            else:
                m["E"] = np.full_like(m["downstream"], np.nan)
            m["H"] = I.h_score(m["R"], m["E"])
    return per


def aggregate(per_v: Mapping[int, dict], seeds, qw) -> dict:
    """``{metric: [B+1]}`` over ``seeds`` of one variant."""
    d = draws_for(seeds, qw)
    return {m: I.over_seeds(d, {s: per_v[s][m] for s in d.seeds}) for m in next(iter(per_v.values()))}


def floors(base: Mapping[str, list], ctx, task: str) -> dict:
    """The downstream floor a variant must beat: max(most common answer, zero-shot)."""
    majority = ctx.down[task].test.majority_rate()
    return {"majority": majority, "zero_shot": _acc(base["down"]), "floor": max(majority, _acc(base["down"]))}


def baselines_table(env):
    """``set, reference, acc, n``: the most common answer (or chance) and zero-shot, per set."""
    import pandas as pd

    ctx, task = env.ctx, env.cfg.task
    qa = {"down": ctx.down[task].test, "easy_vqa": ctx.easy.test, "probe": ctx.probe.test}
    rows = []
    for st, q in qa.items():
        name = f"downstream:{task}" if st == "down" else st
        rows.append({"set": name, "reference": "most common answer", "acc": q.majority_rate(), "n": len(q)})
        rows.append({"set": name, "reference": f"chance ({len(q.options[0])} options)", "acc": q.chance_rate(), "n": len(q)})
        rows.append({"set": name, "reference": "zero-shot", "acc": _acc(env.base_answers[st]), "n": len(q)})
    return pd.DataFrame(rows)


def _verdict_words(a: str, b: str, s: Mapping, metric: str) -> str:
    return I.metric_verdict(a.split("/")[-1], b.split("/")[-1], s, metric)


def build(env, res: Mapping) -> dict:
    """Every table of the study from its records (``res``: :func:`lab.experiments.aware.runner.run_all`)."""
    import pandas as pd

    from lab.experiments.aware.plan import variants, variant_id

    cfg, ctx = env.cfg, env.ctx
    vinfo = {variant_id(v): v for v in variants(cfg)}
    test = [r for r in res.get("test", []) if r["variant"] in vinfo]
    base = env.base_answers
    qw = question_draws({st: len(base[st]) for st in SETS}, cfg.replicates)
    per = per_seed_metrics(test, base, qw)
    fl = floors(base, ctx, cfg.task)

    # which seeds each variant has, and the variant's own metrics over them
    metrics, seeds_of, learned, diverged = {}, {}, {}, {}
    for vid, by_seed in per.items():
        want = set(cfg.seeds_for(vinfo[vid].group, vid))
        have = sorted(set(by_seed) & want)
        if not have:
            continue
        seeds_of[vid] = have
        metrics[vid] = aggregate(by_seed, have, qw)
        down = I.summarise(metrics[vid]["downstream"])
        diverged[vid] = any(r.get("diverged") for r in test if r["variant"] == vid)
        learned[vid] = bool(down["lo"] > fl["floor"]) and not diverged[vid]

    run_rows = []
    for r in test:
        v = vinfo[r["variant"]]
        a = {st: _acc(r["answers"][st]) for st in SETS}
        m = per[r["variant"]][int(r["seed"])]
        run_rows.append({"variant": r["variant"], "group": v.group, "label": v.label, "method": v.spec.method,
                         **table_columns(v.spec, v.calib, v.calib_n or cfg.n_calib),
                         "seed": int(r["seed"]), "lr": r["lr"], "downstream": a["down"], "up_easy_vqa": a["easy_vqa"],
                         "up_probe": a["probe"], "R_easy_vqa": float(m["R_easy_vqa"][0]),
                         "R_probe": float(m["R_probe"][0]), "R": float(m["R"][0]), "E": float(m["E"][0]),
                         "H": float(m["H"][0]), "trainable": r["trainable"],
                         "trainable_frac": r["trainable"] / r["total"] if r["total"] else 0.0,
                         "lora_rank": r["lora_rank"], "steps": r["steps"], "final_loss": r["final_loss"],
                         "diverged": bool(r.get("diverged")), "train_s": r["train_s"], "seconds": r.get("seconds", np.nan)})
    runs = pd.DataFrame(run_rows)

    rows = []
    for vid, ms in metrics.items():
        v = vinfo[vid]
        mine = runs[runs.variant == vid]
        for m, arr in ms.items():
            s = I.summarise(arr)
            if m in ("E", "H") and not learned[vid]:
                s = {"estimate": np.nan, "lo": np.nan, "hi": np.nan}     # not ranked: it did not learn
            rows.append({"variant": vid, "group": v.group, "label": v.label, "method": v.spec.method,
                         "lr": mine.lr.iloc[0], "trainable_frac": float(mine.trainable_frac.mean()),
                         "seeds": len(seeds_of[vid]), "learned": learned[vid], "diverged": diverged[vid],
                         "metric": m, **s})
    summary = pd.DataFrame(rows)

    def paired(a, b, m):
        common = sorted(set(seeds_of.get(a, [])) & set(seeds_of.get(b, [])))
        if not common:
            return None
        da, db = aggregate(per[a], common, qw), aggregate(per[b], common, qw)
        return I.summarise(da[m] - db[m]), len(common)

    def blocked(a, b, m):
        if m in ("E", "H"):
            bad = [x for x in (a, b) if not learned.get(x, False)]
            if bad:
                return f"{m}: not compared — {' and '.join(x.split('/')[-1] for x in bad)} did not learn the task"
        return None

    comp_rows = []
    for name, a, b, ms in comparisons_of(vinfo):
        if a not in metrics or b not in metrics:
            continue
        for m in ms:
            got = paired(a, b, m)
            if got is None:
                continue
            s, k = got
            why = blocked(a, b, m)
            comp_rows.append({"comparison": name, "a": a, "b": b, "metric": m, "seeds": k, **s,
                              "detected": (not I.spans_zero(s["lo"], s["hi"])) if why is None else False,
                              "verdict": why or _verdict_words(a, b, s, m)})
    comps = pd.DataFrame(comp_rows)

    find_rows = []
    for finding, claim, parts in FINDINGS:
        outcomes, texts = [], []
        for a, b, m in parts:
            got = paired(a, b, m) if a in metrics and b in metrics else None
            why = blocked(a, b, m) if got is not None else f"{b.split('/')[-1]} not run yet"
            if got is None or why:
                outcomes.append("n/a")
                texts.append(why)
                continue
            s, k = got
            if claim == "higher":
                o = "reproduced" if s["lo"] > 0 else "contradicted" if s["hi"] < 0 else "not detected"
            else:   # equivalent within +- EQUIVALENCE_H
                o = ("reproduced" if -EQUIVALENCE_H < s["lo"] and s["hi"] < EQUIVALENCE_H else
                     "contradicted" if s["lo"] > EQUIVALENCE_H or s["hi"] < -EQUIVALENCE_H else "not detected")
            outcomes.append(o)
            texts.append(f"{m} {a.split('/')[-1]} − {b.split('/')[-1]} = {s['estimate']:+.1f} "
                         f"[{s['lo']:+.1f}, {s['hi']:+.1f}] ({k} seeds)")
        if "n/a" in outcomes:
            verdict = "not comparable"
        elif "contradicted" in outcomes:
            verdict = "contradicted"
        elif all(o == "reproduced" for o in outcomes):
            verdict = "reproduced"
        else:
            verdict = "not detected"
        find_rows.append({"finding": finding, "verdict": verdict, "evidence": "; ".join(texts),
                          "rule": ("every paired H difference's 95 % interval above zero" if claim == "higher" else
                                   f"the paired H difference's 95 % interval within ±{EQUIVALENCE_H:g} points")})
    findings = pd.DataFrame(find_rows)

    learned_rows = [{"variant": vid, "downstream": I.summarise(metrics[vid]["downstream"])["estimate"],
                     "lo": I.summarise(metrics[vid]["downstream"])["lo"],
                     "hi": I.summarise(metrics[vid]["downstream"])["hi"], "floor": fl["floor"],
                     "majority": fl["majority"], "zero_shot": fl["zero_shot"], "learned": learned[vid],
                     "diverged": diverged[vid], "seeds": len(seeds_of[vid])} for vid in metrics]
    cols = {"runs": ["variant", "group", "label", "method", "seed", "lr", "downstream", "R", "E", "H"],
            "summary": ["variant", "group", "label", "method", "lr", "trainable_frac", "seeds", "learned", "diverged",
                        "metric", "estimate", "lo", "hi"],
            "comparisons": ["comparison", "a", "b", "metric", "seeds", "estimate", "lo", "hi", "detected", "verdict"],
            "findings": ["finding", "verdict", "evidence", "rule"],
            "learned": ["variant", "downstream", "lo", "hi", "floor", "majority", "zero_shot", "learned", "diverged",
                        "seeds"],
            "tuning": ["variant", "method", "lr", "seed", "diverged", "val_downstream", "val_R", "val_E", "val_H",
                       "chosen", "edge"]}
    frames = {"runs": runs, "summary": summary, "comparisons": comps, "findings": findings,
              "learned": pd.DataFrame(learned_rows), "tuning": pd.DataFrame(res.get("tuning_rows", []))}
    tables = {k: (df if len(df) else pd.DataFrame(columns=cols[k])) for k, df in frames.items()}   # readable when empty
    tables["baselines"] = baselines_table(env)
    if len(test):
        tables["answers"] = answers_table(test, {k: v for k, v in base.items() if not k.startswith("val:")})
    cont = [{"label": c["label"], "replay": c["replay"], "seconds": c.get("seconds", np.nan), **row}
            for c in res.get("continual", []) for row in c["rows"]]
    if cont:
        import pandas as pd  # noqa: F811

        tables["continual"] = pd.DataFrame([{k: v for k, v in r.items() if k not in ("correct",)} for r in cont])
        seeds = sorted({r["seed"] for r in cont})
        cs, cc = continual_tables(cont, base, seeds, replicates=cfg.replicates)
        tables["continual_summary"], tables["continual_comparisons"] = cs, cc
    return tables


def answers_table(records: list[dict], base_answers: Mapping[str, list]):
    """Tidy ``variant, seed, set, question, correct`` (``variant='base'``: the model before fine-tuning)."""
    import pandas as pd

    parts = []
    for r in [{"variant": "base", "seed": -1, "answers": base_answers}, *records]:
        for s, a in r["answers"].items():
            if s.startswith("val:"):
                continue
            parts.append(pd.DataFrame({"variant": r["variant"], "seed": int(r["seed"]), "set": s,
                                       "question": np.arange(len(a)), "correct": np.asarray(a, np.int8)}))
    return pd.concat(parts, ignore_index=True)


def continual_tables(cont_rows: list[dict], base_answers: Mapping, seeds, *, replicates: int = 2000, rng_seed: int = 1):
    """Per protocol: Avg, Last, BWT and R after the sequence with intervals, plus paired differences
    (each AWARe protocol minus full fine-tuning, replay minus paper) — :mod:`lab.metrics` on every replicate."""
    import pandas as pd

    from lab import metrics as LM
    from lab.experiments.aware import intervals as I

    df = pd.DataFrame(cont_rows)
    tasks = [t for t in dict.fromkeys(df.task) if not t.startswith("upstream:")]
    n_stages = int(df.stage.max()) + 1
    sizes = {f"cont:{t}": len(df[df.task == t].correct.iloc[0]) for t in tasks}
    sizes.update({k: len(base_answers[k]) for k in ("easy_vqa", "probe")})
    d = I.draw(seeds, sizes, replicates=replicates, rng_seed=rng_seed)
    base = {k: I.accuracy(d, k, base_answers[k]) for k in ("easy_vqa", "probe")}
    out = {}
    for label in dict.fromkeys(df.label):
        per = {}
        for seed in seeds:
            mine = df[(df.label == label) & (df.seed == seed)]
            acc = {(int(r.stage), r.task): I.accuracy(d, f"cont:{r.task}" if not r.task.startswith("upstream:")
                                                     else r.task.split(":", 1)[1], r.correct)
                   for r in mine.itertuples()}
            avg, last, bwt = (np.empty(d.replicates + 1) for _ in range(3))
            for b in range(d.replicates + 1):
                m = LM.from_stage_rows([[acc[(i, tasks[j])][b] for j in range(i + 1)] for i in range(n_stages)])
                a_b = LM.stage_averages(m)
                avg[b], last[b], bwt[b] = LM.average_incremental_accuracy(a_b), LM.last_accuracy(a_b), LM.backward_transfer(m)
            r_after = (I.retention(base["easy_vqa"], acc[(n_stages - 1, "upstream:easy_vqa")])
                       + I.retention(base["probe"], acc[(n_stages - 1, "upstream:probe")])) / 2
            per[seed] = {"Avg": avg, "Last": last, "BWT": bwt, "R_after": r_after}
        out[label] = {m: I.over_seeds(d, {s: per[s][m] for s in seeds}) for m in ("Avg", "Last", "BWT", "R_after")}
    rows = [{"protocol": lab_, "metric": m, **I.summarise(arr)} for lab_, ms in out.items() for m, arr in ms.items()]
    labels = list(out)
    pairs = [(labels[1], labels[0]), (labels[2], labels[0]), (labels[2], labels[1])] if len(labels) == 3 else []
    diffs = []
    for a, b in pairs:
        for m in ("Avg", "Last", "BWT", "R_after"):
            s = I.summarise(out[a][m] - out[b][m])
            scale = 100 if m in ("Avg", "Last", "BWT") else 1
            diffs.append({"a": a, "b": b, "metric": m, **s, "detected": not I.spans_zero(s["lo"], s["hi"]),
                          "verdict": I.verdict(a, b, {k: v * scale for k, v in s.items()}, m,
                                               " pts" if scale == 100 else "")})
    return pd.DataFrame(rows), pd.DataFrame(diffs)
