"""Read-outs of frozen features: nearest-prototype and linear probes, and 2-D projections.

These are the measuring instruments of the quickstart and the ventral-stream notebook: they never
train the backbone, only read what its features already separate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def prototypes(x: torch.Tensor, y: torch.Tensor, num_classes: int | None = None) -> torch.Tensor:
    """Class-mean features [C, d] (the SimpleCIL / TOSCA head initialisation)."""
    c = int(num_classes or int(y.max()) + 1)
    sums = torch.zeros(c, x.shape[1], dtype=x.dtype).index_add_(0, y, x)
    counts = torch.bincount(y, minlength=c).clamp_min(1).unsqueeze(1).to(x.dtype)
    return sums / counts


def prototype_predict(protos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Cosine nearest-prototype prediction."""
    return (F.normalize(x, dim=1) @ F.normalize(protos, dim=1).T).argmax(1)


def prototype_accuracy(train_x, train_y, test_x, test_y) -> float:
    return float((prototype_predict(prototypes(train_x, train_y), test_x) == test_y).float().mean())


def per_class_accuracy(pred: torch.Tensor, y: torch.Tensor, class_names: list[str]):
    import pandas as pd

    rows = []
    for c, name in enumerate(class_names):
        m = y == c
        rows.append({"class": name, "n": int(m.sum()), "accuracy": float((pred[m] == c).float().mean()) if m.any() else float("nan")})
    return pd.DataFrame(rows)


def linear_probe_accuracy(train_x, train_y, test_x, test_y, *, epochs: int = 30, lr: float = 0.01,
                          weight_decay: float = 1e-4, seed: int = 0) -> float:
    """Multinomial logistic regression on standardised features (Adam, minibatches of 256,
    deterministic for a seed). A stage is "linearly decodable" to the extent this is high."""
    g = torch.Generator().manual_seed(seed)
    mu, sd = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    xtr, xte = (train_x - mu) / sd, (test_x - mu) / sd
    c = int(train_y.max()) + 1
    w = torch.zeros(xtr.shape[1], c, requires_grad=True)
    b = torch.zeros(c, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=lr, weight_decay=weight_decay)
    n, bs = len(xtr), 256
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=g).split(bs):
            opt.zero_grad()
            F.cross_entropy(xtr[idx] @ w + b, train_y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return float(((xte @ w + b).argmax(1) == test_y).float().mean())


def project_2d(x: torch.Tensor, method: str = "pca", seed: int = 0) -> torch.Tensor:
    """[N, d] -> [N, 2] by PCA (default, deterministic) or t-SNE (scikit-learn, seeded)."""
    if method == "pca":
        xc = x - x.mean(0)
        _, _, v = torch.linalg.svd(xc, full_matrices=False)
        z = xc @ v[:2].T
        # svd_flip: the largest-magnitude entry of each axis is positive, so plots never mirror
        return z * torch.sign(z[z.abs().argmax(0), torch.arange(2)])
    if method == "tsne":
        from sklearn.manifold import TSNE

        return torch.from_numpy(TSNE(2, random_state=seed, init="pca").fit_transform(x.numpy())).float()
    raise ValueError(f"unknown projection {method!r}; valid: pca, tsne")
