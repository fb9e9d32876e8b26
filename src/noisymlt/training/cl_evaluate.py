"""`noisymlt eval-cl-checkpoint`: a checkpoint of [CL]'s own training, evaluated on this project's test set.

[CL] (github.com/VamosC/CoLearning-meet-StitchUp) publishes the models behind its README's numbers (VOC-MLT-Noise
0.5: 69.67 mAP). This command checks the file's sha256 before it reads anything, converts it into our two-branch
model with noisymlt.models.cl_checkpoint (the same network, key by key), predicts every image of the test label
table in batches (streamed from disk, never the whole set in memory) and writes, in ``--out``:

- ``predictions.npz``: the format of a training run's (noisymlt.evaluation.evaluate), heads ``ensemble``,
  ``random`` and ``balanced`` as Ours' (noisymlt.methods.colearning: predict), sigmoid scores; the ensemble mixes
  the logits as [CL]'s ``simple_test`` does, ``alpha * random + (1 - alpha) * balanced`` with its test_cfg.alpha
  0.1 (CL_TEST_ALPHA, our tau);
- ``metrics.json`` and ``map.json``: what ``noisymlt evaluate`` writes for a run (AP per class, mAP total / head /
  medium / tail per head), with the checkpoint's name and sha256;
- ``manifest.json``: the inputs (the checkpoint among them) with their sha256, the outputs, the code, the device,
  the converted architecture and the transform.

The test-time transform is [CL]'s, not the one our runs are evaluated with. [CL]'s test pipeline
(configs/{voc,coco}/LT_dual_resnet50.py, ``data.test``; mllt/datasets/custom.py ``prepare_test_img`` and
mllt/datasets/transforms.py ``ImageTransform``) reads the image with mmcv (OpenCV: BGR, EXIF orientation applied),
resizes it to 224 x 224 with ``mmcv.imresize`` (``cv2.resize``, INTER_LINEAR: bilinear on pixel centres without
antialiasing, uint8 result), normalises it (``to_rgb``, mean 123.675 116.28 103.53, std 58.395 57.12 57.375), pads
it to a multiple of 32 (``size_divisor``; 224 needs none) and never flips it. Our eval transform
(noisymlt.training.transforms: eval_transform) resizes with PIL's bilinear filter, which antialiases when it shrinks
an image: on a 500 x 375 VOC image the two give different pixels, so a checkpoint evaluated through ours would not
be [CL]'s model as its authors measured it. Here (``cl_test_tensor``): PIL decodes the file (RGB) with its EXIF
orientation applied, torch's ``interpolate(mode="bilinear", align_corners=False, antialias=False)`` resizes it (the
same sampling positions and weights as OpenCV's INTER_LINEAR), the result is rounded to 0-255 (halves up) as
OpenCV's uint8 output is, then normalised and padded as [CL] does. Two differences remain, both about one grey
level at most: OpenCV computes INTER_LINEAR on uint8 in 11-bit fixed point (its rounding differs from a float's on
some pixels), and its JPEG decoder and PIL's may differ in a pixel's last bit; neither was measured against OpenCV
here (it is not a dependency of this project). tests/test_cl_evaluate.py holds the transform to a numpy
transcription of mmcv's pipeline: the same pixels but for one grey level on under 1% of them. The network runs in float32 (TF32 off on a GPU, as [CL]'s torch 1.4 had none).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.models.cl_checkpoint import CL_TEST_ALPHA, PRETRAINED_MODELS

# [CL]'s test pipeline (configs/{voc,coco}/LT_dual_resnet50.py: data.test, img_norm_cfg)
CL_IMAGE_SIZE = 224  # img_scale (224, 224), resize_keep_ratio=False
CL_SIZE_DIVISOR = 32  # size_divisor: padded (bottom, right, zeros after normalising) to a multiple of it
CL_MEAN = (123.675, 116.28, 103.53)  # RGB (to_rgb=True), on 0-255 pixels
CL_STD = (58.395, 57.12, 57.375)
HEADS = ("ensemble", "random", "balanced")  # as noisymlt.methods.colearning's predict names them, in its order
TRANSFORM = ("[CL]'s test pipeline: decode (RGB, EXIF orientation applied), bilinear resize to SxS without "
             "antialiasing (OpenCV INTER_LINEAR's sampling), rounded to 0-255, (x - mean) / std with mean "
             f"{list(CL_MEAN)} and std {list(CL_STD)}, zero padding to a multiple of {CL_SIZE_DIVISOR}, no flip")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def check_sha256(path: str | Path, expected: str) -> str:
    """The file's sha256 when it is ``expected``; else an error, one line, naming the file and both digests."""
    from noisymlt.core.manifest import file_sha256

    path = Path(path)
    want = str(expected).strip().lower()
    if not _HEX64.fullmatch(want):
        raise NoisyMLTError(f"--sha256 {expected!r}: not a sha256 (64 hexadecimal digits; `sha256sum {path}` prints "
                            "it)")
    if not path.is_file():
        raise NoisyMLTError(f"{path}: [CL] checkpoint does not exist ({PRETRAINED_MODELS})")
    got = file_sha256(path)
    if got != want:
        raise NoisyMLTError(f"{path}: sha256 {got} is not the expected {want}; a different or damaged file, "
                            "nothing was read or written")
    return got


def _decode(path: Path):
    """The image as RGB, its EXIF orientation applied (as OpenCV's imread, which [CL] reads with, applies it)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return ImageOps.exif_transpose(img).convert("RGB")
    except FileNotFoundError as exc:
        raise NoisyMLTError(f"{path}: image file is missing") from exc
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise NoisyMLTError(f"{path}: corrupt or unreadable image ({exc})") from exc


def cl_test_tensor(pixels: np.ndarray, size: int = CL_IMAGE_SIZE):
    """[CL]'s test transform of one RGB uint8 (H, W, 3) image: a float32 (3, S', S') tensor, S' = ``size`` rounded up
    to a multiple of CL_SIZE_DIVISOR (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.array(pixels, dtype=np.uint8)).permute(2, 0, 1)[None].double()  # float64: ties stay ties
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    x = (x + 0.5).floor_().clamp_(0, 255)[0].float()  # OpenCV returns a uint8 image for a uint8 one, ties rounded up
    x = (x - torch.tensor(CL_MEAN).view(3, 1, 1)) / torch.tensor(CL_STD).view(3, 1, 1)
    pad = -size % CL_SIZE_DIVISOR
    return F.pad(x, (0, pad, 0, pad)) if pad else x


class CLTestImages:
    """The test images, each read and transformed when a loader asks for it (a map-style dataset: torch's
    DataLoader needs only __len__ and __getitem__, so this module imports no torch until it runs)."""

    def __init__(self, root: str | Path, paths: list[str], size: int = CL_IMAGE_SIZE):
        self.root, self.paths, self.size = Path(root), list(paths), int(size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return cl_test_tensor(np.asarray(_decode(self.root / self.paths[i])), self.size)


def predict(model, images: CLTestImages, device, batch_size: int, workers: int, progress: bool = True
            ) -> dict[str, np.ndarray]:
    """Sigmoid scores of every image per head (HEADS), batch by batch."""
    import torch
    from tqdm import tqdm

    from noisymlt.models.twobranch import ensemble_logits
    from noisymlt.training.loaders import eval_loader

    loader = eval_loader(images, batch_size, workers, device.type == "cuda")
    model = model.to(device).eval()
    outs: dict[str, list] = {head: [] for head in HEADS}
    with torch.no_grad(), tqdm(total=len(images), unit="img", desc="[CL] checkpoint on the test set",
                               disable=not progress) as bar:
        for batch in loader:
            logits = model(batch.to(device, non_blocking=True))
            f, g = logits["random"].float(), logits["balanced"].float()
            for head, z in zip(HEADS, (ensemble_logits(f, g, CL_TEST_ALPHA), f, g)):
                outs[head].append(torch.sigmoid(z).cpu().numpy())
            bar.update(len(batch))
    return {head: np.concatenate(v) if v else np.zeros((0, 0), np.float32) for head, v in outs.items()}


def _check_paths(table, test_labels: str | Path, test_images: str | Path) -> None:
    """Every test image inside ``test_images`` once resolved, and no file twice (noisymlt.data.userpaths), before
    minutes of predictions."""
    from noisymlt.data.userpaths import ImageFolder

    if not Path(test_images).is_dir():
        raise NoisyMLTError(f"{test_images}: the test images folder does not exist")
    folder = ImageFolder(test_images)
    for i, (image_id, relative) in enumerate(zip(table.image_ids, table.paths)):
        file, problem = folder.locate(relative)
        problem = problem or folder.claim(file, f"row {i + 1}", relative)
        if problem:
            raise NoisyMLTError(f"{test_labels} row {i + 1}, image {image_id!r}: {problem}")


def _same_classes(cl_meta: dict, classes: list[str], source: str) -> None:
    """A checkpoint whose meta names its classes (mmcv saves CLASSES when the model has them) must list the test
    table's, in its order: a permuted class list would score every AP against another class's labels."""
    named = cl_meta.get("CLASSES")
    if not isinstance(named, (list, tuple)) or not all(isinstance(c, str) for c in named):
        return
    norm = [re.sub(r"[\s_]+", "", c.lower()) for c in named]
    ours = [re.sub(r"[\s_]+", "", c.lower()) for c in classes]
    if norm != ours:
        first = next((i for i, (a, b) in enumerate(zip(norm, ours)) if a != b), min(len(norm), len(ours)))
        raise NoisyMLTError(f"{source}: its meta lists {len(named)} classes that are not the test table's "
                            f"{len(classes)} in its order (first difference at index {first})")


def evaluate_checkpoint(checkpoint: str | Path, sha256: str, test_labels: str | Path, test_images: str | Path,
                        split: str | Path, out: str | Path, *, device: str = "auto", batch_size: int = 32,
                        image_size: int = CL_IMAGE_SIZE, cores: int | None = None, progress: bool = True) -> dict:
    """Check, convert, predict, evaluate and write (module docstring); returns metrics.json's content."""
    import torch

    from noisymlt.core.codedeps import CLI, digest
    from noisymlt.core.files import check_outputs, replacing, write_json
    from noisymlt.core.manifest import now, write_manifest
    from noisymlt.data.labels import read_class_split, read_labels
    from noisymlt.evaluation.evaluate import evaluate_predictions, map_summary
    from noisymlt.models.cl_checkpoint import build_from_cl, infer_architecture, read_cl_checkpoint
    from noisymlt.training.devices import select_device
    from noisymlt.training.loaders import available_cores, resolve_workers

    started = now()
    out = Path(out)
    written = {name: out / name for name in ("predictions.npz", "metrics.json", "map.json", "manifest.json")}
    check_outputs({"--checkpoint": checkpoint, "--test-labels": test_labels, "--split": split},
                  {f"--out {name}": path for name, path in written.items()})
    sha = check_sha256(checkpoint, sha256)  # first: nothing else is read from a file that is not the one named
    if batch_size < 1 or image_size < 16:
        raise NoisyMLTError(f"--batch-size {batch_size} / --image-size {image_size}: need at least 1 and 16")
    table = read_labels(test_labels)
    read_class_split(split)  # a bad split fails before the predictions take minutes
    if table.paths is None:
        raise NoisyMLTError(f"{test_labels}: no 'path' column; the test images cannot be found")
    _check_paths(table, test_labels, test_images)
    state, cl_meta = read_cl_checkpoint(checkpoint)
    arch = infer_architecture(state, str(checkpoint))
    if arch["num_classes"] != len(table.classes):
        raise NoisyMLTError(f"{checkpoint}: a model of {arch['num_classes']} classes; {test_labels} has "
                            f"{len(table.classes)}: a checkpoint of another dataset")
    _same_classes(cl_meta, table.classes, str(checkpoint))
    model, dropped = build_from_cl(state, source=str(checkpoint))
    del state

    dev = select_device(device)
    cores = cores or available_cores()
    if dev.type == "cpu":
        torch.set_num_threads(cores)
    else:  # float32 as [CL] ran it (torch 1.4 had no TF32)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    workers = resolve_workers("auto", cores, cores if dev.type == "cpu" else 1, dev.type == "cuda")
    t0 = time.perf_counter()
    scores = predict(model, CLTestImages(test_images, table.paths, image_size), dev, batch_size, workers, progress)
    seconds = time.perf_counter() - t0

    pred_path = written["predictions.npz"]
    out.parent.mkdir(parents=True, exist_ok=True)
    # the predictions are scored from a file beside the folder, moved in once they pass: a checkpoint whose scores
    # are refused (non-finite) leaves the folder as it was, never new predictions beside old metrics
    with replacing(pred_path, out.parent / f".{out.name}.predictions.tmp.npz") as tmp:  # numpy keeps a .npz name
        np.savez_compressed(tmp, image_ids=np.array(table.image_ids), heads=np.array(list(HEADS)),
                            checkpoint_sha256=np.array(sha), code_digest=np.array(digest(*CLI, __name__)),
                            **{f"scores_{k}": v for k, v in scores.items()})
        result = evaluate_predictions(tmp, Path(test_labels), Path(split))
        out.mkdir(exist_ok=True)
    result["checkpoint"] = {"file": Path(checkpoint).name, "sha256": sha}
    metrics = write_json(out / "metrics.json", result)
    map_path = write_json(out / "map.json", map_summary(result))
    write_manifest(
        out / "manifest.json", step="eval-cl-checkpoint", started=started, device=str(dev),
        inputs={"checkpoint": checkpoint, "test_labels": test_labels, "split": split},
        outputs={"predictions": pred_path, "metrics": metrics, "map": map_path}, code=(*CLI, __name__),
        extra={"checkpoint": {"file": Path(checkpoint).name, "sha256": sha, **arch, "dropped_keys": dropped,
                              "cl_meta": {k: v for k, v in cl_meta.items() if isinstance(v, (str, int, float, bool))}},
               "test_images": str(test_images), "image_size": int(image_size), "transform": TRANSFORM,
               "heads": list(HEADS), "tau": CL_TEST_ALPHA},
        timing={"predict_seconds": round(seconds, 3), "images": len(table), "batch_size": batch_size,
                "loader_workers": workers})
    return result


def _cmd(args: argparse.Namespace) -> int:
    result = evaluate_checkpoint(args.checkpoint, args.sha256, args.test_labels, args.test_images, args.split,
                                 args.out, device=args.device, batch_size=args.batch_size, image_size=args.image_size,
                                 cores=args.cores, progress=not args.no_progress)
    print(f"{args.out}: [CL]'s {result['checkpoint']['file']} on {result['num_test_images']} test images "
          f"(mAP %, as [CL]'s README reports them):")
    for head, rec in result["heads"].items():
        m = {g: 100 * v for g, v in rec["map"].items()}
        print(f"{head:>10}: mAP {m['total']:.2f} (head {m['head']:.2f}, medium {m['medium']:.2f}, "
              f"tail {m['tail']:.2f})")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval-cl-checkpoint",
        help="evaluate a checkpoint of [CL]'s code (epoch_8.pth) on the test set, as a run is evaluated",
        description=(
            "Check a checkpoint of [CL]'s StitchUpClassifier against its sha256, convert it into this project's "
            "two-branch model (as convert-cl-checkpoint does), predict every image of the test label table with "
            "[CL]'s own test-time transform (bilinear resize to 224 x 224 without antialiasing, [CL]'s "
            "normalisation) and write OUT/predictions.npz (heads ensemble, random, balanced: the ensemble is "
            f"{CL_TEST_ALPHA} * random + {1 - CL_TEST_ALPHA:.1f} * balanced on the logits, [CL]'s test_cfg.alpha), "
            "OUT/metrics.json and OUT/map.json (what `noisymlt evaluate` writes for a run) and OUT/manifest.json. "
            "The ensemble's mAP is the number [CL]'s README reports for its model (VOC-MLT-Noise 0.5: 69.67). "
            f"Where to get one: {PRETRAINED_MODELS}."),
    )
    p.add_argument("--checkpoint", required=True, type=Path,
                   help="[CL]'s checkpoint, e.g. checkpoints/voc_0.5_epoch_8.pth")
    p.add_argument("--sha256", required=True,
                   help="the file's expected sha256 (`sha256sum FILE`), checked before anything is read")
    p.add_argument("--test-labels", required=True, type=Path, help="the clean test label table, "
                                                                   "data/DATASET/test_labels.parquet")
    p.add_argument("--test-images", required=True, type=Path,
                   help="the folder the test table's paths are relative to (VOC: data/raw/voc/VOCdevkit/VOC2007)")
    p.add_argument("--split", required=True, type=Path,
                   help="head/medium/tail class split, data/DATASET/class_split.json")
    p.add_argument("--out", required=True, type=Path, help="output folder, runs/DATASET/authors/NAME")
    p.add_argument("--device", default="auto", help="auto (a GPU when there is one, else the CPU), cpu or cuda:N")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass (default 32; BatchNorm runs "
                                                              "in eval mode, so it changes no score)")
    p.add_argument("--image-size", type=int, default=CL_IMAGE_SIZE,
                   help=f"side of the resized image (default {CL_IMAGE_SIZE}, [CL]'s img_scale)")
    p.add_argument("--cores", type=int, default=None,
                   help="CPU cores this job may use: torch threads on the CPU, image-reading workers on a GPU "
                        "(default: the cores this process was given)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd)
