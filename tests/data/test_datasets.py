"""lab/data/datasets.py (and folders.py, mini.py): the registry's entries, their cards and loaders."""
from pathlib import Path

import numpy as np
import pytest

from lab import data

ROOT = Path(__file__).resolve().parents[2]


def test_every_dataset_has_a_data_card():
    for name in data.list_datasets():
        card = ROOT / data.dataset_info(name)["card"]
        assert card.exists(), f"missing data card {card}"
        text = card.read_text().lower()
        for field in ("source", "licence", "size", "classes", "splits", "caveats"):
            assert field in text, f"{card.name} lacks '{field}'"


def test_offline_default_is_packaged_real_and_verified():
    ds = data.load_dataset("fashion_mnist_mini")
    assert ds.train.images.shape == (6000, 28, 28) and ds.test.images.shape == (1000, 28, 28)
    assert ds.train.images.dtype == np.uint8
    assert np.bincount(ds.train.labels).tolist() == [600] * 10
    assert np.bincount(ds.test.labels).tolist() == [100] * 10
    assert ds.class_names[0] == "T-shirt/top" and ds.class_names[9] == "Ankle boot"


def test_mini_is_a_subset_of_the_full_set_when_present():
    ok, _ = data.is_available("fashion_mnist")
    if not ok:
        pytest.skip("full Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    full, mini = data.load_dataset("fashion_mnist"), data.load_dataset("fashion_mnist_mini")
    z = np.load(data.datasets.ASSETS / "fashion_mnist_mini.npz")
    assert np.array_equal(full.train.images[z["train_index"]], mini.train.images)
    assert np.array_equal(full.test.labels[z["test_index"]], mini.test.labels)


def test_corrupt_mini_is_detected(monkeypatch, tmp_path):
    bad = tmp_path / "fashion_mnist_mini.npz"
    bad.write_bytes(b"not the file")
    monkeypatch.setattr(data.datasets, "ASSETS", tmp_path)
    with pytest.raises(data.DatasetUnavailable, match="damaged"):
        data.load_dataset("fashion_mnist_mini")


def test_mnist_5k_split_is_fixed_and_disjoint():
    a, b = data.load_dataset("mnist_5k"), data.load_dataset("mnist_5k")
    assert len(a.train) == 4000 and len(a.test) == 1000
    assert np.array_equal(a.test.images, b.test.images)
    assert np.bincount(a.test.labels).tolist() == [100] * 10


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(KeyError, match="valid datasets: .*fashion_mnist_mini"):
        data.load_dataset("imagenet-99k")


@pytest.mark.parametrize("name", ["cub200", "imagenet_r", "vtab"])
def test_missing_folder_dataset_says_where(tmp_path, name):
    with pytest.raises(data.DatasetUnavailable, match=rf"{name}/train/<class>"):
        data.load_dataset(name, root=tmp_path)


def test_image_folder_layout_loads(tmp_path):
    from PIL import Image

    for split in ("train", "test"):
        for c in ("b_cls", "a_cls"):
            (tmp_path / "cub200" / split / c).mkdir(parents=True)
            Image.new("RGB", (300, 260), (10, 200, 30)).save(tmp_path / "cub200" / split / c / "x.jpg")
    ds = data.load_dataset("cub200", root=tmp_path)
    assert ds.class_names == ["a_cls", "b_cls"]
    assert ds.train.images.shape == (2, 224, 224, 3)
