"""Class-incremental scenarios: a seeded class order cut into ``B{init} Inc{inc}`` tasks.

Follows the PILOT conventions the TOSCA reference uses: the class order is a seeded permutation
(seed 1993 by default) and labels are remapped to their position in that order, so task ``t``
owns a contiguous block of incremental labels. ``init=0`` means every task has ``inc`` classes
(B0 Inc2 on 10 classes = 5 tasks); ``init=K>0`` makes a larger first task.

Several datasets can be chained (e.g. MNIST then Fashion-MNIST, a domain shift): their classes get
disjoint global ids (offset per dataset), each dataset's classes are shuffled among themselves and
the datasets follow each other in the order given.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from lab.data.datasets import ImageDataset, load_dataset


@dataclass(frozen=True)
class Task:
    index: int
    classes: tuple[int, ...]  # incremental labels owned by this task

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def validate_split(num_classes: int, init: int, inc: int) -> None:
    """Reject a ``B{init} Inc{inc}`` split that does not fit ``num_classes`` (before any work)."""
    _validate(num_classes, init, inc)


def _validate(num_classes: int, init: int, inc: int) -> None:
    if not isinstance(init, (int, np.integer)) or not isinstance(inc, (int, np.integer)):
        raise TypeError(f"init and inc must be integers, got init={init!r}, inc={inc!r}")
    if init < 0 or inc < 1:
        raise ValueError(f"invalid split B{init} Inc{inc}: need init >= 0 and inc >= 1")
    if init > num_classes:
        raise ValueError(f"invalid split B{init} Inc{inc}: init={init} exceeds the {num_classes} classes")
    rest = num_classes - init
    if rest % inc:
        raise ValueError(
            f"invalid split B{init} Inc{inc}: the {rest} classes after the first task are not a "
            f"multiple of inc={inc} ({num_classes} classes in all); e.g. inc in "
            f"{[k for k in range(1, rest + 1) if rest % k == 0]}"
        )
    if init == 0 and rest == 0:
        raise ValueError("invalid split: the scenario has no classes")


@dataclass
class Scenario:
    """A class-incremental scenario over one or several chained datasets."""

    datasets: list[str]
    init: int
    inc: int
    seed: int
    parts: list[ImageDataset] = field(repr=False)

    def __post_init__(self) -> None:
        sizes = [p.num_classes for p in self.parts]
        _validate(sum(sizes), self.init, self.inc)
        rng = np.random.RandomState(self.seed)
        order, offset = [], 0
        for n in sizes:  # shuffle within each dataset, datasets stay in the given order
            order.extend((offset + rng.permutation(n)).tolist())
            offset += n
        self.class_order: list[int] = order
        self._offsets = np.cumsum([0] + sizes[:-1])
        self._position = np.empty(len(order), dtype=np.int64)
        self._position[np.asarray(order)] = np.arange(len(order))
        bounds = ([self.init] if self.init else []) + list(
            range(self.init + self.inc, self.num_classes + 1, self.inc)
        )
        starts = [0] + bounds[:-1]
        self.tasks = [Task(i, tuple(range(s, e))) for i, (s, e) in enumerate(zip(starts, bounds))]

    # --- sizes and names -------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return len(self.class_order)

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def name(self) -> str:
        return f"{'+'.join(self.datasets)} B{self.init} Inc{self.inc} seed{self.seed}"

    @cached_property
    def class_names(self) -> list[str]:
        """Class names in incremental-label order (prefixed by dataset when chained)."""
        glob = []
        for ds in self.parts:
            prefix = f"{ds.name}:" if len(self.parts) > 1 else ""
            glob.extend(prefix + c for c in ds.class_names)
        return [glob[g] for g in self.class_order]

    # --- labels ------------------------------------------------------------------------------
    def _remap(self, split: str) -> np.ndarray:
        labs = [self._offsets[k] + getattr(p, split).labels for k, p in enumerate(self.parts)]
        return self._position[np.concatenate(labs)]

    @cached_property
    def train_labels(self) -> np.ndarray:
        return self._remap("train")

    @cached_property
    def test_labels(self) -> np.ndarray:
        return self._remap("test")

    def task_of(self, labels: np.ndarray) -> np.ndarray:
        """Task id of each incremental label."""
        lut = np.empty(self.num_classes, dtype=np.int64)
        for t in self.tasks:
            lut[list(t.classes)] = t.index
        return lut[np.asarray(labels)]

    @cached_property
    def train_task_ids(self) -> np.ndarray:
        return self.task_of(self.train_labels)

    @cached_property
    def test_task_ids(self) -> np.ndarray:
        return self.task_of(self.test_labels)

    def task_indices(self, t: int, split: str = "train") -> np.ndarray:
        if not 0 <= t < self.num_tasks:
            raise IndexError(f"task {t} out of range: the scenario has {self.num_tasks} tasks")
        ids = self.train_task_ids if split == "train" else self.test_task_ids
        return np.flatnonzero(ids == t)

    def seen_indices(self, t: int, split: str = "test") -> np.ndarray:
        """Indices of samples from tasks 0..t (what is evaluated after stage t)."""
        ids = self.train_task_ids if split == "train" else self.test_task_ids
        return np.flatnonzero(ids <= t)

    def images(self, split: str) -> np.ndarray:
        """All images of a split, concatenated in dataset order (same order as the labels)."""
        arrays = [getattr(p, split).images for p in self.parts]
        if len({a.shape[1:] for a in arrays}) > 1:
            shapes = ", ".join(f"{p.name}: {a.shape[1:]}" for p, a in zip(self.parts, arrays))
            raise ValueError(f"cannot concatenate images of different shapes ({shapes}); use features")
        return np.concatenate(arrays)


def scenario(datasets: str | list[str], *, init: int, inc: int, seed: int = 1993, root=None) -> Scenario:
    """Build a class-incremental scenario; invalid splits are rejected before any data is loaded."""
    from lab.data.datasets import dataset_info

    names = [datasets] if isinstance(datasets, str) else list(datasets)
    if not names:
        raise ValueError("scenario needs at least one dataset")
    total = sum(dataset_info(n)["classes"] for n in names)  # checks names, loads nothing
    _validate(total, init, inc)
    parts = [load_dataset(n, root=root) for n in names]
    return Scenario(names, init, inc, seed, parts)
