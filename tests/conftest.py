import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory):
    """Runs write into a per-session folder. The feature cache is the user's normal one
    ($LAB_CACHE_DIR or ~/.cache/continual-lab): entries are keyed by everything that changes
    them, so sharing it with `make report` is safe and saves re-extracting the same images."""
    os.environ.setdefault("LAB_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
    yield


@pytest.fixture(scope="session")
def lite0():
    from lab import backbones

    return backbones.load("efficientnet_lite0")
