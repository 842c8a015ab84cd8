"""Chat-formatted, short, left-padded batches for the mini-LLaVA.

A sample is rendered with the language model's *own* chat template::

    <|im_start|>system\\n{SYSTEM}<|im_end|>\\n<|im_start|>user\\n<image x n>\\n{question}<|im_end|>\\n
    <|im_start|>assistant\\n{answer}<|im_end|>

Batches are **left**-padded so that every prompt ends at the last position: the answer tokens of
all samples then sit in the last ``k`` positions and the loss needs logits only there
(``logits_to_keep``), and multiple-choice scoring can continue every prompt from one KV cache.

The tokens every sample of a batch shares (system turn and user tag, ~40 % of a short prompt) are
kept in front of the padding: ``[shared prefix | pads | rest]``, with explicit ``position_ids`` and
``prefix_len`` in the batch. :func:`lab.experiments.aware.run.scoring.forward` then runs the prefix once, at batch
size 1, and the rest of every sample on top of its (expanded) KV cache — the same numbers as a plain
forward (gradients included) for ~40 % less compute.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

SYSTEM = "Answer with one word."   # short: every token costs a forward pass on 2 CPU cores
_IMAGE = "<image>"                  # split marker only; never reaches the tokenizer


@dataclass(frozen=True)
class Encoded:
    ids: tuple[int, ...]           # prompt (+ answer) token ids
    image_start: int               # index of the first image placeholder, -1 if text-only
    n_answer: int                  # answer tokens at the end (0 for a bare prompt)


class ChatEncoder:
    """Turns (question, answer, has_image) into token ids; caches the fixed template pieces."""

    def __init__(self, tokenizer, n_image_tokens: int, system: str = SYSTEM):
        self.tok = tokenizer
        self.n_image = n_image_tokens
        self.system = system
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_id = tokenizer.eos_token_id   # SmolLM2: <|im_end|>, the end of an assistant turn
        self._cache: dict = {}

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def encode(self, question: str, answer: str | None = None, *, image: bool = False) -> Encoded:
        key = (question, answer, image)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        user = f"{_IMAGE}\n{question}" if image else question
        msgs = [{"role": "system", "content": self.system}, {"role": "user", "content": user}]
        text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if image:
            before, after = text.split(_IMAGE)
            head = self._ids(before)
            ids, start = head + [self.pad_id] * self.n_image + self._ids(after), len(head)
        else:
            ids, start = self._ids(text), -1
        n_answer = 0
        if answer is not None:
            ans = self._ids(answer) + [self.eos_id]
            ids, n_answer = ids + ans, len(ans)
        enc = Encoded(tuple(ids), start, n_answer)
        if len(self._cache) < 100_000:
            self._cache[key] = enc
        return enc

    def option_ids(self, options: Sequence[str]) -> list[list[int]]:
        """Token ids of answer options as they follow the assistant tag (no end token)."""
        return [self._ids(o) for o in options]

    def collate(self, encoded: Sequence[Encoded], images: Tensor | None = None, *,
                share_prefix: bool = True) -> dict:
        """Batch ``[shared prefix | left padding | rest]``. ``images`` ``[n_with_image, n_tokens, C]``
        in sample order. ``share_prefix=False`` gives plain left padding."""
        p = _shared_prefix(encoded) if share_prefix else 0
        length = max(len(e.ids) for e in encoded)
        b = len(encoded)
        input_ids = torch.full((b, length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros(b, length, dtype=torch.long)
        image_mask = torch.zeros(b, length, dtype=torch.bool)
        labels = torch.full((b, length), -100, dtype=torch.long)
        for i, e in enumerate(encoded):
            pad = length - len(e.ids)
            input_ids[i, :p] = torch.tensor(e.ids[:p])
            input_ids[i, p + pad:] = torch.tensor(e.ids[p:])
            attention_mask[i, :p] = 1
            attention_mask[i, p + pad:] = 1
            if e.image_start >= 0:
                image_mask[i, pad + e.image_start: pad + e.image_start + self.n_image] = True
            if e.n_answer:
                labels[i, length - e.n_answer:] = input_ids[i, length - e.n_answer:]
        position_ids = (attention_mask.cumsum(1) - 1).clamp_min(0)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        if p:
            batch["prefix_len"] = p
        if image_mask.any():
            if images is None:
                raise ValueError("batch has image placeholders but no visual tokens")
            batch.update(images=images, image_mask=image_mask)
        if any(e.n_answer for e in encoded):
            batch["labels"] = labels
        return batch


def _shared_prefix(encoded: Sequence[Encoded]) -> int:
    """Length of the token prefix all samples share, stopping before any image placeholder and
    leaving at least one token of every sample to run on top of it (0 if under 2 tokens)."""
    first = encoded[0].ids
    limit = min(len(e.ids) for e in encoded) - 1
    limit = min([limit] + [e.image_start for e in encoded if e.image_start >= 0])
    n = 0
    while n < limit and all(e.ids[n] == first[n] for e in encoded):
        n += 1
    return n if n >= 2 else 0
