import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory):
    """Runs write into a per-session folder; the feature cache is shared across the session
    (and with earlier sessions via $LAB_CACHE_DIR when set) so tests don't re-extract."""
    os.environ.setdefault("LAB_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
    os.environ.setdefault("LAB_CACHE_DIR", str(ROOT / ".cache"))
    yield


@pytest.fixture(scope="session")
def lite0():
    from lab import backbones

    return backbones.load("efficientnet_lite0")
