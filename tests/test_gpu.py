"""CUDA paths (marker ``gpu``; skipped where CUDA is missing): bf16 feature extraction on the
device, TOSCA and every baseline with ``--device cuda``, a backbone moved by hand, the GPU check.
Tiny random stand-ins (tests/_standins.py): nothing is downloaded."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lab import backbones, cli, data, features
from tests._standins import fake_cifar100, tiny_vit_file

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ROOT = Path(__file__).resolve().parents[1]
VIT_B = "vit_base_patch16_224.augreg_in21k"


@pytest.fixture()
def env(tmp_path, monkeypatch):
    fake_cifar100(tmp_path / "data")
    monkeypatch.setenv("LAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return {"vit": str(tiny_vit_file(tmp_path / "vit.safetensors"))}


def test_bf16_extraction_on_cuda_is_close_to_the_cpu_float32_pass(env):
    cpu = features.extract(backbones.load(VIT_B, weights=env["vit"], resolution=32), "cifar100", "test",
                           progress=False)
    bb = backbones.load(VIT_B, weights=env["vit"], resolution=32, device="cuda")
    assert bb.device.type == "cuda" and bb.precision() == "bf16"
    gpu = features.extract(bb, "cifar100", "test", progress=False)
    assert gpu.meta["precision"] == "bf16" and gpu.meta["path"] != cpu.meta["path"]
    assert gpu.features.device.type == "cpu" and gpu.features.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(gpu.features, cpu.features).min() > 0.98
    assert features.default_workers("cuda") >= 1
    fp32 = features.extract(bb, "cifar100", "test", precision="fp32", progress=False)
    assert "precision" not in fp32.meta   # float32 on CUDA shares the CPU pass's key
    torch.testing.assert_close(fp32.features, cpu.features, atol=1e-3, rtol=1e-3)


def test_reference_preprocessing_on_cuda_matches_the_cpu(env):
    import numpy as np

    img = np.random.RandomState(0).randint(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    cpu = backbones.load("vit_tiny_patch16_224", resolution=224)
    gpu = backbones.load("vit_tiny_patch16_224", resolution=224, device="cuda")
    x = gpu.preprocess(img)
    assert x.device.type == "cuda"
    torch.testing.assert_close(x.cpu(), cpu.preprocess(img), atol=1 / 255 + 1e-6, rtol=0)


def test_a_backbone_moved_by_hand_takes_cpu_inputs(env):
    bb = backbones.load(VIT_B, weights=env["vit"], resolution=32)
    bb.model.cuda()
    with torch.inference_mode():
        out = bb.features(torch.rand(2, 3, 32, 32))
    assert out.device.type == "cuda"


def test_lab_features_on_cuda(env, capsys):
    assert cli.main(["features", "--backbone", VIT_B, "--weights", env["vit"], "--dataset", "cifar100",
                     "--resolution", "32", "--device", "cuda", "--quiet"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count("reference, cuda bf16] extracted") == 2


@pytest.mark.parametrize("extra", [["--method", "tosca"], ["--method", "tosca", "--engine", "cuda_graph"],
                                   ["--method", "finetune"], ["--method", "joint"], ["--method", "simplecil"],
                                   ["--method", "layerwise_adapter"], ["--method", "tosca", "--mode", "augment"]])
def test_lab_tosca_on_cuda(env, capsys, extra):
    epochs = [] if extra[1] == "simplecil" else ["--epochs", "1"]   # simplecil takes no gradient steps: no --epochs
    code = cli.main(["tosca", "--backbone", VIT_B, "--weights", env["vit"], "--dataset", "cifar100", "--resolution",
                     "32", "--init", "0", "--inc", "50", *epochs, "--device", "cuda", "--quiet", *extra])
    assert code == 0, capsys.readouterr().err
    assert "cifar100 B0 Inc50" in capsys.readouterr().out


def test_gpu_check_tiny_on_cuda(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert gpu_check.main(["--device", "cuda", "--tiny", "--target", "1e9"]) == 0
    assert "bf16" in capsys.readouterr().out
