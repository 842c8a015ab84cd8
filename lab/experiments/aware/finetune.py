"""One harness for every fine-tuning method compared with AWARe (docs/aware.md, "Baselines").

Methods differ only in :func:`prepare` (which parameters train, at which learning rate):

- ``zero-shot``: nothing trains.
- ``full``: the whole language model and the projector.
- ``lora`` / ``dora``: peft adapters (``LoraConfig(use_dora=...)``) on the *same* language-model
  target Linears as AWARe (q/k/v); as in LLaVA-1.5's LoRA recipe the projector, when it is a target,
  trains fully at the projector lr. The rank makes the trainable count match AWARe's
  (:func:`matched_lora_rank`).
- ``aware``: profile -> select -> row split (:mod:`lab.aware.freeze`).

:func:`train` is the same short loop for all of them (AdamW, warm-up + cosine, grad clipping, loss
on answer tokens only); :func:`evaluate` scores multiple choice with the KV-cached scorer.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch import nn

from lab.aware.config import AwareConfig
from lab.aware.freeze import apply, merge, trainable_parameters
from lab.aware.masking import select
from lab.aware.prompts import ChatEncoder
from lab.aware.saliency import Saliency
from lab.aware.scoring import answer_loss, greedy_answers, option_scores
from lab.aware.targets import find_targets, is_projector
from lab.aware.tasks import QASet, exact_match

METHODS = ("zero-shot", "full", "lora", "dora", "aware")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation recipe: the reference's (weight decay 0, 3% warm-up then cosine) with a faster
    projector so a few dozen steps learn a new visual task, and each method's own language-model
    (or adapter) lr chosen on validation questions by ``lab aware tune`` (:mod:`lab.aware.tune`;
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

    @property
    def aware_lr(self) -> float:
        """The lr AWARe's trainable language-model rows get (``lr_aware``, or ``lr`` when None)."""
        return self.lr if self.lr_aware is None else self.lr_aware


@dataclass(frozen=True)
class MethodSpec:
    method: str = "aware"
    aware: AwareConfig = field(default_factory=AwareConfig)
    lora_rank: int | None = None    # None: matched to AWARe's trainable count on the same targets

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {list(METHODS)}")

    def to_dict(self) -> dict:
        return {"method": self.method, "lora_rank": self.lora_rank, **self.aware.to_dict()}


def _groups(model: nn.Module, lr: float, lr_projector: float) -> list[dict]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    proj = [p for n, p in named if is_projector(n)]
    rest = [p for n, p in named if not is_projector(n)]
    return [g for g in ({"params": rest, "lr": lr}, {"params": proj, "lr": lr_projector}) if g["params"]]


def _split_targets(model: nn.Module, aware: AwareConfig) -> tuple[dict, dict]:
    layers = find_targets(model, aware.targets, exclude=aware.exclude)
    proj = {n: m for n, m in layers.items() if is_projector(n)}
    return {n: m for n, m in layers.items() if n not in proj}, proj


def matched_lora_rank(model: nn.Module, aware: AwareConfig) -> int:
    """LoRA rank r such that LoRA's trainable count — ``r * sum(d_in + d_out)`` over the language-model
    targets, plus the whole projector when it is a target — equals AWARe's, ``(1 - rho)`` of all
    target rows (weights and biases). Rounded, at least 1."""
    lm_layers, proj_layers = _split_targets(model, aware)
    if not lm_layers:
        raise ValueError("LoRA needs at least one language-model target (e.g. q_proj)")
    size = lambda m: m.weight.numel() + (m.out_features if m.bias is not None else 0)  # noqa: E731
    aware_count = (1 - aware.rho) * sum(size(m) for m in {**lm_layers, **proj_layers}.values())
    proj_count = sum(size(m) for m in proj_layers.values())
    per_rank = sum(m.in_features + m.out_features for m in lm_layers.values())
    return max(1, round((aware_count - proj_count) / per_rank))


def prepare(model: nn.Module, spec: MethodSpec, cfg: TrainConfig, *,
            saliency: Saliency | None = None) -> tuple[nn.Module, list[dict], dict]:
    """Make ``model`` trainable the way ``spec`` says; return (model, optimizer groups, info)."""
    info: dict = {}
    for p in model.parameters():
        p.requires_grad_(False)
    if spec.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        groups = _groups(model, cfg.lr, cfg.lr_projector)
    elif spec.method == "aware":
        layers = find_targets(model, spec.aware.targets, exclude=spec.aware.exclude)
        if spec.aware.rule.startswith("activation"):
            if saliency is None:
                raise ValueError("activation rules need a saliency profile (lab.aware.profile)")
            missing = set(layers) - set(saliency.scores)
            if missing:
                raise ValueError(f"saliency lacks {len(missing)} target layers, e.g. {sorted(missing)[:3]}")
            scores = {n: saliency.scores[n] for n in layers}
        else:
            scores = {n: torch.zeros(m.out_features) for n, m in layers.items()}
        masks = select(scores, spec.aware.rho, spec.aware.rule, weights=layers, seed=spec.aware.seed)
        apply(model, masks)
        info["masks"] = masks
        groups = _groups(model, cfg.aware_lr, cfg.lr_projector)
    elif spec.method in ("lora", "dora"):
        from peft import LoraConfig, get_peft_model

        rank = spec.lora_rank or matched_lora_rank(model, spec.aware)
        lm_layers, proj_layers = _split_targets(model, spec.aware)
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                 target_modules=list(lm_layers), use_dora=spec.method == "dora"))
        for name in proj_layers:   # LLaVA's LoRA recipe: the projector itself trains fully
            for p in model.get_submodule("base_model.model." + name).parameters():
                p.requires_grad_(True)
        info["lora_rank"] = rank
        groups = _groups(model, cfg.lr_adapter, cfg.lr_projector)
    else:  # zero-shot
        groups = []
    info["trainable"], info["total"] = trainable_parameters(model)
    return model, groups, info


def finish(model: nn.Module) -> nn.Module:
    """Back to a standard model: merge LoRA/DoRA adapters or AWARe's row split."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return merge(model).eval()


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
          progress: bool = True, desc: str = "fine-tuning") -> dict:
    """AdamW on ``groups`` for ``cfg.steps`` steps over shuffled epochs of ``qa``."""
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
    for step in tqdm(range(cfg.steps), desc=desc, unit="step", disable=not progress, leave=False):
        t0 = time.perf_counter()
        for g, lr in zip(opt.param_groups, base):
            g["lr"] = lr * _schedule(step, cfg.steps, cfg.warmup)
        loss = answer_loss(model, next(it))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        times.append(time.perf_counter() - t0)
    model.eval()
    return {"losses": losses, "step_seconds": times}


def evaluate(model: nn.Module, qa: QASet, enc: ChatEncoder, *, batch_size: int = 32,
             exact: bool = False, max_new_tokens: int = 8) -> dict:
    """Multiple-choice accuracy (answer log-likelihood over ``qa.options``); with ``exact``, also
    the exact-match rate of a greedy answer against the gold answer and its aliases."""
    model.eval()
    correct, hits = 0, 0
    for s, batch in zip(range(0, len(qa), batch_size), iterate(qa, enc, batch_size, answers=False)):
        idx = range(s, min(s + batch_size, len(qa)))
        opts = [qa.options[i] for i in idx]
        scores = option_scores(model, batch, [enc.option_ids(o) for o in opts])
        pred = scores.argmax(1).tolist()
        correct += sum(opts[j][p] == qa.answers[i] for j, (i, p) in enumerate(zip(idx, pred)))
        if exact:
            gen = greedy_answers(model, batch, max_new_tokens=max_new_tokens, eos_id=enc.eos_id)
            aliases = [qa.aliases[i] if qa.aliases else (qa.answers[i],) for i in idx]
            hits += sum(exact_match(enc.tok.decode(g), a) for g, a in zip(gen, aliases))
    out = {"acc": correct / max(len(qa), 1), "n": len(qa)}
    if exact:
        out["em"] = hits / max(len(qa), 1)
    return out

