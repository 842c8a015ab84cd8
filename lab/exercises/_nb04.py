"""Exercises of notebook 04 (AWARe ablations): its object ``study`` (the shipped study, as
``study_views.load_study`` reads it). They read the per-run table (``study["runs"]``: one row per
variant and seed with R, E, H) and the floors (``study["baselines"]``), which every version of the
study's views shows."""
from __future__ import annotations

from lab.exercises import register

NB = "04_aware_ablations"


def _runs(study, method: str):
    r = study["runs"]
    return r[r.method == method]


@register("04.1", notebook=NB, kind="compute", tol=0.06, prompt="""
Compute $H = 2RE/(R + E)$ for the AWARe run of the methods group with the **smallest seed**, from its
own R and E (`study["runs"]`), to one decimal.""", hint="""
Filter `study["runs"]` to `variant == "methods/aware"`, take the row with the smallest `seed`, then
apply the formula to its R and E columns.""", why="H is high only when a run both keeps (R) and learns (E).")
def _h_first_aware(study):
    r = study["runs"]
    row = r[r.variant == "methods/aware"].sort_values("seed").iloc[0]
    return float(2 * row.R * row.E / (row.R + row.E))


@register("04.2", notebook=NB, kind="read", options=("easy-VQA", "probe"), prompt="""
Which upstream skill does full fine-tuning damage more, on average over its seeds: the visual one
(easy-VQA) or the text one (the probe)?""", hint="""
Compare full fine-tuning's mean R per skill (the R easy-VQA and R probe columns of the methods table).""",
    why="R per skill is the skill's accuracy after over before: the lower one was damaged more.")
def _skill_damaged(study):
    f = _runs(study, "full")
    return "easy-VQA" if f.R_easy_vqa.mean() < f.R_probe.mean() else "probe"


@register("04.3", notebook=NB, kind="read", tol=0.001, prompt="""
What accuracy (0 to 1) does always giving the **most common answer** reach on the downstream set?
(section 1's table of floors)""", hint="Read the downstream row whose reference is the most common answer.",
    why="A model that learned nothing can reach this; 'learned' means a lower bound above it.")
def _majority_floor(study):
    b = study["baselines"]
    row = b[b.set.str.startswith("downstream") & (b.reference == "most common answer")]
    return float(row.acc.iloc[0])


@register("04.4", notebook=NB, kind="predict", options=("higher", "lower"), prompt="""
**Before looking at section 2**, predict: is LoRA's mean R higher or lower than full fine-tuning's?
Write `guess = "higher"` or `"lower"`, then read section 2 and check.""", hint="""
LoRA trains a low-rank update beside frozen weights; compare the R bars of the two methods.""",
    why="R compares each upstream skill after and before: the method that moved them less keeps more.")
def _lora_vs_full(study):
    return "higher" if _runs(study, "lora").R.mean() > _runs(study, "full").R.mean() else "lower"
