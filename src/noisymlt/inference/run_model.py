"""A finished training run loaded for use: its model, its prediction heads and its test-time transform.

``load_run`` rebuilds the run through the trainer itself (``Trainer.from_run_dir``): the recorded configuration,
the train labels, class split and image caches its manifest names (each checked against the record of the step
that wrote it) and the final checkpoint, refused when it is another configuration's, other inputs' or other
code's. A model is used only as the run whose predictions.npz it scored.

``ImageFiles`` gives images by path through the run's own test-time transform, up to where the run's eval batches
go to the device (``Trainer.predict_dataset``). With ``train.loader: cache`` that is a cache row: the image decoded
as the cache step decodes it (PIL, RGB; no EXIF rotation), resized to ``cache_size`` with PIL's bilinear filter,
uint8; on the device it is then resized to ``image_size`` (antialiased bilinear) and normalised with ImageNet's
mean and std, as the run's test images were. Without the cache: the test transform of noisymlt.training.transforms
(PIL bilinear to ``image_size``, normalised) in the loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError

# What the trainer says of a checkpoint that is not the run's (Trainer.load_checkpoint), and what a use says instead
RESUME_ADVICE = "refusing to resume or overwrite it. Move it away or pass --restart."
USE_ADVICE = ("it is not this run's model under the installed code and the data on disk; retrain the run (the "
              "workflow does) or use the code that trained it")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


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


def load_run(run_dir: str | Path, *, device: str = "cpu", train_images: str | Path | None = None):
    """The Trainer holding RUN_DIR's finished model. ``train_images``: the folder the run's train table paths are
    relative to, needed only by a run that read its images without the cache (to score its training images)."""
    from noisymlt.training.trainer import Trainer

    run_dir = Path(run_dir)
    manifest = run_dir / "manifest.json"
    if not run_dir.is_dir():
        raise NoisyMLTError(f"{run_dir}: no such run folder")
    if not manifest.is_file():
        raise NoisyMLTError(f"{manifest}: missing; {run_dir} is not a finished training run")
    try:
        inputs = json.loads(manifest.read_text()).get("inputs", {})
    except json.JSONDecodeError as exc:
        raise NoisyMLTError(f"{manifest}: not JSON ({exc})") from exc
    if "test_labels" not in inputs:
        raise NoisyMLTError(f"{manifest}: no recorded input 'test_labels'; not a training run's manifest")
    cfg = json.loads((run_dir / "run_config.json").read_text()) if (run_dir / "run_config.json").is_file() else None
    cached = cfg is not None and cfg["train"].get("loader") == "cache"
    if not cached and train_images is None and cfg is not None:
        raise NoisyMLTError(f"{run_dir}: the run read its images without the image cache (train.loader "
                            f"{cfg['train'].get('loader')!r}); name the folder of its training images "
                            "(--train-images)")
    root = Path(train_images) if train_images is not None else run_dir  # unread with the cache
    try:
        return Trainer.from_run_dir(run_dir, test_labels=Path(inputs["test_labels"]["path"]), train_images=root,
                                    test_images=root, device=device)
    except NoisyMLTError as exc:  # the trainer's advice is for a training job; this is a use of the model
        text = str(exc)
        if text.endswith(RESUME_ADVICE):
            raise NoisyMLTError(text[: -len(RESUME_ADVICE)] + USE_ADVICE) from None
        raise


def transform_of(cfg: dict) -> dict:
    """The run's test-time transform, step by step, for a person or another framework to repeat."""
    from noisymlt.training.transforms import IMAGENET_MEAN, IMAGENET_STD

    tcfg = cfg["train"]
    size = int(tcfg["image_size"])
    steps = ["decode the file with PIL and convert it to RGB (no EXIF rotation)"]
    if tcfg.get("loader") == "cache":
        cache = int(tcfg["cache_size"])
        steps += [f"resize to {cache} x {cache} with PIL's bilinear filter (Image.BILINEAR), uint8",
                  f"resize to {size} x {size}, bilinear with antialiasing (torchvision resize, antialias=True), "
                  "uint8" if cache != size else "(already the input size)"]
    else:
        steps.append(f"resize to {size} x {size} with PIL's bilinear filter (Image.BILINEAR)")
    steps += ["to float32 (N, 3, H, W), channels RGB, values 0-255",
              "subtract the mean and divide by the std, per channel"]
    cache = int(tcfg["cache_size"]) if tcfg.get("loader") == "cache" else None
    return {"image_size": size, "cache_size": cache, "layout": "NCHW float32, RGB", "pixel_range": "0-255 before normalising",
            "mean": [round(float(v), 4) for v in IMAGENET_MEAN], "std": [round(float(v), 4) for v in IMAGENET_STD],
            "steps": steps}


class ImageFiles:
    """Images by path as the run's eval dataset yields its own (see the module docstring); an unreadable file
    fails with one line naming it (noisymlt.data.images.load_image)."""

    def __init__(self, paths: list[Path], cfg: dict):
        tcfg = cfg["train"]
        self.paths = [Path(p) for p in paths]
        self.cached = tcfg.get("loader") == "cache"
        self.size = int(tcfg["cache_size"] if self.cached else tcfg["image_size"])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        from noisymlt.data.images import load_image
        from noisymlt.training.transforms import eval_transform

        img = load_image(self.paths[i])
        if not self.cached:
            return eval_transform(img, self.size)
        row = np.asarray(img.resize((self.size, self.size), Image.BILINEAR), dtype=np.uint8)
        return torch.from_numpy(np.ascontiguousarray(row)).permute(2, 0, 1)


def image_files(folder: str | Path) -> list[Path]:
    """Every image file under FOLDER (by suffix, subfolders included), in path order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NoisyMLTError(f"{folder}: no such folder of images")
    found = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        raise NoisyMLTError(f"{folder}: no image files in it (suffixes {', '.join(IMAGE_SUFFIXES)})")
    return found


def listed_files(listing: str | Path) -> list[Path]:
    """The images a text file lists, one path a line (relative paths: to the list's folder; # starts a comment)."""
    listing = Path(listing)
    if not listing.is_file():
        raise NoisyMLTError(f"{listing}: no such image list")
    out = []
    for number, line in enumerate(listing.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            path = Path(line)
            out.append(path if path.is_absolute() else listing.parent / path)
    if not out:
        raise NoisyMLTError(f"{listing}: lists no image")
    return out


def scores_of(trainer, dataset, heads: list[str], batch_size: int | None = None,
              progress: bool = False) -> dict[str, np.ndarray]:
    """Sigmoid scores per head of ``heads`` for every item of ``dataset``, as ``Trainer.predict`` scores the run's
    test images: the run's batches (unless ``batch_size``), device, memory format and precision. (The loop is
    Trainer.predict's, over another dataset: an edit of trainer.py is an edit of every run's code, which retrains
    them all.) A loader worker's failure on a file comes back as its own one-line error."""
    import torch
    from tqdm import tqdm

    from noisymlt.training.loaders import eval_loader

    tcfg = trainer.cfg["train"]
    loader = eval_loader(dataset, batch_size or tcfg["eval_batch_size"], trainer.workers,
                         trainer.device.type == "cuda")
    trainer.model.eval()
    outs: dict[str, list] = {}
    try:
        with torch.no_grad():
            for images in tqdm(loader, desc="predict", disable=not progress, leave=False):
                images = trainer.images.eval_images(images)
                if tcfg["channels_last"]:
                    images = images.contiguous(memory_format=torch.channels_last)
                with trainer.autocast():
                    logits = trainer.method.predict(trainer.model, images)
                for name in heads:
                    if name not in logits:
                        raise NoisyMLTError(f"head {name!r} is not among the run's: {', '.join(logits)}")
                    outs.setdefault(name, []).append(torch.sigmoid(logits[name].float()).cpu().numpy())
    except Exception as exc:
        # A loader worker's error comes back as its own type (a NoisyMLTError too) whose text is "Caught ... in
        # DataLoader worker process N", then the worker's traceback, ending in the original line.
        text = str(exc).strip().splitlines()
        if len(text) > 1 and "NoisyMLTError: " in text[-1]:
            raise NoisyMLTError(text[-1].split("NoisyMLTError: ", 1)[1]) from None
        raise
    return {name: np.concatenate(outs[name]) for name in heads}
