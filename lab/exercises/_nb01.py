"""Exercises of notebook 01 (ventral stream vs prefrontal cortex): its objects ``probe`` (section 2),
``cka`` (section 4), ``drift`` (section 6) and ``adapt`` (section 5). The notebook's exercise cells
pass them by name, e.g. ``exercises.check("01.1", answer, probe=probe)``."""
from __future__ import annotations

from lab.exercises import register

NB = "01_ventral_vs_prefrontal"


@register("01.1", notebook=NB, kind="read", options=lambda probe: tuple(probe.stage), prompt="""
In the figure of section 2, which stage of the frozen stream has the highest linear-probe accuracy?""",
    hint="Follow the linear-probe line to its highest point and read the stage under it.",
    why="Decodability need not peak at the last stage: the deepest stages were shaped for ImageNet's classes.")
def _best_stage(probe):
    return str(probe.loc[probe.linear_probe.idxmax(), "stage"])


@register("01.2", notebook=NB, kind="read", tol=0.006, prompt="""
In the CKA heatmap of section 4, what is the linear CKA between the first stage (the stem) and the
last (the head), to two decimals?""", hint="Read the cell in the stem row and the head column.",
    why="The head is far from the pixels: the stream drifts away from the stem with depth.")
def _stem_head(cka):
    return float(cka.iloc[0, -1])


@register("01.3", notebook=NB, kind="predict", options=lambda drift: tuple(
    s for s in dict.fromkeys(drift.stage) if s != "decision point"), prompt="""
**Before running section 6**, predict: at which stage will full fine-tuning's CKA (before vs after)
be lowest? Write `guess = "<stage>"`, run section 6, then check.""", hint="""
The change compounds with depth, and BatchNorm statistics shift every stage: look at the deepest stages.""",
    why="Each stage reads the changed output of the one before, so the change accumulates towards the head.")
def _most_changed(drift):
    ft = drift[(drift.method == "full fine-tuning") & (drift.stage != "decision point")]
    return str(ft.loc[ft.cka.idxmin(), "stage"])


@register("01.4", notebook=NB, kind="compute", rtol=0.02, unit="x", prompt="""
How many times more parameters does full fine-tuning train than TOSCA for this task (section 5's table)?""",
    hint="Divide the 'trained parameters' of the full fine-tuning row by TOSCA's.",
    why="Full fine-tuning trains the whole backbone and a head; TOSCA one LuCA module and its head rows.")
def _parameter_ratio(adapt):
    p = adapt.set_index("method")["trained parameters"]
    return float(p["full fine-tuning"] / p["TOSCA"])
