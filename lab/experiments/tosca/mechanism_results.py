"""The mechanism study (``results/tosca/mechanism``, :mod:`.mechanism`) read back: per-regime means
with 95 % intervals over seeds and the verdicts on the paper's claim (:mod:`.mechanism_views` turns
them into sentences, tables, figures and the README).

Intervals follow the lab's one rule (:mod:`lab.stats`): a 95 % t-interval over per-seed values; a
difference (overlap minus chance, L1 against none) is computed per seed first. The claim, in two parts:

Regimes whose gates are dead — mean |g − 0.5| below :data:`DEAD` (0.001), under 2 % of a freshly
initialised module's (about 0.06) — select no dimensions, so no overlap test counts them (a few
residual dimensions can still pass the 0.01 floor there, and would be compared as if selected).

1. *L1 makes the modules' active dimensions overlap less than chance.* Per regime (scenario, L1 > 0,
   epochs, gates alive), two paired tests over seeds: Jaccard minus its permutation null's mean (expected lower
   than 0), and that excess minus the excess without L1 (expected lower). **Reproduced** where both
   hold somewhere; **contradicted** where nowhere they hold and somewhere both point the other way
   (L1 leaves more overlap than chance *and* more than without L1); otherwise **not detected**.
2. *Less overlap goes with better routing.* Per seed, the correlation across L1 strengths (where
   the overlap is defined) of the Jaccard excess with routing accuracy and with A_B; its interval
   over seeds is the t-interval of Fisher's z = atanh(r), mapped back by tanh (so it stays within
   ±1; expected below 0). Reproduced where one is and none is above 0, contradicted the other way
   round, otherwise not detected.

    python -m lab.experiments.tosca.mechanism_views [FOLDER]           # summary.csv, verdicts.csv, README.md
    python -m lab.experiments.tosca.mechanism_views --check [FOLDER]   # re-run two runs here, compare
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lab import stats

from .mechanism import TABLES

FOLDER = Path(__file__).resolve().parents[3] / "results" / "tosca" / "mechanism"
COMMAND = "lab tosca study mechanism --out results/tosca/mechanism"
REFERENCE = (5e-4, 20)      # the reference's L1 and epochs
DEAD = 1e-3                 # a regime's gates are dead below this seed-mean |g - 0.5| (fresh modules: ~0.06)
# what each measure is, for tables and axes (one quantity each)
LABELS = {
    "weight_near_zero": "weight-matrix entries with |w| < 1e-3 (fraction)",
    "gate_departure": "mean |gate − 0.5| on the task's own images",
    "gate_departure_init": "mean |gate − 0.5| at initialisation",
    "gate_open": "gates open (> 0.9), fraction",
    "gate_closed": "gates closed (< 0.1), fraction",
    "active_size": "active dimensions per task",
    "jaccard": "Jaccard index of active dimensions, mean over task pairs",
    "jaccard_null": "Jaccard index expected by chance (same set sizes at random)",
    "jaccard_excess": "Jaccard index minus chance",
    "cosine": "cosine of centred mean gates, mean over task pairs",
    "cosine_null": "cosine expected by chance (dimensions shuffled)",
    "cosine_excess": "cosine minus chance",
    "routing_accuracy": "routing accuracy, per-sample entropy (%)",
    "A_B": "A_B, per-sample entropy routing (%)",
    "A_B_oracle": "A_B with the true task's module (%)",
    "avg_inc_acc": "Ā, per-sample entropy routing (%)",
    "old_tasks_acc": "accuracy on the earlier tasks, last stage (%)",
    "new_task_acc": "accuracy on the newest task, last stage (%)",
}


@dataclass
class Mechanism:
    folder: Path
    manifest: dict
    runs: pd.DataFrame
    modules: pd.DataFrame
    parts: pd.DataFrame
    pairs: pd.DataFrame

    @property
    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(self.runs.scenario))

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs.seed.unique().tolist())


def table_hashes(out) -> dict:
    """sha256 of each table the study writes (recorded in its manifest; :func:`load` checks them)."""
    from lab import _manifest

    return _manifest.digests(out, TABLES)


def load(folder=None) -> Mechanism:
    """The study in ``folder`` (default ``results/tosca/mechanism``), each table checked against the
    sha256 its manifest records (one line naming the file when anything is wrong)."""
    from lab import _manifest

    folder = Path(folder or FOLDER)
    mpath = folder / "manifest.json"
    if not mpath.is_file():
        raise FileNotFoundError(f"no mechanism study in {folder}: run `lab tosca study mechanism --out {folder}`")
    fix = f"rerun `lab tosca study mechanism --out {folder}`"
    manifest = _manifest.read(mpath, fix=fix)
    paths = _manifest.verify(folder, manifest, mpath, TABLES, fix=fix)
    tables = {n: _manifest.read_csv_table(paths[n], rows=True) for n in TABLES}
    for name in ("modules.csv",):
        for c in ("active_dims", "active_gates"):
            tables[name][c] = tables[name][c].fillna("").astype(str)
    return Mechanism(folder, manifest, *(tables[n] for n in TABLES))


# --- numbers -------------------------------------------------------------------------------------
def l1_text(x: float) -> str:
    """0, 1e-4, 5e-4, ... as a reader writes them."""
    if x == 0:
        return "0"
    e = int(math.floor(math.log10(x)))
    m = x / 10 ** e
    return f"{m:.0f}e{e}" if abs(m - round(m)) < 1e-9 else f"{x:g}"


def _with_excess(runs: pd.DataFrame) -> pd.DataFrame:
    return runs.assign(jaccard_excess=runs.jaccard - runs.jaccard_null, cosine_excess=runs.cosine - runs.cosine_null)


def per_run(m: Mechanism) -> pd.DataFrame:
    """``runs.csv`` with the excess over chance and each part's near-zero fraction (mean over tasks)."""
    parts = m.parts.pivot_table(index=["scenario", "seed", "l1", "epochs"], columns="part", values="near_zero",
                                aggfunc="mean")
    parts.columns = [f"near zero: {c}" for c in parts.columns]
    return _with_excess(m.runs).merge(parts.reset_index(), on=["scenario", "seed", "l1", "epochs"])


def summary(m: Mechanism) -> pd.DataFrame:
    """Tidy: per scenario, L1, epochs and measure, the seeds and the mean with its 95 % t-interval."""
    runs = per_run(m)
    measures = [c for c in runs.columns if c not in ("scenario", "seed", "l1", "epochs", "tasks")]
    rows = []
    for (scn, l1, ep), g in runs.groupby(["scenario", "l1", "epochs"], sort=False):
        for c in measures:
            mean, lo, hi = stats.t_interval(g[c].tolist())
            rows.append({"scenario": scn, "l1": l1, "epochs": ep, "measure": c, "seeds": int(g[c].notna().sum()),
                         "mean": mean, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def stat(m: Mechanism, scenario: str, l1: float, epochs: int, measure: str) -> tuple[float, float, float]:
    g = _with_excess(m.runs)
    g = g[(g.scenario == scenario) & np.isclose(g.l1, l1) & (g.epochs == epochs)]
    return stats.t_interval(g[measure].tolist())


def iv(mean: float, lo: float, hi: float, digits: int = 3) -> str:
    """'0.078 [0.071, 0.085]'; without an interval the mean alone; 'n/a' without a mean."""
    if not math.isfinite(mean):
        return "n/a"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _seeded(runs, scenario, l1, epochs, col) -> pd.Series:
    g = runs[(runs.scenario == scenario) & np.isclose(runs.l1, l1) & (runs.epochs == epochs)]
    return g.set_index("seed")[col]


def alive(m: Mechanism, scenario: str, l1: float, epochs: int) -> bool:
    """Whether a regime's gates still gate: seed-mean |g − 0.5| at least :data:`DEAD`."""
    return bool(_seeded(m.runs, scenario, l1, epochs, "gate_departure").mean() >= DEAD)


def overlap_tests(m: Mechanism) -> pd.DataFrame:
    """Per scenario, epochs and L1: whether the gates are alive; the Jaccard index minus chance (seed by
    seed, then its interval; expected below 0) and, for L1 > 0, that excess minus the excess without
    L1 (paired by seed; expected below 0); the cosine minus chance beside them (a direction, no claim).
    Dead regimes get no verdicts."""
    runs = _with_excess(m.runs)
    rows = []
    for (scn, ep), g in runs.groupby(["scenario", "epochs"], sort=False):
        for l1 in sorted(g.l1.unique()):
            live = alive(m, scn, l1, ep)
            ex = _seeded(runs, scn, l1, ep, "jaccard_excess")
            ex = ex if live else ex * np.nan
            mean, lo, hi = stats.t_interval(ex.tolist())
            row = {"scenario": scn, "epochs": ep, "l1": l1, "alive": live, "seeds": int(ex.notna().sum()),
                   "active_size": float(_seeded(runs, scn, l1, ep, "active_size").mean()),
                   "excess": mean, "excess_lo": lo, "excess_hi": hi,
                   "vs_chance": stats.verdict(lo, hi, expect="lower")}
            c = stats.t_interval((_seeded(runs, scn, l1, ep, "cosine_excess") * (1 if live else np.nan)).tolist())
            row.update(cosine_excess=c[0], cosine_lo=c[1], cosine_hi=c[2], cosine_vs_chance=stats.direction(*c[1:]))
            if l1 > 0:
                base = _seeded(runs, scn, 0.0, ep, "jaccard_excess")
                a, b = ex.align(base, join="inner")
                d = stats.paired(a.tolist(), b.tolist())
                row.update(vs_none=d[0], vs_none_lo=d[1], vs_none_hi=d[2], vs_none_verdict=stats.verdict(*d[1:], expect="lower"))
            rows.append(row)
    return pd.DataFrame(rows)


def _pearson(x, y) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = np.asarray(x)[ok], np.asarray(y)[ok]
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def correlation_tests(m: Mechanism) -> pd.DataFrame:
    """Per scenario, epochs and accuracy (routing accuracy, A_B): the Pearson correlation across L1
    strengths whose gates are alive of the Jaccard excess with it, per seed (where at least three L1
    strengths leave the overlap defined), and its 95 % t-interval over seeds on Fisher's z, mapped back
    to r (the claim expects it below 0)."""
    runs = _with_excess(m.runs)
    live = {(s, l1, e) for s, l1, e in runs[["scenario", "l1", "epochs"]].drop_duplicates().itertuples(index=False)
            if alive(m, s, l1, e)}
    runs = runs[[(s, l1, e) in live for s, l1, e in zip(runs.scenario, runs.l1, runs.epochs)]]
    rows = []
    for (scn, ep), g in runs.groupby(["scenario", "epochs"], sort=False):
        for metric in ("routing_accuracy", "A_B"):
            r = [_pearson(s.jaccard_excess.to_numpy(), s[metric].to_numpy()) for _, s in g.groupby("seed")]
            z = [float(np.arctanh(np.clip(x, -0.999, 0.999))) for x in r]
            mean, lo, hi = (float(np.tanh(v)) for v in stats.t_interval(z))
            rows.append({"scenario": scn, "epochs": ep, "metric": metric, "seeds": int(np.isfinite(r).sum()),
                         "r": mean, "lo": lo, "hi": hi, "verdict": stats.verdict(lo, hi, expect="lower")})
    return pd.DataFrame(rows)


def _claim(verdicts: list[str]) -> str:
    pro, con = "reproduced" in verdicts, "contradicted" in verdicts
    return "reproduced" if pro and not con else "contradicted" if con and not pro else "not detected"


def claims(m: Mechanism) -> pd.DataFrame:
    """The two parts of the claim per scenario, each a computed verdict with the regimes behind it."""
    ov, co = overlap_tests(m), correlation_tests(m)
    rows = []
    for scn in m.scenarios:
        o = ov[(ov.scenario == scn) & (ov.l1 > 0)]
        holds = o[(o.vs_chance == "reproduced") & (o.vs_none_verdict == "reproduced")]
        against = o[(o.vs_chance == "contradicted") & (o.vs_none_verdict == "contradicted")]
        v = "reproduced" if len(holds) else "contradicted" if len(against) else "not detected"
        where = holds if len(holds) else against
        rows.append({"scenario": scn, "claim": "L1 makes the active dimensions overlap less than chance", "verdict": v,
                     "regimes": "; ".join(f"L1 {l1_text(r.l1)}, {r.epochs} epochs" for r in where.itertuples())})
        c = co[co.scenario == scn]
        v2 = _claim(c.verdict.tolist())
        pick = c[c.verdict == ("contradicted" if v2 == "contradicted" else "reproduced")]
        rows.append({"scenario": scn, "claim": "less overlap goes with higher routing accuracy or A_B", "verdict": v2,
                     "regimes": "; ".join(f"{LABELS[r.metric].split(',')[0].split(' (')[0]}, {r.epochs} epochs"
                                          for r in pick.itertuples())})
    return pd.DataFrame(rows)


def verdicts(m: Mechanism) -> pd.DataFrame:
    """``verdicts.csv``: every test (overlap against chance and against no L1, per regime; the
    correlations) and the claim-level verdicts, tidy."""
    rows = []
    for r in overlap_tests(m).itertuples():
        rows.append({"scenario": r.scenario, "test": "Jaccard minus chance", "l1": r.l1, "epochs": r.epochs,
                     "mean": r.excess, "lo": r.excess_lo, "hi": r.excess_hi, "seeds": r.seeds, "expect": "lower",
                     "verdict": r.vs_chance})
        if r.l1 > 0:
            rows.append({"scenario": r.scenario, "test": "Jaccard minus chance, L1 minus none", "l1": r.l1,
                         "epochs": r.epochs, "mean": r.vs_none, "lo": r.vs_none_lo, "hi": r.vs_none_hi,
                         "seeds": r.seeds, "expect": "lower", "verdict": r.vs_none_verdict})
        rows.append({"scenario": r.scenario, "test": "cosine minus chance", "l1": r.l1, "epochs": r.epochs,
                     "mean": r.cosine_excess, "lo": r.cosine_lo, "hi": r.cosine_hi, "seeds": r.seeds, "expect": "",
                     "verdict": r.cosine_vs_chance})
    for r in correlation_tests(m).itertuples():
        rows.append({"scenario": r.scenario, "test": f"correlation across L1: Jaccard minus chance with {r.metric}",
                     "l1": float("nan"), "epochs": r.epochs, "mean": r.r, "lo": r.lo, "hi": r.hi, "seeds": r.seeds,
                     "expect": "lower", "verdict": r.verdict})
    for r in claims(m).itertuples():
        rows.append({"scenario": r.scenario, "test": f"claim: {r.claim}", "l1": float("nan"), "epochs": float("nan"),
                     "mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "seeds": len(m.seeds), "expect": "",
                     "verdict": r.verdict + (f" ({r.regimes})" if r.regimes else "")})
    return pd.DataFrame(rows)


def shown_regime(m: Mechanism, scenario: str) -> tuple[float, int]:
    """The regime the heatmap shows: where the claim holds most strongly (the lowest Jaccard excess
    among the regimes that reproduce it), else the reference's (L1 5e-4, 20 epochs)."""
    o = overlap_tests(m)
    o = o[(o.scenario == scenario) & (o.l1 > 0) & (o.vs_chance == "reproduced") & (o.vs_none_verdict == "reproduced")]
    if len(o):
        best = o.sort_values("excess").iloc[0]
        return float(best.l1), int(best.epochs)
    return REFERENCE


def dead_from(m: Mechanism, scenario: str, epochs: int) -> float | None:
    """The smallest L1 from which on every stronger L1 leaves the gates dead (:func:`alive`), or None."""
    l1s = sorted(m.runs[(m.runs.scenario == scenario) & (m.runs.epochs == epochs)].l1.unique())
    out = None
    for l1 in reversed(l1s):
        if alive(m, scenario, l1, epochs):
            break
        out = l1
    return out


DERIVED = ("summary.csv", "verdicts.csv", "README.md")


def check(m: Mechanism, n: int = 2, log=print) -> bool:
    """Re-run the study's ``n`` cheapest runs here, on the sources as they are now, and compare every
    number of their ``runs.csv`` rows (the CSV keeps 4 decimals): whether this code still gives the
    shipped numbers. Prints one line per run and returns True when all match."""
    from .mechanism import Variant, run_one

    runs = m.runs.assign(cost=m.runs.epochs * m.runs.tasks).sort_values(["cost", "seed", "l1"], kind="stable")
    ok = True
    for r in runs.head(n).itertuples():
        got = run_one(Variant(r.scenario, int(r.seed), float(r.l1), int(r.epochs)))["run"]
        diff = {k: (getattr(r, k), v) for k, v in got.items()
                if k != "train_s" and hasattr(r, k) and not (abs(getattr(r, k) - v) <= 1e-4 + 1e-9 or
                                                              (math.isnan(getattr(r, k)) and math.isnan(v)))}
        ok &= not diff
        log(f"{r.scenario} seed {r.seed} L1 {l1_text(r.l1)} {r.epochs} epochs: "
            + ("every number reproduced" if not diff else f"DIFFERS: {diff}"))
    return ok


# --- a notebook's scenario -----------------------------------------------------------------------------
def scenario_for(m: Mechanism, datasets) -> tuple[str, str]:
    """The study's scenario for a notebook's ``datasets`` and a line saying which one is shown."""
    want = "+".join(datasets) if not isinstance(datasets, str) else datasets
    if want in m.scenarios:
        return want, f"The mechanism study's views below are of {want}, this notebook's scenario."
    return m.scenarios[0], (f"The mechanism study has no {want}: its views below are of {m.scenarios[0]} "
                            f"(it ran {', '.join(m.scenarios)}).")
