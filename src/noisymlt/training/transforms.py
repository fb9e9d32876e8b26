"""Image transforms of SPEC 3, driven by an explicit per-sample generator.

Torchvision's random transforms draw from the global torch RNG, which differs between loader
workers and breaks exact resume. Here every random choice comes from ``numpy.random.Generator``
seeded per (run seed, epoch, sample slot), so an image's augmentation is a pure function of its
place in the schedule, whatever the number of workers.

Order: random crop -> resize -> photometric distortion -> flip -> normalise. The photometric ops are
pointwise, so running them after the resize (on 224x224 instead of the full image) gives the same
distribution at a fraction of the cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


def rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """float RGB in [0, 255] -> H in degrees [0, 360), S and V in [0, 1] (V scaled to 255 below)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    maxc = rgb.max(-1)
    minc = rgb.min(-1)
    delta = maxc - minc
    s = np.where(maxc > 0, delta / np.maximum(maxc, 1e-12), 0.0)
    safe = np.maximum(delta, 1e-12)
    h = np.where(maxc == r, (g - b) / safe % 6, np.where(maxc == g, (b - r) / safe + 2, (r - g) / safe + 4))
    h = np.where(delta > 0, h * 60.0, 0.0)
    return np.stack([h, s, maxc], axis=-1)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    h, s, v = hsv[..., 0] % 360.0, hsv[..., 1], hsv[..., 2]
    c = v * s
    x = c * (1 - np.abs((h / 60.0) % 2 - 1))
    m = v - c
    sector = (h // 60).astype(np.int64) % 6
    zero = np.zeros_like(c)
    table = [(c, x, zero), (x, c, zero), (zero, c, x), (zero, x, c), (x, zero, c), (c, zero, x)]
    out = np.zeros(h.shape + (3,), dtype=np.float32)
    for k, (rr, gg, bb) in enumerate(table):
        sel = sector == k
        out[sel, 0], out[sel, 1], out[sel, 2] = rr[sel], gg[sel], bb[sel]
    return out + m[..., None]


@dataclass(frozen=True)
class Photometric:
    """One draw of the photometric distortion; neutral values where an op was not drawn."""

    brightness: float = 0.0        # added
    contrast_before: float = 1.0   # multiplied before the HSV ops
    saturation: float = 1.0        # multiplies HSV saturation
    hue: float = 0.0               # degrees added to HSV hue
    hsv: bool = False              # the HSV round trip (and its clip to [0, 255]) happens
    contrast_after: float = 1.0    # multiplied after the HSV ops
    channels: tuple[int, int, int] = (0, 1, 2)


def draw_photometric(rng: np.random.Generator) -> Photometric:
    """mmcv-style PhotoMetricDistortion parameters: brightness +-32, contrast 0.5..1.5 (before or after
    the HSV ops, at random), saturation 0.5..1.5, hue +-18 degrees, random channel swap; each applied
    with probability 0.5. The draw order is the reference's: the PIL and the cached-tensor paths take
    their parameters from here, so one slot seed gives both the same augmentation."""
    brightness = rng.uniform(-32, 32) if rng.random() < 0.5 else 0.0
    contrast_first = rng.random() < 0.5
    before = rng.uniform(0.5, 1.5) if contrast_first and rng.random() < 0.5 else 1.0
    do_sat, do_hue = rng.random() < 0.5, rng.random() < 0.5
    saturation = rng.uniform(0.5, 1.5) if do_sat else 1.0
    hue = rng.uniform(-18, 18) if do_hue else 0.0
    after = rng.uniform(0.5, 1.5) if not contrast_first and rng.random() < 0.5 else 1.0
    channels = tuple(int(c) for c in rng.permutation(3)) if rng.random() < 0.5 else (0, 1, 2)
    return Photometric(float(brightness), float(before), float(saturation), float(hue), do_sat or do_hue,
                       float(after), channels)


def apply_photometric(img: np.ndarray, p: Photometric) -> np.ndarray:
    """The distortion ``p`` on float RGB [0, 255] (H, W, 3)."""
    img = img.astype(np.float32, copy=True)
    if p.brightness:
        img += p.brightness
    if p.contrast_before != 1.0:
        img *= p.contrast_before
    if p.hsv:
        hsv = rgb_to_hsv(np.clip(img, 0, 255))
        if p.saturation != 1.0:
            hsv[..., 1] = np.clip(hsv[..., 1] * p.saturation, 0, 1)
        if p.hue:
            hsv[..., 0] = (hsv[..., 0] + p.hue) % 360
        img = hsv_to_rgb(hsv)
    if p.contrast_after != 1.0:
        img *= p.contrast_after
    if p.channels != (0, 1, 2):
        img = img[..., list(p.channels)]
    return np.clip(img, 0, 255)


def photometric_distortion(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """mmcv-style PhotoMetricDistortion on float RGB [0, 255] (see ``draw_photometric``)."""
    return apply_photometric(img, draw_photometric(rng))


def random_crop_box(width: int, height: int, rng: np.random.Generator, lo: float = 0.8) -> tuple[int, int, int, int]:
    """Crop lo..1 of each side independently, at a uniform position."""
    cw = max(1, int(round(width * rng.uniform(lo, 1.0))))
    ch = max(1, int(round(height * rng.uniform(lo, 1.0))))
    x0 = int(rng.integers(0, width - cw + 1))
    y0 = int(rng.integers(0, height - ch + 1))
    return x0, y0, x0 + cw, y0 + ch


def to_tensor(arr: np.ndarray) -> torch.Tensor:
    arr = (arr - IMAGENET_MEAN) / IMAGENET_STD
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1), dtype=np.float32))


def train_transform(img: Image.Image, size: int, rng: np.random.Generator, photometric: bool = True) -> torch.Tensor:
    img = img.crop(random_crop_box(img.width, img.height, rng)).resize((size, size), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.float32)
    if photometric:
        arr = photometric_distortion(arr, rng)
    if rng.random() < 0.5:
        arr = arr[:, ::-1]
    return to_tensor(arr)


def eval_transform(img: Image.Image, size: int) -> torch.Tensor:
    return to_tensor(np.asarray(img.resize((size, size), Image.BILINEAR), dtype=np.float32))
