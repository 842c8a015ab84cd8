"""The paths that need internet, run offline on tiny random stand-ins in the real formats
(tests/_standins.py): the paper's ViT-B/16 entry loading a ViT checkpoint file (and downloading it
from a local stand-in of the Hugging Face hub), CIFAR-100 and EuroSAT folders in torchvision's
layout, each through the registry, ``lab features`` and a tiny ``lab tosca``; the offline failure of
the hub path; the reference preprocessing against torchvision's PIL transform."""
from __future__ import annotations

import http.server
import threading
import time

import numpy as np
import pytest
import torch

from lab import backbones, cli, data, features
from tests._standins import EUROSAT_CLASSES, fake_cifar100, fake_eurosat, tiny_vit_file

VIT_B = "vit_base_patch16_224.augreg_in21k"
HUB_PATH = "/timm/vit_base_patch16_224.augreg_in21k/resolve/main/model.safetensors"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("standins")
    fake_cifar100(root / "data")
    fake_eurosat(root / "data")
    return {"root": root, "data": root / "data", "vit": tiny_vit_file(root / "vit" / "model.safetensors"),
            "vit_pth": tiny_vit_file(root / "vit" / "model.pth", seed=1)}


@pytest.fixture()
def env(assets, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_DATA_DIR", str(assets["data"]))
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("LAB_VIT_B16_WEIGHTS", raising=False)
    return assets


# --- ViT-B/16 entry, weights from a file --------------------------------------------------------
@pytest.mark.parametrize("kind", ["vit", "vit_pth"])
def test_vit_b_entry_loads_a_checkpoint_whose_shapes_define_the_model(env, kind):
    import timm

    bb = backbones.load(VIT_B, weights=str(env[kind]), resolution=32)
    assert bb.kind == "vit" and bb.feature_dim == 64 and len(bb.model.blocks) == 2
    assert bb.model.blocks[0].attn.num_heads == (2 if kind == "vit" else 1)   # metadata, else width // 64
    assert bb.transform == "reference" and bb.weights_id.startswith("sha256-")
    assert not any(p.requires_grad for p in bb.model.parameters())
    # the same function as timm's model holding the file's tensors (the ImageNet-21k head dropped)
    ref = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, embed_dim=64, depth=2,
                            num_heads=bb.model.blocks[0].attn.num_heads, num_classes=0).eval()
    sd = torch.load(env[kind], weights_only=True) if kind == "vit_pth" else __import__(
        "safetensors.torch", fromlist=["load_file"]).load_file(str(env[kind]))
    ref.load_state_dict({k: v for k, v in sd.items() if not k.startswith("head.")})
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(bb.features(x), ref.forward_head(ref.forward_features(x), pre_logits=True))
    # another resolution resamples the position embeddings (timm's checkpoint_filter_fn)
    assert backbones.load(VIT_B, weights=str(env[kind]), resolution=48).model.pos_embed.shape[1] == 1 + 9


def test_vit_b_env_variable_reaches_the_same_loader(env, monkeypatch):
    monkeypatch.setenv("LAB_VIT_B16_WEIGHTS", str(env["vit"]))
    assert backbones.weights_available(VIT_B) == (True, str(env["vit"]))
    bb = backbones.load(VIT_B, resolution=32)
    assert bb.weights_id == backbones.load(VIT_B, weights=str(env["vit"]), resolution=32).weights_id


def test_vit_b_rejects_a_checkpoint_that_is_not_a_vit(env, tmp_path):
    from safetensors.torch import save_file

    bad = tmp_path / "cnn.safetensors"
    save_file({"conv.weight": torch.zeros(4, 3, 3, 3)}, str(bad))
    with pytest.raises(backbones.WeightsUnavailable, match="not a timm ViT checkpoint"):
        backbones.load(VIT_B, weights=str(bad))


# --- ViT-B/16 entry, weights from the hub --------------------------------------------------------
class _Hub(http.server.BaseHTTPRequestHandler):
    """The two requests huggingface_hub makes for one file: HEAD (metadata) and GET (content)."""
    blob = b""
    requests: list[str] = []

    def _headers(self):
        self.send_response(200)
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("ETag", '"standin-etag"')
        self.send_header("Content-Length", str(len(self.blob)))
        self.end_headers()

    def do_HEAD(self):  # noqa: N802 - http.server's naming
        self.requests.append(f"HEAD {self.path}")
        if self.path != HUB_PATH:
            self.send_error(404)
            return
        self._headers()

    def do_GET(self):  # noqa: N802
        self.requests.append(f"GET {self.path}")
        if self.path != HUB_PATH:
            self.send_error(404)
            return
        self._headers()
        self.wfile.write(self.blob)

    def log_message(self, *args):
        pass


@pytest.fixture()
def hub(env, monkeypatch):
    _Hub.blob, _Hub.requests = env["vit"].read_bytes(), []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield _Hub
    server.shutdown()
    server.server_close()


def test_vit_b_downloads_through_huggingface_hub_from_hf_endpoint(hub, env):
    ok, where = backbones.weights_available(VIT_B)
    assert ok and "downloads from the hub" in where
    bb = backbones.load(VIT_B, resolution=32)
    assert f"GET {HUB_PATH}" in hub.requests
    assert bb.weights_id == backbones.load(VIT_B, weights=str(env["vit"]), resolution=32).weights_id
    n = len(hub.requests)
    assert backbones.weights_available(VIT_B)[0] and backbones.load(VIT_B, resolution=32)   # from the HF cache now
    assert len(hub.requests) == n, "a cached file was fetched again"


def test_lab_tosca_with_the_hub_downloads_and_runs(hub, env, capsys):
    code = cli.main(["tosca", "--backbone", VIT_B, "--dataset", "cifar100", "--init", "0", "--inc", "10",
                     "--resolution", "32", "--epochs", "1", "--quiet", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    assert "cifar100 B0 Inc10" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "unreachable HF_ENDPOINT"])
def test_lab_tosca_offline_fails_at_once_saying_what_to_download(env, monkeypatch, capsys, how):
    if how == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # the discard port: connection refused
    t0 = time.perf_counter()
    code = cli.main(["tosca", "--backbone", VIT_B, "--dataset", "cifar100", "--init", "0", "--inc", "10"])
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "timm/vit_base_patch16_224.augreg_in21k/model.safetensors" in err and "--weights" in err, err
    assert seconds < 10, f"{seconds:.1f} s"
    with pytest.raises(backbones.WeightsUnavailable, match="LAB_VIT_B16_WEIGHTS"):   # the library says where to put it
        backbones.load(VIT_B)


# --- CIFAR-100 and EuroSAT folders ---------------------------------------------------------------
def test_cifar100_folder_in_torchvisions_pickle_format(env):
    ds = data.load_dataset("cifar100")
    assert ds.num_classes == 100 and ds.class_names[:2] == ["class_00", "class_01"]
    assert ds.train.images.shape == (600, 32, 32, 3) and ds.train.images.dtype == np.uint8
    assert ds.test.images.shape == (200, 32, 32, 3)
    assert np.bincount(ds.train.labels).tolist() == [6] * 100
    # the same arrays torchvision's own reader gives for these files (it checks md5s, so read directly)
    from torchvision.datasets import CIFAR100

    tv = CIFAR100.__new__(CIFAR100)
    import pickle

    with open(env["data"] / "cifar-100-python" / "test", "rb") as fh:
        raw = pickle.load(fh, encoding="latin1")
    tv.data = np.vstack(raw["data"]).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
    assert np.array_equal(tv.data, ds.test.images) and raw["fine_labels"] == ds.test.labels.tolist()
    assert data.is_available("cifar100")[0]


def test_cifar100_pickle_that_carries_code_is_refused(env, tmp_path, monkeypatch):
    import argparse
    import pickle
    import shutil

    d = tmp_path / "cifar-100-python"
    shutil.copytree(env["data"] / "cifar-100-python", d)
    (d / "meta").write_bytes(pickle.dumps({"fine_label_names": argparse.Namespace(x=1)}))
    with pytest.raises(data.DatasetUnavailable, match="which a CIFAR file never does"):
        data.load_dataset("cifar100", root=tmp_path)


def test_eurosat_folder_in_torchvisions_layout(env):
    ds = data.load_dataset("eurosat")
    assert ds.class_names == sorted(EUROSAT_CLASSES)
    assert ds.train.images.shape == (80, 64, 64, 3) and ds.test.images.shape == (20, 64, 64, 3)
    assert np.bincount(ds.test.labels).tolist() == [2] * 10   # a fifth of each class: a small folder
    assert data.is_available("eurosat")[0]


@pytest.mark.parametrize("dataset,inc", [("cifar100", 10), ("eurosat", 5)])
def test_lab_features_and_tosca_on_the_folders_with_the_vit_b_entry(env, capsys, dataset, inc):
    w = str(env["vit"])
    assert cli.main(["features", "--backbone", VIT_B, "--weights", w, "--dataset", dataset, "--resolution", "32",
                     "--device", "cpu", "--quiet"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "extracted" in out and "reference, cpu fp32" in out
    assert cli.main(["features", "--backbone", VIT_B, "--weights", w, "--dataset", dataset, "--resolution", "32",
                     "--quiet"]) == 0
    assert capsys.readouterr().out.count("cache hit") == 2
    code = cli.main(["tosca", "--backbone", VIT_B, "--weights", w, "--dataset", dataset, "--resolution", "32",
                     "--init", "0", "--inc", str(inc), "--epochs", "2", "--quiet", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{dataset} B0 Inc{inc}" in out and "tosca per-sample" in out.replace("  ", " ")


# --- preprocessing and the device path -----------------------------------------------------------
@pytest.mark.parametrize("shape", [(32, 32, 3), (28, 28), (64, 64, 3), (300, 451, 3)])
def test_reference_preprocessing_matches_torchvisions_pil_transform(shape):
    from PIL import Image
    from torchvision import transforms as T

    img = np.random.RandomState(0).randint(0, 256, shape).astype(np.uint8)
    ref = T.Compose([T.Resize(256, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(224), T.ToTensor()])
    bb = backbones.load("vit_tiny_patch16_224")
    ours = bb.preprocess(img[None])[0]
    theirs = ref(Image.fromarray(img).convert("RGB"))
    diff = (ours - theirs).abs() * 255
    assert diff.max() <= 1.0001 and diff.mean() < 0.01   # PIL's fixed-point rounding, at most one level


def test_timm_preprocessing_and_the_cache_key(env):
    img = np.random.RandomState(0).randint(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    ref = backbones.load(VIT_B, weights=str(env["vit"]), resolution=32)
    tim = backbones.load(VIT_B, weights=str(env["vit"]), resolution=32, preprocess="timm")
    assert tim.transform == "timm" and tim.mean == (0.5,) * 3
    x = tim.preprocess(img)
    assert float(x.min()) < -0.5 and float(ref.preprocess(img).min()) >= 0   # normalised vs [0, 1]
    a = features.extract(ref, "cifar100", "test", progress=False)
    b = features.extract(tim, "cifar100", "test", progress=False)
    assert a.meta["transform"] == "reference" and "transform" not in b.meta and a.meta["path"] != b.meta["path"]
    assert "precision" not in a.meta   # float32 on the CPU: the key of the original pass
    with pytest.raises(ValueError, match="it has one preprocessing, its own"):
        backbones.load("efficientnet_lite0", preprocess="timm")


def test_device_path_on_cpu_matches_the_plain_loop(env):
    """extract(device='cpu', workers=2) gives exactly the features of preprocess + features batch by batch."""
    bb = backbones.load(VIT_B, weights=str(env["vit"]), resolution=32)
    fs = features.extract(bb, "cifar100", "test", device="cpu", workers=2, batch_size=64, progress=False)
    images = data.load_dataset("cifar100").test.images
    with torch.inference_mode():
        plain = torch.cat([bb.features(bb.preprocess(images[i:i + 64])) for i in range(0, len(images), 64)])
    assert torch.equal(fs.features, plain) and fs.features.dtype == torch.float32
    assert bb.device.type == "cpu" and bb.precision() == "fp32"
    bf = features.extract(bb, "cifar100", "test", precision="bf16", progress=False)   # autocast on the CPU too
    assert bf.meta["precision"] == "bf16" and bf.meta["path"] != fs.meta["path"]
    assert torch.nn.functional.cosine_similarity(bf.features, plain).min() > 0.98
