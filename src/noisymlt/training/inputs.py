"""The images of one training run: where they come from and how a batch reaches the model.

``train.loader: cache`` reads the decoded-image caches (``noisymlt cache-images``), checked against the
label tables, and augments each batch where the model is; ``pil`` decodes the image files. With
``train.trunk_cache_views`` the frozen trunk's outputs of fixed views stand in for the training images
(``noisymlt.training.trunkcache``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)


class RunImages:
    """A run's train and test images: datasets for training and prediction, and batches on the device."""

    def __init__(self, cfg: dict, device, *, tables: dict, labels: dict[str, Path], roots: dict[str, Path],
                 caches: dict[str, Path | None]):
        self.cfg, self.device = cfg, device
        self.tables, self.labels, self.roots = tables, labels, roots  # each keyed by part: train, test
        self.caches = self._open_caches(caches)
        self.trunk = None  # noisymlt.training.trunkcache.TrunkCache while training on fixed views (open_trunk)
        # what the manifest says about the views: off, "V views (memo KEY)", "not used: why"; and whether this
        # execution computed or loaded them (noisymlt.training.trunkcache's memo), in the untracked timing file only
        self.trunk_status = "off"
        self.trunk_memo: str | None = None
        # train.device_images: the training set on the device (noisymlt.training.device_images), and what the
        # manifest says about it: on or off, and why
        self.device_store = None
        self.device_images_status = "off (not opened)"

    def _open_caches(self, given: dict[str, Path | None]) -> dict[str, Path]:
        """``train.loader: cache``: the decoded-image caches of the train and test tables, checked
        against them (row order, storage size); ``pil``: none (images decoded from their files)."""
        from noisymlt.data.imagecache import open_cache

        tcfg = self.cfg["train"]
        loader = tcfg.get("loader", "pil")
        if loader == "pil":
            return {}
        if loader != "cache":
            raise NoisyMLTError(f"train.loader: unknown loader {loader!r}; choose cache or pil")
        caches = {}
        for part in ("train", "test"):
            path = given.get(part)
            if path is None:
                raise NoisyMLTError(f"train.loader is cache but no --{part}-cache was given "
                                    "(build it with `noisymlt cache-images`, or set train.loader: pil)")
            table = self.tables[part]
            open_cache(path, labels=self.labels[part], image_ids=table.image_ids, paths=table.paths,
                       size=tcfg["cache_size"])
            caches[part] = Path(path)
        return caches

    def train_dataset(self):
        """The cache path hands uint8 views and their drawn parameters to ``to_device``, which augments
        the batch where the model is (``loaders.CachedTrainImages``)."""
        from noisymlt.training.loaders import CachedTrainImages, CacheRows, TrainImages

        tcfg = self.cfg["train"]
        if not self.caches:
            return TrainImages(self.roots["train"], self.tables["train"].paths, tcfg["image_size"],
                               tcfg["photometric"])
        return CachedTrainImages(CacheRows(self.caches["train"]), tcfg["image_size"], tcfg["photometric"],
                                 deferred=True, views=self.trunk.views if self.trunk is not None else 0)

    def open_device_images(self):
        """``train.device_images``: the decoded training set on the device, where the setting and the card
        allow (``device_images_choice``); called after ``open_trunk``, whose fixed views take precedence."""
        import numpy as np

        from noisymlt.training.device_images import DeviceImages, device_images_choice

        tcfg = self.cfg["train"]
        cache = self.caches.get("train")
        nbytes = int(np.prod(np.load(cache, mmap_mode="r").shape)) if cache else 0
        use, self.device_images_status = device_images_choice(
            tcfg, self.device, nbytes, self.trunk.views if self.trunk is not None else 0, cache is not None)
        log.info("training images on the device: %s", self.device_images_status)
        self.device_store = DeviceImages(cache, self.device, tcfg["image_size"], tcfg["photometric"]) if use else None
        return self.device_store

    def train_loaders(self, streams: int, workers: int, pin_memory: bool) -> list:
        """One loader per stream, each assigned its epoch's batch plan by the trainer: batches of the training
        set on the device, else loader processes reading images (``train_dataset``)."""
        from noisymlt.training.device_images import DeviceBatches
        from noisymlt.training.loaders import stream_loader

        if self.device_store is not None:
            return [DeviceBatches(self.device_store) for _ in range(streams)]
        dataset = self.train_dataset()
        return [stream_loader(dataset, None, workers, pin_memory) for _ in range(streams)]

    def open_trunk(self, model, *, needs_pixels: bool, autocast, precision: str, code: str):
        """``train.trunk_cache_views`` > 0: the frozen trunk's outputs of V fixed views per training image
        (``noisymlt.training.trunkcache``), or None where the run cannot use them (the reason is logged and
        recorded in ``self.trunk_status``). ``code`` (the trainer's closure digest) keys the memo."""
        import torch
        import torchvision

        from noisymlt.training.augment import augment
        from noisymlt.training.loaders import CacheRows
        from noisymlt.training.numerics import fingerprint
        from noisymlt.training.trunkcache import (
            CHUNK, Memo, TrunkCache, check_fixed, frozen_parts, memo_key)

        tcfg = self.cfg["train"]
        views = int(tcfg.get("trunk_cache_views", 0) or 0)
        if not views:
            return None
        model.train()
        why = ("the method trains on pixels" if needs_pixels
               else "train.loader is not cache" if "train" not in self.caches
               else check_fixed(model, tcfg["trainable"]))
        if why:
            log.info("trunk cache not used: %s", why)
            self.trunk_status = f"not used: {why}"
            return None
        parts = frozen_parts(model, tcfg["trainable"], first=True)  # check_fixed: every trunk's are equal

        def prefix(x):
            if tcfg["channels_last"]:
                x = x.contiguous(memory_format=torch.channels_last)
            with autocast():
                for part in parts:
                    x = part(x)
            return x

        t0 = time.process_time()
        rows = CacheRows(self.caches["train"])
        # everything the values depend on besides the rows and the parts (noisymlt.training.trunkcache's module doc)
        settings = {"views": views, "seed": self.cfg["seed"], "photometric": tcfg["photometric"],
                    "image_size": tcfg["image_size"], "channels_last": tcfg["channels_last"],
                    "trainable": tcfg["trainable"],
                    # the machine's kernels (noisymlt.training.numerics): a store made on AMX is not one of AVX-512
                    **fingerprint(self.device, precision, torch.get_num_threads()),
                    "torch": torch.__version__, "torchvision": torchvision.__version__, "chunk": CHUNK,
                    "code": code}
        memo = Memo(self.caches["train"].parent / "trunk", memo_key(rows, parts, settings))
        cache = TrunkCache(rows, views, self.cfg["seed"], tcfg["photometric"], prefix,
                           lambda raw, p: augment(raw, p, tcfg["image_size"], tcfg["photometric"]), self.device,
                           chunk=CHUNK, memo=memo)
        self.trunk_status = f"{views} views (memo {memo.path.stem})"
        self.trunk_memo = "loaded" if cache.loaded else "computed"
        log.info("trunk cache %s in %.1f CPU s (%s)", self.trunk_memo, time.process_time() - t0, memo.path)
        self.trunk = cache
        return cache

    def frozen_inputs(self, model):
        """The training step's context: with a trunk cache, the model's frozen parts pass their input through."""
        from noisymlt.training.trunkcache import frozen_parts_skipped

        if self.trunk is None:
            return contextlib.nullcontext()
        return frozen_parts_skipped(model, self.cfg["train"]["trainable"])

    def eval_dataset(self, part: str):
        from noisymlt.training.loaders import CachedEvalImages, CacheRows, EvalImages

        size = self.cfg["train"]["image_size"]
        if not self.caches:
            return EvalImages(self.roots[part], self.tables[part].paths, size)
        return CachedEvalImages(CacheRows(self.caches[part]), size, deferred=True)

    def eval_images(self, images):
        """A test-transform batch on the device (cached uint8 rows are resized and normalised there)."""
        import torch

        from noisymlt.training.augment import eval_resize

        images = images.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = eval_resize(images, self.cfg["train"]["image_size"])
        return images

    def to_device(self, batch: dict) -> dict:
        import torch

        from noisymlt.training.augment import augment

        batch = dict(batch)
        aug = batch.pop("aug", None)
        view = batch.pop("view", None)
        if view is not None:  # fixed views: their frozen-trunk outputs stand in for the images (no "aug")
            batch["images"] = self.trunk.features(batch["index"], view)
        out = {}
        for k, v in batch.items():
            v = v.to(self.device, non_blocking=True)
            if k == "images" and aug is not None:  # cached uint8 views: augmented here, batched, on the device
                tcfg = self.cfg["train"]
                v = augment(v.flatten(0, 1), aug.flatten(0, 1), tcfg["image_size"], tcfg["photometric"])
                v = v.view(*batch["images"].shape[:2], *v.shape[1:])
            if k == "images" and self.cfg["train"]["channels_last"]:
                v = v.flatten(0, 1).contiguous(memory_format=torch.channels_last).view(v.shape)
            out[k] = v
        return out
