"""The training loop shared by every method, with checkpoint/resume and test-set prediction.

Outputs in the run folder: ``checkpoint.pt`` (after every epoch, plain state dicts loaded with
``weights_only=True``), ``train_log.jsonl`` (one line per epoch), ``predictions.npz`` (test-set
sigmoid scores per head) and ``manifest.json``; given the clean labels (``--clean-labels``, analysis only),
also ``noise_level.jsonl`` (noisymlt.noise_monitor).

A checkpoint is this run's, and is resumed, only when its run id (the resolved configuration), its inputs
(train labels, class split, decoded training images, backbone weights) and its code (the digest of the code that trained it: the trainer, the
method's family and its losses, ``noisymlt.codedeps.run_entries``) are all this job's. Any other checkpoint
is refused (a direct call) or, in the workflow (``--keep-stale``), moved to ``previous/`` while the run trains
from epoch 0; a run of this exact configuration, inputs and code kept there is brought back instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)


def lr_at(cfg: dict, epoch: int, it: int, iters_per_epoch: int) -> float:
    """Linear warm-up from lr * warmup_ratio over warmup_iters, then x lr_gamma at each step epoch."""
    lr = cfg["lr"] * cfg["lr_gamma"] ** sum(epoch >= s for s in cfg["lr_steps"])
    global_it = epoch * iters_per_epoch + it
    if global_it < cfg["warmup_iters"]:
        k = cfg["warmup_ratio"] + (1 - cfg["warmup_ratio"]) * global_it / cfg["warmup_iters"]
        lr *= k
    return lr


# Name components of the layers that start from scratch on top of a pretrained backbone: the neck and head of
# every branch, the partner BatchNorms of feature-level Stitch-Up, BBN's classifier and ML-GCN's GCN.
NEW_LAYERS = frozenset({"neck", "head", "partner_bns", "classifier", "gcn"})


def lr_groups(model, multipliers: dict[str, float], new_layers: float = 1.0) -> list[tuple[float, list]]:
    """The model's trainable parameters as (lr factor, parameters) groups: a parameter takes the factor of the
    first name prefix in ``multipliers`` it starts with (the method's own, from its reference), else
    ``new_layers`` when it belongs to a layer that starts from scratch (``NEW_LAYERS``; train.new_layers_lr_mult),
    else 1. With every factor 1 there is one group, as before."""
    groups: dict[float, list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            mult = next((float(m) for prefix, m in multipliers.items() if name.startswith(prefix)), None)
            if mult is None:
                mult = float(new_layers) if NEW_LAYERS.intersection(name.split(".")) else 1.0
            groups.setdefault(mult, []).append(param)
    return list(groups.items())


def check_warmup(cfg: dict, iters_per_epoch: int, where: str) -> None:
    """Refuse a schedule whose linear warm-up ends after the first lr step: its runs would never train at
    their nominal lr (``train.long_warmup: true`` allows it, to reproduce a reference that does so)."""
    if cfg.get("long_warmup", False) or not cfg["warmup_iters"]:
        return
    total = cfg["epochs"] * iters_per_epoch
    step = min([s for s in cfg["lr_steps"] if s < cfg["epochs"]], default=None)
    first_step = total if step is None else step * iters_per_epoch
    if cfg["warmup_iters"] > first_step:
        span = (f"the {total} iterations of the run" if step is None else
                f"the {first_step} iterations before the first lr step (epoch {step} of {cfg['epochs']}, "
                f"{iters_per_epoch} iterations each, {total} in all)")
        raise NoisyMLTError(
            f"{where}: train.warmup_iters={cfg['warmup_iters']} outlasts {span}, so the run would never reach "
            f"train.lr={cfg['lr']:g}. Shorten the warm-up "
            "(e.g. in the method's schedule), train longer, or set train.long_warmup: true to reproduce a "
            "reference that does this")


RUN_FILES = ("checkpoint.pt", "train_log.jsonl", "noise_level.jsonl", "predictions.npz", "manifest.json",
             "run_config.json", "metrics.json", "map.json", "metrics.manifest.json", "manifest.timing.json",
             "metrics.manifest.timing.json")


def content_sha256(state: dict) -> str:
    """sha256 of a checkpoint's content: tensors by dtype, shape and bytes, other values by repr, keys in
    order. The same for the state saved and the state loaded back, on any device, so a damaged file (one
    flipped byte in a weight) is told from a good one before a run resumes from it."""
    import torch

    h = hashlib.sha256()

    def walk(obj) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous().reshape(-1)
            h.update(f"tensor {t.dtype} {tuple(obj.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, dict):
            h.update(b"{")
            for key in sorted(obj, key=repr):
                h.update(repr(key).encode())
                walk(obj[key])
            h.update(b"}")
        elif isinstance(obj, (list, tuple)):
            h.update(b"[")
            for value in obj:
                walk(value)
            h.update(b"]")
        else:
            h.update(repr(obj).encode())

    walk(state)
    return h.hexdigest()


# Snakemake and DVC delete a train job's declared outputs before they rerun it, so by the time the trainer
# sets a finished run aside its predictions and manifest are gone. A second link to each, made when the run
# finishes, keeps them for archive_run (the same bytes, no copy).
FINISHED = ".finished"
FINISHED_FILES = ("predictions.npz", "manifest.json", "run_config.json", "noise_level.jsonl")


def keep_finished(out: Path) -> None:
    """Link a finished run's outputs into OUT/.finished/, replacing the links of an earlier run."""
    import shutil

    kept = Path(out) / FINISHED
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir()
    for name in FINISHED_FILES:
        if (Path(out) / name).exists():
            try:
                os.link(Path(out) / name, kept / name)
            except OSError:  # a file system without hard links
                shutil.copy2(Path(out) / name, kept / name)


def archive_run(out: Path, tag: str) -> Path:
    """Move a run folder's files to OUT/previous/TAG/ (nothing is deleted) and return that folder. Outputs
    that Snakemake or DVC deleted before rerunning the job come from OUT/.finished/ (keep_finished)."""
    import shutil

    aside = Path(out) / "previous" / tag
    aside.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        for source in (Path(out) / name, Path(out) / FINISHED / name):
            if source.exists():
                source.replace(aside / name)
                break
    shutil.rmtree(Path(out) / FINISHED, ignore_errors=True)
    return aside


def epoch_iterations(rule: str, streams: list, num_images: int, batch_size: int) -> int:
    """Iterations per epoch. ``batches`` ([CL]): floor(N / batch_size) whatever the sampler;
    ``sampler`` ([DB]): one pass over the first stream's sampler, floor(len(sampler) / its batch size)
    (class-aware: int(max_class_count * C / 4) images; random: N)."""
    if rule == "batches":
        iters = num_images // batch_size
    elif rule == "sampler":
        iters = len(streams[0].sampler) // streams[0].batch_size
    else:
        raise NoisyMLTError(f"train.epoch_length: unknown rule {rule!r}; choose batches or sampler")
    if iters < 1:
        raise NoisyMLTError(f"train.epoch_length={rule}: an epoch would have no full batch of {batch_size} images")
    return iters


def _write_failed(path: Path, exc: BaseException) -> OSError:
    """An OSError naming ``path`` for a failed write, told apart as a full disk when its file system has no
    space left (torch and numpy word that differently, or not at all)."""
    import errno
    import shutil

    if isinstance(exc, OSError) and exc.errno is not None:
        return OSError(exc.errno, exc.strerror, str(path))
    free = shutil.disk_usage(path.parent).free
    if free < 1 << 20:
        return OSError(errno.ENOSPC, f"No space left on device ({free} bytes free)", str(path))
    return OSError(errno.EIO, f"write failed ({str(exc).splitlines()[0][:200]})", str(path))


@contextlib.contextmanager
def _unlinked_on_failure(path: Path):
    """A temporary file that is removed when writing it fails (a half-written file is never left to trust)."""
    try:
        yield
    except (OSError, RuntimeError, ValueError) as exc:
        error = _write_failed(path, exc)  # before the unlink frees the space it filled
        path.unlink(missing_ok=True)
        raise error from exc
    except BaseException:
        path.unlink(missing_ok=True)
        raise


class Trainer:
    # A checkpoint at the end of an epoch once this many seconds have passed since the last one, and after the
    # last epoch: every epoch at paper scale (minutes each); once or twice a run for the demo's second-long
    # epochs, where saving every epoch cost 0.9 of Ours' 18 CPU seconds. A resume replays from the checkpoint
    # exactly, so when it is written never changes a result; an interruption loses at most this much work.
    # NOISYMLT_CHECKPOINT_SECONDS sets another interval (0: every epoch), e.g. to interrupt a short run in tests.
    checkpoint_seconds = float(os.environ.get("NOISYMLT_CHECKPOINT_SECONDS", 30.0))

    def __init__(self, resolved: dict, *, train_labels: Path, test_labels: Path, split: Path,
                 train_images: Path, test_images: Path, out_dir: Path, device: str = "auto",
                 progress: bool = True, limit_iters: int | None = None,
                 provenance_inputs: dict[str, Path] | None = None, keep_stale: bool = False,
                 clean_labels: Path | None = None, train_cache: Path | None = None,
                 test_cache: Path | None = None, cores: int | None = None, expect_code: str | None = None):
        import torch

        from noisymlt.codedeps import TRAINER, digest, load_code, run_entries
        from noisymlt.config import run_id
        from noisymlt.dataset import resolve_workers
        from noisymlt.devices import select_device
        from noisymlt.labels import read_class_split, read_labels
        from noisymlt.methods import FAMILY_MODULES, load_family
        from noisymlt.methods.base import TrainContext

        self.cfg = resolved
        self.run_id = run_id(resolved)
        # The code this job runs: imported now, so an edit on disk during the run cannot slip in through an
        # import made later; checked again before the result is recorded (_write_outputs).
        self.code_entries = run_entries(resolved)
        self.code_digest = load_code(*self.code_entries)
        # the code of the frozen trunk's outputs (trainer, trunk cache, augmentation, backbones): part of the
        # trunk-cache memo's key, taken now with the rest, so a memo is never stored under code that did not run
        self.trunk_code = digest(TRAINER)
        if expect_code and expect_code != self.code_digest:
            raise NoisyMLTError(
                f"run {self.run_id}: the workflow planned this job for code {expect_code}, the package source now "
                f"gives {self.code_digest} (edited since the plan was made); nothing was trained. Run the workflow "
                "again: it plans the job for the code on disk")
        self.paths = {"train_labels": Path(train_labels), "test_labels": Path(test_labels), "split": Path(split)}
        self.provenance_inputs = {k: Path(v) for k, v in (provenance_inputs or {}).items()}
        self.keep_stale = keep_stale
        self._lock = None
        self.train_images, self.test_images = Path(train_images), Path(test_images)
        self.out = Path(out_dir)
        self.progress = progress
        # CPU float results depend on the thread count (reduction order), so it is part of the run config.
        torch.set_num_threads(int(resolved["train"].get("cpu_threads", 1)))
        self.device = select_device(device)
        if self.device.type == "cpu":
            # Denormal floats slow CPU kernels several-fold (measured with scripts/benchmark_throughput.py);
            # flushing them to zero is deterministic, so CPU runs stay bit-reproducible.
            torch.set_flush_denormal(True)
        self.train_table = read_labels(train_labels)
        self.test_table = read_labels(test_labels)
        self.split = read_class_split(split)
        for name, table in (("train", self.train_table), ("test", self.test_table)):
            if table.paths is None:
                raise NoisyMLTError(f"{self.paths[name + '_labels']}: no 'path' column; cannot find the images")
        if self.train_table.classes != self.test_table.classes:
            raise NoisyMLTError(f"{test_labels}: class columns differ from {train_labels}")
        tcfg = resolved["train"]
        self.caches = self._open_caches(tcfg, train_cache, test_cache)
        self.inputs_digest = self._inputs_digest(tcfg)
        on_gpu = self.device.type == "cuda"
        self.workers = resolve_workers(tcfg["workers"], cores, int(tcfg.get("cpu_threads", 1)), on_gpu)
        n = len(self.train_table)
        if tcfg["batch_size"] > n:
            raise NoisyMLTError(f"train.batch_size={tcfg['batch_size']} exceeds the {n} training images")
        family = resolved["method_cfg"]["family"]
        if family not in FAMILY_MODULES:
            raise NoisyMLTError(f"method {resolved['method']!r}: unknown family {family!r}; "
                                f"known: {sorted(FAMILY_MODULES)}")
        torch.manual_seed(resolved["seed"])  # weight init; one process per run, so this is the run's own stream
        noisy = torch.as_tensor(self.train_table.labels, dtype=torch.float32, device=self.device)
        self.ctx = TrainContext(resolved, noisy, self.split, self.device, 0,
                                extra={"iterate_train": self.iterate_train_eval,
                                       "classes": list(self.train_table.classes)})
        self.method = load_family(family)(self.ctx)
        self.streams = self.method.streams()
        self.iters = epoch_iterations(tcfg.get("epoch_length", "batches"), self.streams, n, tcfg["batch_size"])
        check_warmup(tcfg, self.iters, f"method {resolved['method']!r} on {resolved['dataset']}")
        if limit_iters:  # smoke tests and benchmarks: a few iterations per epoch
            self.iters = min(self.iters, limit_iters)
        self.ctx.iterations_per_epoch = self.iters
        self.model = self.method.build_model().to(self.device)
        if tcfg.get("head_bias_init", "zero") == "prior":  # before any resume, which overwrites it
            from noisymlt.models.heads import init_bias_at_prior

            init_bias_at_prior(self.model, self.train_table.labels)
        if tcfg["channels_last"]:
            self.model = self.model.to(memory_format=torch.channels_last)
        groups = lr_groups(self.model, self.method.lr_multipliers(), tcfg.get("new_layers_lr_mult", 1.0))
        self.lr_mults = [mult for mult, _ in groups]
        self.optimizer = torch.optim.SGD([{"params": params} for _, params in groups], lr=tcfg["lr"],
                                         momentum=tcfg["momentum"], weight_decay=tcfg["weight_decay"])
        self.noise_monitor = None
        self.trunk = None  # noisymlt.trunkcache.TrunkCache while training on fixed views (trunk_cache, in fit)
        # what the manifest says about the views: off, "V views (memo KEY)", "not used: why"; and whether this
        # execution computed or loaded them (noisymlt.trunkcache's memo), in the untracked timing file only
        self.trunk_status = "off"
        self.trunk_memo: str | None = None
        self.saved_noise_log: str | None = None  # the noise log as the loaded checkpoint holds it
        self.checkpoint_sha256: str | None = None  # content hash of the checkpoint saved or resumed last
        if clean_labels is not None:
            # Analysis only: the monitor alone holds the clean labels; the method merely publishes the
            # targets it has computed (noisymlt.noise_monitor). The run id does not depend on it.
            from noisymlt.noise_monitor import NoiseMonitor

            self.noise_monitor = NoiseMonitor.from_files(clean_labels, self.train_table, train_labels, self.split,
                                                         self.device, self.iters)
            self.method.publish_targets = True
            if Path(clean_labels) not in self.provenance_inputs.values():
                self.provenance_inputs["clean_labels"] = Path(clean_labels)

    def _inputs_digest(self, tcfg: dict) -> str:
        """What the trained weights are made of besides configuration and code: the noisy train labels, the
        class split, the decoded training images (train.loader: cache) and the backbone weights it starts
        from (train.weights_path). A new long-tail subset or noisy copy, re-decoded images or a re-pretrained
        backbone under the same configuration must not resume the old model. (The test images only reach
        the predictions, which every job makes anew.)"""
        from noisymlt.provenance import file_sha256

        sources = [self.paths["train_labels"], self.paths["split"]]
        if "train" in self.caches:
            sources.append(self.caches["train"])
        if tcfg.get("weights_path") and Path(tcfg["weights_path"]).is_file():
            sources.append(Path(tcfg["weights_path"]))
        return hashlib.sha256("+".join(file_sha256(p) for p in sources).encode()).hexdigest()[:16]

    def _open_caches(self, tcfg: dict, train_cache: Path | None, test_cache: Path | None) -> dict:
        """``train.loader: cache``: the decoded-image caches of the train and test tables, checked
        against them (row order, storage size); ``pil``: none (images decoded from their files)."""
        from noisymlt.imagecache import open_cache

        loader = tcfg.get("loader", "pil")
        if loader == "pil":
            return {}
        if loader != "cache":
            raise NoisyMLTError(f"train.loader: unknown loader {loader!r}; choose cache or pil")
        caches = {}
        for part, path in (("train", train_cache), ("test", test_cache)):
            if path is None:
                raise NoisyMLTError(f"train.loader is cache but no --{part}-cache was given "
                                    "(build it with `noisymlt cache-images`, or set train.loader: pil)")
            table = self.train_table if part == "train" else self.test_table
            open_cache(path, labels=self.paths[f"{part}_labels"], image_ids=table.image_ids, paths=table.paths,
                       size=tcfg["cache_size"])
            caches[part] = Path(path)
        return caches

    @classmethod
    def from_run_dir(cls, run_dir: Path, *, test_labels: Path, train_images: Path, test_images: Path,
                     device: str = "cpu", train_labels: Path | None = None, split: Path | None = None,
                     resolved: dict | None = None) -> "Trainer":
        """A Trainer holding the finished model of RUN_DIR: its recorded configuration (or ``resolved``,
        read from there by the caller), the train labels and class split its manifest names (unless
        given), the image caches it read, and its final checkpoint, which ``load_checkpoint`` refuses
        if it belongs to another configuration or other inputs. When the train table stands in for the
        test table, the train cache does too."""
        run_dir = Path(run_dir)
        files = {name: run_dir / name for name in ("run_config.json", "manifest.json", "checkpoint.pt")}
        for name, path in files.items():
            if not path.is_file():
                raise NoisyMLTError(f"{path}: missing; {run_dir} is not a finished training run")
        cfg = resolved if resolved is not None else json.loads(files["run_config.json"].read_text())
        inputs = json.loads(files["manifest.json"].read_text()).get("inputs", {})
        given = {"train_labels": train_labels, "split": split}
        for key, value in given.items():
            if value is None and key not in inputs:
                raise NoisyMLTError(f"{files['manifest.json']}: no recorded input {key!r}")
            given[key] = Path(value) if value is not None else Path(inputs[key]["path"])
        # train.loader: cache reads the images the run read
        caches = {f"{part}_cache": Path(inputs[f"{part}_cache"]["path"]) for part in ("train", "test")
                  if f"{part}_cache" in inputs}
        if Path(test_labels) == given["train_labels"] and "train_cache" in caches:
            caches["test_cache"] = caches["train_cache"]
        trainer = cls(cfg, train_labels=given["train_labels"], test_labels=test_labels, split=given["split"],
                      train_images=train_images, test_images=test_images, out_dir=run_dir, device=device,
                      progress=False, **caches)
        epoch, _ = trainer.load_checkpoint()
        if epoch != cfg["train"]["epochs"]:
            raise NoisyMLTError(f"{files['checkpoint.pt']}: training stopped at epoch {epoch} of "
                                f"{cfg['train']['epochs']}; a finished run is needed")
        return trainer

    def train_dataset(self):
        """The cache path hands uint8 views and their drawn parameters to ``to_device``, which augments
        the batch where the model is (``dataset.CachedTrainImages``)."""
        from noisymlt.dataset import CachedTrainImages, CacheRows, TrainImages

        tcfg = self.cfg["train"]
        if not self.caches:
            return TrainImages(self.train_images, self.train_table.paths, tcfg["image_size"], tcfg["photometric"])
        return CachedTrainImages(CacheRows(self.caches["train"]), tcfg["image_size"], tcfg["photometric"],
                                 deferred=True, views=self.trunk.views if self.trunk is not None else 0)

    def trunk_cache(self):
        """``train.trunk_cache_views`` > 0: the frozen trunk's outputs of V fixed views per training image
        (``noisymlt.trunkcache``), or None where the run cannot use them (the reason is logged and recorded
        in ``self.trunk_status``)."""
        import torch
        import torchvision

        from noisymlt.dataset import CacheRows
        from noisymlt.tensoraug import augment
        from noisymlt.trunkcache import CHUNK, Memo, TrunkCache, check_fixed, device_settings, frozen_parts, memo_key

        tcfg = self.cfg["train"]
        views = int(tcfg.get("trunk_cache_views", 0) or 0)
        if not views:
            return None
        self.model.train()
        why = ("the method trains on pixels" if self.method.needs_pixels
               else "train.loader is not cache" if "train" not in self.caches
               else check_fixed(self.model, tcfg["trainable"]))
        if why:
            log.info("trunk cache not used: %s", why)
            self.trunk_status = f"not used: {why}"
            return None
        parts = frozen_parts(self.model, tcfg["trainable"], first=True)  # check_fixed: every trunk's are equal

        def prefix(x):
            if tcfg["channels_last"]:
                x = x.contiguous(memory_format=torch.channels_last)
            with self.autocast():
                for part in parts:
                    x = part(x)
            return x

        t0 = time.process_time()
        rows = CacheRows(self.caches["train"])
        # everything the values depend on besides the rows and the parts (noisymlt.trunkcache's module doc)
        settings = {"views": views, "seed": self.cfg["seed"], "photometric": tcfg["photometric"],
                    "image_size": tcfg["image_size"], "channels_last": tcfg["channels_last"],
                    "trainable": tcfg["trainable"], "precision": self.precision, **device_settings(self.device),
                    "torch": torch.__version__, "torchvision": torchvision.__version__, "chunk": CHUNK,
                    "code": self.trunk_code}
        memo = Memo(self.caches["train"].parent / "trunk", memo_key(rows, parts, settings))
        cache = TrunkCache(rows, views, self.cfg["seed"], tcfg["photometric"], prefix,
                           lambda raw, p: augment(raw, p, tcfg["image_size"], tcfg["photometric"]), self.device,
                           chunk=CHUNK, memo=memo)
        self.trunk_status = f"{views} views (memo {memo.path.stem})"
        self.trunk_memo = "loaded" if cache.loaded else "computed"
        log.info("trunk cache %s in %.1f CPU s (%s)", self.trunk_memo, time.process_time() - t0, memo.path)
        return cache

    def frozen_inputs(self):
        """The training step's context: with a trunk cache, the model's frozen parts pass their input through."""
        from noisymlt.trunkcache import frozen_parts_skipped

        if self.trunk is None:
            return contextlib.nullcontext()
        return frozen_parts_skipped(self.model, self.cfg["train"]["trainable"])

    def eval_dataset(self, part: str):
        from noisymlt.dataset import CachedEvalImages, CacheRows, EvalImages

        size = self.cfg["train"]["image_size"]
        if not self.caches:
            root, table = (self.train_images, self.train_table) if part == "train" else (self.test_images, self.test_table)
            return EvalImages(root, table.paths, size)
        return CachedEvalImages(CacheRows(self.caches[part]), size, deferred=True)

    def eval_images(self, images):
        """A test-transform batch on the device (cached uint8 rows are resized and normalised there)."""
        import torch

        from noisymlt.tensoraug import eval_resize

        images = images.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = eval_resize(images, self.cfg["train"]["image_size"])
        return images

    # ------------------------------------------------------------------ checkpoints
    @property
    def ckpt_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def save_checkpoint(self, epoch: int, history: list) -> None:
        import torch

        state = {
            "run_id": self.run_id,
            "inputs": self.inputs_digest,
            "code": self.code_digest,  # the code that trained it (a resume needs the same)
            "epoch": epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "method": self.method.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "history": json.dumps(history),
        }
        if self.noise_monitor is not None:  # the log travels with the weights: a resume rewrites it from here
            state["noise_log"] = self.noise_monitor.snapshot()
        state["content_sha256"] = self.checkpoint_sha256 = content_sha256(state)
        tmp = self.ckpt_path.with_name("checkpoint.pt.tmp")
        with _unlinked_on_failure(tmp):  # torch reports a full disk as a RuntimeError ("unexpected pos")
            torch.save(state, tmp)
        tmp.replace(self.ckpt_path)  # the last complete checkpoint stays in place until here

    @property
    def identity(self) -> str:
        """The name of this run's folder under previous/: its run id, inputs and code."""
        return f"{self.run_id}-{self.inputs_digest[:8]}-{self.code_digest[:8]}"

    def restore(self) -> bool:
        """Bring back a checkpoint of this very run (same run id, inputs and code) from previous/."""
        kept = self.out / "previous" / self.identity / "checkpoint.pt"
        if not (self.keep_stale and kept.exists()):
            return False
        kept.replace(self.ckpt_path)
        for name in ("train_log.jsonl", "noise_level.jsonl"):
            if kept.with_name(name).exists():
                kept.with_name(name).replace(self.out / name)
        log.warning("reusing the checkpoint of this configuration kept in %s", kept.parent)
        return True

    def load_checkpoint(self) -> tuple[int, list]:
        import torch

        if not self.ckpt_path.exists() and not self.restore():
            return 0, []
        try:
            state = torch.load(self.ckpt_path, map_location=self.device, weights_only=True)
        except Exception as exc:  # noqa: BLE001 (any failure to read it means it is damaged)
            return self._damaged_checkpoint(f"unreadable ({str(exc).splitlines()[0][:200]})")
        recorded = state.pop("content_sha256", None)
        if recorded is None:
            log.warning("%s has no content hash (written by an older version): it cannot be checked", self.ckpt_path)
        elif content_sha256(state) != recorded:
            return self._damaged_checkpoint("its content does not match the content hash it was saved with")
        self.checkpoint_sha256 = recorded
        why = self._foreign(state)
        if why and self.keep_stale:
            # The workflow reran this job because its configuration, inputs or code changed: the previous run's
            # files move to previous/<its run id>-<inputs>-<code>/, and a finished run of this very
            # configuration, inputs and code kept there earlier comes back instead of being retrained.
            tag = "-".join(str(state.get(k) or "unknown")[:n] for k, n in (("run_id", 64), ("inputs", 8), ("code", 8)))
            aside = archive_run(self.out, tag)
            if self.restore():
                return self.load_checkpoint()
            self._log_restart(f"{self.ckpt_path}: {why}", aside)
            log.warning("%s: %s; training starts from epoch 0 (the previous run is kept in %s)",
                        self.ckpt_path, why, aside)
            return 0, []
        if why:
            raise NoisyMLTError(f"{self.ckpt_path}: {why}; refusing to resume or overwrite it. Move it away or "
                                "pass --restart.")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict(state["method"])
        torch.set_rng_state(state["torch_rng"].cpu())
        self.saved_noise_log = state.get("noise_log")
        log.info("resumed %s from epoch %d", self.ckpt_path, state["epoch"])
        return int(state["epoch"]), json.loads(state["history"])

    def _foreign(self, state: dict) -> str | None:
        """Why a loaded checkpoint is not this run's (None when it is): another configuration, other inputs
        or other code."""
        if state.get("run_id") != self.run_id:
            return (f"checkpoint belongs to run {state.get('run_id')}, not {self.run_id} "
                    "(the configuration changed)")
        if state.get("inputs") != self.inputs_digest:
            return ("checkpoint was trained on other inputs (train labels, class split, decoded training images or "
                    "backbone weights changed)")
        if state.get("code") != self.code_digest:
            return (f"checkpoint was trained by other code ({state.get('code') or 'not recorded: an older version'}"
                    f", this job runs {self.code_digest})")
        return None

    def _log_restart(self, reason: str, aside: Path) -> None:
        """The first line of the new epoch log: why the run starts over and where the old one went."""
        from noisymlt.jsonlog import write_records

        write_records(self.out / "train_log.jsonl", [{"event": "restart", "reason": reason,
                                                      "previous_run": str(aside)}])

    def _damaged_checkpoint(self, why: str) -> tuple[int, list]:
        """A damaged checkpoint is never resumed from. The workflow (keep_stale) keeps it in previous/ and
        starts over, saying so in the log and in train_log.jsonl's first line; a direct call refuses."""
        what = f"{self.ckpt_path}: damaged checkpoint: {why}"
        if not self.keep_stale:
            raise NoisyMLTError(f"{what}; refusing to resume from it. Move it away or pass --restart to start over.")
        aside = archive_run(self.out, f"damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        self._log_restart(what, aside)
        log.warning("%s; training starts over (the damaged run is kept in %s)", what, aside)
        return 0, []

    # ------------------------------------------------------------------ loop
    @property
    def precision(self) -> str:
        """The precision the model runs at on this device: ``train.precision`` on a GPU, ``train.cpu_precision``
        on the CPU."""
        tcfg = self.cfg["train"]
        return tcfg["precision"] if self.device.type == "cuda" else tcfg.get("cpu_precision", "fp32")

    def autocast(self):
        """bf16 / fp16 autocast on a GPU (``train.precision``); on the CPU ``train.cpu_precision`` (fp32 by
        default; bf16 uses the CPU's bf16 units, e.g. AMX: deterministic for a given thread count)."""
        import torch

        precision = self.precision
        if self.device.type == "cuda":
            if precision == "fp32":
                return contextlib.nullcontext()
            return torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
        if precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def to_device(self, batch: dict) -> dict:
        import torch

        from noisymlt.tensoraug import augment

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

    @contextlib.contextmanager
    def exclusive(self):
        """Hold OUT/.train.lock: a second trainer on the same run folder stops instead of interleaving
        its checkpoints with this one's (re-entrant within this trainer)."""
        from noisymlt.locks import holder, release, try_lock

        if self._lock is not None:
            yield
            return
        path = self.out / ".train.lock"
        handle = try_lock(path)
        if handle is None:
            raise NoisyMLTError(f"{self.out}: another trainer (pid {holder(path)}) is training this run folder; "
                                "wait for it or stop it first")
        self._lock = handle
        try:
            yield
        finally:
            self._lock = None
            release(handle)

    def fit(self) -> list[dict]:
        with self.exclusive():
            return self._fit()

    def _fit(self) -> list[dict]:
        import torch
        from tqdm import tqdm

        from noisymlt.dataset import EpochPlan, stream_loader

        tcfg = self.cfg["train"]
        self.out.mkdir(parents=True, exist_ok=True)
        start_epoch, history = self.load_checkpoint()
        self._trim_epoch_log(start_epoch)
        saved_at = time.monotonic()
        monitor = self.noise_monitor
        if monitor is not None:
            monitor.start(self.out / "noise_level.jsonl", start_epoch, self.saved_noise_log)
        streams = self.streams
        plans = [EpochPlan(s, self.cfg["seed"], self.iters) for s in streams]
        self.trunk = self.trunk_cache()
        dataset = self.train_dataset()
        pin = self.device.type == "cuda"
        loaders = [stream_loader(dataset, None, self.workers, pin) for _ in plans]
        params = [p for p in self.model.parameters() if p.requires_grad]
        for epoch in range(start_epoch, tcfg["epochs"]):
            t0 = time.time()
            self.model.train()
            self.method.on_epoch_start(self.model, epoch)
            for loader, plan in zip(loaders, plans):
                loader.batch_sampler.batches = plan.batches(epoch)
            sums: dict[str, float] = {}
            bar = tqdm(zip(*loaders), total=self.iters, desc=f"{self.cfg['method']} epoch {epoch + 1}/{tcfg['epochs']}",
                       disable=not self.progress, leave=False, dynamic_ncols=True)
            for it, raw in enumerate(bar):
                lr = lr_at(tcfg, epoch, it, self.iters)
                for group, mult in zip(self.optimizer.param_groups, self.lr_mults):
                    group["lr"] = lr * mult
                batches = {s.name: self.to_device(b) for s, b in zip(streams, raw)}
                with self.autocast(), self.frozen_inputs():
                    loss, logs = self.method.training_loss(self.model, batches, epoch, it)
                published = self.method.take_published()  # computed targets only, never read back
                if monitor is not None:
                    monitor.observe(epoch, it, published)
                if not torch.isfinite(loss):
                    raise NoisyMLTError(f"{self.cfg['method']}: non-finite loss at epoch {epoch + 1} iteration {it}")
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if tcfg["grad_clip"]:
                    torch.nn.utils.clip_grad_norm_(params, tcfg["grad_clip"])
                self.optimizer.step()
                for k, v in logs.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.4g}")
            # the history goes into the checkpoint and the manifest (tracked outputs): results only; the
            # wall time goes to the untracked epoch log (train_log.jsonl) and the run's timing file
            record = {"epoch": epoch + 1, "lr": lr, **{k: v / self.iters for k, v in sums.items()}}
            seconds = round(time.time() - t0, 2)
            history.append(record)
            log.info("epoch %d/%d %s seconds=%.2f", epoch + 1, tcfg["epochs"],
                     " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()),
                     seconds)
            if monitor is not None:
                monitor.append_epoch()
            if epoch + 1 == tcfg["epochs"] or time.monotonic() - saved_at >= self.checkpoint_seconds:
                self.save_checkpoint(epoch + 1, history)
                saved_at = time.monotonic()
            with open(self.out / "train_log.jsonl", "a") as f:
                f.write(json.dumps({**record, "seconds": seconds}) + "\n")
        return history

    def _trim_epoch_log(self, epochs_done: int) -> None:
        """Drop the epoch log's records of epochs after the checkpoint (a resume trains them again); events
        such as a restart stay."""
        from noisymlt.jsonlog import read_records, write_records

        path = self.out / "train_log.jsonl"
        if not path.exists():
            return
        # rewritten whole: a cut-off last line (killed mid-append, disk full), which read_records drops,
        # would otherwise be joined by the next append
        write_records(path, [r for r in read_records(path) if r.get("epoch", 0) <= epochs_done])

    def iterate_train_eval(self):
        """Yield (row indices, images on device) over the whole train set with the test transform:
        for methods that score every training image (DivideMix's per-sample losses)."""
        import torch

        from noisymlt.dataset import eval_loader

        tcfg = self.cfg["train"]
        loader = eval_loader(self.eval_dataset("train"), tcfg["eval_batch_size"], self.workers,
                             self.device.type == "cuda")
        start = 0
        for images in loader:
            idx = torch.arange(start, start + len(images), device=self.device)
            start += len(images)
            yield idx, self.eval_images(images)

    def predict(self, batch_size: int | None = None, forward_seconds: list | None = None,
                part: str = "test") -> dict[str, np.ndarray]:
        """Sigmoid scores of every image of ``part`` (test or train, test transform) per head.
        ``forward_seconds``: a list that receives the time of each batch's forward pass (synchronised on
        a GPU), for the inference-time table."""
        import torch
        from tqdm import tqdm

        from noisymlt.dataset import eval_loader

        tcfg = self.cfg["train"]
        loader = eval_loader(self.eval_dataset(part), batch_size or tcfg["eval_batch_size"], self.workers,
                             self.device.type == "cuda")
        self.model.eval()
        outs: dict[str, list] = {}
        with torch.no_grad():
            for images in tqdm(loader, desc=f"predict {part}", disable=not self.progress, leave=False):
                images = self.eval_images(images)
                if tcfg["channels_last"]:
                    images = images.contiguous(memory_format=torch.channels_last)
                t0 = time.perf_counter()
                with self.autocast():
                    heads = self.method.predict(self.model, images)
                if forward_seconds is not None:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    forward_seconds.append(time.perf_counter() - t0)
                for name, logits in heads.items():
                    outs.setdefault(name, []).append(torch.sigmoid(logits.float()).cpu().numpy())
        return {name: np.concatenate(v) for name, v in outs.items()}

    def run(self) -> Path:
        from noisymlt.provenance import now

        started = now()
        with self.exclusive():
            history = self.fit()
            scores = self.predict()
            return self._write_outputs(started, history, scores, self.fit_record(history, scores))

    def fit_record(self, history: list, test_scores: dict) -> dict:
        """How far the finished model fitted its training labels (noisymlt.fit_diagnostics; analysis
        only, computed after training)."""
        from noisymlt.fit_diagnostics import diagnose

        tcfg = self.cfg["train"]
        rates = [lr_at(tcfg, e, i, self.iters) for e in range(tcfg["epochs"]) for i in range(self.iters)]
        noise_log = self.noise_monitor.snapshot() if self.noise_monitor is not None else None
        return diagnose(train_cfg=tcfg, lr_rates=rates, history=history, noisy=self.train_table.labels,
                        train_scores=self.predict(part="train"), test_scores=test_scores, noise_log=noise_log)

    def _write_outputs(self, started: str, history: list, scores: dict, fit: dict) -> Path:
        import torch

        from noisymlt.codedeps import check_unchanged
        from noisymlt.provenance import write_manifest

        # recorded under the code that ran, or not at all: an edit on disk since the start would otherwise be
        # credited with a result it did not make (and, once reverted, hide one it did)
        check_unchanged(self.code_digest, *self.code_entries, what=f"run {self.run_id} ({self.out})")
        pred_path = self.out / "predictions.npz"
        tmp = self.out / "predictions.tmp.npz"
        with _unlinked_on_failure(tmp):
            np.savez_compressed(tmp, image_ids=np.array(self.test_table.image_ids), heads=np.array(list(scores)),
                                checkpoint_sha256=np.array(self.checkpoint_sha256 or ""),  # the weights they came from
                                # the code that trained those weights: this job's, as a resume requires
                                code_digest=np.array(self.code_digest),
                                **{f"scores_{k}": v for k, v in scores.items()})
        tmp.replace(pred_path)
        (self.out / "run_config.json").write_text(json.dumps(self.cfg, indent=1, sort_keys=True) + "\n")
        write_manifest(
            self.out / "manifest.json", step="train", started=started, device=str(self.device),
            inputs={**self.provenance_inputs, **self.paths, **{f"{k}_cache": v for k, v in self.caches.items()}},
            outputs={"checkpoint": self.ckpt_path, "predictions": pred_path}, code=self.code_entries,
            code_digest=self.code_digest,
            extra={"run_id": self.run_id, "run": self.cfg, "history": history, "fit": fit,
                   "checkpoint_content_sha256": self.checkpoint_sha256,
                   "iterations_per_epoch": self.iters, "cpu_threads": torch.get_num_threads(),
                   # fixed views (train.trunk_cache_views) or, with the reason, fresh ones
                   "trunk_cache": self.trunk_status,
                   # the build as well as the release (the environment block has the release only)
                   "torch_build": {"version": torch.__version__, "cuda": torch.version.cuda}},
            # how it ran, not what it computed (loader workers never change results): untracked
            timing={"epoch_seconds": self._epoch_seconds(), "loader_workers": self.workers,
                    **({"trunk_cache": self.trunk_memo} if self.trunk_memo else {})},  # computed or loaded
        )
        keep_finished(self.out)
        return pred_path

    def _epoch_seconds(self) -> list:
        """Wall seconds per epoch from the epoch log (epochs of an earlier process included)."""
        from noisymlt.jsonlog import read_records

        return [rec["seconds"] for rec in read_records(self.out / "train_log.jsonl") if "seconds" in rec]
