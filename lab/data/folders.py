"""Image-folder datasets in the layout PILOT users already have.

    $LAB_DATA_DIR/<name>/train/<class name>/<image files>
    $LAB_DATA_DIR/<name>/test/<class name>/<image files>

Class ids follow the sorted class-folder names of ``train/`` (as torchvision's ImageFolder);
``test/`` must hold the same folders. Images are converted to RGB, resized so the short side is
256 px and centre-cropped to 224x224 (the usual ImageNet-style evaluation transform), and kept in
memory as uint8. See data_cards/image_folder.md.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

FOLDER_DATASETS = {
    # name: (classes, where to get it)
    "cub200": (200, "CUB-200-2011 (Caltech): https://www.vision.caltech.edu/datasets/cub_200_2011/, "
                    "PILOT split: https://drive.google.com/file/d/1XbUpnWpJPnItt5zQ6sHJnsjPncnNLvWb"),
    "imagenet_r": (200, "ImageNet-R: https://github.com/hendrycks/imagenet-r (PILOT split: imagenet-r in PILOT README)"),
    "imagenet_a": (200, "ImageNet-A: https://github.com/hendrycks/natural-adv-examples (PILOT split in PILOT README)"),
    "omnibenchmark": (300, "OmniBenchmark: https://github.com/ZhangYuanhan-AI/OmniBenchmark (PILOT split in PILOT README)"),
    "vtab": (50, "VTAB (the 50-class PILOT subset): see https://github.com/sun-hailong/LAMDA-PILOT#datasets"),
}
_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


def _layout_error(name: str, root: Path, problem: str, Unavailable):
    classes, where = FOLDER_DATASETS[name]
    return Unavailable(
        f"{name}: {problem}. Expected {root / name}/train/<class>/*.jpg and {root / name}/test/<class>/*.jpg "
        f"({classes} class folders; set $LAB_DATA_DIR or pass root=). Get it from {where}."
    )


def _read_split(folder: Path, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    images, labels = [], []
    for c, cname in enumerate(classes):
        for f in sorted(p for p in (folder / cname).iterdir() if p.suffix.lower() in _EXTS):
            with Image.open(f) as im:
                im = im.convert("RGB")
                s = 256 / min(im.size)
                im = im.resize((max(224, round(im.width * s)), max(224, round(im.height * s))), Image.BICUBIC)
                left, top = (im.width - 224) // 2, (im.height - 224) // 2
                images.append(np.asarray(im.crop((left, top, left + 224, top + 224))))
            labels.append(c)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def register_folder_datasets(registry, Unavailable, ImageDataset, Split) -> None:
    for name, (classes, _) in FOLDER_DATASETS.items():
        def available(root: Path, name=name):
            return (root / name / "train").is_dir(), str(root / name)

        def load(root: Path, name=name):
            base = root / name
            if not (base / "train").is_dir() or not (base / "test").is_dir():
                raise _layout_error(name, root, f"no train/ and test/ folders under {base}", Unavailable)
            classes_ = sorted(p.name for p in (base / "train").iterdir() if p.is_dir())
            missing = [c for c in classes_ if not (base / "test" / c).is_dir()]
            if not classes_ or missing:
                raise _layout_error(name, root, f"test/ lacks class folders {missing[:5]}" if missing
                                    else "train/ holds no class folders", Unavailable)
            tr, te = _read_split(base / "train", classes_), _read_split(base / "test", classes_)
            return ImageDataset(name, classes_, Split(*tr), Split(*te), str(base))

        registry.register(name, classes=classes, train=None, test=None, licence="see the dataset's site",
                          image="RGB, resized to 224x224", available=available)(load)
