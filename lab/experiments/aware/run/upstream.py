"""The upstream stage: align the mini-LLaVA projector on easy-VQA, language model frozen.

This is LLaVA's stage-1 "pre-training" in miniature: only ``mm_projector`` learns, so SmolLM2's
own text skills stay exactly SmolLM2's (the general-knowledge probe measures them) and the model
gains a visual skill (easy-VQA). The result is done once and cached on disk: the projector weights
are keyed by the alignment config, the language model and the visual-token settings.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass

import torch

from lab.experiments.aware.run.finetune import TrainConfig, evaluate, train
from lab.experiments.aware.run.minillava import SMOLLM2, MiniLlava, cache_root, load_language_model
from lab.experiments.aware.run.prompts import ChatEncoder
from lab.experiments.aware.run.tasks import Task


@dataclass(frozen=True)
class AlignConfig:
    """Projector alignment recipe. Default measured on 2 idle CPU cores (2 threads): 100 steps of
    16 questions take ~205 s and reach easy-VQA 0.71 on 100 test questions (majority answer 0.36);
    lr 4e-3 gave the same 0.71, and 300 steps at 1e-3 (~10 min) 0.81 — the first AWARe notebook
    of a fresh machine pays this once, so the default is the short one."""

    steps: int = 100
    batch_size: int = 16
    lr_projector: float = 2e-3
    seed: int = 0

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1 or self.lr_projector <= 0:
            raise ValueError("alignment needs steps >= 1, batch_size >= 1 and lr_projector > 0")


def _key(align: AlignConfig, llm: str, task: Task, grid: int) -> str:
    """Cache key of an aligned projector: the recipe, the language model and the training set by
    identity — every question, answer and image row, and the visual tokens' own cache key (which
    names the images, backbone weights, resolution and grid). Never the tokens' float values:
    those differ in the last bits with the CPU thread count and would miss the cache."""
    qa = task.train
    h = hashlib.sha256()
    for part in (qa.questions, qa.answers, qa.image_index.tolist()):
        h.update(json.dumps(part).encode())
    blob = json.dumps({"align": asdict(align), "llm": llm, "grid": grid, "n": len(qa),
                       "tokens_shape": list(qa.tokens.shape) if qa.tokens is not None else None,
                       "tokens": qa.source, "qa": h.hexdigest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def align_projector(model: MiniLlava, task: Task, enc: ChatEncoder, align: AlignConfig, *,
                    progress: bool = True) -> dict:
    """Train only ``model.mm_projector`` on ``task.train`` (in place)."""
    for p in model.parameters():
        p.requires_grad_(False)
    for p in model.mm_projector.parameters():
        p.requires_grad_(True)
    cfg = TrainConfig(steps=align.steps, batch_size=align.batch_size, lr_projector=align.lr_projector,
                      seed=align.seed)
    log = train(model, [{"params": list(model.mm_projector.parameters()), "lr": align.lr_projector}],
                task.train, enc, cfg, progress=progress, desc="aligning projector (easy-VQA)")
    for p in model.parameters():
        p.requires_grad_(False)
    return log


def build_base(task: Task, align: AlignConfig = AlignConfig(), *, llm: str = SMOLLM2, grid: int = 2,
               cache_dir=None, progress: bool = True, language_model=None, device: str = "cpu"):
    """Return ``(model, encoder, info)``: the aligned mini-LLaVA, loaded from cache when possible.

    ``language_model=(tokenizer, causal_lm)`` skips loading (tests pass a tiny one; such runs are
    never cached).
    """
    from lab._io import CorruptFile, load_tensors, save_tensors

    tiny = language_model is not None
    tok, lm = language_model if tiny else load_language_model(llm, cache_dir=cache_dir)
    lm.eval()
    n_tokens, vision_dim = task.train.tokens.shape[1:]
    torch.manual_seed(align.seed)
    model = MiniLlava(lm, int(vision_dim), meta={"llm": llm, "grid": grid, "align": asdict(align)}).to(device).eval()
    enc = ChatEncoder(tok, int(n_tokens))
    path = cache_root(cache_dir) / "projectors" / f"{_key(align, llm, task, grid)}.safetensors"
    info = {"cache": str(path), "cache_hit": False, "seconds": 0.0}
    if not tiny and path.exists():
        try:
            model.mm_projector.load_state_dict({k: v.to(device) for k, v in load_tensors(path)[0].items()})
            info["cache_hit"] = True
            return model, enc, info
        except CorruptFile:
            pass
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as the shipped projector was aligned: other float sums, another projector
    try:
        log = align_projector(model, task, enc, align, progress=progress)
    finally:
        torch.set_num_threads(threads)
    info.update(seconds=time.perf_counter() - t0, final_loss=float(sum(log["losses"][-10:]) / max(1, len(log["losses"][-10:]))))
    if not tiny:
        save_tensors(path, dict(model.mm_projector.state_dict()), {"align": json.dumps(asdict(align)), "llm": llm})
    return model, enc, info


def upstream_skills(model, enc: ChatEncoder, easy: Task, probe: Task | None, *, exact: bool = True,
                    batch_size: int = 32) -> dict:
    """easy-VQA accuracy and the text probe (MC accuracy and exact match) in one dict; ``probe=None``:
    easy-VQA only."""
    e = evaluate(model, easy.test, enc, batch_size=batch_size)
    if probe is None:
        return {"easy_vqa": e["acc"]}
    p = evaluate(model, probe.test, enc, batch_size=batch_size, exact=exact)
    out = {"easy_vqa": e["acc"], "probe": p["acc"]}
    if exact:
        out["probe_em"] = p["em"]
    return out
