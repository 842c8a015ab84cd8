"""The real offline language model (SmolLM2-135M-Instruct GGUF): loading, chat format, AWARe step,
standard checkpoint. Slow (~30-60 s on 2 cores in a cold cache): the GGUF is de-quantised on first load."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(smollm2_in_cache):
    # The user's cache, shared with the other tests (conftest.smollm2_in_cache): in a cold cache (CI,
    # a fresh clone) the run's first load goes through the GGUF path and writes the plain checkpoint
    # every later load reads, so a test run de-quantises the GGUF once.
    from lab.experiments.aware.run.minillava import load_language_model

    return load_language_model()


def test_the_first_load_leaves_a_plain_checkpoint_in_the_cache(smol):
    from lab.experiments.aware.run.minillava import SMOLLM2, cache_root

    plain = cache_root() / "models" / SMOLLM2
    assert (plain / "model.safetensors").is_file() and (plain / "tokenizer_config.json").is_file()


def test_smollm2_is_a_standard_llama(smol, tmp_path):
    tok, lm = smol
    assert type(lm).__name__ == "LlamaForCausalLM" and lm.config.num_hidden_layers == 30
    assert getattr(lm, "hf_quantizer", None) is None          # GGUF marker dropped: saveable
    assert tok.eos_token == "<|im_end|>"


def test_chat_format_image_slots_and_answer(smol):
    from lab.experiments.aware.run.prompts import ChatEncoder

    tok, _ = smol
    enc = ChatEncoder(tok, 4)
    e = enc.encode("Which digit is this?", "7", image=True)
    toks = tok.convert_ids_to_tokens(list(e.ids))
    assert toks[: e.image_start][-2:] == ["user", "Ċ"]         # image right after the user tag
    assert e.ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and e.n_answer == 2
    text = tok.decode(list(e.ids[e.image_start + 4:]))
    assert text.startswith("\nWhich digit is this?<|im_end|>\n<|im_start|>assistant\n7")


def test_aware_step_on_minillava_and_checkpoint(smol, tmp_path):
    from lab.aware.config import AwareConfig
    from lab.aware.methods import MethodSpec, finish, prepare
    from lab.experiments.aware.run.finetune import TrainConfig, iterate, train
    from lab.experiments.aware.run.minillava import MiniLlava
    from lab.experiments.aware.run.prompts import ChatEncoder
    from lab.aware.saliency import profile
    from lab.experiments.aware.run.scoring import model_inputs
    from lab.experiments.aware.run.tasks import QASet

    import numpy as np

    tok, lm = smol
    model = MiniLlava(lm, 32).eval()
    enc = ChatEncoder(tok, 4)
    qa = QASet("t", ["Which digit is this?"] * 4, ["1", "2", "3", "4"], [tuple("0123456789")] * 4,
               np.arange(4), torch.randn(4, 4, 32))
    sal = profile(model, [model_inputs(b) for b in iterate(qa, enc, 4, answers=True)], progress=False)
    assert len(sal.scores) == 90 + 2                          # 30 layers x q/k/v + 2 projector Linears
    model, groups, info = prepare(model, MethodSpec("aware", AwareConfig(rho=0.3)), TrainConfig(), saliency=sal)
    frac = info["trainable"] / info["total"]
    assert 0.05 < frac < 0.15                                 # ~0.7 x (q/k/v + projector) of 135M
    train(model, groups, qa, enc, TrainConfig(steps=1, batch_size=4), progress=False)
    model = finish(model, "aware")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "language_model" / "model.safetensors").exists()
