"""Sparsity and orthogonality of the learned LuCA modules, and the entropy routing's raw material
(docs/tosca.md, "Sparsity and orthogonality"). Pure functions of a trained :class:`~lab.tosca.learner.Tosca`
and features; every result is a tidy DataFrame for the notebooks.

Definitions (ours, stated because the paper gives none):
* gate: the calibrator's sigmoid output s(h) in (0, 1) per dimension. L1 drives the SE weights to
  zero, which drives the gate to the neutral 0.5 — so "closed" means gate < ``closed`` (default .1)
  and a dimension's *use* by a task is how far its mean gate on that task's data departs from 0.5.
* active dimensions of a task: the ``top`` fraction (default 10%) of dimensions with the largest
  |mean gate - 0.5| on the task's own data (dimensions at exactly the neutral 0.5 are never active:
  a strong L1 can leave a task with none, and then its Jaccard overlaps are NaN).
* overlap of tasks i, j: cosine of their centred mean-gate vectors (mean gate - 0.5) and Jaccard of
  their active-dimension sets.
* weight sparsity: fraction of weights with |w| < ``threshold`` (default 1e-3) and the L1 mass Σ|w|.
"""
from __future__ import annotations

import numpy as np
import torch

from lab.tosca.learner import Tosca, ToscaConfig
from lab.tosca.routing import entropy


def _frame(rows):
    import pandas as pd

    return pd.DataFrame(rows)


def _need_gate(model: Tosca) -> None:
    if model.config.flow == "adapter":
        raise ValueError("flow 'adapter' has no calibrator gate")


@torch.no_grad()
def gates(model: Tosca, x: torch.Tensor) -> torch.Tensor:
    """Every module's gate on the same features: ``[T, N, d]``."""
    _need_gate(model)
    x = x.to(model.config.device, torch.float32)
    return torch.stack([m.gate(m.gate_input(x)) for m in model.luca]).cpu()


def weight_sparsity(model: Tosca, threshold: float = 1e-3):
    """Per task and part (adapter down/up, calibrator down/up, LayerNorm): fraction |w| < threshold, L1 mass."""
    rows = []
    for t, m in enumerate(model.luca):
        for name, p in m.named_parameters():
            w = p.detach().abs().cpu()
            rows.append({"task": t, "param": name, "numel": w.numel(), "frac_below": float((w < threshold).float().mean()),
                         "l1_mass": float(w.sum()), "mean_abs": float(w.mean()), "threshold": threshold})
    return _frame(rows)


def mean_gates(model: Tosca, x: torch.Tensor, task_of_sample: torch.Tensor) -> torch.Tensor:
    """Mean gate of module t on task t's own samples: ``[T, d]``."""
    g = gates(model, x)
    return torch.stack([g[t][task_of_sample == t].mean(0) for t in range(model.num_tasks)])


def gate_sparsity(model: Tosca, x, task_of_sample, *, closed: float = 0.1, top: float = 0.1):
    """Per task, on its own samples: fraction of closed gates, mean gate, mean |gate - .5|."""
    g = gates(model, x)
    rows = []
    for t in range(model.num_tasks):
        own = g[t][task_of_sample == t]
        rows.append({"task": t, "frac_closed": float((own < closed).float().mean()),
                     "frac_open": float((own > 1 - closed).float().mean()), "mean_gate": float(own.mean()),
                     "mean_departure": float((own - 0.5).abs().mean()), "closed_threshold": closed})
    return _frame(rows)


def active_dims(model: Tosca, x, task_of_sample, *, top: float = 0.1) -> list[np.ndarray]:
    """Per task, the indices of its active dimensions (largest |mean gate - 0.5| on own data)."""
    if not 0 < top <= 1:
        raise ValueError(f"top must be in (0, 1] (got {top})")
    dev = (mean_gates(model, x, task_of_sample) - 0.5).abs()
    k = max(1, int(round(top * dev.shape[1])))
    out = []
    for t in range(dev.shape[0]):  # a dimension whose gate sits at the neutral 0.5 is not used (ties!)
        idx = dev[t].topk(k).indices
        out.append(np.sort(idx[dev[t, idx] > 1e-6].numpy()))
    return out


def overlap(model: Tosca, x, task_of_sample, *, top: float = 0.1):
    """Task x task overlap, tidy: cosine of centred mean gates and Jaccard of active dimensions."""
    g = mean_gates(model, x, task_of_sample) - 0.5
    g = g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
    cos = (g @ g.T).numpy()
    act = [set(a.tolist()) for a in active_dims(model, x, task_of_sample, top=top)]
    rows = []
    for i in range(len(act)):
        for j in range(len(act)):
            rows.append({"task_i": i, "task_j": j, "cosine": float(cos[i, j]),
                         "jaccard": len(act[i] & act[j]) / len(act[i] | act[j]) if act[i] | act[j] else float("nan"),
                         "top": top})
    return _frame(rows)


def entropy_distributions(model: Tosca, x, task_of_sample):
    """Entropy of every module on every sample, tidy: module, sample_task, own (module == task)."""
    ent = entropy(model.all_logits(x)).cpu()  # [T, N]
    task = task_of_sample.cpu().numpy()
    rows = {"module": [], "sample_task": [], "own": [], "entropy": []}
    for t in range(ent.shape[0]):
        rows["module"].append(np.full(len(task), t))
        rows["sample_task"].append(task)
        rows["own"].append(task == t)
        rows["entropy"].append(ent[t].numpy())
    return _frame({k: np.concatenate(v) for k, v in rows.items()})


def l1_sweep(data, l1_values, config: ToscaConfig = ToscaConfig(), *, threshold: float = 1e-3, top: float = 0.1):
    """Train TOSCA (cached features) for each L1 coefficient; one row per (l1, task) with weight and
    gate sparsity, mean overlap with the other tasks, and the per-sample accuracy at the end.

    Gate statistics are measured on the training features (no test data is used to describe modules);
    accuracies on the test split, as everywhere else.
    """
    from dataclasses import replace

    from lab.tosca.routing import route

    from .methods import create, fit

    out = []
    for l1 in l1_values:
        model = fit(create("tosca", data.dim, replace(config, l1=float(l1))), data).model
        r = route(model.all_logits(data.test_x), "per-sample", task_ids=data.test_task)
        acc = float((r.preds == data.test_y).float().mean() * 100)
        ws = weight_sparsity(model, threshold).groupby("task")[["frac_below", "l1_mass"]].agg(
            {"frac_below": "mean", "l1_mass": "sum"})
        gs = gate_sparsity(model, data.train_x, data.train_task).set_index("task")
        ov = overlap(model, data.train_x, data.train_task, top=top)
        ov = ov[ov.task_i != ov.task_j].groupby("task_i")[["cosine", "jaccard"]].mean()
        for t in range(model.num_tasks):
            out.append({"l1": float(l1), "task": t, "weight_frac_below": ws.loc[t, "frac_below"],
                        "weight_l1_mass": ws.loc[t, "l1_mass"], "gate_frac_closed": gs.loc[t, "frac_closed"],
                        "gate_mean_departure": gs.loc[t, "mean_departure"],
                        "overlap_cosine_mean": ov.loc[t, "cosine"] if t in ov.index else float("nan"),
                        "overlap_jaccard_mean": ov.loc[t, "jaccard"] if t in ov.index else float("nan"),
                        "accuracy_per_sample": acc, "routing_accuracy": r.routing_accuracy})
    return _frame(out)
