"""AWARe generic core: saliency formula, masking rule, row freezing, merge round trip, errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lab import aware
from lab.aware.config import AwareConfig
from lab.aware.freeze import RowSplitLinear, apply, merge, trainable_parameters
from lab.aware.masking import frozen_fraction, select
from lab.aware.saliency import profile, sample_saliency
from lab.aware.targets import find_targets


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def batches(n_batches=2, b=3, length=5, seed=0, pad=True):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(1, 64, (b, length), generator=g)
        mask = torch.ones(b, length, dtype=torch.long)
        if pad:
            mask[0, :2] = 0     # left padding on the first sample
            ids[0, :2] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


# ---- saliency ---------------------------------------------------------------------------------
def test_sample_saliency_by_hand_with_padding():
    # one sample, L=3 (last position is padding), d=2
    act = torch.tensor([[[3.0, 0.0], [4.0, 1.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # L2 over sequence: [5, 1]; per-sample normalised: [5, 1] / sqrt(26)
    expect = torch.tensor([[5.0, 1.0]]) / math.sqrt(26.0)
    torch.testing.assert_close(sample_saliency(act, mask), expect)
    # without the mask the padding would dominate
    assert not torch.allclose(sample_saliency(act), expect)


class Toy(nn.Module):
    """Named like an LLM + projector + vision tower, so target selection can be checked."""

    def __init__(self):
        super().__init__()
        self.language_model = nn.ModuleDict({"q_proj": nn.Linear(2, 3, bias=False),
                                             "o_proj": nn.Linear(3, 2)})
        self.vision_tower = nn.ModuleDict({"q_proj": nn.Linear(2, 2)})
        self.mm_projector = nn.Sequential(nn.Linear(2, 2), nn.GELU(), nn.Linear(2, 2))

    def forward(self, x, attention_mask=None, images=None):
        self.vision_tower["q_proj"](x)
        if images is not None:
            self.mm_projector(images)
        return self.language_model["o_proj"](self.language_model["q_proj"](x))


def test_profile_matches_hand_computation_and_mean_over_samples():
    toy = Toy()
    with torch.no_grad():
        toy.language_model["q_proj"].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [9.0, 9.0]],      # last position padded
                      [[3.0, 4.0], [0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    sal = profile(toy, [{"x": x, "attention_mask": mask}], targets=("q_proj",), progress=False)
    assert list(sal.scores) == ["language_model.q_proj"]          # vision tower's q_proj excluded
    # sample 0: outputs [1,0,1], [0,2,2] -> L2 over seq [1,2,sqrt5]; sample 1: [3,4,7] -> [3,4,7]
    s0 = torch.tensor([1.0, 2.0, math.sqrt(5)]); s0 /= s0.norm()
    s1 = torch.tensor([3.0, 4.0, 7.0]); s1 /= s1.norm()
    torch.testing.assert_close(sal.scores["language_model.q_proj"], (s0 + s1) / 2)
    assert sal.n_samples == 2


def test_profile_projector_over_image_tokens_is_not_masked():
    toy = Toy()
    x = torch.randn(2, 5, 2)
    images = torch.randn(2, 3, 2)          # 3 image tokens != 5 LM positions: no mask applies
    sal = profile(toy, [{"x": x, "attention_mask": torch.ones(2, 5), "images": images}],
                  targets="qkv+projector", progress=False)
    assert set(sal.scores) == {"language_model.q_proj", "mm_projector.0", "mm_projector.2"}
    assert sal.matrix().shape == (3, 3)


def test_profile_real_llama_targets_and_padding_invariance():
    model = tiny_llama()
    sal = profile(model, batches(), targets="qkv", progress=False)
    assert len(sal.scores) == 6 and all(torch.isfinite(v).all() for v in sal.scores.values())
    assert sal.scores["model.layers.0.self_attn.k_proj"].shape == (8,)  # 2 kv heads x 4


def test_profile_errors_before_work():
    model = tiny_llama()
    with pytest.raises(ValueError, match="calibration set is empty"):
        profile(model, [], progress=False)
    with pytest.raises(ValueError, match="calibration set is empty"):
        profile(model, iter(()), progress=False)
    with pytest.raises(ValueError, match=r"match no nn.Linear.*Available Linear modules: .*q_proj"):
        profile(model, batches(), targets=("no_such_layer",), progress=False)


# ---- masking rule -----------------------------------------------------------------------------
SCORES = {"a": torch.tensor([0.9, 0.1, 0.5, 0.3]), "b": torch.tensor([0.8, 0.2])}


def test_select_global_balanced_extremes():
    m = select(SCORES, 0.5, "activation-global")          # top 3 of 6: 0.9, 0.8, 0.5
    assert m["a"].tolist() == [True, False, True, False] and m["b"].tolist() == [True, False]
    m = select(SCORES, 0.5, "activation-balanced")        # top 2 of a, top 1 of b
    assert m["a"].tolist() == [True, False, True, False] and m["b"].tolist() == [True, False]
    assert not any(v.any() for v in select(SCORES, 0.0).values())
    assert all(v.all() for v in select(SCORES, 1.0).values())
    for rule in aware.RULES.names():
        kw = {"weights": {"a": nn.Linear(3, 4), "b": nn.Linear(3, 2)}} if rule == "weight-norm" else {}
        assert frozen_fraction(select(SCORES, 0.0, rule, **kw)) == 0.0
        assert frozen_fraction(select(SCORES, 1.0, rule, **kw)) == 1.0


def test_mask_composition_by_layer_kind():
    from lab.aware.masking import composition

    m = {"l.0.self_attn.q_proj": torch.tensor([1, 0, 0, 0], dtype=torch.bool),
         "l.1.self_attn.q_proj": torch.tensor([1, 1], dtype=torch.bool),
         "mm_projector.0": torch.tensor([0, 1], dtype=torch.bool)}
    assert composition(m) == {"q_proj": (3, 6), "projector": (1, 2)}


def test_weight_norm_ranks_rows():
    lin = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.1, 0.0], [3.0, 4.0], [1.0, 0.0]]))
    m = select({"l": torch.zeros(3)}, 1 / 3, "weight-norm", weights={"l": lin})
    assert m["l"].tolist() == [False, True, False]


def test_random_rule_is_seeded():
    big = {"a": torch.rand(200), "b": torch.rand(100)}
    m1, m2 = select(big, 0.3, "random", seed=1), select(big, 0.3, "random", seed=1)
    m3 = select(big, 0.3, "random", seed=2)
    assert all(torch.equal(m1[k], m2[k]) for k in big)
    assert not all(torch.equal(m1[k], m3[k]) for k in big)
    assert sum(int(v.sum()) for v in m1.values()) == 90


@pytest.mark.parametrize("rho", [-0.1, 1.5, float("nan"), True, "0.3"])
def test_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        select(SCORES, rho)
    with pytest.raises(ValueError, match="rho"):
        AwareConfig(rho=rho)


def test_unknown_rule_and_preset():
    with pytest.raises(ValueError, match="unknown selection rule"):
        select(SCORES, 0.3, "activation-max")
    with pytest.raises(ValueError, match="unknown selection rule"):
        AwareConfig(rule="magnitude")
    with pytest.raises(ValueError, match="unknown target preset"):
        AwareConfig(targets="qkv+mlp")
    with pytest.raises(ValueError, match="weight-norm"):
        select(SCORES, 0.3, "weight-norm")


# ---- freezing rows ----------------------------------------------------------------------------
def _train(model, steps=3, wd=0.1):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=wd)
    model.train()
    for b in batches(n_batches=steps, seed=3):
        out = model(**b, labels=b["input_ids"])
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def test_frozen_rows_bit_identical_after_adamw_with_weight_decay():
    model = tiny_llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    targets = find_targets(model, "qkv")
    masks = select({n: torch.rand(m.out_features) for n, m in targets.items()}, 0.3)
    apply(model, masks)
    t, total = trainable_parameters(model)
    assert 0 < t < total
    _train(model)
    merge(model)
    after = dict(model.named_parameters())
    changed_rows = 0
    for name in masks:
        w0, w1 = before[name + ".weight"], after[name + ".weight"]
        assert torch.equal(w0[masks[name]], w1[masks[name]]), name          # bit-identical
        changed_rows += int((w0[~masks[name]] != w1[~masks[name]]).any(1).sum())
    assert changed_rows > 0
    # everything outside the targets is untouched too (MLP, o_proj, embeddings, norms)
    for n, p in after.items():
        if not any(n.startswith(k) for k in masks):
            assert torch.equal(before[n], p), n


def test_trainable_fraction_counts_rows():
    model = tiny_llama()
    targets = find_targets(model, "qkv")
    total_rows_params = sum(m.weight.numel() for m in targets.values())
    apply(model, select({n: torch.rand(m.out_features) for n, m in targets.items()}, 0.0))
    assert trainable_parameters(model)[0] == total_rows_params
    assert all(isinstance(model.get_submodule(n), RowSplitLinear) for n in targets)


def test_round_trip_save_load_after_apply(tmp_path):
    from transformers import LlamaForCausalLM

    model = tiny_llama()
    targets = find_targets(model, "qkv")
    apply(model, select({n: torch.rand(m.out_features) for n, m in targets.items()}, 0.5))
    _train(model, steps=1)
    merge(model)
    assert not any(isinstance(m, RowSplitLinear) for m in model.modules())
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    b = batches(n_batches=1)[0]
    with torch.no_grad():
        torch.testing.assert_close(model(**b).logits, loaded(**b).logits)


def test_apply_rejects_unknown_layer_and_empty_masks():
    model = tiny_llama()
    with pytest.raises(ValueError, match="not an nn.Linear"):
        apply(model, {"model.layers.0.nope": torch.zeros(4, dtype=torch.bool)})
    with pytest.raises(ValueError, match="no masks"):
        apply(model, {})


# ---- a real transformers LLaVA (tiny, random): the hub path of the generic core -------------------
def tiny_hf_llava():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    vc = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          image_size=28, patch_size=14, projection_dim=16)
    tc = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    return LlavaForConditionalGeneration(LlavaConfig(vision_config=vc, text_config=tc, image_token_id=63)).eval()


def llava_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 60, (2, 9), generator=g)
    ids[:, 1:5] = 63                                   # 4 image tokens (2x2 patches) per sample
    mask = torch.ones_like(ids)
    mask[1, 0] = 0
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.randn(2, 3, 28, 28, generator=g)}


def test_hub_llava_path_targets_profile_apply_merge_roundtrip(tmp_path):
    from transformers import LlavaForConditionalGeneration

    model = tiny_hf_llava()
    targets = find_targets(model, "qkv+projector")
    assert not any("vision_tower" in n for n in targets)               # CLIP's q/k/v excluded
    assert {"model.multi_modal_projector.linear_1", "model.multi_modal_projector.linear_2"} <= set(targets)
    sal = profile(model, [llava_batch(0), llava_batch(1)], progress=False)
    assert set(sal.scores) == set(targets)
    masks = select(sal.scores, 0.3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    apply(model, masks)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    model.train()
    for s in range(2):
        b = llava_batch(s)
        model(**b, labels=b["input_ids"]).loss.backward()
        opt.step()
        opt.zero_grad()
    merge(model).eval()
    for n, m in masks.items():
        assert torch.equal(before[n + ".weight"][m], dict(model.named_parameters())[n + ".weight"][m])
    model.save_pretrained(tmp_path)
    loaded = LlavaForConditionalGeneration.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**llava_batch(5)).logits, loaded(**llava_batch(5)).logits)
