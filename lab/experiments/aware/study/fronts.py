"""Learning-rate fronts: what a method gains downstream against what it keeps upstream, and how two
methods compare along them — pure functions of per-run numbers (no model, no files).

A run at one learning-rate scale is one point ``(downstream accuracy, upstream retention R)``. A
method's *front* on one seed is the path its points trace as the learning rate grows, joined by
straight lines (as drawn in the figures). :func:`at_level` reads it at a level: ``R*(d)``, the
retention where the path crosses downstream accuracy ``d`` (the highest, if it crosses twice) —
defined only where the seed's path reaches ``d``. :func:`pareto` gives the non-dominated points. Two methods are compared *at matched downstream accuracy*: ``R*_A(d) - R*_B(d)``
seed by seed, at levels every seed of both reaches, then a t-interval over seeds (:mod:`lab.stats`).
The same read the other way (:func:`downstream_at`) gives downstream accuracy at matched retention.

R here is upstream *multimodal* retention: the mean over easy-VQA's question kinds (yes/no, shape,
colour) of ``100 x after / before``, each kind an upstream skill with its own floors; the text
probe is reported apart (:func:`easy_kinds`, :func:`run_metrics`).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from lab import stats

KINDS = ("yes/no", "shape", "colour")
SHAPES = ("circle", "triangle", "rectangle")
DOWN_LEVELS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8)     # downstream accuracy levels read off the fronts
R_LEVELS = (50.0, 60.0, 70.0, 80.0, 90.0)             # retention levels (%)


def easy_kinds(answers: Sequence[str]) -> np.ndarray:
    """The kind of every easy-VQA question, from its gold answer: yes/no, shape or colour."""
    return np.array(["yes/no" if a in ("yes", "no") else "shape" if a in SHAPES else "colour" for a in answers])


def kind_floors(qa) -> list[dict]:
    """Per easy-VQA kind: questions, the most common answer's rate and chance among the kind's own
    answers (a model that knows only the kind of answer asked for scores this much)."""
    kinds = easy_kinds(qa.answers)
    out = []
    for k in KINDS:
        ans = [a for a, kk in zip(qa.answers, kinds) if kk == k]
        if not ans:
            continue
        vals, counts = np.unique(ans, return_counts=True)
        own = 2 if k == "yes/no" else len(SHAPES) if k == "shape" else len(set(qa.options[0]) - {"yes", "no", *SHAPES})
        out.append({"kind": k, "n": len(ans), "most_common": float(counts.max() / len(ans)), "chance": 1.0 / own})
    return out


def upstream_skills(qa, base_easy: Sequence[int]) -> tuple[str, ...]:
    """The easy-VQA kinds the base model actually has as skills: its accuracy's 95 % Wilson lower
    bound above the kind's most common answer and its chance. Retention of a kind the model never
    knew (e.g. colour, answered at chance before any fine-tuning) would only add noise to R."""
    from lab.metrics import wilson_interval

    kinds = easy_kinds(qa.answers)
    base = np.asarray(base_easy)
    out = []
    for k in kind_floors(qa):
        m = kinds == k["kind"]
        lo, _ = wilson_interval(float(base[m].mean()), int(m.sum()), percent=False)
        if lo > max(k["most_common"], k["chance"]):
            out.append(k["kind"])
    return tuple(out)


def _acc(a) -> float:
    return float(np.mean(a)) if len(a) else math.nan


def run_metrics(answers: Mapping[str, Sequence[int]], base: Mapping[str, Sequence[int]], kinds: np.ndarray,
                prefix: str = "", skills: Sequence[str] = KINDS) -> dict:
    """A run's numbers from its per-question answers and the base model's: downstream accuracy,
    easy-VQA accuracy overall and per kind, probe accuracy, R (multimodal: mean retention over the
    kinds in ``skills``, see :func:`upstream_skills`), R of easy-VQA as one set, R of the probe.
    ``prefix``: ``"val:"`` for validation answers (there is no validation probe; kinds then come
    from the validation questions)."""
    out = {"downstream": _acc(answers[f"{prefix}down"])}
    easy, easy0 = np.asarray(answers[f"{prefix}easy_vqa"]), np.asarray(base[f"{prefix}easy_vqa"])
    out["easy_vqa"] = _acc(easy)
    rs = []
    for k in KINDS:
        m = kinds == k
        if m.any():
            out[f"easy_vqa:{k}"] = _acc(easy[m])
            before = _acc(easy0[m])
            out[f"R:{k}"] = 100.0 * out[f"easy_vqa:{k}"] / before if before > 0 else math.nan
            if k in skills:
                rs.append(out[f"R:{k}"])
    rs = [r for r in rs if not math.isnan(r)]          # a kind the base never answered right has no retention
    out["R"] = float(np.mean(rs)) if rs else math.nan
    out["R_easy_vqa"] = 100.0 * out["easy_vqa"] / _acc(easy0) if _acc(easy0) > 0 else math.nan
    if f"{prefix}probe" in answers and f"{prefix}probe" in base:
        out["probe"] = _acc(answers[f"{prefix}probe"])
        p0 = _acc(base[f"{prefix}probe"])
        out["R_probe"] = 100.0 * out["probe"] / p0 if p0 > 0 else math.nan
    return out


# ---------------------------------------------------------------- one seed's front
def pareto(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated ``(x, y)`` points (more of both is better), by increasing x (so decreasing y);
    a point with a NaN is dropped."""
    pts = sorted({(float(x), float(y)) for x, y in points if not (math.isnan(x) or math.isnan(y))},
                 key=lambda p: (-p[0], -p[1]))
    out, best_y = [], -math.inf
    for x, y in pts:           # from the largest x down: keep a point only if it beats every larger x's y
        if y > best_y:
            out.append((x, y))
            best_y = y
    return out[::-1]


def at_level(points: Sequence[tuple[float, float]], level: float) -> float:
    """The path's y at x = ``level``: ``points`` in learning-rate order joined by straight lines,
    read where the path crosses ``level`` (the highest y where it crosses more than once); NaN where
    it never reaches ``level``."""
    pts = [(float(x), float(y)) for x, y in points if not (math.isnan(x) or math.isnan(y))]
    best = -math.inf
    for x, y in pts:
        if abs(x - level) <= 1e-12:
            best = max(best, y)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 != x1 and min(x0, x1) - 1e-12 <= level <= max(x0, x1) + 1e-12:
            best = max(best, y0 + (y1 - y0) * (level - x0) / (x1 - x0))
    return best if best > -math.inf else math.nan


def retention_at(points, level: float) -> float:
    """R at downstream accuracy ``level`` (``points``: ``(downstream, R)``)."""
    return at_level(points, level)


def downstream_at(points, level: float) -> float:
    """Downstream accuracy at retention ``level`` (``points``: ``(downstream, R)``)."""
    return at_level([(r, d) for d, r in points], level)


# ---------------------------------------------------------------- two methods, paired by seed
def common_levels(fronts: Sequence[Mapping[int, Sequence[tuple[float, float]]]], levels: Sequence[float],
                  seeds: Sequence[int], *, axis: int = 0) -> list[float]:
    """The ``levels`` every seed of every front in ``fronts`` reaches (``axis`` 0: downstream, 1: R)."""
    out = []
    for lv in levels:
        ok = True
        for f in fronts:
            for s in seeds:
                xs = [p[axis] for p in f.get(s, ()) if not math.isnan(p[axis])]
                if not xs or not (min(xs) - 1e-12 <= lv <= max(xs) + 1e-12):
                    ok = False
        if ok:
            out.append(lv)
    return out


def compare(a: Mapping[int, Sequence[tuple[float, float]]], b: Mapping[int, Sequence[tuple[float, float]]],
            *, levels=DOWN_LEVELS, read: str = "retention") -> list[dict]:
    """``a - b`` read off both fronts at each level both reach on every shared seed, paired by seed:
    ``read="retention"``: R at matched downstream accuracy (levels: accuracies); ``"downstream"``:
    downstream accuracy at matched R (levels: %). Plus a row ``level=None``: the mean over those
    levels, per seed first (one number per seed for the whole shared range)."""
    seeds = sorted(set(a) & set(b))
    axis = 0 if read == "retention" else 1
    fn = retention_at if read == "retention" else downstream_at
    lv = common_levels([a, b], levels, seeds, axis=axis)
    rows, per_seed = [], {s: [] for s in seeds}
    for level in lv:
        va = [fn(a[s], level) for s in seeds]
        vb = [fn(b[s], level) for s in seeds]
        for s, x, y in zip(seeds, va, vb):
            per_seed[s].append(x - y)
        rows.append(_row(level, va, vb, seeds))
    if lv:
        d = [float(np.mean(per_seed[s])) for s in seeds]
        ma = [float(np.mean([fn(a[s], level) for level in lv])) for s in seeds]
        rows.append({**_row(None, ma, [x - y for x, y in zip(ma, d)], seeds)})
    return rows


def _row(level, va, vb, seeds) -> dict:
    ma, la, ha = stats.t_interval(va)
    mb, lb, hb = stats.t_interval(vb)
    md, lo, hi = stats.paired(va, vb)
    return {"level": level, "seeds": len(seeds), "a_mean": ma, "a_lo": la, "a_hi": ha, "b_mean": mb, "b_lo": lb, "b_hi": hb,
            "diff": md, "lo": lo, "hi": hi, "direction": stats.direction(lo, hi)}


def dominance(rows: list[dict], a: str, b: str) -> str:
    """Which front lies above where, in words, from :func:`compare`'s per-level rows."""
    parts = []
    for r in rows:
        if r["level"] is None:
            continue
        who = {"higher": a, "lower": b}.get(r["direction"], r["direction"] if r["direction"] == "not enough seeds" else None)
        parts.append((r["level"], who))
    if not parts:
        return "the fronts share no level on every seed"
    spans = []
    for level, who in parts:
        if spans and spans[-1][2] == who:
            spans[-1][1] = level
        else:
            spans.append([level, level, who])
    words = []
    for lo, hi, who in spans:
        rng = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        words.append(f"not enough seeds at {rng}" if who == "not enough seeds" else
                     f"{who} above at {rng}" if who else f"no difference detected at {rng}")
    return "; ".join(words)
