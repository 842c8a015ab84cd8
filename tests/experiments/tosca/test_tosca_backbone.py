"""TOSCA with the backbone in the loop (augment mode, layer-wise adapters) on the untrained vit_tiny
at 32 px: the frozen backbone must come out bit-identical."""
import numpy as np
import pytest
import torch

from lab.experiments.tosca.augment import random_resized_crop_flip
from lab.experiments.tosca.layerwise import adapter_param_count, add_adapters
from lab.experiments.tosca.methods import ScenarioData
from lab.experiments.tosca.run import RunConfig, run


@pytest.fixture(scope="module")
def tiny():
    from lab import backbones

    torch.manual_seed(0)
    bb = backbones.load("vit_tiny_patch16_224", resolution=32)
    rng = np.random.default_rng(0)
    n_tr, n_te, C = 12, 6, 4  # per class and split: C classes, 2 tasks of 2
    imgs = {s: rng.integers(0, 256, size=(n * C, 28, 28), dtype=np.uint8) for s, n in (("train", n_tr), ("test", n_te))}
    ys = {s: torch.arange(C).repeat_interleave(n) for s, n in (("train", n_tr), ("test", n_te))}
    for s in imgs:  # make classes visible: a class-dependent bright stripe
        for c in range(C):
            imgs[s][(ys[s] == c).numpy(), c * 6:(c * 6) + 5, :] = 255
    x = {s: bb.embed(imgs[s], progress=False) for s in imgs}
    data = ScenarioData(x["train"], ys["train"], ys["train"] // 2, x["test"], ys["test"], ys["test"] // 2,
                        [[0, 1], [2, 3]], images=lambda s: imgs[s], backbone=bb)
    return bb, data


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_identical(model, snap):
    now = model.state_dict()
    assert now.keys() == snap.keys()
    for k in snap:
        assert torch.equal(now[k], snap[k]), k
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_augment_mode_leaves_the_backbone_bit_identical(tiny, tmp_path):
    bb, data = tiny
    snap = _snapshot(bb.model)
    res = run(RunConfig(backbone=bb.name, mode="augment", epochs=1, batch_size=16), data=data, runs_root=tmp_path,
              progress=False)
    _assert_identical(bb.model, snap)
    assert res.info["num_tasks"] == 2 and res.info["config"]["mode"] == "augment"


def test_layerwise_adapter_baseline_leaves_the_backbone_bit_identical(tiny, tmp_path):
    bb, data = tiny
    snap = _snapshot(bb.model)
    res = run(RunConfig(backbone=bb.name, method="layerwise_adapter", epochs=1, batch_size=16), data=data,
              runs_root=tmp_path, progress=False)
    _assert_identical(bb.model, snap)
    per_block = 192 * 64 + 64 + 64 * 192 + 192
    assert adapter_param_count(res.method.adapted.model) == 12 * per_block
    assert res.info["trainable_params_per_task"] == [12 * per_block + 2 * 192 + 1, 0]
    assert res.method.feats["test"].shape == (len(data.test_y), 2 * 192)  # [frozen, adapted]
    # adapted model: adapters moved the features (up-projections left zero init)
    assert any(p.abs().sum() > 0 for n, p in res.method.adapted.model.named_parameters() if "adapter.up" in n)


def test_efficientnet_stage_adapters():
    import timm

    m = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = m.forward_head(m.forward_features(x), pre_logits=True)
        add_adapters(m)
        out = m.forward_head(m.forward_features(x), pre_logits=True)
    torch.testing.assert_close(out, ref)  # zero-initialised up-projections: identity at start
    chans = [16, 24, 40, 80, 112, 192, 320]
    assert adapter_param_count(m) == sum(2 * c * min(64, c) + min(64, c) + c for c in chans)


def test_adapters_refuse_unknown_models():
    with pytest.raises(NotImplementedError, match="ViTs"):
        add_adapters(torch.nn.Linear(2, 2))


def test_random_resized_crop_flip_shapes_and_reproducibility():
    x = torch.randn(5, 3, 32, 32)
    a = random_resized_crop_flip(x, torch.Generator().manual_seed(1))
    b = random_resized_crop_flip(x, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, x)
    full = random_resized_crop_flip(x, torch.Generator().manual_seed(1), scale=(1, 1), ratio=(1, 1), flip_p=0)
    torch.testing.assert_close(full, x, atol=1e-5, rtol=1e-5)  # the whole image, unflipped: identity
