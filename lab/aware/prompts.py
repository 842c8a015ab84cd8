"""Chat-formatted, short, left-padded batches for the mini-LLaVA.

A sample is rendered with the language model's *own* chat template::

    <|im_start|>system\\n{SYSTEM}<|im_end|>\\n<|im_start|>user\\n<image x n>\\n{question}<|im_end|>\\n
    <|im_start|>assistant\\n{answer}<|im_end|>

Batches are **left**-padded so that every prompt ends at the last position: the answer tokens of
all samples then sit in the last ``k`` positions and the loss needs logits only there
(``logits_to_keep``), and multiple-choice scoring can continue every prompt from one KV cache.
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

    def collate(self, encoded: Sequence[Encoded], images: Tensor | None = None) -> dict:
        """Left-pad to a batch. ``images`` ``[n_with_image, n_tokens, C]`` in sample order."""
        length = max(len(e.ids) for e in encoded)
        b = len(encoded)
        input_ids = torch.full((b, length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros(b, length, dtype=torch.long)
        image_mask = torch.zeros(b, length, dtype=torch.bool)
        labels = torch.full((b, length), -100, dtype=torch.long)
        for i, e in enumerate(encoded):
            pad = length - len(e.ids)
            input_ids[i, pad:] = torch.tensor(e.ids)
            attention_mask[i, pad:] = 1
            if e.image_start >= 0:
                image_mask[i, pad + e.image_start: pad + e.image_start + self.n_image] = True
            if e.n_answer:
                labels[i, length - e.n_answer:] = input_ids[i, length - e.n_answer:]
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if image_mask.any():
            if images is None:
                raise ValueError("batch has image placeholders but no visual tokens")
            batch.update(images=images, image_mask=image_mask)
        if any(e.n_answer for e in encoded):
            batch["labels"] = labels
        return batch
