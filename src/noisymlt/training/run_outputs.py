"""What a finished training run writes beside its checkpoint: ``predictions.npz`` (test-set sigmoid scores per
head, with the checkpoint and code they came from), ``run_config.json`` and ``manifest.json`` (noisymlt.core.manifest:
inputs, outputs, code, history, fit diagnostics and numerics; wall times in its untracked timing file).

Recorded under the code that ran or not at all: the package source is checked against the digest the run loaded
before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from noisymlt.core.files import replacing
from noisymlt.training import checkpoint


def write_run_outputs(trainer, started: str, history: list, scores: dict, fit: dict) -> Path:
    """Write the outputs of ``trainer`` (a noisymlt.training.trainer.Trainer whose run has finished): its
    ``history`` (one record per epoch), test ``scores`` per head and ``fit`` record; ``started`` is the
    manifest's start time. Returns the predictions file."""
    import torch

    from noisymlt.core.codedeps import check_unchanged
    from noisymlt.core.manifest import write_manifest
    from noisymlt.training.numerics import cpu_model, fingerprint

    out = trainer.out
    # recorded under the code that ran, or not at all: an edit on disk since the start would otherwise be
    # credited with a result it did not make (and, once reverted, hide one it did)
    check_unchanged(trainer.code_digest, *trainer.code_entries, what=f"run {trainer.run_id} ({out})")
    pred_path = out / "predictions.npz"
    with replacing(pred_path, out / "predictions.tmp.npz") as tmp:  # numpy keeps a name ending .npz
        np.savez_compressed(tmp, image_ids=np.array(trainer.test_table.image_ids), heads=np.array(list(scores)),
                            checkpoint_sha256=np.array(trainer.checkpoint_sha256 or ""),  # the weights they came from
                            # the code that trained those weights: this job's, as a resume requires
                            code_digest=np.array(trainer.code_digest),
                            **{f"scores_{k}": v for k, v in scores.items()})
    (out / "run_config.json").write_text(json.dumps(trainer.cfg, indent=1, sort_keys=True) + "\n")
    images = trainer.images
    write_manifest(
        out / "manifest.json", step="train", started=started, device=str(trainer.device),
        inputs={**trainer.provenance_inputs, **trainer.paths, **{f"{k}_cache": v for k, v in trainer.caches.items()},
                **trainer.asset_inputs()},
        outputs={"checkpoint": trainer.ckpt_path, "predictions": pred_path}, code=trainer.code_entries,
        code_digest=trainer.code_digest,
        extra={"run_id": trainer.run_id, "run": trainer.cfg, "history": history, "fit": fit,
               "checkpoint_content_sha256": trainer.checkpoint_sha256,
               "iterations_per_epoch": trainer.iters, "cpu_threads": torch.get_num_threads(),
               # which kernels made these numbers (the same run is another draw on another CPU type)
               "numerics": {**fingerprint(trainer.device, trainer.precision, torch.get_num_threads()),
                            "cpu": cpu_model()},
               # fixed views (train.trunk_cache_views) or, with the reason, fresh ones
               "trunk_cache": images.trunk_status,
               # the training set on the device, augmented there (another draw than the loader's), or why not
               "device_images": images.device_images_status,
               # the build as well as the release (the environment block has the release only)
               "torch_build": {"version": torch.__version__, "cuda": torch.version.cuda}},
        # how it ran, not what it computed (loader workers never change results): untracked
        timing={"epoch_seconds": epoch_seconds(out), "loader_workers": trainer.workers,
                **getattr(trainer, "predict_timing", {}),
                **({"trunk_cache": images.trunk_memo} if images.trunk_memo else {})},  # computed or loaded
    )
    checkpoint.keep_finished(out)
    return pred_path


def epoch_seconds(out: Path) -> list:
    """Wall seconds per epoch from the run folder's epoch log (epochs of an earlier process included)."""
    from noisymlt.core.jsonlog import read_records

    return [rec["seconds"] for rec in read_records(Path(out) / "train_log.jsonl") if "seconds" in rec]
