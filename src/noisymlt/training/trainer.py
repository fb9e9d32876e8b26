"""The training loop shared by every method, with checkpoint/resume and test-set prediction.

Outputs in the run folder: ``checkpoint.pt`` (after every epoch, plain state dicts loaded with
``weights_only=True``), ``train_log.jsonl`` (one line per epoch), ``predictions.npz`` (test-set
sigmoid scores per head) and ``manifest.json`` (both written by noisymlt.training.run_outputs); given the clean
labels (``--clean-labels``, analysis only), also ``noise_level.jsonl`` (noisymlt.training.noise_monitor).

A checkpoint is this run's, and is resumed, only when its run id (the resolved configuration), its inputs
(train labels, class split, decoded training images, backbone weights) and its code (the digest of the code that trained it: the trainer, the
method's family and its losses, ``noisymlt.methods.run_entries``) are all this job's. Any other checkpoint
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

from noisymlt.core.files import read_json
from noisymlt.data.assets import run_inputs
from noisymlt.errors import NoisyMLTError
from noisymlt.training import checkpoint
from noisymlt.training.inputs import RunImages
from noisymlt.training.run_outputs import write_run_outputs
from noisymlt.training.schedule import build_optimizer, capped, check_warmup, epoch_iterations
from noisymlt.training.speed import StepLog, compile_model, mark_step

log = logging.getLogger(__name__)


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
                 test_cache: Path | None = None, cores: int | None = None, expect_code: str | None = None,
                 runs_per_gpu: int | None = None):
        import torch

        from noisymlt.core.codedeps import TRAINER, digest, load_code
        from noisymlt.core.manifest import check_inputs, run_id
        from noisymlt.data.imagecache import index_path
        from noisymlt.data.labels import read_class_split, read_labels
        from noisymlt.methods import FAMILY_MODULES, load_family, run_entries
        from noisymlt.methods.base import TrainContext
        from noisymlt.training.devices import select_device
        from noisymlt.training.loaders import resolve_workers

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
        # every file the run reads, checked against the record of the step that wrote it before any is read:
        # a cache, weights or predictions that changed since stop the job here (noisymlt.core.manifest)
        caches = {f"{k}_cache": Path(v) for k, v in (("train", train_cache), ("test", test_cache)) if v}
        inputs = {**self.provenance_inputs, **self.paths, **caches, **self.asset_inputs(),
                  **{f"{k}_index": index_path(v) for k, v in caches.items()}}
        hashes = check_inputs(inputs)
        self.input_sha256 = {Path(inputs[name]): sha for name, sha in hashes.items()}  # for _inputs_digest
        self.keep_stale = keep_stale
        self._lock = None
        self.train_images, self.test_images = Path(train_images), Path(test_images)
        self.out = Path(out_dir)
        self.progress = progress
        # CPU float results depend on the thread count (reduction order), so it is part of the run config.
        torch.set_num_threads(int(resolved["train"].get("cpu_threads", 1)))
        self.device = select_device(device, runs_per_gpu)
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
        split_classes = sum(map(len, self.split.values()))
        if split_classes != len(self.train_table.classes):
            raise NoisyMLTError(f"{split}: a class split of {split_classes} classes, "
                                f"{train_labels} has {len(self.train_table.classes)}")
        tcfg = resolved["train"]
        self.images = RunImages(resolved, self.device, tables={"train": self.train_table, "test": self.test_table},
                                labels={"train": self.paths["train_labels"], "test": self.paths["test_labels"]},
                                roots={"train": self.train_images, "test": self.test_images},
                                caches={"train": train_cache, "test": test_cache})
        self.caches = self.images.caches
        self.inputs_digest = self._inputs_digest()
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
        known = None
        drops = (resolved.get("clean") or {}).get("action") == "drop"
        if drops != (self.train_table.ignored is not None):  # a cleaned run on the raw table, or the other way
            raise NoisyMLTError(f"{train_labels}: " + ("no ignored_* columns, but the run's labels are cleaned by "
                                                       "dropping" if drops else "ignored_* columns, but the run "
                                                       "config drops no labels") + " (noisymlt.pipeline.cleaning)")
        if drops:  # the loss leaves them out (TrainContext.known); the sampler draws from the given labels
            known = 1.0 - torch.as_tensor(self.train_table.ignored, dtype=torch.float32, device=self.device)
        self.ctx = TrainContext(resolved, noisy, self.split, self.device, 0,
                                extra={"iterate_train": self.iterate_train_eval,
                                       "classes": list(self.train_table.classes)}, known=known)
        self.method = load_family(family)(self.ctx)
        self.streams = self.method.streams()
        self.iters = epoch_iterations(tcfg.get("epoch_length", "batches"), self.streams, n, tcfg["batch_size"])
        self.iters = capped(tcfg, self.iters)
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
        self.optimizer, self.lr_schedule = build_optimizer(self.model, tcfg, self.method.lr_multipliers(),
                                                           self.iters, self.device)
        self.compiled = compile_model(self.model, self.device) if tcfg.get("compile", False) else []
        self.noise_monitor = None
        self.saved_noise_log: str | None = None  # the noise log as the loaded checkpoint holds it
        self.checkpoint_sha256: str | None = None  # content hash of the checkpoint saved or resumed last
        if clean_labels is not None:
            # Analysis only: the monitor alone holds the clean labels; the method merely publishes the
            # targets it has computed (noisymlt.training.noise_monitor). The run id does not depend on it.
            from noisymlt.training.noise_monitor import NoiseMonitor

            self.noise_monitor = NoiseMonitor.from_files(clean_labels, self.train_table, train_labels, self.split,
                                                         self.device, self.iters)
            self.method.publish_targets = True
            if Path(clean_labels) not in self.provenance_inputs.values():
                self.provenance_inputs["clean_labels"] = Path(clean_labels)

    def _inputs_digest(self) -> str:
        """What the trained weights are made of besides configuration and code: the noisy train labels, the
        class split, the decoded training images (train.loader: cache), the backbone weights it starts from
        (train.weights_path) and any other file the method reads (ML-GCN's GloVe vectors). A new long-tail
        subset or noisy copy, re-decoded images or a re-pretrained backbone under the same configuration must
        not resume the old model. (The test images only reach
        the predictions, which every job makes anew.) The hashes are those taken when the inputs were checked."""
        from noisymlt.core.manifest import file_sha256

        sources = [self.paths["train_labels"], self.paths["split"]]
        if "train" in self.caches:
            sources.append(self.caches["train"])
        # the backbone weights (train.weights_path; ImageNet's asset file) and the method's own files (GloVe)
        sources += [path for path in self.asset_inputs().values() if path.is_file()]
        hashes = [self.input_sha256.get(Path(p)) or file_sha256(p) for p in sources]
        return hashlib.sha256("+".join(hashes).encode()).hexdigest()[:16]

    def asset_inputs(self) -> dict[str, Path]:
        """The files this run reads besides its data, by role (noisymlt.data.assets.run_inputs)."""
        return {role: Path(f) for role, f in run_inputs(self.cfg).items()}

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
        cfg = resolved if resolved is not None else read_json(files["run_config.json"], require_object=True)
        inputs = read_json(files["manifest.json"], require_object=True).get("inputs", {})
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
        self.checkpoint_sha256 = checkpoint.save(self.ckpt_path, state)

    @property
    def identity(self) -> str:
        """The name of this run's folder under previous/: its run id, inputs and code."""
        return f"{self.run_id}-{self.inputs_digest[:8]}-{self.code_digest[:8]}"

    def restore(self) -> bool:
        """Bring back a checkpoint of this very run (same run id, inputs and code) from previous/."""
        return self.keep_stale and checkpoint.bring_back(self.out, self.identity)

    def load_checkpoint(self) -> tuple[int, list]:
        import torch

        if not self.ckpt_path.exists() and not self.restore():
            return 0, []
        try:
            state, self.checkpoint_sha256 = checkpoint.read_checked(self.ckpt_path, self.device)
        except checkpoint.Damaged as exc:
            return self._damaged_checkpoint(str(exc))
        why = checkpoint.foreign(state, run_id=self.run_id, inputs=self.inputs_digest, code=self.code_digest)
        if why and self.keep_stale:
            # The workflow reran this job because its configuration, inputs or code changed: the previous run's
            # files move to previous/<its run id>-<inputs>-<code>/, and a finished run of this very
            # configuration, inputs and code kept there earlier comes back instead of being retrained.
            aside = checkpoint.archive_run(self.out, checkpoint.tag_of(state))
            if self.restore():
                return self.load_checkpoint()
            checkpoint.log_restart(self.out, f"{self.ckpt_path}: {why}", aside)
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

    def _damaged_checkpoint(self, why: str) -> tuple[int, list]:
        """A damaged checkpoint is never resumed from. The workflow (keep_stale) keeps it in previous/ and
        starts over, saying so in the log and in train_log.jsonl's first line; a direct call refuses."""
        what = f"{self.ckpt_path}: damaged checkpoint: {why}"
        if not self.keep_stale:
            raise NoisyMLTError(f"{what}; refusing to resume from it. Move it away or pass --restart to start over.")
        aside = checkpoint.archive_run(self.out, f"damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        checkpoint.log_restart(self.out, what, aside)
        log.warning("%s; training starts over (the damaged run is kept in %s)", what, aside)
        return 0, []

    # ------------------------------------------------------------------ loop
    def open_trunk(self):
        """The frozen trunk's outputs of fixed views, when the run trains on them (RunImages.open_trunk)."""
        return self.images.open_trunk(self.model, needs_pixels=self.method.needs_pixels, autocast=self.autocast,
                                      precision=self.precision, code=self.trunk_code)

    @property
    def precision(self) -> str:
        """The precision the model runs at on this device (noisymlt.training.devices.run_precision)."""
        from noisymlt.training.devices import run_precision

        return run_precision(self.cfg["train"], self.device)

    def autocast(self):
        from noisymlt.training.devices import autocast

        return autocast(self.device, self.precision)

    @contextlib.contextmanager
    def exclusive(self):
        """Hold OUT/.train.lock: a second trainer on the same run folder stops instead of interleaving
        its checkpoints with this one's (re-entrant within this trainer)."""
        from noisymlt.core.locks import holder, release, try_lock

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

        from noisymlt.data.sampling import EpochPlan

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
        self.open_trunk()
        self.images.open_device_images()
        loaders = self.images.train_loaders(len(plans), self.workers, self.device.type == "cuda")
        params = [p for p in self.model.parameters() if p.requires_grad]
        for epoch in range(start_epoch, tcfg["epochs"]):
            t0 = time.time()
            self.model.train()
            self.method.on_epoch_start(self.model, epoch)
            for loader, plan in zip(loaders, plans):
                loader.batch_sampler.batches = plan.batches(epoch)
            steps = StepLog(self.device)  # sums and the finiteness check stay on the device until the epoch ends
            bar = tqdm(zip(*loaders), total=self.iters, desc=f"{self.cfg['method']} epoch {epoch + 1}/{tcfg['epochs']}",
                       disable=not self.progress, leave=False, dynamic_ncols=True)
            for it, raw in enumerate(bar):
                lr = self.lr_schedule.apply(self.optimizer, epoch, it)
                mark_step(self.device, bool(self.compiled))
                batches = {s.name: self.images.to_device(b) for s, b in zip(streams, raw)}
                with self.autocast(), self.images.frozen_inputs(self.model):
                    loss, logs = self.method.training_loss(self.model, batches, epoch, it)
                published = self.method.take_published()  # computed targets only, never read back
                if monitor is not None:
                    monitor.observe(epoch, it, published)
                steps.add(it, loss, logs)
                if self.device.type != "cuda":  # free on the CPU: stop at the first bad step
                    steps.check_finite(self.cfg['method'], epoch)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if tcfg["grad_clip"]:
                    torch.nn.utils.clip_grad_norm_(params, tcfg["grad_clip"])
                self.optimizer.step()
                if self.progress and it % 20 == 0:  # a host sync: only where a bar shows it
                    bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.4g}")
            steps.check_finite(self.cfg['method'], epoch)  # before anything of this epoch is saved
            # the history goes into the checkpoint and the manifest (tracked outputs): results only; the
            # wall time goes to the untracked epoch log (train_log.jsonl) and the run's timing file
            record = {"epoch": epoch + 1, "lr": lr, **steps.means(self.iters)}
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
        from noisymlt.core.jsonlog import read_records, write_records

        path = self.out / "train_log.jsonl"
        if not path.exists():
            return
        # rewritten whole: a cut-off last line (killed mid-append, disk full), which read_records drops,
        # would otherwise be joined by the next append
        write_records(path, [r for r in read_records(path) if r.get("epoch", 0) <= epochs_done])

    def iterate_train_eval(self, part: str = "train"):
        """Yield (row indices, images on device) over the whole train set (or ``part``) with the test transform:
        for methods that score every training image (DivideMix's per-sample losses)."""
        import torch

        from noisymlt.training.loaders import eval_loader

        tcfg = self.cfg["train"]
        loader = eval_loader(self.images.eval_dataset(part), tcfg["eval_batch_size"], self.workers,
                             self.device.type == "cuda")
        start = 0
        for images in loader:
            idx = torch.arange(start, start + len(images), device=self.device)
            start += len(images)
            yield idx, self.images.eval_images(images)

    def predict(self, dataset=None, *, part: str = "test", forward=None, batch_size: int | None = None,
                forward_seconds: list | None = None, progress: bool | None = None) -> dict[str, np.ndarray]:
        """Sigmoid scores per output of ``forward`` (default the method's ``predict``: one per head) of every
        image of ``dataset``, default the run's ``part`` (test or train), through the test transform.
        ``dataset``: items as the run's eval dataset yields them (noisymlt.training.loaders.EvalImages).
        ``forward_seconds``: a list that receives the time of each batch's forward pass (synchronised on a GPU),
        for the inference-time table."""
        import torch
        from tqdm import tqdm

        from noisymlt.training.loaders import eval_loader

        tcfg = self.cfg["train"]
        forward = forward or self.method.predict
        desc = f"predict {part}" if dataset is None else "predict"
        dataset = self.images.eval_dataset(part) if dataset is None else dataset
        loader = eval_loader(dataset, batch_size or tcfg["eval_batch_size"], self.workers, self.device.type == "cuda")
        self.model.eval()
        outs: dict[str, list] = {}
        with torch.no_grad():
            shown = self.progress if progress is None else progress
            for images in tqdm(loader, desc=desc, disable=not shown, leave=False):
                images = self.images.eval_images(images)
                if tcfg["channels_last"]:
                    images = images.contiguous(memory_format=torch.channels_last)
                t0 = time.perf_counter()
                with self.autocast():
                    heads = forward(self.model, images)
                if forward_seconds is not None:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    forward_seconds.append(time.perf_counter() - t0)
                for name, logits in heads.items():
                    outs.setdefault(name, []).append(torch.sigmoid(logits.float()).cpu().numpy())
        return {name: np.concatenate(v) for name, v in outs.items()}

    def run(self) -> Path:
        from noisymlt.core.manifest import now

        started = now()
        with self.exclusive():
            history = self.fit()
            t0 = time.perf_counter()
            scores = self.predict()
            fit = self.fit_record(history, scores)  # predicts the training images too
            # how long prediction took, for the GPU check's grid wall time (untracked timing file)
            self.predict_timing = {"predict_seconds": round(time.perf_counter() - t0, 3),
                                   "predicted_images": len(self.test_table) + len(self.train_table)}
            return self._write_outputs(started, history, scores, fit)

    def fit_record(self, history: list, test_scores: dict) -> dict:
        """How far the finished model fitted its training labels (noisymlt.training.fit_diagnostics; analysis
        only, computed after training)."""
        from noisymlt.training.fit_diagnostics import diagnose

        tcfg = self.cfg["train"]
        rates = self.lr_schedule.rates()
        noise_log = self.noise_monitor.snapshot() if self.noise_monitor is not None else None
        record = diagnose(train_cfg=tcfg, lr_rates=rates, history=history, noisy=self.train_table.labels,
                          train_scores=self.predict(part="train"), test_scores=test_scores, noise_log=noise_log)
        if float(self.cfg["gamma"]) == 0.0:  # clean labels: would a probe of the frozen trunk do as well?
            record["probe"] = self.probe()
        return record

    def probe(self) -> dict:
        """The linear probe of the run's pretrained trunk, frozen, on the run's training labels
        (noisymlt.training.probe): fine-tuning should do better than it, as with ImageNet features on VOC.
        The trunk is built afresh from the run's weights, so a resumed run gets the same probe."""
        import torch

        from noisymlt.models.backbones import build_backbone
        from noisymlt.training.probe import probe_record

        tcfg = self.cfg["train"]
        with torch.random.fork_rng(devices=[]):  # a trunk without weights file: the same random one every time
            torch.manual_seed(self.cfg["seed"])
            trunk = build_backbone(tcfg["backbone"], pretrained=tcfg["pretrained"],
                                   weights_path=tcfg.get("weights_path")).to(self.device)
        if tcfg["channels_last"]:
            trunk = trunk.to(memory_format=torch.channels_last)
        return probe_record(trunk, (x for _, x in self.iterate_train_eval()),
                            (x for _, x in self.iterate_train_eval("test")), self.train_table.labels,
                            self.test_table.labels, seed=self.cfg["seed"])

    def _write_outputs(self, started: str, history: list, scores: dict, fit: dict) -> Path:
        """The finished run's predictions, configuration and manifest (noisymlt.training.run_outputs)."""
        return write_run_outputs(self, started, history, scores, fit)
