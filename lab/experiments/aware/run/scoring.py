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
    """The module that continues text: the mini-LLaVA's causal ``language_model``; a transformers
    LLaVA runs text itself (its ``language_model``, where present, is the decoder without a head)."""
    lm = getattr(model, "language_model", None)
    head = getattr(lm, "get_output_embeddings", None)
    return lm if lm is not None and head is not None and head() is not None else model


def _cache_kw(lm: nn.Module) -> str:
    """transformers 5.x calls the KV cache ``cache``; 4.x ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"


def to_device(batch: dict, model: nn.Module) -> dict:
    """Move a batch's tensors to the device of the model's parameters (CPU here, CUDA on a GPU)."""
    dev = next(model.parameters()).device
    return {k: v.to(dev) if isinstance(v, Tensor) else v for k, v in batch.items()}


def model_inputs(batch: dict) -> dict:
    """The keyword arguments a plain ``model(**...)`` call takes (no labels, no prefix marker)."""
    return {k: v for k, v in batch.items() if k not in ("labels", "prefix_len")}


def forward(model: nn.Module, batch: dict, *, logits_to_keep: int = 0, use_cache: bool = False):
    """``model(**batch)``, running a shared prefix (``batch['prefix_len']``) once at batch size 1.

    The prefix's KV cache is expanded to the batch and the rest of every sample runs on top of it:
    the same logits and gradients as the plain call (the prefix has no padding and no image)."""
    batch = to_device(batch, model)
    p = batch.get("prefix_len", 0)
    inputs = model_inputs(batch)
    if not p:
        return model(**inputs, logits_to_keep=logits_to_keep, use_cache=use_cache)
    lm = _lm(model)
    kw = _cache_kw(lm)
    ids, pos = inputs["input_ids"], inputs["position_ids"]
    head = lm(input_ids=ids[:1, :p], position_ids=pos[:1, :p], use_cache=True, logits_to_keep=1)
    cache = getattr(head, kw)
    cache.batch_repeat_interleave(ids.shape[0])                      # (1, ...) -> (B, ...)
    rest = {"input_ids": ids[:, p:], "attention_mask": inputs["attention_mask"], "position_ids": pos[:, p:]}
    if "images" in inputs:
        rest.update(images=inputs["images"], image_mask=inputs["image_mask"][:, p:])
    if "pixel_values" in inputs:   # a transformers LLaVA (its encoder shares no prefix; kept for callers that do)
        rest["pixel_values"] = inputs["pixel_values"]
    return model(**rest, logits_to_keep=logits_to_keep, use_cache=True, **{kw: cache})


def answer_loss(model: nn.Module, batch: dict) -> Tensor:
    """Mean token cross-entropy over the answer positions marked in ``batch['labels']`` (left-padded)."""
    batch = to_device(batch, model)
    labels = batch["labels"]                                         # (B, L), -100 outside answers
    k = int((labels != -100).sum(1).max())
    logits = forward(model, batch, logits_to_keep=k + 1).logits      # (B, k+1, V)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, -k:].flatten())


@torch.inference_mode()
def option_scores(model: nn.Module, batch: dict, options: Sequence[Sequence[Sequence[int]]]) -> Tensor:
    """Log-likelihood ``[B, K]`` of every option's tokens after each prompt.

    ``options[b][k]`` = token ids of option ``k`` for sample ``b`` (same ``K`` for all samples;
    pass the same list for every sample when the options are shared).
    """
    batch = to_device(batch, model)
    dev = batch["input_ids"].device
    lm = _lm(model)
    kw = _cache_kw(lm)
    out = forward(model, batch, use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1].float().log_softmax(-1)                # (B, V)
    b, k = len(options), len(options[0])
    if b != first.shape[0] or any(len(o) != k for o in options):
        raise ValueError("options must give the same number of choices for every sample in the batch")
    scores = torch.stack([first[i, [o[0] for o in options[i]]] for i in range(b)])   # (B, K)
    rows = [(i, j) for i in range(b) for j in range(k) if len(options[i][j]) > 1]
    if not rows:
        return scores.cpu()
    cache = getattr(out, kw)
    cache.batch_select_indices(torch.tensor([i for i, _ in rows], device=dev))  # one cached prompt per row
    t = max(len(options[i][j]) for i, j in rows) - 1
    feed = torch.zeros(len(rows), t, dtype=torch.long)             # option tokens except the last
    target = torch.full((len(rows), t), -100, dtype=torch.long)    # option tokens except the first
    for r, (i, j) in enumerate(rows):
        o = options[i][j]
        feed[r, : len(o) - 1] = torch.tensor(o[:-1])
        target[r, : len(o) - 1] = torch.tensor(o[1:])
    sel = [i for i, _ in rows]
    feed, target = feed.to(dev), target.to(dev)
    mask = torch.cat([batch["attention_mask"][sel], (target != -100).long()], 1)
    pos = batch["position_ids"][sel, -1:] + 1 + torch.arange(t, device=dev)  # continue each prompt's positions
    logp = lm(input_ids=feed, attention_mask=mask, position_ids=pos, **{kw: cache}).logits.float().log_softmax(-1)
    tok_lp = logp.gather(-1, target.clamp_min(0)[..., None])[..., 0] * (target != -100)
    extra = torch.zeros_like(scores)
    for r, (i, j) in enumerate(rows):
        extra[i, j] = tok_lp[r].sum()
    return (scores + extra).cpu()


@torch.inference_mode()
def greedy_answers(model: nn.Module, batch: dict, *, max_new_tokens: int, eos_id: int) -> list[list[int]]:
    """Greedy continuation (KV cache) of every prompt, stopped at ``eos_id``; returns token ids."""
    batch = to_device(batch, model)
    lm = _lm(model)
    kw = _cache_kw(lm)
    out = forward(model, batch, use_cache=True, logits_to_keep=1)
    mask = batch["attention_mask"]
    pos = batch["position_ids"][:, -1:]
    done = torch.zeros(mask.shape[0], dtype=torch.bool)                 # on the CPU: loop bookkeeping
    result: list[list[int]] = [[] for _ in range(mask.shape[0])]
    nxt = out.logits[:, -1].argmax(-1).cpu()
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
        mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype, device=mask.device)], 1)
        pos = pos + 1
        out = lm(input_ids=nxt[:, None].to(mask.device), attention_mask=mask, position_ids=pos, use_cache=True,
                 logits_to_keep=1, **{kw: cache})
        cache = getattr(out, kw)
        nxt = out.logits[:, -1].argmax(-1).cpu()
    return result
