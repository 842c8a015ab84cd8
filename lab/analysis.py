"""Instruments for the ventral-stream notebook (notebook 01) and the routing study of
notebook 02: what a representation is like along a backbone's depth, and what adapting it changes.

* :func:`linear_cka`, :func:`cka_matrix`, :func:`cka_by_stage` — linear CKA (Kornblith et al.,
  ICML 2019) between two sets of features of the same images; 1 = the same geometry up to
  rotation and scale.
* :func:`stage_features`, :func:`stage_shapes` — pooled output of every stage, in memory.
* :func:`augment`, :func:`invariance` — how close a stage's feature of an image stays to the
  feature of its augmented twin (geometric or photometric), relative to a random other image.
* :func:`probe_stages` — linear and nearest-prototype decodability of every stage.
* :func:`state_hash`, :func:`parameter_drift` — did a module change at all, and where.
* :func:`finetune_backbone` — full fine-tuning of a copy of a frozen backbone on one task (the
  foil to TOSCA); :func:`imagenet_top1`, :func:`photos` — what the original ImageNet head says.
* :func:`route_in_order`, :func:`routing_by_order` — TOSCA's per-batch entropy routing over any
  test order and batch size (the reference's protocol, and what shuffling does to it).
* :func:`balanced_indices`, :func:`relabel` — class-balanced subsets, labels of one task.

Pure functions on tensors, tested on hand-made inputs in ``tests/test_analysis.py``.
"""
from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


# --- CKA ------------------------------------------------------------------------------------------
def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of ``x [n, p]`` and ``y [n, q]`` (rows: the same n inputs).

    ``||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`` on column-centred features, in float64;
    invariant to orthogonal transforms and isotropic scaling of either side, in [0, 1].
    """
    if x.shape[0] != y.shape[0] or x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"need [n, p] and [n, q] features of the same n inputs, got {tuple(x.shape)}, {tuple(y.shape)}")
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    if x.shape[0] < x.shape[1] + y.shape[1]:  # Gram form is cheaper when n is small
        k, l = x @ x.T, y @ y.T  # [n, n]
        num, den = (k * l).sum(), k.norm() * l.norm()
    else:
        num, den = (y.T @ x).pow(2).sum(), (x.T @ x).norm() * (y.T @ y).norm()
    return float(num / den) if den > 0 else float("nan")


def cka_matrix(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor] | None = None):
    """CKA of every entry of ``a`` against every entry of ``b`` (default ``a``): DataFrame [a x b]."""
    import pandas as pd

    b = a if b is None else b
    return pd.DataFrame([[linear_cka(a[i], b[j]) for j in b] for i in a], index=list(a), columns=list(b))


# --- subsets -------------------------------------------------------------------------------------------
def balanced_indices(labels, per_class: int, *, classes=None, seed: int = 0) -> np.ndarray:
    """Sorted indices of up to ``per_class`` random samples of each class in ``classes`` (default: all)."""
    labels = np.asarray(labels)
    rng = np.random.RandomState(seed)
    classes = np.unique(labels) if classes is None else classes
    idx = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in classes]
    return np.sort(np.concatenate(idx)) if idx else np.zeros(0, dtype=np.int64)


def relabel(labels, classes) -> torch.Tensor:
    """Dataset labels -> position in ``classes`` (0..len-1), -1 for labels outside ``classes``."""
    lut = {int(c): i for i, c in enumerate(classes)}
    return torch.tensor([lut.get(int(c), -1) for c in np.asarray(labels)], dtype=torch.long)


# --- augmentation and stage features -------------------------------------------------------------
AUGMENTATIONS = ("all", "geometric", "photometric")


def augment(x: torch.Tensor, generator: torch.Generator, *, kind: str = "all", scale=(0.6, 1.0),
            max_rotate: float = 15.0, flip_p: float = 0.5, jitter: float = 0.3) -> torch.Tensor:
    """Mild label-preserving augmentation of preprocessed images ``x [N, 3, R, R]``. Geometric: a
    random crop of ``scale`` of the area (resized back), a rotation within ``±max_rotate`` degrees,
    a horizontal flip; photometric: contrast/brightness jitter of relative size ``jitter``.
    ``kind`` picks both ('all') or one of them (the same random draws either way)."""
    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation kind {kind!r}; valid: {', '.join(AUGMENTATIONS)}")
    n = x.shape[0]
    u = torch.rand(n, 6, generator=generator)
    s = torch.sqrt(scale[0] + (scale[1] - scale[0]) * u[:, 0])  # side fraction of the crop
    a = torch.deg2rad((2 * u[:, 1] - 1) * max_rotate)
    flip = torch.where(u[:, 2] < flip_p, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 1] = s * torch.cos(a) * flip, -s * torch.sin(a)
    theta[:, 1, 0], theta[:, 1, 1] = s * torch.sin(a) * flip, s * torch.cos(a)
    theta[:, 0, 2], theta[:, 1, 2] = (2 * u[:, 3] - 1) * (1 - s), (2 * u[:, 4] - 1) * (1 - s)
    contrast = (1 + jitter * (2 * u[:, 5] - 1)).view(n, 1, 1, 1).to(x)
    bright = (jitter * (2 * torch.rand(n, generator=generator) - 1)).view(n, 1, 1, 1).to(x)
    if kind != "photometric":
        grid = F.affine_grid(theta.to(x), list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return x if kind == "geometric" else x * contrast + bright


def augmented_examples(images, n: int = 6, *, seed: int = 0) -> np.ndarray:
    """``n`` uint8 images followed by one augmented twin of each (what :func:`augment` does, to look at)."""
    x = torch.from_numpy(np.asarray(images[:n])).float() / 255
    x = x.unsqueeze(1).expand(-1, 3, -1, -1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    y = augment(x.contiguous(), torch.Generator().manual_seed(seed)).clamp(0, 1)
    both = torch.cat([x, y]).permute(0, 2, 3, 1)
    return (both * 255).round().byte().numpy()


@torch.no_grad()
def stage_features(bb, images, *, batch_size: int = 64, augmented: bool | str = False, seed: int = 0,
                   progress: bool = False) -> dict[str, torch.Tensor]:
    """Pooled output of every stage of backbone ``bb`` for ``images`` (uint8, in memory, uncached):
    ``{stage: [N, C_stage]}``. For a CNN the last stage ('head') pooled is the decision-point
    feature. ``augmented`` (True or an :func:`augment` kind) augments each image first (seeded)."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    outs: dict[str, list] = {}
    was_training = bb.model.training
    bb.model.eval()
    for i in tqdm(range(0, len(images), batch_size), disable=not progress, desc="stages", unit="batch"):
        x = bb.preprocess(images[i:i + batch_size]).float()
        if augmented:
            x = augment(x, gen, kind="all" if augmented is True else augmented)
        for k, v in bb.pooled_stages(x).items():
            outs.setdefault(k, []).append(v.float())
    bb.model.train(was_training)
    return {k: torch.cat(v) for k, v in outs.items()}


@torch.no_grad()
def stage_shapes(bb, image) -> "pd.DataFrame":  # noqa: F821
    """Channels and spatial size (or tokens) of every stage for one image at the backbone's resolution."""
    import pandas as pd

    out = bb.stages(bb.preprocess(np.asarray(image)[None]).float())
    return pd.DataFrame([{"stage": k, "depth": i, "channels": v.shape[1 if v.ndim == 4 else 2],
                          "grid": f"{v.shape[2]}x{v.shape[3]}" if v.ndim == 4 else f"{v.shape[1]} tokens"}
                         for i, (k, v) in enumerate(out.items())])


def cka_by_stage(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]):
    """Linear CKA of each stage with itself before and after a change (same images): 1 = unchanged geometry."""
    import pandas as pd

    return pd.DataFrame([{"stage": k, "depth": i, "cka": linear_cka(before[k], after[k])}
                         for i, k in enumerate(before)])


def invariance(clean: dict[str, torch.Tensor], augmented: dict[str, torch.Tensor], *, seed: int = 0):
    """Per stage: mean cosine of each (centred) feature to its augmented twin, to a random other
    image's augmented feature, and the index ``(twin - other) / (1 - other)``: 1 = the twin is
    as close as the image itself, 0 = the twin is no closer than any other image."""
    import pandas as pd

    n = next(iter(clean.values())).shape[0]
    if n < 2:
        raise ValueError("invariance needs at least 2 images")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    other = torch.empty(n, dtype=torch.long)
    other[perm] = perm.roll(1)  # a derangement: nobody is paired with itself
    rows = []
    for depth, (name, c) in enumerate(clean.items()):
        mu = c.mean(0)
        cn, an = F.normalize(c - mu, dim=1), F.normalize(augmented[name] - mu, dim=1)
        twin, rand = float((cn * an).sum(1).mean()), float((cn * an[other]).sum(1).mean())
        rows.append({"stage": name, "depth": depth, "twin": twin, "other": rand,
                     "invariance": (twin - rand) / (1 - rand) if rand < 1 else float("nan")})
    return pd.DataFrame(rows)


def probe_stages(train: dict[str, torch.Tensor], train_y, test: dict[str, torch.Tensor], test_y, *,
                 epochs: int = 30, seed: int = 0):
    """Linear-probe and nearest-prototype accuracy of every stage (the features stay frozen)."""
    import pandas as pd

    from lab.probes import linear_probe_accuracy, prototype_accuracy

    rows = []
    for depth, name in enumerate(train):
        rows.append({"stage": name, "depth": depth, "dim": int(train[name].shape[1]),
                     "linear_probe": linear_probe_accuracy(train[name], train_y, test[name], test_y,
                                                           epochs=epochs, seed=seed),
                     "prototype": prototype_accuracy(train[name], train_y, test[name], test_y)})
    return pd.DataFrame(rows)


# --- has anything changed? ------------------------------------------------------------------------
def state_hash(module: nn.Module) -> str:
    """sha256 of every parameter and buffer (names, dtypes, shapes, bytes): equal iff bit-identical."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def stage_of(param_name: str, kind: str = "cnn") -> str:
    """Which stage of :meth:`lab.backbones.Backbone.stages` a timm parameter belongs to."""
    parts = param_name.split(".")
    if parts[0] == "blocks":
        return f"{'stage' if kind == 'cnn' else 'block'}{int(parts[1]) + 1}"
    if kind == "cnn":
        return {"conv_stem": "stem", "bn1": "stem", "conv_head": "head", "bn2": "head"}.get(parts[0], "classifier")
    return {"norm": "norm", "head": "classifier", "fc_norm": "norm"}.get(parts[0], "embed")


def parameter_drift(before: nn.Module, after: nn.Module, kind: str = "cnn"):
    """Per stage, relative change of the weights ``||W_after - W_before|| / ||W_before||`` (parameters
    only) and whether any buffer (BatchNorm running statistics) moved."""
    import pandas as pd

    pa, pb = dict(before.named_parameters()), dict(after.named_parameters())
    buf_a, buf_b = dict(before.named_buffers()), dict(after.named_buffers())
    acc: dict[str, list] = {}
    for name, w in pa.items():
        d = acc.setdefault(stage_of(name, kind), [0.0, 0.0, False])
        d[0] += float((pb[name].detach() - w.detach()).double().pow(2).sum())
        d[1] += float(w.detach().double().pow(2).sum())
    for name, b in buf_a.items():
        if b.is_floating_point() and stage_of(name, kind) in acc:
            acc[stage_of(name, kind)][2] |= not torch.equal(b, buf_b[name])
    return pd.DataFrame([{"stage": k, "relative_change": math.sqrt(v[0] / v[1]) if v[1] else float("nan"),
                          "buffers_changed": v[2]} for k, v in acc.items()])


# --- full fine-tuning, the foil ---------------------------------------------------------------------
@dataclass
class FineTuned:
    """A fully fine-tuned copy of a backbone plus the linear head trained with it."""

    backbone: object  # lab.backbones.Backbone (a copy; the original is untouched), frozen again
    head: nn.Linear
    log: list[dict] = field(default_factory=list)  # one row per epoch: loss, train accuracy, lr
    seconds: float = 0.0

    @torch.no_grad()
    def predict(self, images, batch_size: int = 64) -> torch.Tensor:
        out = [self.head(self.backbone.features(self.backbone.preprocess(images[i:i + batch_size]).float())).argmax(1)
               for i in range(0, len(images), batch_size)]
        return torch.cat(out)


def finetune_backbone(bb, images, labels, *, epochs: int = 2, lr: float = 0.01, batch_size: int = 32,
                      seed: int = 0, train_bn: bool = True, progress: bool = False) -> FineTuned:
    """Full fine-tuning of a deep copy of ``bb`` on one task: every backbone weight and a new
    linear head on the decision-point feature, cross-entropy, SGD (momentum .9, cosine lr), no
    augmentation. ``labels`` must be 0..C-1. ``train_bn`` keeps BatchNorm in training mode (its
    running statistics adapt too, as in ordinary fine-tuning)."""
    import time

    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    n_cls = int(labels.max()) + 1
    ft = replace(bb, model=copy.deepcopy(bb.model), weights_id=bb.weights_id + f"+finetuned-s{seed}")
    ft.model.requires_grad_(True).train(train_bn)
    head = nn.Linear(ft.feature_dim, n_cls)
    params = [*ft.model.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    steps = epochs * math.ceil(len(labels) / batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, steps))
    log = []
    bar = tqdm(total=steps, disable=not progress, desc="full fine-tuning", unit="step")
    for epoch in range(epochs):
        tot, correct = 0.0, 0
        for idx in torch.randperm(len(labels), generator=gen).split(batch_size):
            x = ft.preprocess(images[idx.numpy()]).float()
            logits = head(ft.features(x))
            loss = F.cross_entropy(logits, labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            tot += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == labels[idx]).sum())
            bar.update(1)
        log.append({"epoch": epoch, "loss": tot / len(labels), "train_accuracy": correct / len(labels),
                    "lr": sched.get_last_lr()[0]})
    bar.close()
    ft.model.eval().requires_grad_(False)
    head.eval().requires_grad_(False)
    return FineTuned(ft, head, log, time.perf_counter() - t0)


# --- the ImageNet head on real photos ---------------------------------------------------------------
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera", "clock", "coins", "moon",
          "hubble_deep_field", "brick", "grass", "gravel")


def photos(names=PHOTOS, size: int = 224) -> tuple[np.ndarray, list[str]]:
    """Real photographs shipped with scikit-image, centre-cropped square: uint8 ``[N, size, size, 3]``."""
    import skimage.data

    out = []
    for name in names:
        img = np.asarray(getattr(skimage.data, name)())
        img = np.repeat(img[..., None], 3, -1) if img.ndim == 2 else img[..., :3]
        h, w = img.shape[:2]
        s = min(h, w)
        img = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
        t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float()
        t = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(t[0].permute(1, 2, 0).round().clamp(0, 255).byte().numpy())
    return np.stack(out), list(names)


@torch.no_grad()
def imagenet_top1(bb, images, batch_size: int = 32, *, resolution: int | None = None):
    """Top-1 ImageNet class index and its description for each image, from ``bb``'s own head,
    at ``resolution`` (default: the backbone's; a CNN's weights work at any size)."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    bb = replace(bb, resolution=resolution) if resolution else bb
    idx = torch.cat([bb.logits(bb.preprocess(images[i:i + batch_size]).float()).argmax(1)
                     for i in range(0, len(images), batch_size)])
    return idx, [info.index_to_description(int(i)).split(",")[0] for i in idx]


# --- TOSCA routing over any test order --------------------------------------------------------------
def route_in_order(logits: torch.Tensor, order: torch.Tensor, batch_size: int) -> torch.Tensor:
    """TOSCA's per-batch rule over a given test order: consecutive ``batch_size`` samples of
    ``order`` share the module with the lowest mean entropy. ``logits [T, N, C]`` -> module ``[N]``.
    (``lab.tosca.routing`` builds only the reference's class-ordered batches.)"""
    from lab.tosca.routing import entropy

    ent = entropy(logits)  # [T, N]
    choice = torch.empty(ent.shape[1], dtype=torch.long)
    for idx in order.split(batch_size):
        choice[idx] = ent[:, idx].mean(1).argmin()
    return choice


def routing_by_order(logits, labels, task_ids, batch_sizes=(1, 8, 48, 128), *, seed: int = 0):
    """Accuracy and routing accuracy of per-batch routing for each batch size, with the test set
    class-ordered (as the reference's loader) and shuffled; batch size 1 is per-sample routing."""
    import pandas as pd

    from lab.tosca.routing import predict

    labels, task_ids = torch.as_tensor(labels), torch.as_tensor(task_ids)
    orders = {"class-ordered": torch.sort(labels, stable=True).indices,
              "shuffled": torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))}
    rows = []
    for name, order in orders.items():
        for bs in batch_sizes:
            choice = route_in_order(logits, order, int(bs))
            rows.append({"order": name, "batch_size": int(bs),
                         "accuracy": float((predict(logits, choice) == labels).float().mean() * 100),
                         "routing_accuracy": float((choice == task_ids).float().mean() * 100)})
    return pd.DataFrame(rows)
