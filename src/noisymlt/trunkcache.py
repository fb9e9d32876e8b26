"""The frozen trunk's output of a fixed set of augmented views per training image, computed once per run.

With ``train.trainable: layer4`` and frozen BatchNorm ([CL]'s recipe) the stem and layer1-3 are a fixed
function of their input, and on the demo's 32 px images they are most of a step: their forward pass on the
augmented views, the augmentation and the loader took 16 of Ours' 28 CPU seconds a run. With
``train.trunk_cache_views: V`` (> 0) every training image has V augmented views, drawn one after the other from
the image's own generator (seed, i) as ``tensoraug.draw_train_params`` draws a fresh view, and each slot of a
batch picks one of them (from its slot generator, so batches stay a pure function of seed and epoch). The
N x V outputs are computed once when the run starts and kept in memory (on the toy: 355 x 16 views, where an
Ours run augments and passes 33,792 fresh ones through the frozen stages); the trainer then runs the model with
its frozen parts passed through (``frozen_parts_skipped``), on those outputs.

What changes against fresh augmentation: each image is seen in at most V distinct augmentations per run (the
balanced sampler repeats a tail image dozens of times). Methods that train on pixels (Mix-Up, image-level
Stitch-Up, DivideMix's MixMatch) cannot use it; ``Method.needs_pixels`` says so and the trainer then draws
fresh views as usual. Test-time prediction always runs the whole model on the images.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import ResNetTrunk

log = logging.getLogger(__name__)

MAX_BYTES = 4 * 2**30  # a cache this large is a paper-scale mistake: (N, V, 1024, 14, 14) at 224 px
VIEW_STREAM = 0x7472756E  # "trun": separates the views' generators from every other seeded stream


def trunks(model: nn.Module) -> list[ResNetTrunk]:
    """The ResNet trunks of ``model``: its submodules, or those it names in ``source_trunks`` when it holds
    their stages in another arrangement (BBN's shared part and branch stages)."""
    return [m for m in model.modules() if isinstance(m, ResNetTrunk)] or list(getattr(model, "source_trunks", ()))


def frozen_parts(model: nn.Module, policy: str, first: bool = False) -> list[nn.Module]:
    """The frozen parts (stem, ..., the stage before ``policy``) of every ResNet trunk in ``model``, in order;
    ``first``: of its first trunk only."""
    return [part for m in trunks(model)[:1 if first else None] for part in m.frozen_parts(policy)]


def check_fixed(model: nn.Module, policy: str) -> str | None:
    """Why the frozen parts of ``model`` (in train mode) are not one fixed function, or None when they are:
    no parameter trains, every BatchNorm keeps its running statistics, and every trunk's parts carry the
    same weights (two-branch models with a backbone each load the same pretrained weights)."""
    found = trunks(model)
    if not found:
        return "the backbone is not a ResNet trunk with stages"
    if policy == "all":
        return "train.trainable is all: no stage is frozen"
    reference = None
    for trunk in found:
        parts = nn.ModuleList(trunk.frozen_parts(policy))
        if any(p.requires_grad for p in parts.parameters()):
            return "a frozen stage has parameters that train"
        if any(m.training for m in parts.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)):
            return "a frozen stage's BatchNorm updates its statistics (train.frozen_bn is false)"
        state = [t.detach() for t in parts.state_dict().values()]
        if reference is None:
            reference = state
        elif len(state) != len(reference) or any(not torch.equal(a, b) for a, b in zip(state, reference)):
            return "the trunks of the model's branches differ in their frozen stages"
    return None


@contextlib.contextmanager
def frozen_parts_skipped(model: nn.Module, policy: str):
    """Within the block the model's frozen parts pass their input through: its inputs are their outputs."""
    parts = frozen_parts(model, policy)
    for part in parts:
        part.forward = _identity  # an instance attribute shadows nn.Module's forward for __call__
    try:
        yield
    finally:
        for part in parts:
            del part.forward


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class TrunkCache:
    """Frozen-trunk outputs of V augmented views of each row of an image cache, all computed when it is built,
    in chunks of a fixed size and order, so a run resumed from a checkpoint rebuilds the very same values.

    ``prefix`` maps a normalised image batch to the frozen trunk's output (the model's own frozen parts, under
    the trainer's autocast); ``augment`` maps (uint8 rows, parameter rows) to normalised views on the device."""

    def __init__(self, rows, views: int, seed: int, photometric: bool, prefix, augment, device, chunk: int = 256):
        if views < 1:
            raise NoisyMLTError(f"train.trunk_cache_views: {views} views; need at least 1 (0 turns it off)")
        self.rows = rows  # dataset.CacheRows of the training images
        self.views = int(views)
        self.seed = int(seed)
        self.photometric = photometric
        pairs = np.stack(np.meshgrid(np.arange(len(rows)), np.arange(self.views), indexing="ij"), -1).reshape(-1, 2)
        all_params = np.concatenate([self.image_views(i) for i in range(len(rows))])  # in pair order
        store = None
        with torch.no_grad():
            for start in range(0, len(pairs), chunk):
                images, picks = pairs[start:start + chunk].T
                raw = torch.from_numpy(rows.array[images]).permute(0, 3, 1, 2).to(device)
                params = torch.from_numpy(all_params[start:start + chunk])
                out = prefix(augment(raw, params.to(device)))
                if store is None:
                    store = self._allocate(len(rows), out)
                store[torch.from_numpy(images).to(store.device), torch.from_numpy(picks).to(store.device)] = out
        self.store = store  # (N, V, C, h, w)

    def _allocate(self, n: int, out: torch.Tensor) -> torch.Tensor:
        shape = (n, self.views, *out.shape[1:])
        nbytes = int(np.prod(shape)) * out.element_size()
        if nbytes > MAX_BYTES:
            raise NoisyMLTError(
                f"train.trunk_cache_views: {self.views} views of {n} images at {tuple(out.shape[1:])} would hold "
                f"{nbytes / 2**30:.1f} GiB; lower it or set 0 (it is meant for small inputs such as the demo's)")
        log.info("trunk cache: %d views x %d images of %s (%.0f MiB)", self.views, n, tuple(out.shape[1:]),
                 nbytes / 2**20)
        return torch.empty(shape, dtype=out.dtype, device=out.device)

    def image_views(self, image: int) -> np.ndarray:
        """The augmentations (V, NPARAMS) of the views of image ``image``: drawn one after the other, each as a
        fresh view is, from the image's own generator."""
        from noisymlt.tensoraug import draw_train_params

        s = self.rows.size
        rng = np.random.default_rng([self.seed, VIEW_STREAM, int(image)])
        return np.stack([draw_train_params(rng, s, s, self.photometric) for _ in range(self.views)])

    def features(self, index: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        """The frozen-trunk outputs (*index.shape, C, h, w) of the views ``view`` of images ``index``."""
        i, v = index.flatten().to(self.store.device), view.flatten().to(self.store.device)
        out = self.store[i, v]
        return out.view(*index.shape, *out.shape[1:])
