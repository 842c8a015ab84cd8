"""Tiny random stand-ins for the assets that need internet, in the formats the real ones come in.

* :func:`tiny_vit_file` — a timm ViT (same architecture family as ViT-B/16: patch 16, class token,
  pre-norm blocks), 2 blocks of width 64, random weights, saved as safetensors (or a torch state
  dict) with an ImageNet-21k-sized classifier stripped as the hub file has it (``head.*``).
* :func:`fake_cifar100` — ``cifar-100-python/{train,test,meta}`` pickled exactly as the python
  version of CIFAR-100 that torchvision reads (dicts with ``data`` [N, 3072] uint8, ``fine_labels``,
  ``coarse_labels``, ``filenames``; ``meta`` with ``fine_label_names``).
* :func:`fake_eurosat` — ``eurosat/2750/<Class>/<Class>_<i>.jpg``, 64x64 RGB, torchvision's layout.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

EUROSAT_CLASSES = ["AnnualCrop", "Forest", "HerbaceousVegetation", "Highway", "Industrial", "Pasture",
                   "PermanentCrop", "Residential", "River", "SeaLake"]


def tiny_vit_file(path: Path, *, width: int = 64, depth: int = 2, heads: int = 2, seed: int = 0,
                  head_classes: int = 21843) -> Path:
    import timm
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, embed_dim=width,
                                  depth=depth, num_heads=heads, num_classes=head_classes)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(path), metadata={"num_heads": str(heads)})
    else:
        torch.save(sd, path)
    return path


def fake_cifar100(root: Path, *, train_per_class: int = 6, test_per_class: int = 2, seed: int = 0) -> Path:
    rng = np.random.RandomState(seed)
    d = root / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    for name, per in (("train", train_per_class), ("test", test_per_class)):
        labels = np.repeat(np.arange(100), per)
        rng.shuffle(labels)
        data = rng.randint(0, 256, (len(labels), 3072)).astype(np.uint8)
        # class c tints its red plane: features differ by class, so a probe has something to learn
        data[:, :1024] = np.clip(data[:, :1024] // 4 + 2 * labels[:, None], 0, 255).astype(np.uint8)
        blob = {"filenames": [f"img_{i}.png" for i in range(len(labels))], "batch_label": f"{name} batch 1 of 1",
                "fine_labels": labels.tolist(), "coarse_labels": (labels // 5).tolist(), "data": data}
        with open(d / name, "wb") as fh:
            pickle.dump(blob, fh, protocol=2)
    meta = {"fine_label_names": [f"class_{i:02d}" for i in range(100)],
            "coarse_label_names": [f"super_{i:02d}" for i in range(20)]}
    with open(d / "meta", "wb") as fh:
        pickle.dump(meta, fh, protocol=2)
    return d


def fake_eurosat(root: Path, *, per_class: int = 10, seed: int = 0) -> Path:
    from PIL import Image

    rng = np.random.RandomState(seed)
    base = root / "eurosat" / "2750"
    for c, name in enumerate(EUROSAT_CLASSES):
        (base / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = rng.randint(0, 64, (64, 64, 3)).astype(np.uint8) + np.uint8(19 * c)
            Image.fromarray(img).save(base / name / f"{name}_{i + 1}.jpg", quality=95)
    return base
