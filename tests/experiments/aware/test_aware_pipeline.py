"""Mini-LLaVA pipeline on a tiny random model: prompts, KV-cached scoring, every method, round trip."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lab.aware.config import AwareConfig
from lab.aware.methods import MethodSpec, finish, matched_lora_rank, prepare
from lab.experiments.aware.run.finetune import TrainConfig, evaluate, iterate, train
from lab.aware.freeze import RowSplitLinear
from lab.experiments.aware.run.minillava import MiniLlava
from lab.experiments.aware.run.prompts import ChatEncoder, Encoded
from lab.aware.saliency import profile
from lab.experiments.aware.run.scoring import answer_loss, forward, model_inputs, option_scores
from lab.experiments.aware.run.tasks import QASet, QuestionTemplate, calibration, exact_match
from lab.experiments.aware.run.tiny import tiny_minillava, tiny_tokenizer

COLORS = ("red", "blue", "dark green", "teal blue green")
QUESTIONS = ("what color is the shape ?", "which color ?")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(list(COLORS) + list(QUESTIONS) + ["capital of France Paris Rome"])


def qaset(n=12, seed=0, text_every=0):
    g = np.random.RandomState(seed)
    img = np.arange(n)
    if text_every:
        img[::text_every] = -1
    return QASet("toy", [QUESTIONS[i % 2] for i in range(n)], [COLORS[g.randint(4)] for _ in range(n)],
                 [COLORS] * n, img, torch.randn(n, 4, 8, generator=torch.Generator().manual_seed(seed)))


def model_and_enc(tok, seed=0):
    return tiny_minillava(tok, 8, seed=seed), ChatEncoder(tok, 4)


def test_template_without_answer_fails():
    with pytest.raises(ValueError, match="has no answer"):
        QuestionTemplate("Which digit is this?", "")
    with pytest.raises(ValueError, match="has no answer"):
        QuestionTemplate("Which digit is this?", "a digit")
    with pytest.raises(ValueError, match="unknown answer fields"):
        QuestionTemplate("Which digit is this?", "{colour}")
    t = QuestionTemplate("Is this digit even?", "{even}")
    assert t.render(4, "0123456789") == "yes" and t.render(7, "0123456789") == "no"


def test_encode_and_collate_left_padded(tok):
    enc = ChatEncoder(tok, 4)
    a = enc.encode(QUESTIONS[0], "teal blue green", image=True)
    b = enc.encode(QUESTIONS[1], "red")
    assert a.n_answer == 4 and a.ids[-1] == enc.eos_id and a.image_start > 0
    batch = enc.collate([a, b], torch.randn(1, 4, 8))
    L = batch["input_ids"].shape[1]
    assert batch["attention_mask"][:, -1].all() and batch["image_mask"].sum() == 4
    assert batch["labels"][0, L - 4:].tolist() == list(a.ids[-4:])
    assert (batch["labels"][1] != -100).sum() == 2
    with pytest.raises(ValueError, match="no visual tokens"):
        enc.collate([a])


def test_option_scores_equal_full_sequence_scoring(tok):
    model, enc = model_and_enc(tok)
    qa = qaset(6, text_every=3)
    batch = next(iterate(qa, enc, 6, answers=False))
    opts = enc.option_ids(COLORS)
    got = option_scores(model, batch, [opts] * 6)
    rows = [int(i) for i in qa.image_index if i >= 0]
    img_iter = iter(rows)
    for i in range(6):
        e = enc.encode(qa.questions[i], image=qa.image_index[i] >= 0)
        r = next(img_iter) if qa.image_index[i] >= 0 else None
        for k, o in enumerate(opts):
            full = enc.collate([Encoded(e.ids + tuple(o), e.image_start, 0)],
                               qa.tokens[[r]] if r is not None else None, share_prefix=False)
            with torch.no_grad():
                lp = model(**full).logits[0].log_softmax(-1)
            ref = sum(float(lp[len(e.ids) - 1 + t, o[t]]) for t in range(len(o)))
            assert got[i, k].item() == pytest.approx(ref, abs=1e-4)


def test_shared_prefix_forward_equals_plain_forward_with_gradients(tok):
    qa = qaset(6, text_every=3)
    grads, losses = [], []
    for share in (True, False):
        model, enc = model_and_enc(tok)
        encs = [enc.encode(qa.questions[i], qa.answers[i], image=qa.image_index[i] >= 0) for i in range(6)]
        batch = enc.collate(encs, qa.tokens[[int(i) for i in qa.image_index if i >= 0]], share_prefix=share)
        assert ("prefix_len" in batch) == share and batch.get("prefix_len", 0) >= (8 if share else 0)
        loss = answer_loss(model, batch)
        loss.backward()
        losses.append(loss.item())
        grads.append(model.language_model.model.layers[0].self_attn.k_proj.weight.grad.clone())
        with torch.no_grad():
            logits = forward(model, batch, logits_to_keep=3).logits
        if share:
            ref = logits
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ref, logits, rtol=1e-4, atol=1e-5)


def test_answer_loss_only_on_answer_tokens(tok):
    model, enc = model_and_enc(tok)
    batch = next(iterate(qaset(4), enc, 4, answers=True))
    loss = answer_loss(model, batch)
    with torch.no_grad():
        logits = model(**model_inputs(batch)).logits
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_profile_minillava_hooks_projector_and_lm(tok):
    model, enc = model_and_enc(tok)
    cal = [model_inputs(b) for b in iterate(qaset(8), enc, 4, answers=True)]
    sal = profile(model, cal, targets="qkv+projector", progress=False)
    assert {"mm_projector.0", "mm_projector.2"} <= set(sal.scores)
    assert len(sal.scores) == 2 + 3 * 2 and sal.n_samples == 8


@pytest.mark.parametrize("method", ["zero-shot", "full", "lora", "dora", "aware"])
def test_every_method_trains_and_finishes_as_a_standard_model(tok, method, tmp_path):
    model, enc = model_and_enc(tok)
    qa = qaset(16)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sal = profile(model, [model_inputs(b) for b in iterate(qa, enc, 8, answers=True)], progress=False)
    spec = MethodSpec(method, AwareConfig(rho=0.3))
    cfg = TrainConfig(steps=2, batch_size=4, weight_decay=0.1)
    model, groups, info = prepare(model, spec, cfg, saliency=sal)
    assert (info["trainable"] == 0) == (method == "zero-shot")
    log = train(model, groups, qa, enc, cfg, progress=False)
    assert len(log["losses"]) == (0 if method == "zero-shot" else 2)
    model = finish(model, method)
    assert isinstance(model, MiniLlava)
    assert not any(isinstance(m, RowSplitLinear) or "lora" in type(m).__name__.lower() for m in model.modules())
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    if method == "aware":
        for name, mask in info["masks"].items():
            assert torch.equal(before[name + ".weight"][mask], after[name + ".weight"][mask])
        assert torch.equal(before["language_model.model.layers.0.mlp.up_proj.weight"],
                           after["language_model.model.layers.0.mlp.up_proj.weight"])
    model.save_pretrained(tmp_path)
    loaded = MiniLlava.from_pretrained(tmp_path)
    b = next(iterate(qa, enc, 4, answers=False))
    with torch.no_grad():
        torch.testing.assert_close(model(**b).logits, loaded(**b).logits)
    assert 0 <= evaluate(loaded, qa, enc)["acc"] <= 1


def test_lora_rank_matches_aware_count(tok):
    model, _ = model_and_enc(tok)
    r = matched_lora_rank(model, AwareConfig(rho=0.3))
    spec_a, spec_l = MethodSpec("aware", AwareConfig(rho=0.3, rule="random")), MethodSpec("lora")
    _, _, ia = prepare(tiny_minillava(tok, 8), spec_a, TrainConfig())
    _, _, il = prepare(tiny_minillava(tok, 8), spec_l, TrainConfig())
    assert il["lora_rank"] == r
    assert abs(il["trainable"] - ia["trainable"]) / ia["trainable"] < 0.25


def test_bad_inputs_fail_before_work(tok):
    with pytest.raises(ValueError, match="unknown method"):
        MethodSpec("adapter")
    with pytest.raises(ValueError, match="calibration set is empty"):
        calibration("upstream", 0)
    with pytest.raises(ValueError, match="unknown calibration set"):
        calibration("mmmu", 4)
    model, _ = model_and_enc(tok)
    with pytest.raises(ValueError, match="saliency profile"):
        prepare(model, MethodSpec("aware"), TrainConfig())
    with pytest.raises(ValueError, match="match no nn.Linear"):
        prepare(model, MethodSpec("aware", AwareConfig(rule="random", targets=("nothing_here",))), TrainConfig())


def test_exact_match_rule():
    assert exact_match("The capital of France is Paris.", ("Paris",))
    assert exact_match("8 legs", ("8", "eight"))
    assert not exact_match("Parisian", ("Paris",))
    assert exact_match("Eight.", ("8", "eight"))


def test_projector_cache_key_is_identity_not_float_values():
    """Regression: the key once hashed a float sum of the tokens, which differs in the last bits
    with the CPU thread count, so a cached projector was silently re-aligned (15+ minutes)."""
    from dataclasses import replace

    from lab.experiments.aware.run.tasks import Task
    from lab.experiments.aware.run.upstream import AlignConfig, _key

    qa = replace(qaset(12), source="efficientnet_lite0-abc")
    key = _key(AlignConfig(), "smollm2", Task("easy_vqa", qa, qa), 2)
    nudged = replace(qa, tokens=qa.tokens + 1e-6)
    assert _key(AlignConfig(), "smollm2", Task("easy_vqa", nudged, qa), 2) == key
    other_images = replace(qa, source="efficientnet_lite0-def")
    assert _key(AlignConfig(), "smollm2", Task("easy_vqa", other_images, qa), 2) != key
    other_answers = replace(qa, answers=list(reversed(qa.answers)))
    assert _key(AlignConfig(), "smollm2", Task("easy_vqa", other_answers, qa), 2) != key
    assert _key(AlignConfig(steps=301), "smollm2", Task("easy_vqa", qa, qa), 2) != key


def test_aware_can_have_its_own_language_model_lr(tok):
    spec = MethodSpec("aware", AwareConfig(rule="weight-norm"))
    lrs = lambda cfg: sorted(g["lr"] for g in prepare(tiny_minillava(tok, 8), spec, cfg)[1])  # noqa: E731
    assert lrs(TrainConfig(lr=2e-5, lr_projector=1e-3, lr_aware=None)) == [2e-5, 1e-3]   # the reference
    assert lrs(TrainConfig(lr=2e-5, lr_projector=1e-3)) == [3e-4, 1e-3]                 # chosen on validation
    assert lrs(TrainConfig(lr=2e-5, lr_projector=1e-3, lr_aware=3e-4)) == [3e-4, 1e-3]
    full = prepare(tiny_minillava(tok, 8), MethodSpec("full"), TrainConfig(lr=2e-5, lr_aware=3e-4))[1]
    assert sorted(g["lr"] for g in full) == [2e-5, 1e-3]          # full fine-tuning keeps --lr
    with pytest.raises(ValueError, match="lr_aware 0.0: must be a finite number > 0"):
        TrainConfig(lr_aware=0.0)


def test_unreachable_checkpoints_say_what_to_do(tmp_path):
    from lab.experiments.aware.run.minillava import load_hub_llava, load_language_model

    with pytest.raises(RuntimeError, match="packaged default"):
        load_language_model(str(tmp_path))                 # an empty folder: no config.json
    with pytest.raises(RuntimeError, match="mini-LLaVA"):
        load_hub_llava(str(tmp_path))
