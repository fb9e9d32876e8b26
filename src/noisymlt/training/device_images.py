"""The decoded training set kept on the device, augmented there in batches (``train.device_images``).

The image cache (``noisymlt.data.imagecache``) is loaded once onto the training device as uint8
(N, 3, S, S): VOC-MLT's 1,142 images at 256 px are 0.2 GB, COCO-MLT's 1,909 0.4 GB. Each batch then takes
its rows by index and gets every view's own random augmentation in a few batched tensor ops, with no
loader process, no host-to-device copy and no host sync (the data path ``cache_batched_gpu`` could not feed
Ours at paper shapes on an H200: docs/benchmarks/device_check_h200.md).

The draws follow ``noisymlt.training.transforms`` (SPEC 3) in distribution, each view its own: crop of
0.8..1 of each side at a uniform integer position, photometric distortion (brightness +-32, contrast
0.5..1.5 before or after the HSV ops, saturation 0.5..1.5, hue +-18 degrees, channel swap; each with
probability 0.5), flip with probability 0.5 (tests/test_device_images.py compares the distributions).
They come from a generator on the device seeded by the batch's first slot's seed (``EpochPlan``), so a
batch is a pure function of (run seed, epoch, slot) and a resumed run replays it; the values are not the
cache loader's (numpy draws per slot), so the choice is part of the run's configuration. Crop, resize and
flip are one bilinear ``grid_sample`` per batch (an affine grid per view; torchvision's v2 resize takes
one size per call, and kornia is not a dependency); unlike the cache loader's resize it does not
antialias, which matters only for downscaling, here by at most S / image_size (256 / 224: 1.14x).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from noisymlt.errors import NoisyMLTError
from noisymlt.training.augment import (
    BRIGHT, CONTRAST_AFTER, CONTRAST_BEFORE, FLIP, HSV, HUE, NPARAMS, P0, SAT, X0, X1, Y0, Y1, hsv_to_rgb,
    normalize, rgb_to_hsv)

log = logging.getLogger(__name__)

CROP_LO = 0.8  # transforms.random_crop_box: each side 0.8..1 of the image's


def draw_params(n: int, side: int, generator: torch.Generator, photometric: bool = True) -> torch.Tensor:
    """(n, NPARAMS) rows as ``augment.draw_train_params`` lays them out, drawn in one go on the generator's
    device, with the same distributions (see the module doc)."""
    dev = generator.device
    u = torch.rand((n, 15), generator=generator, device=dev, dtype=torch.float64)
    p = torch.zeros((n, NPARAMS), dtype=torch.float64, device=dev)
    cw = torch.round(side * (CROP_LO + (1 - CROP_LO) * u[:, 0])).clamp_min(1)
    ch = torch.round(side * (CROP_LO + (1 - CROP_LO) * u[:, 1])).clamp_min(1)
    x0 = torch.floor(u[:, 2] * (side - cw + 1)).clamp(max=side - cw)
    y0 = torch.floor(u[:, 3] * (side - ch + 1)).clamp(max=side - ch)
    p[:, X0], p[:, Y0], p[:, X1], p[:, Y1] = x0, y0, x0 + cw, y0 + ch
    p[:, [CONTRAST_BEFORE, SAT, CONTRAST_AFTER]] = 1.0
    p[:, P0:P0 + 3] = torch.arange(3, dtype=torch.float64, device=dev)
    if photometric:
        coin = u[:, 4:10] < 0.5  # brightness, contrast first, contrast drawn, saturation, hue, channel swap
        p[:, BRIGHT] = torch.where(coin[:, 0], -32 + 64 * u[:, 10], 0.0)
        contrast = 0.5 + u[:, 11]
        first, drawn = coin[:, 1], coin[:, 2]
        p[:, CONTRAST_BEFORE] = torch.where(first & drawn, contrast, 1.0)
        p[:, CONTRAST_AFTER] = torch.where(~first & drawn, contrast, 1.0)
        p[:, SAT] = torch.where(coin[:, 3], 0.5 + u[:, 12], 1.0)
        p[:, HUE] = torch.where(coin[:, 4], -18 + 36 * u[:, 13], 0.0)
        p[:, HSV] = (coin[:, 3] | coin[:, 4]).double()
        perm = torch.argsort(torch.rand((n, 3), generator=generator, device=dev), dim=1).double()
        p[:, P0:P0 + 3] = torch.where(coin[:, 5:6], perm, p[:, P0:P0 + 3])
    p[:, FLIP] = (u[:, 14] < 0.5).double()
    return p


def crop_resize_flip(images: torch.Tensor, p: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (n, 3, S, S) -> float (n, 3, size, size) in [0, 255]: each view's crop box resized to size x size
    (bilinear, pixel centres as torchvision's resize) and mirrored where drawn, in one grid_sample."""
    import torch.nn.functional as F

    side = images.shape[-1]
    x = images.float()
    cw, ch = p[:, X1] - p[:, X0], p[:, Y1] - p[:, Y0]
    sign = 1 - 2 * p[:, FLIP]  # a mirrored view samples its columns right to left
    theta = torch.zeros((len(p), 2, 3), dtype=x.dtype, device=x.device)
    theta[:, 0, 0] = (sign * cw / side).to(x.dtype)
    theta[:, 0, 2] = ((2 * p[:, X0] + cw) / side - 1).to(x.dtype)
    theta[:, 1, 1] = (ch / side).to(x.dtype)
    theta[:, 1, 2] = ((2 * p[:, Y0] + ch) / side - 1).to(x.dtype)
    grid = F.affine_grid(theta, [len(p), x.shape[1], size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def photometric_dense(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``augment.photometric`` without its row selection (a host sync): the HSV round trip runs on every
    view and is kept where it was drawn."""
    col = lambda k: p[:, k].to(x.dtype).view(-1, 1, 1, 1)  # noqa: E731
    x = (x + col(BRIGHT)) * col(CONTRAST_BEFORE)
    hsv = rgb_to_hsv(x.clamp(0, 255))
    sat = (hsv[:, 1] * p[:, SAT].to(x.dtype).view(-1, 1, 1)).clamp(0, 1)
    hue = torch.remainder(hsv[:, 0] + p[:, HUE].to(x.dtype).view(-1, 1, 1), 360)
    x = torch.where(col(HSV) > 0, hsv_to_rgb(torch.stack([hue, sat, hsv[:, 2]], 1)), x)
    x = x * col(CONTRAST_AFTER)
    perm = p[:, P0:P0 + 3].long()
    return x[torch.arange(len(x), device=x.device).unsqueeze(1), perm].clamp(0, 255)


def augment_on_device(images: torch.Tensor, p: torch.Tensor, size: int, photometric: bool = True) -> torch.Tensor:
    x = crop_resize_flip(images, p, size)
    if photometric:
        x = photometric_dense(x, p)
    return normalize(x)


class DeviceImages:
    """The training cache's rows on ``device``; ``batch`` turns a batch plan's slots into a training batch."""

    def __init__(self, cache: Path, device, size: int, photometric: bool = True):
        arr = np.load(cache, mmap_mode="r")  # (N, S, S, 3) uint8
        self.images = torch.from_numpy(np.array(arr)).to(device).permute(0, 3, 1, 2).contiguous()
        self.device, self.size, self.photometric = torch.device(device), size, photometric
        self.generator = torch.Generator(device=self.device)

    @property
    def nbytes(self) -> int:
        return self.images.numel()

    def batch(self, slots: list[tuple[tuple[int, ...], int, bool]]) -> dict:
        """``slots``: (image indices, augmentation seed, stitched) per slot, as ``EpochPlan`` gives them."""
        index = torch.tensor([ids for ids, _, _ in slots], dtype=torch.int64)
        self.generator.manual_seed(int(slots[0][1]))
        flat = index.flatten().to(self.device, non_blocking=True)
        p = draw_params(len(flat), self.images.shape[-1], self.generator, self.photometric)
        views = augment_on_device(self.images.index_select(0, flat), p, self.size, self.photometric)
        return {"images": views.view(*index.shape, *views.shape[1:]), "index": index.to(self.device),
                "stitched": torch.tensor([s for _, _, s in slots], device=self.device)}


class DeviceBatches:
    """A stream's batches from ``DeviceImages``, with a loader's interface to the trainer: assign the
    epoch's plan to ``batch_sampler.batches``, then iterate."""

    def __init__(self, store: DeviceImages):
        from types import SimpleNamespace

        self.store = store
        self.batch_sampler = SimpleNamespace(batches=[])

    def __iter__(self):
        for slots in self.batch_sampler.batches:
            yield self.store.batch(slots)


def device_images_choice(tcfg: dict, device, cache_bytes: int, trunk_views: int, has_cache: bool) -> tuple[bool, str]:
    """(use it, why): ``train.device_images`` true, false or auto (on CUDA when the decoded set is at most
    ``train.device_images_max_share`` of the card's memory; the CPU paths stay as they were)."""
    setting = tcfg.get("device_images", "auto")
    blocker = ("train.loader is not cache" if not has_cache
               else "train.trunk_cache_views > 0 (the frozen trunk's outputs stand in for the images)" if trunk_views
               else None)
    if setting is False:
        return False, "off (train.device_images: false)"
    if setting is True:
        if blocker:
            raise NoisyMLTError(f"train.device_images is true but {blocker}; set train.device_images: auto or false")
        return True, f"on ({cache_bytes / 2**20:.0f} MiB, train.device_images: true)"
    if blocker:
        return False, f"off ({blocker})"
    if device.type != "cuda":
        return False, "off (auto: the CPU keeps its loader)"
    total = torch.cuda.get_device_properties(device).total_memory
    share = float(tcfg.get("device_images_max_share", 0.1))
    if cache_bytes > share * total:
        return False, (f"off (auto: {cache_bytes / 2**20:.0f} MiB exceeds train.device_images_max_share {share} of "
                       f"{total / 2**30:.0f} GiB)")
    return True, f"on ({cache_bytes / 2**20:.0f} MiB of {total / 2**30:.0f} GiB, auto)"
