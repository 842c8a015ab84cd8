"""Notebook 01's comparisons over seeds: is a stage before the head more decodable, does full
fine-tuning change what the backbone knew about the other classes, and how does its task accuracy
compare with TOSCA's at the budgets given?

One seed draws its own class-balanced subset of the images (``lab.analysis.balanced_indices``) and
trains everything with that seed: linear probes on two stages of the frozen backbone, full
fine-tuning of a copy of the backbone on one task (``lab.analysis.finetune_backbone``), and TOSCA's
LuCA on the frozen decision-point feature of the same task's images. Differences are paired by seed
and given the lab's one interval (:mod:`lab.stats`: a 95 % t-interval over per-seed values), with a
verdict — *higher*, *lower* or *no difference detected*.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from lab import stats


def one_seed(bb, ds, task_classes, *, seed: int, stage: str, train_per_class: int, test_per_class: int,
             probe_epochs: int, ft_epochs: int, ft_lr: float, tosca_epochs: int) -> dict:
    """Every number of one seed (accuracies as fractions): the linear probe at ``stage`` and at the
    head, full fine-tuning's and TOSCA's accuracy on the task, and a nearest-prototype read-out of the
    other classes on the frozen backbone's and the fine-tuned backbone's decision-point features."""
    import torch

    from lab import analysis
    from lab.probes import linear_probe_accuracy, prototype_accuracy
    from lab.tosca import Tosca, ToscaConfig

    tr = analysis.balanced_indices(ds.train.labels, train_per_class, seed=seed)
    te = analysis.balanced_indices(ds.test.labels, test_per_class, seed=seed)
    ytr, yte = torch.from_numpy(ds.train.labels[tr]), torch.from_numpy(ds.test.labels[te])
    f_tr, f_te = analysis.stage_features(bb, ds.train.images[tr]), analysis.stage_features(bb, ds.test.images[te])
    probe = {s: linear_probe_accuracy(f_tr[s], ytr, f_te[s], yte, epochs=probe_epochs, seed=seed)
             for s in dict.fromkeys((stage, "head"))}
    in_tr, in_te = np.isin(ds.train.labels[tr], task_classes), np.isin(ds.test.labels[te], task_classes)
    ty_tr = analysis.relabel(ds.train.labels[tr][in_tr], task_classes)
    ty_te = analysis.relabel(ds.test.labels[te][in_te], task_classes)
    ft = analysis.finetune_backbone(bb, ds.train.images[tr][in_tr], ty_tr, epochs=ft_epochs, lr=ft_lr, seed=seed)
    ft_acc = float((ft.predict(ds.test.images[te][in_te]) == ty_te).float().mean())
    torch.manual_seed(seed)
    tosca = Tosca(bb.feature_dim, ToscaConfig(epochs=tosca_epochs, seed=seed))
    tosca.learn_task(list(range(len(task_classes))), f_tr["head"][in_tr], ty_tr)
    tosca_acc = float((tosca.all_logits(f_te["head"][in_te])[0].argmax(1) == ty_te).float().mean())
    ft_tr = analysis.stage_features(ft.backbone, ds.train.images[tr][~in_tr])["head"]
    ft_te = analysis.stage_features(ft.backbone, ds.test.images[te][~in_te])["head"]
    other = {"other_frozen": prototype_accuracy(f_tr["head"][~in_tr], ytr[~in_tr], f_te["head"][~in_te], yte[~in_te]),
             "other_ft": prototype_accuracy(ft_tr, ytr[~in_tr], ft_te, yte[~in_te])}
    return {"seed": seed, "probe_stage": probe[stage], "probe_head": probe["head"], "ft_task": ft_acc,
            "tosca_task": tosca_acc, **other, "test_task_images": int(in_te.sum()),
            "test_other_images": int((~in_te).sum())}


def over_seeds(bb, ds, task_classes, seeds, **kw) -> pd.DataFrame:
    """:func:`one_seed` for every seed, one row each."""
    return pd.DataFrame([one_seed(bb, ds, task_classes, seed=int(s), **kw) for s in seeds])


COMPARISONS = (  # (name, a, b): a − b per seed
    ("linear probe, chosen stage − head", "probe_stage", "probe_head"),
    ("other classes read out after full fine-tuning − before", "other_ft", "other_frozen"),
    ("task accuracy, full fine-tuning − TOSCA", "ft_task", "tosca_task"),
)


def comparisons(per_seed: pd.DataFrame, names=None) -> pd.DataFrame:
    """Each comparison as the mean of ``a`` and ``b`` and their difference paired by seed, each with
    its 95 % t-interval over seeds, and the difference's direction (:func:`lab.stats.direction`)."""
    rows = []
    for name, a, b in COMPARISONS:
        ma, mb = stats.t_interval(per_seed[a]), stats.t_interval(per_seed[b])
        d = stats.paired(per_seed[a].tolist(), per_seed[b].tolist())
        rows.append({"comparison": (names or {}).get(name, name), "a": ma[0], "a_lo": ma[1], "a_hi": ma[2],
                     "b": mb[0], "b_lo": mb[1], "b_hi": mb[2], "difference": d[0], "lo": d[1], "hi": d[2],
                     "seeds": len(per_seed), "verdict": stats.direction(d[1], d[2])})
    return pd.DataFrame(rows)


def interval(mean: float, lo: float, hi: float, digits: int = 3, sign: bool = False) -> str:
    """'0.832 [0.815, 0.849]' ('+' on differences with ``sign``); the mean alone without an interval."""
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f.format(mean)
    return f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"


def sentence(row) -> str:
    """One comparison in words, e.g. '... −0.012 [−0.030, +0.006] over 5 seeds: no difference detected'."""
    return (f"{row.comparison}: {interval(row.difference, row.lo, row.hi, sign=True)} over {row.seeds} seeds — "
            f"{row.verdict}")
