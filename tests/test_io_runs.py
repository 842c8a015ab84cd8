import multiprocessing as mp

import pytest
import torch

from lab import _io, runs


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def boom(p):
        p.write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        _io.atomic_write(target, boom)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temp file left behind


def test_tensors_round_trip_and_truncation_detected(tmp_path):
    path = tmp_path / "t.safetensors"
    _io.save_tensors(path, {"a": torch.arange(6.0).view(2, 3)}, {"k": "v"})
    tensors, meta = _io.load_tensors(path)
    assert torch.equal(tensors["a"], torch.arange(6.0).view(2, 3)) and meta == {"k": "v"}
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(_io.CorruptFile, match="sha256"):
        _io.load_tensors(path)
    (tmp_path / "t.safetensors.sha256").unlink()
    with pytest.raises(_io.CorruptFile, match="sidecar"):
        _io.load_tensors(path)


def _mk(root):
    return str(runs.new_run_dir("tosca", "same name", root))


def test_run_dirs_never_collide_across_processes(tmp_path):
    with mp.get_context("spawn").Pool(2) as pool:
        dirs = pool.map(_mk, [tmp_path] * 8)
    dirs += [_mk(tmp_path) for _ in range(8)]
    assert len(set(dirs)) == 16


def test_versions_record_the_stack():
    v = runs.versions()
    assert {"python", "torch", "timm"} <= set(v)
