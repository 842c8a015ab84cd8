import numpy as np
import pytest
import torch

from lab import backbones


def test_registry_lists_the_required_entries():
    names = backbones.list_backbones()
    assert {"efficientnet_lite0", "vit_base_patch16_224.augreg_in21k", "vit_tiny_patch16_224"} <= set(names)
    assert backbones.backbone_info("vit_tiny_patch16_224")["untrained"] is True


def test_unknown_name_lists_valid_ones():
    with pytest.raises(KeyError, match="valid backbones: .*efficientnet_lite0"):
        backbones.load("resnet9000")


@pytest.mark.parametrize("res", [0, 16, 4096])
def test_invalid_resolution_fails_before_building(res):
    with pytest.raises(ValueError, match="resolution"):
        backbones.load("efficientnet_lite0", resolution=res)


def test_vit_tiny_resolution_must_fit_patches():
    with pytest.raises(ValueError, match="multiple of 16"):
        backbones.load("vit_tiny_patch16_224", resolution=100)


def test_lite0_equals_the_package_weights_reference_and_sees_a_cat(lite0):
    """timm's model with the mapped weights computes the same function as an independent
    implementation reading the package's own state dict; chelsea is ImageNet class 285."""
    import skimage.data

    from tests._lite0_reference import forward

    ref = backbones.load("efficientnet_lite0", resolution=224)
    sd = torch.load(backbones._lite0_file(), map_location="cpu", weights_only=True)
    x = ref.preprocess(skimage.data.chelsea()[None])
    with torch.inference_mode():
        feat_ref, logits_ref = forward(sd, x.contiguous())
        logits = ref.logits(x)
        feat = ref.features(x)
    assert int(logits.argmax()) == 285 == int(logits_ref.argmax())
    torch.testing.assert_close(logits, logits_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(feat, feat_ref, atol=1e-4, rtol=1e-4)
    # the package's documented preprocessing: (pixel - 127) / 128
    img = torch.from_numpy(skimage.data.chelsea()).permute(2, 0, 1).float()[None]
    manual = (torch.nn.functional.interpolate(img, size=224, mode="bilinear", antialias=True) - 127) / 128
    torch.testing.assert_close(x, manual, atol=1e-4, rtol=0)


def test_contract_shapes_and_frozen(lite0):
    x = lite0.preprocess(np.zeros((2, 28, 28), np.uint8))
    assert x.shape == (2, 3, lite0.resolution, lite0.resolution)
    with torch.inference_mode():
        f = lite0.features(x)
        stages = lite0.stages(x)
        pooled = lite0.pooled_stages(x)
    assert f.shape == (2, lite0.feature_dim) == (2, 1280)
    assert list(stages) == lite0.stage_names
    torch.testing.assert_close(pooled["head"], f)  # the decision point is the pooled last stage
    assert not any(p.requires_grad for p in lite0.model.parameters())
    assert not lite0.model.training


def test_vit_tiny_cls_is_prelogits_and_untrained():
    bb = backbones.load("vit_tiny_patch16_224")
    assert bb.untrained and bb.feature_dim == 192
    x = bb.preprocess(np.random.RandomState(0).randint(0, 255, (2, 32, 32, 3), dtype=np.uint8))
    with torch.inference_mode():
        torch.testing.assert_close(bb.features(x), bb.stages(x)["norm"][:, 0])
    assert backbones.load("vit_tiny_patch16_224").weights_id == bb.weights_id  # seeded init


def test_vit_base_offline_fails_fast_with_instructions(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("LAB_VIT_B16_WEIGHTS", raising=False)
    with pytest.raises(backbones.WeightsUnavailable, match="LAB_VIT_B16_WEIGHTS"):
        backbones.load("vit_base_patch16_224.augreg_in21k")
    with pytest.raises(backbones.WeightsUnavailable, match="does not exist"):
        backbones.load("vit_base_patch16_224.augreg_in21k", weights=str(tmp_path / "missing.safetensors"))


@pytest.mark.parametrize("name", ["efficientnet_lite0", "vit_tiny_patch16_224"])
def test_param_count_matches_the_loaded_model(name):
    assert backbones.param_count(name) == backbones.load(name).num_params


def test_lite0_builds_its_network_only_when_used(tmp_path):
    """A cache hit needs the backbone's identity, not its network: extracting cached features leaves
    the model unbuilt; the first use builds it (frozen, eval mode, on the device asked for before)
    and it reproduces the cached features."""
    from lab import features

    first = features.extract("efficientnet_lite0", "fashion_mnist_mini", "test", resolution=32, progress=False,
                             cache_dir=tmp_path)
    bb = backbones.load("efficientnet_lite0", resolution=32).to("cpu")
    assert not bb.built and bb.feature_dim == 1280 and bb.device == torch.device("cpu") and bb.precision() == "fp32"
    again = features.extract(bb, "fashion_mnist_mini", "test", progress=False, cache_dir=tmp_path)
    assert again.cache_hit and not bb.built and torch.equal(again.features, first.features)
    import pickle

    assert not pickle.loads(pickle.dumps(bb)).built          # an unbuilt backbone travels (Ray, spawn)
    from lab.data import load_dataset

    images = load_dataset("fashion_mnist_mini").split("test").images[:16]
    with torch.inference_mode():
        fresh = bb.features(bb.preprocess(images))
    assert bb.built and not bb.model.training and not any(p.requires_grad for p in bb.model.parameters())
    torch.testing.assert_close(fresh, first.features[:16], rtol=1e-4, atol=1e-4)


def test_lite0_weights_that_are_not_lite0_fail_at_load(tmp_path):
    bad = tmp_path / "other.pth"
    torch.save({"w": torch.zeros(3)}, bad)
    with pytest.raises(backbones.WeightsUnavailable, match="holds 1 tensors"):
        backbones.load("efficientnet_lite0", weights=str(bad))


@pytest.mark.parametrize("name", backbones.list_backbones())
def test_recorded_parameter_counts_match_the_architecture(name):
    """`lab backbones` prints the count recorded in the registry (no model built); it is the count
    of the architecture as loaded, built on the meta device."""
    recorded = backbones.backbone_info(name).get("params")
    assert recorded is not None, f"{name}: record params=<count> in its registry entry (lab/backbones.py)"
    assert backbones.params(name) == recorded == backbones.param_count(name)
