"""Exercises of notebook 00 (quickstart): its objects ``bb``, ``train``, ``test``, ``per_class``,
``protos``, ``accuracy``."""
from __future__ import annotations

from lab.exercises import register

NB = "00_quickstart"


@register("00.1", notebook=NB, kind="read", unit="numbers", prompt="""
How many numbers describe one image at the decision point — the length of the feature vector the
backbone hands to everything later in the lab? Read it off the table of section 1.""", hint="""
It is the backbone's feature dimension: one column of the table in section 1 (`bb.feature_dim`).""",
    why="The backbone's pooled pre-logits vector: TOSCA's modules and every probe read it.")
def _feature_dim(bb):
    return int(bb.feature_dim)


@register("00.2", notebook=NB, kind="read", prompt="""
In the per-class bar chart, which class does the nearest-prototype read-out get right least
often? Answer with its name as the chart writes it.""", hint="""
Find the shortest bar of the per-class chart (or sort the table above it by accuracy).""",
    options=lambda per_class: tuple(per_class["class"]),
    why="Its test images most often lie nearer another class's mean than their own.")
def _worst_class(per_class):
    return str(per_class.loc[per_class["accuracy"].idxmin(), "class"])


@register("00.3", notebook=NB, kind="compute", tol=0.002, prompt="""
Compute the nearest-prototype accuracy (a fraction, 0 to 1) when each class mean is built from only
the **first 10 training images of that class** (in the order of `train.labels`).
`probes.prototypes(features, labels)` builds class means from any subset.""", hint="""
Select, for every class c, the first 10 indices where `train.labels == c`; build the prototypes from
those features and labels; then score `probes.prototype_predict(...)` on every test image, as section 5 does.""",
    why="Compare it with section 5's accuracy from every training image: how much do the other images add?")
def _ten_per_class(train, test):
    import torch

    from lab import probes

    keep = torch.cat([torch.nonzero(train.labels == c).squeeze(1)[:10] for c in torch.unique(train.labels)])
    protos = probes.prototypes(train.features[keep], train.labels[keep])
    return float((probes.prototype_predict(protos, test.features) == test.labels).float().mean())


@register("00.4", notebook=NB, kind="predict", options=("higher", "lower"), prompt="""
**Before running the next cell**, predict: is the read-out's accuracy on the *training* images
higher or lower than on the test images? Write `guess = "higher"` or `guess = "lower"`, then run
the cell: it measures both and checks your guess.""", hint="""
The class means were computed from the training images themselves; compare the two accuracies the
cell prints.""", why="Each class mean is the training images' own average, yet an average of hundreds barely "
    "depends on any one of them: compare the two accuracies the cell prints.")
def _train_vs_test(protos, train, accuracy):
    from lab import probes

    train_acc = float((probes.prototype_predict(protos, train.features) == train.labels).float().mean())
    return "higher" if train_acc > accuracy else "lower"
