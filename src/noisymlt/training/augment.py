"""The training and test transforms of ``noisymlt.training.transforms`` on uint8 image tensors, in batches.

Decoded images come from the image cache (``noisymlt.data.imagecache``) as uint8 (N, 3, S, S). The random
parameters of each view are drawn on the CPU from the slot's numpy generator, in the reference order
(crop box, photometric distortion, flip: ``draw_train_params``), and travel as one float row per view;
``augment`` applies them wherever the images are (loader process on CPU, the GPU after the transfer),
so a slot's augmentation does not depend on the device, the batch it lands in or the number of workers.

Crop and resize use torchvision.transforms.v2's functional ops (bilinear with antialias, as PIL's
resize); the photometric ops follow mmcv's definition (additive brightness, multiplicative contrast, HSV
saturation scaling and hue shift), which torchvision's adjust_* functions do not (they blend with a
grey image), so they are written here with torch ops, batched with per-view factors.
"""

from __future__ import annotations

import numpy as np
import torch

from noisymlt.training.transforms import IMAGENET_MEAN, IMAGENET_STD, draw_photometric, random_crop_box

# One row of parameters per view.
X0, Y0, X1, Y1, BRIGHT, CONTRAST_BEFORE, SAT, HUE, HSV, CONTRAST_AFTER, P0, P1, P2, FLIP = range(14)
NPARAMS = 14


def draw_train_params(rng: np.random.Generator, width: int, height: int, photometric: bool = True) -> np.ndarray:
    """The random choices of ``transforms.train_transform`` for one view, drawn in the same order."""
    row = np.zeros(NPARAMS, dtype=np.float64)
    row[[X0, Y0, X1, Y1]] = random_crop_box(width, height, rng)
    p = draw_photometric(rng) if photometric else None
    if p is not None:
        row[[BRIGHT, CONTRAST_BEFORE, SAT, HUE, HSV, CONTRAST_AFTER]] = (
            p.brightness, p.contrast_before, p.saturation, p.hue, float(p.hsv), p.contrast_after)
        row[[P0, P1, P2]] = p.channels
    else:
        row[[CONTRAST_BEFORE, SAT, CONTRAST_AFTER]] = 1.0
        row[[P0, P1, P2]] = (0, 1, 2)
    row[FLIP] = float(rng.random() < 0.5)
    return row


def rgb_to_hsv(rgb: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) float RGB in [0, 255] -> H in degrees, S in [0, 1], V = max channel (as transforms)."""
    r, g, b = rgb.unbind(1)
    maxc = torch.amax(rgb, 1)  # values only: max(1) also finds the indices, ~20x slower here
    minc = torch.amin(rgb, 1)
    delta = maxc - minc
    s = torch.where(maxc > 0, delta / maxc.clamp_min(1e-12), torch.zeros_like(maxc))
    safe = delta.clamp_min(1e-12)
    h = torch.where(maxc == r, torch.remainder((g - b) / safe, 6),
                    torch.where(maxc == g, (b - r) / safe + 2, (r - g) / safe + 4))
    h = torch.where(delta > 0, h * 60.0, torch.zeros_like(h))
    return torch.stack([h, s, maxc], 1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    h, s, v = torch.remainder(hsv[:, 0], 360.0), hsv[:, 1], hsv[:, 2]
    c = v * s
    x = c * (1 - torch.abs(torch.remainder(h / 60.0, 2) - 1))
    m = v - c
    sector = torch.div(h, 60, rounding_mode="floor").long() % 6
    zero = torch.zeros_like(c)
    table = torch.stack([torch.stack(t, 0) for t in
                         [(c, x, zero), (x, c, zero), (zero, c, x), (zero, x, c), (x, zero, c), (c, zero, x)]], 0)
    out = table.gather(0, sector.unsqueeze(0).unsqueeze(0).expand(1, 3, *sector.shape)).squeeze(0)
    return out.permute(1, 0, 2, 3) + m.unsqueeze(1)


def photometric(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """mmcv-style distortion of float RGB [0, 255] (N, 3, H, W), one parameter row per image."""
    col = lambda k: p[:, k].to(x.dtype).view(-1, 1, 1, 1)  # noqa: E731
    x = (x + col(BRIGHT)) * col(CONTRAST_BEFORE)
    rows = torch.nonzero(p[:, HSV] > 0).flatten()  # the HSV round trip only where it was drawn
    if rows.numel():
        q = p.index_select(0, rows)
        hsv = rgb_to_hsv(x.index_select(0, rows).clamp(0, 255))
        sat = (hsv[:, 1] * q[:, SAT].to(x.dtype).view(-1, 1, 1)).clamp(0, 1)
        hue = torch.remainder(hsv[:, 0] + q[:, HUE].to(x.dtype).view(-1, 1, 1), 360)
        x = x.index_copy(0, rows, hsv_to_rgb(torch.stack([hue, sat, hsv[:, 2]], 1)))
    x = x * col(CONTRAST_AFTER)
    perm = p[:, [P0, P1, P2]].long()
    return x[torch.arange(len(x), device=x.device).unsqueeze(1), perm].clamp(0, 255)  # indexing: 2x a gather


def normalize(x: torch.Tensor) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as F

    return F.normalize(x, mean=IMAGENET_MEAN.tolist(), std=IMAGENET_STD.tolist())


def augment(images: torch.Tensor, params: torch.Tensor, size: int, photometric_on: bool = True) -> torch.Tensor:
    """uint8 (N, 3, S, S) + parameter rows (N, NPARAMS) -> normalised float (N, 3, size, size), on
    the images' device. Crop + resize per view (boxes differ), the rest batched."""
    from torchvision.transforms.v2 import functional as F

    boxes = params[:, [X0, Y0, X1, Y1]].round().long().tolist()
    # One resize per crop shape, not per view (the per-call cost is most of it at 32 px): the kernel
    # resizes each image of a batch on its own, so the views are the same as resized one by one.
    shapes: dict[tuple[int, int], list[int]] = {}
    for n, (x0, y0, x1, y1) in enumerate(boxes):
        shapes.setdefault((y1 - y0, x1 - x0), []).append(n)
    x = images.new_empty((len(boxes), images.shape[1], size, size))
    for (h, w), rows in shapes.items():
        crops = torch.stack([images[n, :, boxes[n][1]:boxes[n][1] + h, boxes[n][0]:boxes[n][0] + w] for n in rows])
        x[rows] = F.resize(crops, [size, size], antialias=True)
    x = x.float()
    p = params.to(x.device)
    if photometric_on:
        x = photometric(x, p)
    flip = (p[:, FLIP] > 0).view(-1, 1, 1, 1)
    x = torch.where(flip, x.flip(-1), x)
    return normalize(x)


def eval_resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """The test transform on cached uint8 images: resize S -> size (antialiased) and normalise."""
    from torchvision.transforms.v2 import functional as F

    if images.shape[-1] != size or images.shape[-2] != size:
        images = F.resize(images, [size, size], antialias=True)
    return normalize(images.float())
