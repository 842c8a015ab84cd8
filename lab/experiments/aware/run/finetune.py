"""The training and evaluation harness shared by every fine-tuning method (docs/aware.md, "Baselines").

Methods differ only in how they prepare the model (:mod:`lab.aware.methods`, a registry);
:func:`train` is the same short loop for all of them (AdamW, warm-up + cosine, grad clipping, loss
on answer tokens only); :func:`evaluate` scores multiple choice with the KV-cached scorer.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import nn

from lab.experiments.aware.run.prompts import ChatEncoder
from lab.experiments.aware.run.scoring import answer_loss, greedy_answers, option_scores
from lab.experiments.aware.run.tasks import QASet, exact_match


PRECISIONS = ("fp32", "bf16")


def autocast(precision: str, device: str = "cpu"):
    """The context a training forward runs in: bf16 autocast (float32 master weights, optimizer
    state and norms; bf16 matmuls) for ``"bf16"``, nothing for ``"fp32"``."""
    import contextlib

    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def for_scoring(model: nn.Module, precision: str) -> nn.Module:
    """The model as it is scored: itself for ``"fp32"``, a bf16 copy of its weights for ``"bf16"``
    (autocast would re-cast every weight at every forward)."""
    import copy

    return copy.deepcopy(model).to(torch.bfloat16) if precision == "bf16" else model


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation recipe: the reference's (weight decay 0, 3% warm-up then cosine) with a faster
    projector so a few dozen steps learn a new visual task, and each method's own language-model
    (or adapter) lr chosen on validation questions by ``lab aware tune`` (:mod:`lab.experiments.aware.run.tune`;
    the grids and what they chose: docs/aware.md, "Learning rates"): full 2e-5 (the reference's),
    LoRA/DoRA 1e-4, AWARe 3e-4.
    ``lr_aware=None`` gives AWARe the same lr as full fine-tuning, as the reference does."""

    steps: int = 24
    batch_size: int = 8
    lr: float = 2e-5             # language-model weights under full fine-tuning (the reference's)
    lr_projector: float = 1e-3   # mm_projector (full, AWARe, LoRA); the projector-alignment lr
    lr_adapter: float = 1e-4     # LoRA / DoRA matrices (chosen on validation)
    lr_aware: float | None = 3e-4  # AWARe's trainable LM rows (chosen on validation); None: ``lr``
    weight_decay: float = 0.0
    warmup: float = 0.03
    max_grad_norm: float = 1.0
    seed: int = 0
    precision: str = "fp32"      # "bf16": matmuls under bf16 autocast while training, scored as a bf16 copy


    def __post_init__(self):
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError("steps must be >= 0 and batch_size >= 1")
        from lab._validate import learning_rate, number

        for name in ("lr", "lr_projector", "lr_adapter", "lr_aware"):   # the one lr check (also lab aware tune's)
            if getattr(self, name) is not None:
                learning_rate(name, getattr(self, name))
        number("weight_decay", self.weight_decay, ge=0)
        if not 0 <= self.warmup < 1:
            raise ValueError("warmup is a fraction of the steps in [0, 1)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose from {list(PRECISIONS)}")

    @property
    def aware_lr(self) -> float:
        """The lr AWARe's trainable language-model rows get (``lr_aware``, or ``lr`` when None)."""
        return self.lr if self.lr_aware is None else self.lr_aware


def iterate(qa: QASet, enc: ChatEncoder, batch_size: int, *, answers: bool, order=None) -> Iterator[dict]:
    """Collated batches of ``qa`` in ``order`` (default: as stored)."""
    order = np.arange(len(qa)) if order is None else np.asarray(order)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        enc_list = [enc.encode(qa.questions[i], qa.answers[i] if answers else None,
                               image=bool(qa.image_index[i] >= 0)) for i in idx]
        rows = [int(qa.image_index[i]) for i in idx if qa.image_index[i] >= 0]
        images = qa.tokens[rows] if rows else None
        yield enc.collate(enc_list, images)


def _schedule(step: int, total: int, warmup: float) -> float:
    w = max(1, math.ceil(warmup * total))
    if step < w:
        return (step + 1) / w
    return 0.5 * (1 + math.cos(math.pi * (step - w) / max(1, total - w)))


def train(model: nn.Module, groups: list[dict], qa: QASet, enc: ChatEncoder, cfg: TrainConfig, *,
          progress: bool = True, desc: str = "fine-tuning", stop_after: int | None = None) -> dict:
    """AdamW on ``groups`` for ``cfg.steps`` steps over shuffled epochs of ``qa`` (``stop_after``:
    only the first that many steps of the same schedule, for a quick reproduction check)."""
    from tqdm.auto import tqdm

    if not groups or cfg.steps == 0:
        return {"losses": [], "step_seconds": []}
    if len(qa) == 0:
        raise ValueError(f"{qa.name}: no training samples")
    torch.manual_seed(cfg.seed)
    rng = np.random.RandomState(cfg.seed)
    opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    base = [g["lr"] for g in opt.param_groups]
    params = [p for g in groups for p in g["params"]]
    order = np.concatenate([rng.permutation(len(qa)) for _ in range(cfg.steps * cfg.batch_size // len(qa) + 1)])
    losses, times = [], []
    model.train()
    it = iterate(qa, enc, cfg.batch_size, answers=True, order=order[: cfg.steps * cfg.batch_size])
    n = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    for step in tqdm(range(n), desc=desc, unit="step", disable=not progress, leave=False):
        t0 = time.perf_counter()
        for g, lr in zip(opt.param_groups, base):
            g["lr"] = lr * _schedule(step, cfg.steps, cfg.warmup)
        with autocast(cfg.precision, next(model.parameters()).device):
            loss = answer_loss(model, next(it))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        times.append(time.perf_counter() - t0)
    model.eval()
    return {"losses": losses, "step_seconds": times}


def fit(model: nn.Module, spec, cfg: TrainConfig, qa: QASet, enc: ChatEncoder, *, saliency=None,
        fresh: bool = True, progress: bool = False, desc: str = "fine-tuning", trainer=None) -> tuple:
    """One fine-tuning run, the same for every sweep (``lab aware finetune``, ``tune``, ``ablate``,
    ``study``, each stage of the continual sequence): prepare ``model`` the way ``spec`` says
    (:func:`lab.aware.methods.prepare`; a random selection rule draws from ``cfg.seed``), train it on
    ``qa`` with ``cfg``, bring it back to a standard model. ``fresh``: work on a copy (the base stays
    untouched); ``trainer``: a function with :func:`train`'s signature (several processes:
    :meth:`lab.experiments.aware.run.distributed.Session.train`).
    Returns ``(model, info, log, train_s)``: ``info`` from ``prepare`` (trainable counts, masks)."""
    import copy
    from dataclasses import replace

    from lab.aware.methods import finish, prepare

    if spec.aware.rule == "random":
        spec = replace(spec, aware=replace(spec.aware, seed=cfg.seed))
    model = copy.deepcopy(model) if fresh else model
    t0 = time.perf_counter()
    model, groups, info = prepare(model, spec, cfg, saliency=saliency)
    log = (trainer or train)(model, groups, qa, enc, cfg, progress=progress, desc=desc)
    train_s = time.perf_counter() - t0
    return finish(model, spec.method), info, log, train_s


def strictly_best(scores: torch.Tensor, gold: int) -> bool:
    """Right only when the gold option's score is finite and above every other option's: a tie or a
    non-finite score (a diverged model) is wrong, so no option position can be favoured by
    ``argmax``'s first-index rule."""
    g = scores[gold]
    if not bool(torch.isfinite(g)):
        return False
    others = torch.cat([scores[:gold], scores[gold + 1:]])
    return bool((g > others).all())


def evaluate(model: nn.Module, qa: QASet, enc: ChatEncoder, *, batch_size: int = 32,
             exact: bool = False, max_new_tokens: int = 8) -> dict:
    """Multiple-choice accuracy (answer log-likelihood over ``qa.options``; right only when the gold
    option scores strictly highest, :func:`strictly_best`) and ``correct``, which
    questions it got right (for paired intervals); with ``exact``, also the exact-match rate of a greedy answer against the gold answer and its aliases."""
    model.eval()
    correct, hits, per_q = 0, 0, []
    for s, batch in zip(range(0, len(qa), batch_size), iterate(qa, enc, batch_size, answers=False)):
        idx = range(s, min(s + batch_size, len(qa)))
        opts = [qa.options[i] for i in idx]
        scores = option_scores(model, batch, [enc.option_ids(o) for o in opts])
        right = [strictly_best(scores[j], opts[j].index(qa.answers[i])) for j, i in enumerate(idx)]
        correct += sum(right)
        per_q += right
        if exact:
            gen = greedy_answers(model, batch, max_new_tokens=max_new_tokens, eos_id=enc.eos_id)
            aliases = [qa.aliases[i] if qa.aliases else (qa.answers[i],) for i in idx]
            hits += sum(exact_match(enc.tok.decode(g), a) for g, a in zip(gen, aliases))
    out = {"acc": correct / max(len(qa), 1), "n": len(qa), "correct": per_q}   # per question, in qa's order
    if exact:
        out["em"] = hits / max(len(qa), 1)
    return out

