"""How ``fashion_mnist_mini`` (the packaged offline default) was made, so anyone can rebuild it.

    python -m lab.data.mini            # needs the full Fashion-MNIST (see data_cards/fashion_mnist.md)

A seeded (seed 0) class-balanced random subset of the official splits: TRAIN_PER_CLASS training
and TEST_PER_CLASS test images per class, stored as a compressed npz. The counts were chosen by
measurement (data_cards/fashion_mnist_mini.md): prototype accuracy has flattened by then, and the
whole set extracts in well under the 2-minute budget on 2 CPU cores.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

TRAIN_PER_CLASS = 600
TEST_PER_CLASS = 100
SEED = 0


def pick(labels: np.ndarray, per_class: int, rng: np.random.RandomState) -> np.ndarray:
    return np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:per_class]
                                   for c in range(int(labels.max()) + 1)]))


def build(out: Path, train_per_class: int = TRAIN_PER_CLASS, test_per_class: int = TEST_PER_CLASS) -> str:
    from lab._io import atomic_write, sha256_file
    from lab.data import load_dataset

    full = load_dataset("fashion_mnist")
    rng = np.random.RandomState(SEED)
    tr = pick(full.train.labels, train_per_class, rng)
    te = pick(full.test.labels, test_per_class, rng)

    def write(p: Path) -> None:
        with open(p, "wb") as fh:
            np.savez_compressed(fh, train_images=full.train.images[tr], train_labels=full.train.labels[tr].astype(np.uint8),
                                test_images=full.test.images[te], test_labels=full.test.labels[te].astype(np.uint8),
                                train_index=tr.astype(np.int32), test_index=te.astype(np.int32))

    atomic_write(out, write)
    return sha256_file(out)


if __name__ == "__main__":
    from lab.data.datasets import ASSETS

    path = ASSETS / "fashion_mnist_mini.npz"
    digest = build(path)
    print(f"{path}: {path.stat().st_size / 1e6:.2f} MB, sha256 {digest}")
