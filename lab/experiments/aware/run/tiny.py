"""Tiny, randomly initialised stand-ins for tests and smoke runs (seconds, no downloads).

``tiny_tokenizer(words)`` is a word-level tokenizer with SmolLM2's special tokens and chat
template; ``tiny_minillava(tokenizer, vision_dim)`` wraps a 2-layer ``LlamaForCausalLM`` with the
same projector as the real mini-LLaVA. Structure and code paths are identical to the real model;
only sizes (and therefore numbers) differ.
"""
from __future__ import annotations

import re
from typing import Iterable

import torch

CHAT_TEMPLATE = (  # SmolLM2-135M-Instruct's template (see the GGUF's tokenizer.chat_template)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|pad|>", "<|im_end|>", "<|im_start|>", "<unk>"]


def tiny_tokenizer(words: Iterable[str] = ()):
    """Word-level tokenizer over ``words`` (plus the template's own words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    text = " ".join(words) + " system user assistant Answer with one word . You are a helpful AI"
    for w in re.findall(r"\w+|[^\w\s]", text):
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|im_end|>",
                                  bos_token="<|im_start|>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama(vocab_size: int, *, hidden: int = 32, layers: int = 2, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=True, pad_token_id=0,
                      eos_token_id=1, bos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def tiny_minillava(tokenizer, vision_dim: int = 8, *, seed: int = 0):
    from lab.experiments.aware.run.minillava import MiniLlava

    lm = tiny_llama(len(tokenizer), seed=seed)
    torch.manual_seed(seed)
    return MiniLlava(lm, vision_dim, meta={"tiny": True}).eval()
