"""`noisymlt export`: a finished run's model as TorchScript, a torch.export program and ONNX, each checked against the
run's own scores.

The exported graph is the run's network with its method's prediction for one head (the reported one unless
``--head``: a two-branch method's ensemble mixes its branches' logits inside it) and the sigmoid: normalised images
in, per-class scores out, float32, any batch size. What comes before it, the decoding and resizing of
noisymlt.inference.run_model (``transform_of``), is written step by step in ``model.json`` beside it, with the
input size, mean and std, the classes in output order, the run, its run id and checkpoint, and each file's sha256.

Each file is checked before the command succeeds: the first images (up to 16) of the run's test table, put
through the run's test-time transform, go through the exported model on the CPU, and its scores must equal the
run's predictions.npz within a tolerance: TorchScript and the exported program (``model.pt2``, torch.export.save;
load it with torch.export.load(...).module(): PyTorch deprecates TorchScript from 2.14 on) 1e-6, ONNX Runtime 1e-5
(absolute, on scores in [0, 1]);
the largest difference found is recorded. The tolerances bound float32 kernel differences, not model changes:
the traced graph runs PyTorch's own kernels, ONNX Runtime its own convolutions and reductions (on a ResNet-18 here
3e-7 at most). A run predicted in another precision (bf16 autocast on a GPU) is checked against an fp32 forward of
the run's own model instead, and model.json says so.

ONNX needs the ``onnx`` and ``onnxscript`` packages (the torch.export-based exporter) and ``onnxruntime`` for the
check; all three are in the project's environment. ``--formats torchscript exported_program`` skips it.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError

TOLERANCE = {"torchscript": 1e-6, "exported_program": 1e-6, "onnx": 1e-5}
# Where PIL does the last resize (transform's without_torch): up to 2 of 255 differ on some pixels, which moves a
# score by far less than this on the models here; recorded beside the difference measured on the check images
WITHOUT_TORCH_TOLERANCE = 1e-2
FILES = {"torchscript": "model.torchscript.pt", "exported_program": "model.pt2", "onnx": "model.onnx"}
CHECK_IMAGES = 16


def scores_module(trainer, head: str):
    """The run's network and its method's ``head`` prediction, with the sigmoid, as one eval-mode module."""
    import torch

    class Scores(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = trainer.model

        def forward(self, images):
            return torch.sigmoid(trainer.method.predict(self.model, images)[head].float())

    return Scores().eval()


def check_images(trainer):
    """The first test images as the run's eval dataset yields them (before the device's part of the transform)
    and as the exported model takes them (the run's test-time transform, normalised)."""
    import torch

    dataset = trainer.images.eval_dataset("test")
    batch = torch.stack([dataset[i] for i in range(min(CHECK_IMAGES, len(dataset)))])
    return batch, trainer.images.eval_images(batch).float().cpu().contiguous()


def pil_resized(trainer, batch):
    """The check images (``batch``, as the eval dataset yields them) with their last resize done by PIL (transform's
    ``without_torch``), normalised; None where the run's transform has no such step."""
    import torch
    from PIL import Image

    from noisymlt.training.transforms import IMAGENET_MEAN, IMAGENET_STD

    size = int(trainer.cfg["train"]["image_size"])
    if batch.dtype != torch.uint8 or batch.shape[-1] == size:
        return None
    resized = [np.asarray(Image.fromarray(row.permute(1, 2, 0).numpy()).resize((size, size), Image.BILINEAR),
                          dtype=np.float32).transpose(2, 0, 1) for row in batch]
    mean = np.asarray(IMAGENET_MEAN, np.float32)[None, :, None, None]
    std = np.asarray(IMAGENET_STD, np.float32)[None, :, None, None]
    return torch.from_numpy(np.ascontiguousarray((np.stack(resized) - mean) / std))


def export_torchscript(module, example, path: Path) -> None:
    import torch

    with torch.no_grad():  # no gradient: the models pool by a plain mean, which tracing sees
        traced = torch.jit.trace(module, (example,), check_trace=False)
    traced.save(str(path))


def run_torchscript(path: Path, images) -> np.ndarray:
    import torch

    loaded = torch.jit.load(str(path), map_location="cpu").eval()
    with torch.no_grad():
        return loaded(images).numpy()


def export_program(module, example, path: Path) -> None:
    import torch

    with torch.no_grad():  # no gradient: the models pool by a plain mean, which tracing sees
        program = torch.export.export(module, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    torch.export.save(program, str(path))


def run_program(path: Path, images) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch.export.load(str(path)).module()(images).numpy()


def export_onnx(module, example, path: Path) -> None:
    import io

    import torch

    import logging

    for name in ("onnx_ir", "onnxscript"):  # each optimisation pass logs a line at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    batch = torch.export.Dim("batch", min=1)
    # no gradient, as above; the exporter's progress lines are not shown
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(module, (example,), str(path), input_names=["images"], output_names=["scores"],
                          dynamic_shapes=({0: batch},), dynamo=True, verbose=False,
                          external_data=False)  # one file, weights inside (ONNX's 2 GB limit: a ResNet-50 is 0.1 GB)


def run_onnx(path: Path, images) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]


def _onnx_missing() -> str | None:
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
    return f"ONNX needs the package(s) {', '.join(missing)} (pip install them)" if missing else None


WRITERS = {"torchscript": (export_torchscript, run_torchscript), "exported_program": (export_program, run_program),
           "onnx": (export_onnx, run_onnx)}


def export_run(run: Path, out: Path, *, head: str | None = None, formats=tuple(FILES)) -> dict:
    """Write the run's model in ``formats`` into OUT with model.json; returns that record."""
    import torch

    from noisymlt.core.files import read_json, replacing, write_json
    from noisymlt.core.manifest import file_sha256
    from noisymlt.inference.run_model import check_run_outputs, load_run, recorded_heads, transform_of

    if out.exists() and not out.is_dir():
        raise NoisyMLTError(f"--out {out}: a file; export writes a folder (model.json and the models)")
    check_run_outputs(run, {}, {f"--out's {name}": out / name for name in (*FILES.values(), "model.json")})
    heads = recorded_heads(run)
    head = head or heads[0]
    if head not in heads:
        raise NoisyMLTError(f"--head {head}: the run's heads are {', '.join(heads)}")
    if "onnx" in formats and (why := _onnx_missing()):
        raise NoisyMLTError(f"{why}, or export --formats torchscript exported_program")
    trainer = load_run(run, device="cpu")
    module = scores_module(trainer, head)
    rows, images = check_images(trainer)
    count = len(rows)
    with np.load(Path(run) / "predictions.npz", allow_pickle=False) as npz:
        recorded = npz[f"scores_{head}"][:count]
    # the run's scores are another device's or precision's (a GPU, bf16): check against its own fp32 forward
    ran_on = str(read_json(Path(run) / "manifest.json").get("device", "cpu"))
    precision = trainer.precision if ran_on == "cpu" else f"{ran_on}'s precision"
    if precision != "fp32":
        with torch.no_grad():
            recorded = module(images).numpy()
    out.mkdir(parents=True, exist_ok=True)
    record = {"run": str(run), "run_id": trainer.run_id, "checkpoint_sha256": trainer.checkpoint_sha256,
              "code_digest": trainer.code_digest, "method": trainer.cfg["method"], "head": head,
              "classes": list(trainer.train_table.classes),
              "input": {"name": "images", "shape": ["batch", 3, transform_of(trainer.cfg)["image_size"],
                                                    transform_of(trainer.cfg)["image_size"]]},
              "output": {"name": "scores", "shape": ["batch", len(trainer.train_table.classes)],
                         "meaning": "sigmoid score a class, in the order of 'classes'"},
              "transform": transform_of(trainer.cfg),
              "checked": {"images": f"the first {count} of the run's test table",
                          "against": "predictions.npz" if precision == "fp32" else
                          f"an fp32 forward of the run's model (the run predicted in {precision})"},
              "files": {}}
    by_pil = pil_resized(trainer, rows)
    if by_pil is not None:
        with torch.no_grad():
            record["transform"]["without_torch_max_abs_difference"] = float(np.abs(module(by_pil).numpy()
                                                                                  - recorded).max())
        record["transform"]["without_torch_tolerance"] = WITHOUT_TORCH_TOLERANCE
    # Every file is written and checked under a temporary name; they reach their names together once all are
    # checked, model.json last (an interrupt or a failed check leaves none of them, and an earlier export whole).
    with contextlib.ExitStack() as whole:
        record_tmp = whole.enter_context(replacing(out / "model.json"))
        for fmt in formats:
            path = out / FILES[fmt]
            tmp = whole.enter_context(replacing(path, out / f".{FILES[fmt]}.tmp{path.suffix}"))
            write, run_file = WRITERS[fmt]
            write(module, images, tmp)
            got = run_file(tmp, images)
            diff = float(np.abs(got - recorded).max())
            if not diff <= TOLERANCE[fmt]:
                raise NoisyMLTError(f"{path}: its scores differ from the run's by {diff:.3g} on the check images, "
                                    f"more than the {TOLERANCE[fmt]:g} allowed; the file is not a faithful export")
            record["files"][fmt] = {"file": path.name, "sha256": file_sha256(tmp), "max_abs_difference": diff,
                                    "tolerance": TOLERANCE[fmt]}
        write_json(record_tmp, record)
    return record


def _cmd_export(args: argparse.Namespace) -> int:
    record = export_run(Path(args.run), Path(args.out), head=args.head, formats=tuple(args.formats))
    for fmt, rec in record["files"].items():
        print(f"{fmt}: {Path(args.out) / rec['file']} (largest difference from the run's scores "
              f"{rec['max_abs_difference']:.2g}, allowed {rec['tolerance']:g})")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "export", help="a finished run's model as TorchScript, torch.export and ONNX, checked against its scores",
        description="Export a finished run's model (network, the method's prediction for one head, sigmoid) as "
                    "TorchScript, a torch.export program and ONNX, each checked against the run's predictions.npz, "
                    "with model.json "
                    "beside them: input size, mean and std, the preprocessing steps, the classes.")
    p.add_argument("--run", required=True, help="a finished run's folder (runs/DATASET/gGAMMA/sSEED/METHOD)")
    p.add_argument("--out", required=True,
                   help="the folder to write model.torchscript.pt, model.pt2, model.onnx and model.json")
    p.add_argument("--head", help="the head to export (default: the run's reported head)")
    p.add_argument("--formats", nargs="+", choices=list(FILES), default=list(FILES),
                   help="what to write (default: all three)")
    p.set_defaults(func=_cmd_export)
