"""Exercises of notebook 02 (TOSCA): its objects ``tosca_matrix`` (section 3), ``summary`` (section 2),
``by_order`` (section 8) and ``off`` (section 5, the off-diagonal task pairs)."""
from __future__ import annotations

from lab.exercises import register

NB = "02_tosca_sparsity_orthogonality"


@register("02.1", notebook=NB, kind="read", tol=0.06, unit="%", prompt="""
In the accuracy matrix of section 3, what is TOSCA's accuracy on task 0 after the **last** stage?""",
    hint="Row 'task 0', the right-most column (the last stage b).",
    why="Task 0's module is frozen; what moved its accuracy since stage 0 is routing among more modules.")
def _task0_last(tosca_matrix):
    return float(tosca_matrix.iloc[0, -1])


@register("02.2", notebook=NB, kind="compute", tol=0.02, unit="points", prompt="""
Compute the price of routing: TOSCA's $A_B$ under oracle routing minus its $A_B$ under per-sample
routing, in points (section 2's table).""", hint="""
Take the `last_acc` of the rows 'tosca (oracle)' and 'tosca (per-sample)' of `summary` and subtract.""",
    why="The oracle knows each image's task; the gap is what entropy routing gives away.")
def _routing_price(summary):
    s = summary.set_index("method (routing)")["last_acc"]
    return float(s["tosca (oracle)"] - s["tosca (per-sample)"])


@register("02.3", notebook=NB, kind="predict", options=("better", "worse", "the same"), prompt="""
**Before running section 8**, predict: with a *shuffled* test set in batches of 48, will per-batch
routing be better, worse or the same as per-sample routing (batch 1)? Write `guess = ...`, run the
section, then check.""", hint="""
In a shuffled batch of 48 the images come from every task, yet one module must answer for all of them.""",
    why="On a shuffled stream a batch mixes tasks, yet one module answers for all of them.")
def _shuffled_48(by_order):
    sh = by_order[by_order.order == "shuffled"].set_index("batch_size").accuracy
    one = float(by_order[by_order.batch_size == 1].accuracy.iloc[0])
    b48 = float(sh.loc[48])
    return "the same" if abs(b48 - one) < 1e-9 else ("better" if b48 > one else "worse")
