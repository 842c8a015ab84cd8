import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Under pytest-xdist (`make test` spreads the suite over the CPUs), each worker gets its share of the cores for torch (and for the notebook
    kernels and CLI subprocesses it starts), so that workers do not oversubscribe the machine."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        threads = str(max(1, (os.cpu_count() or 1) // int(workers)))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, threads)
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory):
    """Runs write into a per-session folder. The feature cache is the user's normal one
    ($LAB_CACHE_DIR or ~/.cache/continual-lab): entries are keyed by everything that changes
    them, so sharing it with `make report` is safe and saves re-extracting the same images."""
    os.environ.setdefault("LAB_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
    yield


@pytest.fixture
def one_torch_thread():
    """Torch at one intra-op thread for the test, the caller's count restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def lite0():
    from lab import backbones

    return backbones.load("efficientnet_lite0")


@pytest.fixture(scope="session")
def smollm2_in_cache(tmp_path_factory):
    """The packaged SmolLM2 GGUF de-quantised once per test run into the shared cache (the user's,
    as for features): the first pytest-xdist worker to need it takes the GGUF path (~20 s on 2 cores)
    and writes the plain checkpoint; a worker that needs it meanwhile waits on a lock, then reads
    that copy. In a warm cache nobody de-quantises."""
    pytest.importorskip("gguf")
    from _report_helpers import _once
    from lab.experiments.aware.run.minillava import load_language_model, smollm2_gguf

    try:
        smollm2_gguf()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with _once(tmp_path_factory, "smollm2-plain"):
        load_language_model()
