"""Exercises of notebook 05 (your own router): its objects ``comp`` (the per-seed results of every
router), ``diffs`` (the paired differences) and ``mine`` (your router's name)."""
from __future__ import annotations

from lab.exercises import register

NB = "05_your_own_idea"
NOT_METHODS = ("oracle", "per-batch")   # an upper bound and a test protocol, not routers to rank


def _builtins(comp):
    return [r for r in comp.builtins if r not in NOT_METHODS]


@register("05.1", notebook=NB, kind="read", options=_builtins, prompt="""
In the table of section 4, which built-in router (not `oracle`) has the highest mean $A_B$?""", hint="""
Compare the A_B (%) column of the built-in rows only; `oracle` is an upper bound, not a router to beat.""",
    why="The means are over seeds; whether two of them differ is what the paired intervals of section 5 answer.")
def _best_builtin(comp):
    return max(_builtins(comp), key=lambda r: float(comp.per_seed(r).mean()))


@register("05.2", notebook=NB, kind="compute", tol=0.01, unit="points", prompt="""
Compute, for the **first** seed, your router's $A_B$ minus per-sample entropy's $A_B$, in points.
`comp.per_seed(router)` gives a router's $A_B$ per seed.""", hint="""
Take `comp.per_seed(mine)` and `comp.per_seed("per-sample")`, subtract them and read the first seed's
entry (they are indexed by seed, sorted).""",
    why="One seed's difference; section 5's interval is the t-interval of these differences over every seed.")
def _first_seed_difference(comp, mine):
    d = comp.per_seed(mine) - comp.per_seed("per-sample")
    return float(d.iloc[0])


@register("05.3", notebook=NB, kind="predict", options=("wider", "narrower", "the same"), prompt="""
**Before running the next cell**, predict: computed from the **first two seeds only**, is the 95 %
interval of (your router − per-sample) on $A_B$ wider, narrower or the same as with every seed? Write
`guess = "wider"`, `"narrower"` or `"the same"`, then run the cell.""", hint="""
The half-width is t(0.975, n−1) · sd / √n: with fewer seeds both t and 1/√n grow (and with exactly two
seeds in the notebook, both intervals use the same seeds).""",
    why="Fewer seeds: a larger t quantile and a larger 1/√n, so the interval widens unless the spread shrinks a lot.")
def _fewer_seeds(comp, mine):
    from lab.experiments.tosca.compare import t_interval

    d = (comp.per_seed(mine) - comp.per_seed("per-sample")).dropna()
    full, two = t_interval(d.tolist())[1], t_interval(d.iloc[:2].tolist())[1]
    if abs(full - two) < 1e-9 or len(d) <= 2:
        return "the same"
    return "wider" if two > full else "narrower"


@register("05.4", notebook=NB, kind="read", prompt="""
In the figure of paired differences (section 5), against how many built-in routers does your router
get the verdict **better** on $A_B$?""", hint="""
Count the points coloured as "better": their interval lies entirely right of zero.""",
    why="A verdict is one 95 % interval; with several comparisons, one in twenty can be chance.")
def _better_count(diffs, mine):
    d = diffs[mine]
    return int(((d.metric == "last_acc") & (d.verdict == "better")).sum())
