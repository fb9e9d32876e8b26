"""The frozen trunk's output of a fixed set of augmented views per training image, computed once per run.

With ``train.trainable: layer4`` and frozen BatchNorm ([CL]'s recipe) the stem and layer1-3 are a fixed
function of their input, and on the demo's 32 px images they are most of a step: their forward pass on the
augmented views, the augmentation and the loader took 16 of Ours' 28 CPU seconds a run. With
``train.trunk_cache_views: V`` (> 0) every training image has V augmented views, drawn one after the other from
the image's own generator (seed, i) as ``noisymlt.training.augment.draw_train_params`` draws a fresh view, and each slot of a
batch picks one of them (from its slot generator, so batches stay a pure function of seed and epoch). The
N x V outputs are computed once when the run starts and kept in memory (the demo: 355 x 8 views, where an
Ours run augments and passes 33,792 fresh ones through the frozen stages); the trainer then runs the model with
its frozen parts passed through (``frozen_parts_skipped``), on those outputs.

What changes against fresh augmentation: each image is seen in at most V distinct augmentations per run (the
balanced sampler repeats a tail image dozens of times). Methods that train on pixels (Mix-Up, image-level
Stitch-Up, DivideMix's MixMatch) cannot use it; ``Method.needs_pixels`` says so and the trainer then draws
fresh views as usual. Test-time prediction always runs the whole model on the images.

The outputs are memoised on disk, beside the training image cache (``cache/trunk/KEY.pt``), since most of the
demo's runs build the very same tensors (same images, seed, frozen weights and views): 0.9 CPU s of a 6 s ERM
run, where loading them takes 0.03-0.13 s. The name is content-addressed: KEY is the sha256 (``memo_key``) of
everything the values are a function of: the image cache's pixels, the frozen parts' structure and state (names,
dtypes, shapes, bytes), V, the seed, the augmentation and model settings, the device's numerics fingerprint
(noisymlt.training.numerics: the precision, the GPU model or the CPU's kernels and thread count), the torch and torchvision releases, the chunk size and the
code that computes them (the trainer's import closure, ``noisymlt.core.codedeps``). So a memo holds exactly the values
the run would compute, or there is none: nothing ever needs invalidating, and a run (a resume included) trains on
the same tensors whether it computed or loaded them. The manifest records the key; whether this execution
computed or loaded them goes to the untracked timing file, so that a rerun still writes the same bytes. A memo is
written under a temporary name and renamed into place (parallel jobs computing one key write the same bytes);
one that does not load, holds another key or shape, or whose bytes do not match the digest saved with them is
reported, computed again and replaced. The folder may be deleted at any time; memos of earlier code or weights
stay until it is (the six keys of the demo's main grid take 350 MB).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import ResNetTrunk
from noisymlt.core.files import replacing

log = logging.getLogger(__name__)

MAX_BYTES = 4 * 2**30  # a cache this large is a paper-scale mistake: (N, V, 1024, 14, 14) at 224 px
VIEW_STREAM = 0x7472756E  # "trun": separates the views' generators from every other seeded stream
CHUNK = 256  # views per forward pass while building: part of the key (a batch's size may change its rounding)
MEMO_FORMAT = 1  # the memo file's layout ({"format", "key", "sha256", "store"}); part of the key


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


def _update(h, array) -> None:
    """Feed a tensor's or array's dtype, shape and bytes to the hash ``h``."""
    if isinstance(array, torch.Tensor):
        flat = array.detach().cpu().contiguous().reshape(-1)
        h.update(f"{flat.dtype} {tuple(array.shape)}".encode())
        h.update(flat.view(torch.uint8).numpy())
    else:
        h.update(f"{array.dtype} {array.shape}".encode())
        h.update(np.ascontiguousarray(array))


def memo_key(rows, parts: list[nn.Module], settings: dict) -> str:
    """The content key of a store: sha256 over ``settings`` (JSON: everything else its values depend on), the
    structure and state of each frozen part (names, dtypes, shapes and bytes, in order) and the rows' pixels."""
    h = hashlib.sha256(json.dumps({"format": MEMO_FORMAT, **settings}, sort_keys=True).encode())
    for part in parts:
        h.update(repr(part).encode())
        for name, value in part.state_dict().items():
            h.update(name.encode())
            _update(h, value)
    _update(h, rows.array)
    return h.hexdigest()


@dataclass(frozen=True)
class Memo:
    """A store on disk, named by its content key (``memo_key``)."""

    folder: Path
    key: str

    @property
    def path(self) -> Path:
        return Path(self.folder) / f"{self.key[:20]}.pt"

    def load(self, shape: tuple[int, int], device) -> torch.Tensor | None:
        """The stored tensor (N, V, ...) of this key, or None when there is none or it is damaged (logged)."""
        if not self.path.exists():
            return None
        try:
            saved = torch.load(self.path, map_location=device, weights_only=True)
            store = saved["store"]
            if saved.get("format") != MEMO_FORMAT or saved.get("key") != self.key:
                why = f"written for key {str(saved.get('key'))[:20]} (format {saved.get('format')})"
            elif not isinstance(store, torch.Tensor) or not store.is_floating_point() or store.dim() < 3 \
                    or tuple(store.shape[:2]) != tuple(shape):
                why = f"holds {getattr(store, 'dtype', type(store).__name__)} {tuple(getattr(store, 'shape', ()))}, " \
                      f"expected floats of shape ({shape[0]}, {shape[1]}, ...)"
            elif _digest(store) != saved.get("sha256"):
                why = "its bytes do not match the digest stored with them"
            else:
                return store
        except Exception as exc:  # noqa: BLE001 (a file that does not load is damaged)
            why = f"unreadable ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"
        log.warning("%s: unusable trunk-cache memo, %s; computing the views again to replace it", self.path, why)
        return None

    def save(self, store: torch.Tensor) -> None:
        """Write the store under a name of this process's own in the folder, then rename it into place (atomic)."""
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        # a name of this process's own: two jobs may compute the same memo at once
        with replacing(self.path, self.path.with_name(f"{self.path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")) as tmp:
            with open(tmp, "xb") as f:
                torch.save({"format": MEMO_FORMAT, "key": self.key, "sha256": _digest(store), "store": store}, f)


def _digest(store: torch.Tensor) -> str:
    h = hashlib.sha256()
    _update(h, store)
    return h.hexdigest()


class TrunkCache:
    """Frozen-trunk outputs of V augmented views of each row of an image cache, all computed when it is built,
    in chunks of a fixed size and order, so a run resumed from a checkpoint rebuilds the very same values.

    ``prefix`` maps a normalised image batch to the frozen trunk's output (the model's own frozen parts, under
    the trainer's autocast); ``augment`` maps (uint8 rows, parameter rows) to normalised views on the device.
    ``memo``: where the outputs are loaded from when an earlier run saved them, else saved to once computed
    (``loaded`` says which); its key must cover every argument here (``memo_key``)."""

    def __init__(self, rows, views: int, seed: int, photometric: bool, prefix, augment, device,
                 chunk: int = CHUNK, memo: Memo | None = None):
        if views < 1:
            raise NoisyMLTError(f"train.trunk_cache_views: {views} views; need at least 1 (0 turns it off)")
        self.rows = rows  # dataset.CacheRows of the training images
        self.views = int(views)
        self.seed = int(seed)
        self.photometric = photometric
        store = memo.load((len(rows), self.views), device) if memo is not None else None
        self.loaded = store is not None
        if store is not None:
            self._check_size(store.shape, store.element_size())
        else:
            store = self._compute(prefix, augment, device, chunk)
            if memo is not None:
                try:
                    memo.save(store)
                except OSError as exc:  # a read-only data folder: the run goes on without a memo
                    log.warning("%s: trunk-cache memo not saved (%s)", memo.path, exc)
        self.store = store  # (N, V, C, h, w)

    def _compute(self, prefix, augment, device, chunk: int) -> torch.Tensor:
        rows = self.rows
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
        return store

    def _allocate(self, n: int, out: torch.Tensor) -> torch.Tensor:
        shape = (n, self.views, *out.shape[1:])
        self._check_size(shape, out.element_size())
        return torch.empty(shape, dtype=out.dtype, device=out.device)

    def _check_size(self, shape, element_size: int) -> None:
        nbytes = int(np.prod(shape)) * element_size
        if nbytes > MAX_BYTES:
            raise NoisyMLTError(
                f"train.trunk_cache_views: {self.views} views of {shape[0]} images at {tuple(shape[2:])} would hold "
                f"{nbytes / 2**30:.1f} GiB; lower it or set 0 (it is meant for small inputs such as the demo's)")
        log.info("trunk cache: %d views x %d images of %s (%.0f MiB)", self.views, shape[0], tuple(shape[2:]),
                 nbytes / 2**20)

    def image_views(self, image: int) -> np.ndarray:
        """The augmentations (V, NPARAMS) of the views of image ``image``: drawn one after the other, each as a
        fresh view is, from the image's own generator."""
        from noisymlt.training.augment import draw_train_params

        s = self.rows.size
        rng = np.random.default_rng([self.seed, VIEW_STREAM, int(image)])
        return np.stack([draw_train_params(rng, s, s, self.photometric) for _ in range(self.views)])

    def features(self, index: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        """The frozen-trunk outputs (*index.shape, C, h, w) of the views ``view`` of images ``index``."""
        i, v = index.flatten().to(self.store.device), view.flatten().to(self.store.device)
        out = self.store[i, v]
        return out.view(*index.shape, *out.shape[1:])
