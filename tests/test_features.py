import json
import time

import pytest
import torch

from lab import backbones, features
from lab._io import CorruptFile, load_tensors


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    """The untrained ViT on fashion_mnist_mini test split at 32 px: a fast, real extraction."""
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    return backbones.load("vit_tiny_patch16_224", resolution=32)


def test_extract_then_hit_is_identical_and_fast(tiny):
    first = features.extract(tiny, "fashion_mnist_mini", "test", progress=False)
    assert not first.cache_hit and first.features.shape == (1000, 192)
    t = time.perf_counter()
    second = features.extract(tiny, "fashion_mnist_mini", "test", progress=False)
    assert second.cache_hit and time.perf_counter() - t < 1.0
    assert torch.equal(first.features, second.features)
    assert torch.equal(second.labels, torch.as_tensor(second.labels))


def test_key_covers_resolution_layer_and_weights(tiny, tmp_path):
    a = features.extract(tiny, "fashion_mnist_mini", "test", progress=False)
    b = features.extract(backbones.load("vit_tiny_patch16_224", resolution=48), "fashion_mnist_mini", "test", progress=False)
    c = features.extract(tiny, "fashion_mnist_mini", "test", layer="block6", progress=False)
    assert len({a.meta["path"], b.meta["path"], c.meta["path"]}) == 3
    assert not b.cache_hit and not c.cache_hit
    assert a.meta["weights"] == tiny.weights_id and a.meta["data"]


def test_corrupt_file_is_detected_reported_and_rebuilt(tiny):
    fs = features.extract(tiny, "fashion_mnist_mini", "test", progress=False)
    path = fs.meta["path"]
    with open(path, "r+b") as fh:  # flip bytes in the tensor payload
        fh.seek(-64, 2)
        fh.write(b"\x00" * 64)
    with pytest.raises(CorruptFile):
        load_tensors(path)
    with pytest.warns(UserWarning, match="rebuilding"):
        again = features.extract(tiny, "fashion_mnist_mini", "test", progress=False)
    assert not again.cache_hit and torch.equal(again.features, fs.features)


def test_mismatched_key_is_rebuilt(tiny):
    from lab._io import save_tensors

    fs = features.extract(tiny, "fashion_mnist_mini", "test", progress=False)
    save_tensors(fs.meta["path"], {"features": fs.features}, {"key": json.dumps({"backbone": "other"})})
    with pytest.warns(UserWarning, match="does not match"):
        assert not features.extract(tiny, "fashion_mnist_mini", "test", progress=False).cache_hit


def test_several_layers_in_one_pass(tiny):
    sets = features.extract_layers(tiny, "fashion_mnist_mini", "test", [None, "block1", "norm"], progress=False)
    torch.testing.assert_close(sets[None].features, sets["norm"].features)  # CLS after final norm
    assert sets["block1"].features.shape == (1000, 192)


@pytest.mark.parametrize("kw,err", [(dict(split="val"), "valid splits"), (dict(batch_size=0), "batch_size"),
                                    (dict(layer="block99"), "valid layers")])
def test_bad_input_fails_before_work(tiny, kw, err):
    args = dict(split="test") | kw
    split = args.pop("split")
    with pytest.raises((ValueError, KeyError), match=err):
        features.extract(tiny, "fashion_mnist_mini", split, progress=False, **args)


def test_scenario_features_follow_scenario_order(tiny):
    from lab import data

    scn = data.scenario(["fashion_mnist_mini"], init=0, inc=5)
    out = features.scenario_features(scn, tiny, progress=False)
    assert out["test_x"].shape == (1000, 192) and torch.equal(out["test_y"], torch.from_numpy(scn.test_labels))


def test_the_allocator_settings_leave_the_features_bit_identical(tmp_path):
    """lab._alloc.tune_allocator (on by default in the feature pass) changes where glibc puts the
    batch's buffers, never the numbers: the same images embedded with glibc's defaults
    (LAB_MALLOC=default) and with the tuned settings give identical bytes."""
    import os
    import subprocess
    import sys

    import numpy as np

    code = ("import sys, numpy as np; from lab import _alloc, backbones; from lab.data.datasets import load_dataset;"
            "bb = backbones.load(); x = load_dataset('fashion_mnist_mini').train.images[:24];"
            "f = bb.embed(x, batch_size=8, progress=False); print(_alloc._done); np.save(sys.argv[1], f.numpy())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = {}
    for mode in ("default", "tuned"):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"{mode}.npy")], env={**env, "LAB_MALLOC": mode},
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        done[mode] = r.stdout.strip().splitlines()[-1]
    assert done == {"default": "False", "tuned": "True"}
    assert np.array_equal(np.load(tmp_path / "default.npy"), np.load(tmp_path / "tuned.npy"))


def test_the_allocator_leaves_a_users_own_malloc_settings_alone(monkeypatch):
    import lab._alloc as A

    monkeypatch.setattr(A, "_done", False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert A.tune_allocator() is False
