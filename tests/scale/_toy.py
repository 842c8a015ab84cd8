"""A tiny random mini-LLaVA and toy questions (no data, no downloads) for the scale tests."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

WORDS = ["red", "blue", "green", "yes", "no", "what", "color", "is", "it", "?", "capital", "Paris", "Rome"]


def toy(n, seed, text=False):
    from lab.experiments.aware.run.tasks import QASet

    g = np.random.RandomState(seed)
    opts = ("red", "blue", "green")
    if text:
        return QASet("probe", ["what is the capital ?"] * n, ["Paris"] * n, [("Paris", "Rome")] * n,
                     np.full(n, -1), None, [("Paris",)] * n)
    return QASet("toy", ["what color is it ?"] * n, [opts[g.randint(3)] for _ in range(n)], [opts] * n,
                 np.arange(n), torch.randn(n, 4, 8, generator=torch.Generator().manual_seed(seed)))


def toy_context(**size_over):
    """The tiny model, its encoder and toy tasks as a sweep :class:`Context` (``size_over``: Size fields)."""
    from lab.experiments.aware.run.context import SIZES, Context
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.experiments.aware.run.tasks import Task
    from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

    tok = tiny_tokenizer(WORDS)
    size = replace(SIZES["smoke"], n_calib=8, calib_sizes=(4,), **size_over)
    return Context(tiny_minillava(tok, 8), ChatEncoder(tok, 4), Task("easy_vqa", toy(16, 0), toy(8, 1)),
                   Task("probe", None, toy(6, 2, text=True)),
                   {t: Task(t, toy(16, 3 + i), toy(8, 6 + i)) for i, t in enumerate(("fashion", "digits", "even"))},
                   size, {("upstream", 8): toy(8, 9), ("upstream", 4): toy(4, 9), ("proxy", 8): toy(8, 10)})


def _train():
    from lab.experiments.aware.run.finetune import TrainConfig

    # lrs large enough that 4 steps move the weights far beyond the comparison's float tolerance
    return TrainConfig(steps=4, batch_size=8, lr=1e-2, lr_aware=1e-2, lr_projector=1e-2, warmup=0.0)


TRAIN = _train()
