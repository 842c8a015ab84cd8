"""lab.analysis on hand-made inputs (and one tiny untrained backbone)."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from lab import analysis as A


def _rand(n, d, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


# --- CKA ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,d", [(50, 8), (10, 40)])  # feature form and Gram form
def test_cka_of_x_with_itself_is_one(n, d):
    x = _rand(n, d)
    assert A.linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("n,d", [(60, 6), (12, 30)])
def test_cka_invariant_to_orthogonal_transform_and_isotropic_scaling_and_shift(n, d):
    x = _rand(n, d)
    q, _ = torch.linalg.qr(_rand(d, d, seed=1))
    assert torch.allclose(q.T @ q, torch.eye(d), atol=1e-5)
    y = 7.5 * x @ q + 3.0
    assert A.linear_cka(x, y) == pytest.approx(1.0, abs=1e-6)
    z = _rand(n, 5, seed=2)
    assert A.linear_cka(x, z) == pytest.approx(A.linear_cka(y, 0.1 * z), abs=1e-6)


def test_cka_is_symmetric_bounded_and_low_for_independent_features():
    x, y = _rand(400, 5), _rand(400, 5, seed=3)
    c = A.linear_cka(x, y)
    assert c == pytest.approx(A.linear_cka(y, x), abs=1e-12)
    assert 0 <= c < 0.1
    # not invariant to a non-isotropic rescaling of coordinates
    assert A.linear_cka(x, x * torch.tensor([10.0, 1, 1, 1, 1])) < 0.99


def test_cka_known_value_one_dimensional():
    # 1-D features: CKA is the squared Pearson correlation
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    y = torch.tensor([[1.0], [3.0], [2.0], [4.0]])
    r = np.corrcoef(x[:, 0], y[:, 0])[0, 1]
    assert A.linear_cka(x, y) == pytest.approx(r ** 2, abs=1e-12)


def test_cka_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="same n"):
        A.linear_cka(_rand(5, 2), _rand(6, 2))


def test_cka_matrix_is_symmetric_with_unit_diagonal():
    feats = {"a": _rand(30, 4), "b": _rand(30, 9, seed=1), "c": _rand(30, 2, seed=2)}
    m = A.cka_matrix(feats)
    assert list(m.index) == list(m.columns) == ["a", "b", "c"]
    assert np.allclose(np.diag(m.values), 1.0)
    assert np.allclose(m.values, m.values.T)
    cross = A.cka_matrix(feats, {"z": feats["a"]})
    assert cross.shape == (3, 1) and cross.loc["a", "z"] == pytest.approx(1.0)


# --- augmentation, invariance ----------------------------------------------------------------------
def test_augment_identity_settings_leave_images_unchanged_and_seed_is_reproducible():
    x = torch.rand(4, 3, 16, 16)
    same = A.augment(x, torch.Generator().manual_seed(0), scale=(1, 1), max_rotate=0, flip_p=0, jitter=0)
    assert torch.allclose(same, x, atol=1e-5)
    a = A.augment(x, torch.Generator().manual_seed(1))
    b = A.augment(x, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.allclose(a, x)


def test_augment_kinds_split_geometry_from_photometry():
    x = torch.rand(3, 3, 16, 16)
    geo = A.augment(x, torch.Generator().manual_seed(2), kind="geometric")
    pho = A.augment(x, torch.Generator().manual_seed(2), kind="photometric")
    both = A.augment(x, torch.Generator().manual_seed(2))
    assert not torch.allclose(geo, x) and not torch.allclose(pho, x)
    # photometric = per-image x * c + b; 'all' applies the same c, b after the same geometry
    xc, pc = x - x.mean((1, 2, 3), keepdim=True), pho - pho.mean((1, 2, 3), keepdim=True)
    c = (xc * pc).sum((1, 2, 3), keepdim=True) / xc.pow(2).sum((1, 2, 3), keepdim=True)
    b = pho.mean((1, 2, 3), keepdim=True) - c * x.mean((1, 2, 3), keepdim=True)
    assert torch.allclose(pho, c * x + b, atol=1e-5)
    assert torch.allclose(both, c * geo + b, atol=1e-5)
    with pytest.raises(ValueError, match="kind"):
        A.augment(x, torch.Generator(), kind="colour")


def test_balanced_indices_and_relabel():
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    idx = A.balanced_indices(labels, 2, seed=0)
    assert list(np.bincount(labels[idx])) == [2, 2, 2] and list(idx) == sorted(idx)
    sub = A.balanced_indices(labels, 10, classes=[2, 0])
    assert set(labels[sub]) == {0, 2} and len(sub) == 7
    assert A.relabel([2, 0, 1, 2], [2, 0]).tolist() == [0, 1, -1, 0]


def test_invariance_is_one_for_identical_twins_and_near_zero_for_unrelated():
    clean = {"s1": _rand(200, 6), "s2": _rand(200, 3, seed=1)}
    same = A.invariance(clean, {k: v.clone() for k, v in clean.items()})
    assert list(same.stage) == ["s1", "s2"] and list(same.depth) == [0, 1]
    assert np.allclose(same.twin, 1.0) and np.allclose(same.invariance, 1.0)
    noise = A.invariance(clean, {k: _rand(*v.shape, seed=9) for k, v in clean.items()})
    assert (noise.invariance.abs() < 0.2).all()
    half = A.invariance(clean, {k: v + 1.0 * _rand(*v.shape, seed=5) for k, v in clean.items()})
    assert ((half.invariance > 0.3) & (half.invariance < 0.95)).all()


def test_probe_stages_reads_a_separable_stage_and_not_a_noise_stage():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(200) % 2
    sep = torch.randn(200, 4, generator=g) + 4 * (2 * y[:, None].float() - 1)  # means at ±4
    noise = torch.randn(200, 4, generator=g)
    df = A.probe_stages({"noise": noise[:100], "sep": sep[:100]}, y[:100],
                        {"noise": noise[100:], "sep": sep[100:]}, y[100:], epochs=20)
    row = df.set_index("stage")
    assert row.loc["sep", "linear_probe"] > 0.95 and row.loc["sep", "prototype"] > 0.95
    assert row.loc["noise", "linear_probe"] < 0.75
    assert list(df.dim) == [4, 4]


# --- change detection --------------------------------------------------------------------------------
def test_state_hash_detects_any_parameter_or_buffer_change():
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    h = A.state_hash(m)
    assert A.state_hash(copy.deepcopy(m)) == h
    m2 = copy.deepcopy(m)
    with torch.no_grad():
        m2[0].weight[0, 0] = torch.nextafter(m2[0].weight[0, 0], torch.tensor(10.0))
    assert A.state_hash(m2) != h
    m3 = copy.deepcopy(m)
    m3[1].running_mean += 1e-7
    assert A.state_hash(m3) != h


def test_stage_of_maps_timm_names():
    assert A.stage_of("conv_stem.weight") == "stem" and A.stage_of("bn1.bias") == "stem"
    assert A.stage_of("blocks.0.0.conv_dw.weight") == "stage1" and A.stage_of("blocks.6.0.bn1.weight") == "stage7"
    assert A.stage_of("conv_head.weight") == "head" and A.stage_of("classifier.weight") == "classifier"
    assert A.stage_of("blocks.11.attn.qkv.weight", "vit") == "block12"
    assert A.stage_of("cls_token", "vit") == "embed" and A.stage_of("norm.weight", "vit") == "norm"


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_stem, self.bn1 = nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2)
        self.blocks = nn.ModuleList([nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1)])


def test_parameter_drift_is_zero_for_a_copy_and_located_where_weights_moved():
    a = _Tiny()
    b = copy.deepcopy(a)
    assert (A.parameter_drift(a, b).relative_change == 0).all()
    with torch.no_grad():
        b.blocks[1].weight.mul_(2)
    b.bn1.running_var.fill_(3)
    d = A.parameter_drift(a, b).set_index("stage")
    assert d.loc["stage2", "relative_change"] > 0.5
    assert d.loc["stage1", "relative_change"] == 0 and d.loc["stem", "relative_change"] == 0
    assert bool(d.loc["stem", "buffers_changed"]) and not bool(d.loc["stage1", "buffers_changed"])


# --- routing over an order ------------------------------------------------------------------------
def _two_module_logits():
    # 4 samples, 2 modules, 2 classes. Module 0 is confident on samples 0,1; module 1 on 2,3,
    # except sample 1, where module 1 is (wrongly) slightly more confident.
    sure, flat, mid = [5.0, 0.0], [0.1, 0.0], [2.5, 0.0]
    m0 = torch.tensor([sure, mid, flat, flat])
    m1 = torch.tensor([flat, [0, 3.0], [0.0, 5.0], [0.0, 5.0]])
    return torch.stack([m0, m1])  # [T=2, N=4, C=2]


def test_route_in_order_batch_one_is_per_sample_and_batches_share_a_module():
    logits = _two_module_logits()
    order = torch.arange(4)
    from lab.tosca.routing import entropy

    assert torch.equal(A.route_in_order(logits, order, 1), entropy(logits).argmin(0))
    both = A.route_in_order(logits, order, 2)
    assert both[0] == both[1] == 0 and both[2] == both[3] == 1  # the batch fixes sample 1
    whole = A.route_in_order(logits, order, 4)
    assert len(set(whole.tolist())) == 1


def test_routing_by_order_reports_both_orders_and_every_batch_size():
    logits = _two_module_logits()
    labels, tasks = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 1])
    df = A.routing_by_order(logits, labels, tasks, batch_sizes=(1, 2))
    assert len(df) == 4 and set(df.order) == {"class-ordered", "shuffled"}
    co = df[df.order == "class-ordered"].set_index("batch_size")
    assert co.loc[2, "routing_accuracy"] == 100.0 and co.loc[1, "routing_accuracy"] == 75.0


# --- with a real (tiny, untrained) backbone -------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from lab import backbones

    return backbones.load("vit_tiny_patch16_224", resolution=32)


@pytest.mark.slow
def test_stage_features_and_finetune_leave_the_original_bit_identical(tiny):
    imgs = np.random.RandomState(0).randint(0, 255, (12, 28, 28), dtype=np.uint8)
    before = A.state_hash(tiny.model)
    feats = A.stage_features(tiny, imgs, batch_size=5)
    assert list(feats) == tiny.stage_names and all(v.shape[0] == 12 for v in feats.values())
    aug = A.stage_features(tiny, imgs, batch_size=5, augmented=True, seed=1)
    assert not torch.allclose(aug["norm"], feats["norm"])  # ([CLS] at "embed" is image-independent)
    ft = A.finetune_backbone(tiny, imgs, np.arange(12) % 3, epochs=1, batch_size=6, lr=0.05)
    assert A.state_hash(tiny.model) == before
    assert A.state_hash(ft.backbone.model) != before
    assert ft.backbone.weights_id != tiny.weights_id and len(ft.log) == 1
    assert not any(p.requires_grad for p in ft.backbone.model.parameters())
    drift = A.parameter_drift(tiny.model, ft.backbone.model, "vit")
    assert (drift.relative_change > 0).any()
    assert ft.predict(imgs).shape == (12,)


def test_photos_are_real_square_rgb_uint8():
    imgs, names = A.photos(("astronaut", "camera"), size=64)
    assert imgs.shape == (2, 64, 64, 3) and imgs.dtype == np.uint8 and names == ["astronaut", "camera"]
    assert imgs.std() > 10
