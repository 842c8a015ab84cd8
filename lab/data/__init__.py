"""Datasets (real images, labels, class names) and class-incremental scenarios.

    >>> from lab import data
    >>> data.list_datasets()
    >>> ds = data.load_dataset("fashion_mnist_mini")      # the offline default, shipped in the repo
    >>> scn = data.scenario("fashion_mnist_mini", init=0, inc=2, seed=1993)   # B0 Inc2: 5 tasks

Every dataset has a data card in ``data_cards/<name>.md``.
"""
from lab.data.datasets import (
    DEFAULT_DATASET,
    DatasetUnavailable,
    ImageDataset,
    Split,
    dataset_info,
    is_available,
    list_datasets,
    load_dataset,
)
from lab.data.scenarios import Scenario, Task, scenario, validate_split

__all__ = [
    "DEFAULT_DATASET", "DatasetUnavailable", "ImageDataset", "Split", "Scenario", "Task",
    "dataset_info", "is_available", "list_datasets", "load_dataset", "scenario", "validate_split",
]
