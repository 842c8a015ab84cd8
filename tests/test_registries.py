"""Every backbone and every dataset honours its registry's contract; a toy entry added by the test
goes through the command line like a real one (``lab backbones|datasets``, ``lab features``, a tiny
``lab tosca``) and is removed afterwards.

Backbones whose weights are not on this machine are built from a tiny random checkpoint through
their own loader (tests/_standins.py), with the hub switched off: the test never downloads.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lab import backbones, cli, data
from tests._standins import tiny_vit_file

ROOT = Path(__file__).resolve().parents[1]
BACKBONE_INFO = ("default_resolution", "resolution_range", "feature_dim", "pretrained", "untrained", "available",
                 "arch")
DATASET_INFO = ("name", "classes", "train", "test", "licence", "image", "card")
CARD_FIELDS = ("source", "licence", "size", "classes", "splits", "caveats")


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("LAB_VIT_B16_WEIGHTS", raising=False)
    return tmp_path


def _small_resolution(name: str) -> int:
    lo, hi, mult = backbones.backbone_info(name)["resolution_range"]
    return max(lo, 64 if mult == 1 else mult * -(-32 // mult))


def _build(name: str, tmp_path) -> backbones.Backbone:
    ok, where = backbones.weights_available(name)
    assert isinstance(ok, bool) and isinstance(where, str) and where
    res = _small_resolution(name)
    if ok:
        return backbones.load(name, resolution=res)
    return backbones.load(name, resolution=res, weights=str(tiny_vit_file(tmp_path / f"{name}.safetensors")))


def check_backbone_contract(bb: backbones.Backbone) -> None:
    x = bb.preprocess(np.random.RandomState(0).randint(0, 256, (2, 28, 28), dtype=np.uint8))
    assert x.shape == (2, 3, bb.resolution, bb.resolution) and x.dtype == torch.float32
    with torch.inference_mode():
        f, fmap, stages, pooled = bb.features(x), bb.feature_map(x), bb.stages(x), bb.pooled_stages(x)
    assert f.shape == (2, bb.feature_dim) and torch.isfinite(f).all()
    assert list(stages) == list(pooled) == bb.stage_names and len(bb.stage_names) >= 3
    assert all(v.shape[0] == 2 for v in stages.values())
    if bb.kind == "cnn":
        assert fmap.ndim == 4 and fmap.shape[1] == bb.feature_dim
        torch.testing.assert_close(pooled[bb.stage_names[-1]], f)   # the decision point: the pooled last stage
    else:
        assert fmap.ndim == 3 and fmap.shape[2] == bb.feature_dim
        torch.testing.assert_close(pooled[bb.stage_names[-1]], f)   # the final [CLS] token
        torch.testing.assert_close(fmap, stages[bb.stage_names[-1]])
    assert not bb.model.training and not any(p.requires_grad for p in bb.model.parameters())
    assert bb.weights_id and bb.transform in ("reference", "timm", "package")


@pytest.mark.parametrize("name", backbones.list_backbones())
def test_every_backbone_honours_the_contract(name, offline):
    info = backbones.backbone_info(name)
    assert set(BACKBONE_INFO) <= set(info), f"{name} lacks {set(BACKBONE_INFO) - set(info)}"
    assert backbones.param_count(name) > 0   # the architecture on the meta device, no weights read
    import timm

    arch, kw = info["arch"]
    with torch.device("meta"):
        assert timm.create_model(arch, pretrained=False, **kw).num_features == info["feature_dim"]
    bb = _build(name, offline)
    check_backbone_contract(bb)
    if backbones.weights_available(name)[0]:
        assert bb.feature_dim == info["feature_dim"]
    for choice in info.get("preprocess", ()):
        assert backbones.check_preprocess(name, choice) == choice


def _toy_vit(resolution: int, weights=None, transform: str = "reference") -> backbones.Backbone:
    import timm

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0, img_size=resolution,
                                  embed_dim=32, depth=2, num_heads=2)
    return backbones._finish("toy_vit", model, resolution, "toy-seed0", True, (0.5,) * 3, (0.5,) * 3, "vit", transform)


@pytest.fixture()
def toy_backbone():
    backbones._REGISTRY.register(
        "toy_vit", default_resolution=32, resolution_range=(32, 64, 16), feature_dim=32, pretrained="none (toy)",
        untrained=True, available=lambda: (True, "random init (toy)"), preprocess=backbones.PREPROCESS,
        arch=("vit_base_patch16_224", {"num_classes": 0, "embed_dim": 32, "depth": 2, "num_heads": 2,
                                       "img_size": 32}))(_toy_vit)
    yield "toy_vit"
    backbones._REGISTRY.unregister("toy_vit")


def test_a_toy_backbone_goes_through_the_cli(toy_backbone, offline, capsys):
    check_backbone_contract(backbones.load(toy_backbone))
    assert cli.main(["backbones"]) == 0 and "toy_vit (UNTRAINED)" in capsys.readouterr().out
    assert cli.main(["features", "--backbone", toy_backbone, "--splits", "test", "--quiet", "--device", "cpu"]) == 0
    assert "(1000, 32) [toy_vit@32px, reference, cpu fp32] extracted" in capsys.readouterr().out
    code = cli.main(["tosca", "--backbone", toy_backbone, "--inc", "5", "--epochs", "1", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert "toy_vit, cached mode, 2 tasks" in capsys.readouterr().out


def test_toy_backbone_is_gone_afterwards():
    assert "toy_vit" not in backbones.list_backbones()


# --- datasets -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", data.list_datasets())
def test_every_dataset_honours_the_contract(name, tmp_path):
    info = data.dataset_info(name)
    assert set(DATASET_INFO) <= set(info) and info["name"] == name
    assert isinstance(info["classes"], int) and info["classes"] >= 2
    assert all(info[k] is None or (isinstance(info[k], int) and info[k] > 0) for k in ("train", "test"))
    assert info["licence"] and info["image"]
    card = ROOT / info["card"]
    assert card.is_file(), f"missing data card {card}"
    text = card.read_text().lower()
    assert all(f in text for f in CARD_FIELDS), f"{card.name} lacks {[f for f in CARD_FIELDS if f not in text]}"
    ok, where = data.is_available(name, tmp_path)   # an empty root: says where it looked / how to get it
    assert isinstance(ok, bool) and isinstance(where, str) and where
    if ok:   # available without a root (packaged or installed): the real thing is checked
        check_dataset_contract(data.load_dataset(name, root=tmp_path), info)


def check_dataset_contract(ds: data.ImageDataset, info: dict) -> None:
    assert len(ds.class_names) == ds.num_classes == info["classes"]
    for split, n in ((ds.train, info["train"]), (ds.test, info["test"])):
        assert split.images.dtype == np.uint8 and split.images.ndim in (3, 4)
        assert split.labels.dtype == np.int64 and len(split.labels) == len(split.images)
        assert split.labels.min() >= 0 and split.labels.max() < ds.num_classes
        assert n is None or len(split) == n
    assert ds.source


def _toy_dataset(root) -> data.ImageDataset:
    rng = np.random.RandomState(0)

    def split(per_class):
        labels = np.repeat(np.arange(4), per_class).astype(np.int64)
        images = (rng.randint(0, 64, (len(labels), 16, 16, 3)) + 48 * labels[:, None, None, None]).astype(np.uint8)
        return data.Split(images, labels)

    return data.ImageDataset("toy_ds", ["a", "b", "c", "d"], split(10), split(5), "generated in the test")


@pytest.fixture()
def toy_dataset():
    data.datasets._REGISTRY.register("toy_ds", classes=4, train=40, test=20, licence="CC0 (generated)",
                                     image="16x16 RGB", available=lambda root: (True, "generated"))(_toy_dataset)
    yield "toy_ds"
    data.datasets._REGISTRY.unregister("toy_ds")


def test_a_toy_dataset_goes_through_the_cli(toy_dataset, offline, capsys):
    check_dataset_contract(data.load_dataset(toy_dataset), data.dataset_info(toy_dataset))
    assert cli.main(["datasets"]) == 0 and "toy_ds" in capsys.readouterr().out
    assert cli.main(["features", "--backbone", "vit_tiny_patch16_224", "--resolution", "32", "--dataset",
                     toy_dataset, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "toy_ds/train: 40 images -> (40, 192)" in out and "toy_ds/test: 20 images -> (20, 192)" in out
    code = cli.main(["tosca", "--backbone", "vit_tiny_patch16_224", "--resolution", "32", "--dataset", toy_dataset,
                     "--inc", "2", "--epochs", "1", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert "toy_ds B0 Inc2" in capsys.readouterr().out


def test_toy_dataset_is_gone_afterwards():
    assert "toy_ds" not in data.list_datasets()
