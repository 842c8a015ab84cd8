"""Exercises of notebook 04 (AWARe ablations): its object ``study`` (the shipped study, as
``study_views.load_study`` reads it). They read the per-run table (``study["runs"]``: one row per
variant, learning-rate scale and seed, with downstream accuracy and the upstream retention R, per
skill too) and the floors (``study["baselines"]``), which the study's views show."""
from __future__ import annotations

from lab.exercises import register

NB = "04_aware_ablations"


def _full(study):
    r = study["runs"]
    return r[r.method == "full"]


@register("04.1", notebook=NB, kind="compute", tol=0.06, unit="points", prompt="""
For full fine-tuning on the **smallest seed**, how many points of upstream retention R does it lose
from its smallest learning rate to its largest (`study["runs"]`: one row per method, rate scale and
seed)? Answer R at the smallest scale minus R at the largest, to one decimal.""", hint="""
Filter `study["runs"]` to `method == "full"` and the smallest `seed`, sort by `scale`, and subtract the
last row's R from the first row's.""", why="A larger rate learns more and keeps less: the front's two ends.")
def _r_lost_along_the_front(study):
    f = _full(study)
    f = f[f.seed == f.seed.min()].sort_values("scale")
    return float(f.R.iloc[0] - f.R.iloc[-1])


@register("04.2", notebook=NB, kind="read", options=("easy-VQA", "probe"), prompt="""
At its base learning rate (scale 1), which upstream skill does full fine-tuning damage more, on
average over its seeds: the visual one (easy-VQA) or the text one (the probe)?""", hint="""
Compare full fine-tuning's R per skill at scale 1 (the R easy-VQA and R probe columns): the lower one
lost more.""", why="R per skill is the skill's accuracy after over before: the lower one was damaged more.")
def _skill_damaged(study):
    f = _full(study)
    f = f[(f.scale - 1).abs() < 1e-9]
    return "easy-VQA" if f.R_easy_vqa.mean() < f.R_probe.mean() else "probe"


@register("04.3", notebook=NB, kind="read", tol=0.001, prompt="""
What accuracy (0 to 1) does always giving the **most common answer** reach on the downstream set?
(section 1's table of floors)""", hint="Read the downstream row whose reference is the most common answer.",
    why="A model that learned nothing can reach this; 'learned' means a lower bound above it.")
def _majority_floor(study):
    b = study["baselines"]
    row = b[b.set.str.startswith("downstream") & (b.reference == "most common answer")]
    return float(row.acc.iloc[0])


@register("04.4", notebook=NB, kind="predict", options=("up", "down"), prompt="""
**Before looking at the learning-rate fronts**, predict: as full fine-tuning's learning rate grows from
its smallest scale to its largest, does its mean upstream retention R go up or down? Write
`guess = "up"` or `"down"`, then look and check.""", hint="""
A larger rate moves the weights further from what they were: compare full fine-tuning's mean R at its
smallest and largest scale.""", why="R compares each upstream skill after and before: the larger the move, the more is lost.")
def _r_with_rate(study):
    f = _full(study)
    by = f.groupby("scale").R.mean().sort_index()
    return "down" if by.iloc[-1] < by.iloc[0] else "up"
