"""Cheap loss and evaluation for causal (multimodal) LMs on a CPU.

- :func:`answer_loss`: cross-entropy on the answer tokens only; with left padding the answers sit
  in the last ``k`` positions, so the LM head runs on ``k + 1`` positions instead of all ``L``.
- :func:`option_scores`: multiple-choice log-likelihoods. The shared prompt runs once with a KV
  cache; the first option token is read from the prompt's last logits, and only options longer than
  one token are continued — each from the cached prompt, feeding just its own tokens.
- :func:`greedy_answers`: short greedy generation for exact-match scoring.
"""
from __future__ import annotations

import inspect
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _lm(model: nn.Module) -> nn.Module:
    return getattr(model, "language_model", model)


def _cache_kw(lm: nn.Module) -> str:
    """transformers 5.x calls the KV cache ``cache``; 4.x ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"


def _inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def answer_loss(model: nn.Module, batch: dict) -> Tensor:
    """Mean token cross-entropy over the answer positions marked in ``batch['labels']`` (left-padded)."""
    labels = batch["labels"]                                         # (B, L), -100 outside answers
    k = int((labels != -100).sum(1).max())
    logits = model(**_inputs(batch), logits_to_keep=k + 1).logits   # (B, k+1, V)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, -k:].flatten())


@torch.inference_mode()
def option_scores(model: nn.Module, batch: dict, options: Sequence[Sequence[Sequence[int]]]) -> Tensor:
    """Log-likelihood ``[B, K]`` of every option's tokens after each prompt.

    ``options[b][k]`` = token ids of option ``k`` for sample ``b`` (same ``K`` for all samples;
    pass the same list for every sample when the options are shared).
    """
    lm = _lm(model)
    kw = _cache_kw(lm)
    out = model(**_inputs(batch), use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1].float().log_softmax(-1)                # (B, V)
    b, k = len(options), len(options[0])
    if b != first.shape[0] or any(len(o) != k for o in options):
        raise ValueError("options must give the same number of choices for every sample in the batch")
    scores = torch.stack([first[i, [o[0] for o in options[i]]] for i in range(b)])   # (B, K)
    rows = [(i, j) for i in range(b) for j in range(k) if len(options[i][j]) > 1]
    if not rows:
        return scores
    cache = getattr(out, kw)
    cache.batch_select_indices(torch.tensor([i for i, _ in rows]))  # one cached prompt per row
    t = max(len(options[i][j]) for i, j in rows) - 1
    feed = torch.zeros(len(rows), t, dtype=torch.long)             # option tokens except the last
    target = torch.full((len(rows), t), -100, dtype=torch.long)    # option tokens except the first
    for r, (i, j) in enumerate(rows):
        o = options[i][j]
        feed[r, : len(o) - 1] = torch.tensor(o[:-1])
        target[r, : len(o) - 1] = torch.tensor(o[1:])
    prompt_mask = batch["attention_mask"][[i for i, _ in rows]]
    mask = torch.cat([prompt_mask, (target != -100).long()], 1)
    logp = lm(input_ids=feed, attention_mask=mask, **{kw: cache}).logits.float().log_softmax(-1)
    tok_lp = logp.gather(-1, target.clamp_min(0)[..., None])[..., 0] * (target != -100)
    extra = torch.zeros_like(scores)
    for r, (i, j) in enumerate(rows):
        extra[i, j] = tok_lp[r].sum()
    return scores + extra


@torch.inference_mode()
def greedy_answers(model: nn.Module, batch: dict, *, max_new_tokens: int, eos_id: int) -> list[list[int]]:
    """Greedy continuation (KV cache) of every prompt, stopped at ``eos_id``; returns token ids."""
    lm = _lm(model)
    kw = _cache_kw(lm)
    out = model(**_inputs(batch), use_cache=True, logits_to_keep=1)
    mask = batch["attention_mask"]
    done = torch.zeros(mask.shape[0], dtype=torch.bool)
    result: list[list[int]] = [[] for _ in range(mask.shape[0])]
    nxt = out.logits[:, -1].argmax(-1)
    cache = getattr(out, kw)
    for _ in range(max_new_tokens):
        for i in range(len(result)):
            if not done[i]:
                if int(nxt[i]) == eos_id:
                    done[i] = True
                else:
                    result[i].append(int(nxt[i]))
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], 1)
        out = lm(input_ids=nxt[:, None], attention_mask=mask, use_cache=True, logits_to_keep=1, **{kw: cache})
        cache = getattr(out, kw)
        nxt = out.logits[:, -1].argmax(-1)
    return result
