"""A finished training run loaded for use: its model, its prediction heads and its test-time transform.

``load_run`` rebuilds the run through the trainer itself (``Trainer.from_run_dir``): the recorded configuration,
the train labels, class split and image caches its manifest names (each checked against the record of the step
that wrote it) and the final checkpoint, refused when it is another configuration's, other inputs' or other
code's. A model is used only as the run whose predictions.npz it scored.

``image_dataset`` gives images by path through the run's own test-time transform, up to where the run's eval
batches go to the device, and ``scores_of`` scores them by the run's own predict loop (``Trainer.predict``). With
``train.loader: cache`` that is a cache row: the image decoded as the cache step decodes it (PIL, RGB; no EXIF
rotation), resized to ``cache_size`` with PIL's bilinear filter, uint8; on the device it is then resized to
``image_size`` (antialiased bilinear) and normalised with ImageNet's mean and std, as the run's test images were.
Without the cache: the test transform of noisymlt.training.transforms (PIL bilinear to ``image_size``,
normalised) in the loader.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError, cause

# What the trainer says of a checkpoint that is not the run's or is damaged (Trainer.load_checkpoint), advice for a
# training job, and what a use of the model says instead
USE_ADVICE = ("it is not this run's model under the installed code and the data on disk; retrain the run (the "
              "workflow does) or use the code that trained it")
RESUME_ADVICE = {
    "refusing to resume or overwrite it. Move it away or pass --restart.": USE_ADVICE,
    "refusing to resume from it. Move it away or pass --restart to start over.":
        "the model cannot be used; restore the file (dvc checkout, if DVC versions the run) or retrain the run",
}


def check_run_outputs(run: Path, inputs: dict, outputs: dict) -> None:
    """Refuse, before anything is read or written, an output inside the run's folder (the workflow's, which DVC
    versions) or one that is an input or another output (noisymlt.core.files.check_outputs)."""
    from noisymlt.core.files import check_outputs

    folder = os.path.realpath(run)
    for name, path in outputs.items():
        if path is not None and os.path.commonpath([folder, os.path.realpath(path)]) == folder:
            raise NoisyMLTError(f"{path}: {name} lies in the run folder {run}, which only its training job writes; "
                                "give a file elsewhere")
    check_outputs(inputs, outputs)


def recorded_heads(run_dir: Path) -> list[str]:
    """The run's prediction heads, its reported one first, as its predictions.npz lists them."""
    path = Path(run_dir) / "predictions.npz"
    if not Path(run_dir).is_dir():
        raise NoisyMLTError(f"{run_dir}: no such run folder")
    if not path.is_file():
        raise NoisyMLTError(f"{path}: missing; {run_dir} is not a finished training run")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return [str(h) for h in npz["heads"]]
    except Exception as exc:  # a damaged or foreign file: the file and the cause
        raise NoisyMLTError(f"{path}: cannot read its heads ({exc})") from exc


def recorded_inputs(record: dict, manifest: Path) -> dict[str, Path]:
    """The inputs a run's manifest (``record``, read from MANIFEST) names (key -> path), each a relative path that
    stays inside the project (the current folder) as written: no absolute path, no ``..`` out of it. The project's
    own links (a data folder on another disk, DVC's cache) are followed as the workflow follows them."""
    inputs = record.get("inputs")
    if not isinstance(inputs, dict) or "test_labels" not in inputs:
        raise NoisyMLTError(f"{manifest}: no recorded input 'test_labels'; not a training run's manifest")
    out = {}
    for key, entry in inputs.items():
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path or "\0" in path:
            raise NoisyMLTError(f"{manifest}: input {key!r} records no usable path ({str(entry)[:80]})")
        if os.path.isabs(path) or os.path.normpath(path).split(os.sep)[0] == "..":
            raise NoisyMLTError(f"{manifest}: input {key!r} is {path!r}, outside the project; a run's inputs are "
                                "relative paths inside it")
        out[key] = Path(path)
    return out


def load_run(run_dir: str | Path, *, device: str = "cpu", train_images: str | Path | None = None):
    """The Trainer holding RUN_DIR's finished model, whose checkpoint is the one its manifest records (the model
    that wrote predictions.npz). ``train_images``: the folder the run's train table paths are relative to, needed
    only by a run that read its images without the cache (to score its training images)."""
    from noisymlt.core.files import read_json
    from noisymlt.training.trainer import Trainer

    run_dir = Path(run_dir)
    manifest = run_dir / "manifest.json"
    if not run_dir.is_dir():
        raise NoisyMLTError(f"{run_dir}: no such run folder")
    if not manifest.is_file():
        raise NoisyMLTError(f"{manifest}: missing; {run_dir} is not a finished training run")
    record = read_json(manifest, require_object=True)
    inputs = recorded_inputs(record, manifest)
    config = run_dir / "run_config.json"
    cfg = read_json(config, require_object=True) if config.is_file() else None
    train = cfg.get("train") if cfg is not None else None
    if cfg is not None and not isinstance(train, dict):
        raise NoisyMLTError(f"{config}: no 'train' block; not a run's configuration")
    cached = cfg is not None and train.get("loader") == "cache"
    if not cached and train_images is None and cfg is not None:
        raise NoisyMLTError(f"{run_dir}: the run read its images without the image cache (train.loader "
                            f"{train.get('loader')!r}); name the folder of its training images "
                            "(--train-images)")
    root = Path(train_images) if train_images is not None else run_dir  # unread with the cache
    try:
        trainer = Trainer.from_run_dir(run_dir, test_labels=inputs["test_labels"], train_images=root,
                                       test_images=root, device=device)
    except NoisyMLTError as exc:  # the trainer's advice is for a training job; this is a use of the model
        text = str(exc)
        for advice, instead in RESUME_ADVICE.items():
            if text.endswith(advice):
                raise NoisyMLTError(text[: -len(advice)] + instead) from None
        raise
    except (KeyError, TypeError, ValueError) as exc:  # a configuration of another version or hand-edited
        raise NoisyMLTError(f"{config}: not a configuration this version can rebuild ({cause(exc)})") from None
    recorded = record.get("checkpoint_content_sha256")
    if trainer.checkpoint_sha256 is None or trainer.checkpoint_sha256 != recorded:
        raise NoisyMLTError(f"{trainer.ckpt_path}: not the checkpoint the run's manifest records (content "
                            f"{trainer.checkpoint_sha256 or 'unrecorded'}, the manifest's {recorded}); its "
                            f"predictions.npz is another model's: {USE_ADVICE}")
    return trainer


def transform_of(cfg: dict) -> dict:
    """The run's test-time transform, step by step, for a person or another framework to repeat."""
    from noisymlt.training.transforms import IMAGENET_MEAN, IMAGENET_STD

    tcfg = cfg["train"]
    size = int(tcfg["image_size"])
    steps = ["decode the file with PIL and convert it to 8-bit RGB (no EXIF rotation; alpha dropped, 16-bit grey "
             "scaled by 255/65535, an animation's first frame: noisymlt.data.images)"]
    cache = int(tcfg["cache_size"]) if tcfg.get("loader") == "cache" else None
    without_torch = None
    if cache is not None:
        steps += [f"resize to {cache} x {cache} with PIL's bilinear filter (Image.BILINEAR), uint8",
                  f"resize the uint8 (N, 3, {cache}, {cache}) tensor to {size} x {size} with "
                  "torch.nn.functional.interpolate(mode='bilinear', antialias=True, align_corners=False), uint8, "
                  "as torchvision's resize does" if cache != size else "(already the input size)"]
        if cache != size:
            without_torch = (f"where torch is not at hand, PIL's Image.BILINEAR resize to {size} x {size} in its "
                             "place: its kernel rounds otherwise, by up to 2 of 255 on some pixels, so the scores "
                             "differ slightly (export measures it on its check images)")
    else:
        steps.append(f"resize to {size} x {size} with PIL's bilinear filter (Image.BILINEAR)")
    steps += ["to float32 (N, 3, H, W), channels RGB, values 0-255",
              "subtract the mean and divide by the std, per channel"]
    out = {"image_size": size, "cache_size": cache, "layout": "NCHW float32, RGB",
           "pixel_range": "0-255 before normalising", "mean": [round(float(v), 4) for v in IMAGENET_MEAN],
           "std": [round(float(v), 4) for v in IMAGENET_STD], "steps": steps}
    if without_torch:
        out["without_torch"] = without_torch
    return out


def image_dataset(paths: list[Path], cfg: dict):
    """Images by path as the run's eval dataset yields its own (see the module docstring), each decoded by
    noisymlt.data.images.load_image (its conversions stated there)."""
    from noisymlt.training.loaders import EvalImages

    tcfg = cfg["train"]
    cached = tcfg.get("loader") == "cache"
    return EvalImages(Path(), [str(p) for p in paths], int(tcfg["cache_size"] if cached else tcfg["image_size"]),
                      as_cache=cached)


def scores_of(trainer, dataset, heads: list[str], batch_size: int | None = None,
              progress: bool = False) -> dict[str, np.ndarray]:
    """Sigmoid scores per head of ``heads`` for every item of ``dataset``, by the run's own predict loop
    (``Trainer.predict``: its batches unless ``batch_size``, device, memory format and precision). A loader
    worker's failure on a file comes back as its own one-line error."""
    try:
        scores = trainer.predict(dataset, batch_size=batch_size, progress=progress)
    except Exception as exc:
        # A loader worker's error comes back as its own type (a NoisyMLTError too) whose text is "Caught ... in
        # DataLoader worker process N", then the worker's traceback, ending in the original line.
        text = str(exc).strip().splitlines()
        if len(text) > 1 and "NoisyMLTError: " in text[-1]:
            raise NoisyMLTError(text[-1].split("NoisyMLTError: ", 1)[1]) from None
        raise
    missing = [name for name in heads if name not in scores]
    if missing:
        raise NoisyMLTError(f"head {missing[0]!r} is not among the run's: {', '.join(scores)}")
    return {name: scores[name] for name in heads}
