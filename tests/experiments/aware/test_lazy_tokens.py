"""Lazy visual tokens: only the rows read are computed, they match the eager pass, nothing is cached."""
from __future__ import annotations

import numpy as np
import torch

from lab.experiments.aware.run.minillava import LazyTokens, visual_tokens


def _images(n=12, seed=0):
    return np.random.RandomState(seed).randint(0, 255, (n, 32, 32, 3), dtype=np.uint8)


def test_lazy_tokens_compute_only_the_rows_read_and_match_the_eager_pass(tmp_path):
    torch.set_num_threads(1)
    imgs = _images()
    lazy, key = visual_tokens(imgs, cache_dir=tmp_path, progress=False, return_key=True, lazy=True)
    assert isinstance(lazy, LazyTokens)
    assert not list(tmp_path.rglob("*.safetensors")), "a lazy set is never written to the cache"
    rows = np.array([7, 2, 7])
    got = lazy[rows]
    assert sorted(lazy._rows) == [0, 2, 7]            # row 0 gave the shape; nothing else was computed
    eager, eager_key = visual_tokens(imgs, cache_dir=tmp_path, progress=False, return_key=True)
    assert key == eager_key                           # the same identity: the projector cache key holds
    assert lazy.shape == eager.shape and lazy.dtype == eager.dtype and len(lazy) == len(imgs)
    assert got.shape == (3, *eager.shape[1:])
    torch.testing.assert_close(got, eager[rows], rtol=1e-4, atol=1e-5)   # other batches: last bits only
    assert torch.equal(got[0], got[2])
    assert torch.equal(lazy[7], got[0]) and torch.equal(lazy[np.int64(2)], got[1])   # one row, as a tensor gives
    # once the whole set is cached, lazy=True reads the cache file like the eager call
    again = visual_tokens(imgs, cache_dir=tmp_path, progress=False, lazy=True)
    assert isinstance(again, torch.Tensor) and torch.equal(again, eager)
