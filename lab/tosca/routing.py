"""Inference for TOSCA: one backbone feature per image, every task module on it, entropy routing.

(docs/tosca.md, "Inference: entropy routing".) For module i, ``logits_i = head(LuCA_i(f))`` over every class seen so
far; the module with the lowest softmax entropy answers. Routings:

* ``per-sample`` (default, honest): each test image picks its own module.
* ``per-batch`` (the reference protocol): the entropy is averaged over a batch and ONE module
  answers for the whole batch. The reference's test loader is ordered class by class and not
  shuffled, so a batch is nearly one class and the choice leaks the task grouping. We reproduce
  that order (stable sort by label) and batch size (48), and record both with every result.
* ``oracle``: the module of the sample's true task (an upper bound, not a method).

Routing accuracy: the fraction of samples routed to their own task's module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ROUTINGS = ("per-sample", "per-batch", "oracle")
PER_BATCH_ORDER = "class-ordered (stable sort by incremental label, as the reference's test loader)"


def check_routing(name: str) -> str:
    if name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; valid routings: {', '.join(ROUTINGS)}")
    return name


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Softmax entropy over the last axis (nats): ``[..., C] -> [...]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def choose(ent: torch.Tensor, routing: str, *, task_ids: torch.Tensor | None = None,
           labels: torch.Tensor | None = None, batch_size: int = 48) -> torch.Tensor:
    """Module index per sample ``[N]`` from entropies ``ent [T, N]``.

    ``task_ids`` (true task per sample) is needed by 'oracle'; ``labels`` by 'per-batch' only to
    build the reference's class-ordered test order.
    """
    check_routing(routing)
    if routing == "per-sample":
        return ent.argmin(0)
    if routing == "oracle":
        if task_ids is None:
            raise ValueError("oracle routing needs the true task ids")
        return task_ids.to(ent.device).long()
    if labels is None:
        raise ValueError("per-batch routing needs the labels to build the reference's class-ordered test order")
    if batch_size < 1:
        raise ValueError(f"per-batch routing needs batch_size >= 1 (got {batch_size})")
    order = torch.sort(labels.to(ent.device), stable=True).indices
    choice = torch.empty(ent.shape[1], dtype=torch.long, device=ent.device)
    for idx in order.split(batch_size):
        choice[idx] = ent[:, idx].mean(1).argmin()
    return choice


def predict(logits: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """Class predictions ``[N]`` from ``logits [T, N, C]`` and the chosen module per sample ``[N]``."""
    n = torch.arange(logits.shape[1], device=logits.device)
    return logits[choice.to(logits.device), n].argmax(-1)


@dataclass
class Routed:
    routing: str
    preds: torch.Tensor  # [N] predicted class
    choice: torch.Tensor  # [N] module used
    routing_accuracy: float  # fraction routed to their own task's module (NaN without task ids)
    batch_size: int | None = None  # per-batch only
    order: str | None = None  # per-batch only


def route(logits: torch.Tensor, routing: str, *, task_ids: torch.Tensor | None = None,
          labels: torch.Tensor | None = None, batch_size: int = 48) -> Routed:
    """Apply one routing to precomputed ``logits [T, N, C]`` (T learned modules)."""
    ent = entropy(logits)
    choice = choose(ent, routing, task_ids=task_ids, labels=labels, batch_size=batch_size)
    racc = float((choice.cpu() == task_ids.cpu()).float().mean()) if task_ids is not None else float("nan")
    per_batch = routing == "per-batch"
    return Routed(routing, predict(logits, choice).cpu(), choice.cpu(), racc,
                  batch_size if per_batch else None, PER_BATCH_ORDER if per_batch else None)
