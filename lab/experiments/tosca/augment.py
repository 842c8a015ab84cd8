"""Training-time augmentation for ``augment`` mode: the backbone runs on augmented images each epoch.

PILOT's ViT train transform is ``RandomResizedCrop(224, scale=(0.05, 1), ratio=(3/4, 4/3))`` +
``RandomHorizontalFlip()``. We apply the same random crop/flip, vectorised over a batch with
``affine_grid``/``grid_sample`` on the already preprocessed (resized, normalised) tensor — one
resampling more than torchvision's crop-then-resize, the same distribution of crops.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

SCALE = (0.05, 1.0)
RATIO = (3 / 4, 4 / 3)


def random_resized_crop_flip(x: torch.Tensor, generator: torch.Generator, *, scale=SCALE, ratio=RATIO,
                             flip_p: float = 0.5) -> torch.Tensor:
    """``x [N, C, R, R]`` -> a random crop of each image (area fraction in ``scale``, aspect in
    ``ratio``), resized back to R, mirrored with probability ``flip_p``."""
    n = x.shape[0]
    u = torch.rand(n, 4, generator=generator)
    area = scale[0] + (scale[1] - scale[0]) * u[:, 0]
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[:, 1]
    w = torch.sqrt(area * log_r.exp()).clamp(max=1.0)  # crop width / image width
    h = torch.sqrt(area / log_r.exp()).clamp(max=1.0)
    cx = (2 * u[:, 2] - 1) * (1 - w)  # crop centre in [-1, 1] so the crop fits
    cy = (2 * u[:, 3] - 1) * (1 - h)
    flip = torch.where(torch.rand(n, generator=generator) < flip_p, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = w * flip, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    grid = F.affine_grid(theta.to(x), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


class AugmentedFeatures:
    """``batch_features(idx)`` for augment mode: backbone features of freshly augmented images.

    ``images``: uint8 array of the task's training images (rows match ``idx``). The backbone stays
    frozen and in eval mode; nothing here has gradients.
    """

    def __init__(self, backbone, images: np.ndarray, *, seed: int, device: str = "cpu"):
        self.backbone, self.images, self.device = backbone, images, device
        self.generator = torch.Generator().manual_seed(seed)
        self.images_seen = 0  # backbone passes spent, for the time/cost accounting

    @torch.no_grad()
    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        batch = self.images[idx.cpu().numpy()]
        x = random_resized_crop_flip(self.backbone.preprocess(batch).float(), self.generator)
        self.images_seen += len(idx)
        where = next(self.backbone.model.parameters()).device  # the backbone may live elsewhere
        return self.backbone.features(x.to(where)).float().to(self.device)
