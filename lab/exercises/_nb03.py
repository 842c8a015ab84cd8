"""Exercises of notebook 03 (AWARe saliency): its objects ``study`` (the saliency profiles),
``reference`` (the largest upstream set), ``rho``, ``selections`` (the global and balanced masks)
and ``agreement`` (section 7's table)."""
from __future__ import annotations

from lab.exercises import register

NB = "03_aware_saliency"


def _frozen_pct(masks, target: str) -> float:
    from lab.experiments.aware.study import profile_tables as tables

    return 100 * float(tables.frozen_by_target({"m": masks})["m"][target])


@register("03.1", notebook=NB, kind="read", tol=0.06, unit="%", prompt="""
In section 6's table, what percent of the **k** rows (`k_proj`) does the global rule freeze at this
notebook's ρ?""", hint="""
The table's rows are the targets, its columns the two rules; read the k_proj row of the global column
(it is already in percent).""", why="A global ranking does not spread ρ evenly: narrow, flat layers go first.")
def _k_frozen(selections):
    return _frozen_pct(selections["global"], "k_proj")


@register("03.2", notebook=NB, kind="predict", options=("more", "less"), prompt="""
**Before running the next cell**, predict: at ρ = 0.1, will the global rule freeze more or less than
10 % of the **k** rows? Write `guess = "more"` or `guess = "less"`, then run the cell (it re-selects the
masks on the stored saliency, no model pass).""", hint="""
Look at section 6 again: at ρ = 0.3, did k get more or less than its 30 %? The same ranking decides at 0.1.""",
    why="The global rule sets one threshold for every layer: a target whose saliencies sit above it in bulk "
    "keeps more or less than its share at any ρ.")
def _k_at_01(study, reference):
    return "more" if _frozen_pct(study.select(reference, 0.1), "k_proj") > 10 else "less"


@register("03.3", notebook=NB, kind="compute", unit="rows", prompt="""
How many rows does the global rule freeze at this ρ, over every target together? Each entry of
`selections["global"]` is a boolean tensor per Linear, `True` = a frozen row.""", hint="""
Sum `mask.sum()` over the values of `selections["global"]` (and make it an int).""",
    why="About ρ times all target rows: the rule freezes ρ of the rows it ranks, wherever they are.")
def _rows_frozen(selections):
    return int(sum(int(m.sum()) for m in selections["global"].values()))


@register("03.4", notebook=NB, kind="read", options=lambda study, reference: tuple(
    l for l in study.labels if l != reference), prompt="""
In section 7 (the table and the Jaccard heatmap), which **calibration set** — not a rule — gives the
mask that agrees least with the reference mask? Answer with its label (e.g. `upstream-8`).""", hint="""
Compare the Jaccard of the calibration-set rows only (skip `weight-norm` and `random`, which are rules).""",
    why="The set whose ranking of the neurons differs most from the reference's.")
def _least_agreeing(agreement, study, reference):
    rows = agreement[agreement.compared.isin([l for l in study.labels if l != reference])]
    return str(rows.loc[rows.jaccard.idxmin(), "compared"])
