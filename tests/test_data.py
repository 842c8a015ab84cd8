from pathlib import Path

import numpy as np
import pytest

from lab import data

ROOT = Path(__file__).resolve().parents[1]


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


def test_b0_inc2_scenario_is_seeded_and_partitions_classes():
    s1 = data.scenario("fashion_mnist_mini", init=0, inc=2, seed=1993)
    s2 = data.scenario("fashion_mnist_mini", init=0, inc=2, seed=1993)
    s3 = data.scenario("fashion_mnist_mini", init=0, inc=2, seed=1)
    assert s1.class_order == s2.class_order != s3.class_order
    assert s1.num_tasks == 5 and [t.classes for t in s1.tasks][1] == (2, 3)
    # incremental labels are positions in the class order
    raw = s1.parts[0].train.labels
    assert np.array_equal(np.asarray(s1.class_order)[s1.train_labels], raw)
    # each task's samples are exactly its classes
    for t in s1.tasks:
        assert set(np.unique(s1.train_labels[s1.task_indices(t.index)])) == set(t.classes)
    assert s1.class_names[0] == data.load_dataset("fashion_mnist_mini").class_names[s1.class_order[0]]


def test_init_task_and_chained_domains():
    s = data.scenario("fashion_mnist_mini", init=4, inc=3)
    assert [len(t.classes) for t in s.tasks] == [4, 3, 3]
    c = data.scenario(["mnist_5k", "fashion_mnist_mini"], init=0, inc=2)
    assert c.num_classes == 20 and c.num_tasks == 10
    assert all(g < 10 for g in c.class_order[:10]) and all(g >= 10 for g in c.class_order[10:])
    assert c.class_names[0].startswith("mnist_5k:") and c.class_names[-1].startswith("fashion_mnist_mini:")
    assert len(c.images("train")) == len(c.train_labels) == 10000


@pytest.mark.parametrize("init,inc,msg", [(0, 3, "not a multiple"), (11, 1, "exceeds"), (-1, 2, "init >= 0"), (0, 0, "inc >= 1")])
def test_invalid_splits_rejected_before_loading(monkeypatch, init, inc, msg):
    monkeypatch.setattr(data.scenarios, "load_dataset", lambda *a, **k: pytest.fail("loaded data"))
    with pytest.raises(ValueError, match=msg):
        data.scenario("fashion_mnist_mini", init=init, inc=inc)
