"""`noisymlt export` (noisymlt.inference.export): a run's model as TorchScript, a torch.export program and ONNX.

For a run of each method family (conftest's tiny_runs_project), the exported files are loaded as a user loads them
(torch.jit.load, torch.export.load, onnxruntime) and fed every test image, preprocessed here from model.json's own words (sizes,
filters, mean, std): their scores equal the run's predictions.npz within the tolerance model.json states.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import copy_build, tool_env

RUN = "runs/toy/g0.5/s0/{}"
IMAGES = "data/raw/toy/VOCdevkit/TOY"


@pytest.fixture(scope="module")
def project(tiny_runs_project, tmp_path_factory):
    return copy_build(tiny_runs_project, tmp_path_factory.mktemp("export") / "project")


def _preprocess(files, record: dict):
    """The images as model.json says to prepare them, written from its fields, not from the package's code."""
    import torch
    from PIL import Image
    from torchvision.transforms.v2 import functional as F

    transform = record["transform"]
    size = transform["image_size"]
    cache = transform["cache_size"]
    mean = torch.tensor(transform["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(transform["std"]).view(1, 3, 1, 1)
    batch = []
    for path in files:
        with Image.open(path) as img:
            rgb = img.convert("RGB").resize((cache, cache), Image.BILINEAR)
        batch.append(torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1))
    images = F.resize(torch.stack(batch), [size, size], antialias=True)
    return ((images.float() - mean) / std).contiguous()


@pytest.mark.parametrize("method", ["erm", "bbn", "mlgcn", "dividemix", "ours"])
def test_the_exported_model_gives_the_runs_scores(project, tmp_path, method):
    import onnxruntime
    import torch

    from noisymlt.data.labels import read_labels

    out = tmp_path / "export"
    done = subprocess.run([sys.executable, "-m", "noisymlt", "export", "--run", RUN.format(method), "--out", str(out)],
                          cwd=project, env=tool_env(project), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "model.json").read_text())
    assert set(record["files"]) == {"torchscript", "exported_program", "onnx"}
    with np.load(project / RUN.format(method) / "predictions.npz") as npz:
        head = str(npz["heads"][0])
        expected = npz[f"scores_{head}"]
    assert record["head"] == head and record["classes"] == list(read_labels(project / "data/toy/test_labels.parquet").classes)
    test = read_labels(project / "data/toy/test_labels.parquet")
    images = _preprocess([project / IMAGES / p for p in test.paths], record)
    assert list(images.shape[1:]) == record["input"]["shape"][1:]
    with torch.no_grad(), pytest.warns(FutureWarning, match="deprecated"):  # TorchScript, as PyTorch 2.14 says
        scripted = torch.jit.load(str(out / record["files"]["torchscript"]["file"])).eval()(images).numpy()
    with torch.no_grad():
        program = torch.export.load(str(out / record["files"]["exported_program"]["file"])).module()(images).numpy()
    session = onnxruntime.InferenceSession(str(out / record["files"]["onnx"]["file"]), providers=["CPUExecutionProvider"])
    onnx_scores = session.run(None, {record["input"]["name"]: images.numpy()})[0]
    for fmt, got in (("torchscript", scripted), ("exported_program", program), ("onnx", onnx_scores)):
        # on the test set whole, in one batch (the run scored batches of 64): float32 rounding, no more
        tolerance = record["files"][fmt]["tolerance"]
        assert got.shape == expected.shape and np.abs(got - expected).max() <= tolerance, (fmt, np.abs(got - expected).max())
        assert record["files"][fmt]["max_abs_difference"] <= tolerance


def test_an_unknown_head_or_format_is_refused_in_one_line(project, tmp_path):
    for args, says in ((["--head", "ensemble"], "the run's heads are main"),
                       (["--formats", "pickle"], "invalid choice")):
        done = subprocess.run([sys.executable, "-m", "noisymlt", "export", "--run", RUN.format("erm"), "--out",
                               str(tmp_path / "x"), *args], cwd=project, env=tool_env(project), capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert not (tmp_path / "x").exists()
