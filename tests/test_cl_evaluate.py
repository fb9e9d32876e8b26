"""`noisymlt eval-cl-checkpoint`: a checkpoint of [CL]'s code evaluated on a test set gives [CL]'s network's scores
and the mAP of those scores, and the workflow step that runs it.

[CL]'s network is rebuilt in tests/cl_network.py, with mmcv's ResNet-18 (BasicBlocks) in place of its ResNet-50
(same key layout, a fraction of the time), and its test-time ensemble transcribed from its
StitchUpClassifier.simple_test (0.1 * random + 0.9 * balanced, test_cfg.alpha). Its test pipeline (mmcv.imread,
imresize, imnormalize, impad_to_multiple) is transcribed in numpy, independently of the command's torch version.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from cl_network import mmcv_checkpoint, randomise, stitchup_classifier18
from noisymlt.cli import main
from noisymlt.data.labels import LabelTable, read_labels, write_labels

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog", "bird", "fish"]
CL_MEAN = np.array([123.675, 116.28, 103.53], np.float32)  # configs/voc/LT_dual_resnet50.py, img_norm_cfg
CL_STD = np.array([58.395, 57.12, 57.375], np.float32)


# ------------------------------------------------------------------ [CL]'s test pipeline, in numpy
def _cv2_linear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """cv2.resize(INTER_LINEAR) as its table is built (imgproc resize.cpp): source position (d + 0.5) * scale - 0.5,
    clamped at the borders, two taps per axis; rounded to uint8 half up, as its fixed-point result."""
    def taps(n_in: int, n_out: int):
        f = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        s = np.floor(f).astype(int)
        a = f - s
        a[s < 0], s[s < 0] = 0.0, 0
        a[s >= n_in - 1], s[s >= n_in - 1] = 0.0, n_in - 1
        return s, np.minimum(s + 1, n_in - 1), a

    y0, y1, ay = taps(img.shape[0], height)
    x0, x1, ax = taps(img.shape[1], width)
    src = img.astype(np.float64)
    rows = src[y0] * (1 - ay)[:, None, None] + src[y1] * ay[:, None, None]
    out = rows[:, x0] * (1 - ax)[None, :, None] + rows[:, x1] * ax[None, :, None]
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)


def _mmcv_test_image(rgb: np.ndarray, size: int) -> np.ndarray:
    """CustomDataset.prepare_test_img: mmcv.imread (BGR), ImageTransform (imresize to (size, size), imnormalize
    with to_rgb, impad_to_multiple(32) with zeros, CHW)."""
    bgr = rgb[..., ::-1]
    img = _cv2_linear(bgr, size, size)
    img = (img[..., ::-1].astype(np.float32) - CL_MEAN) / CL_STD
    side = -(-size // 32) * 32
    padded = np.zeros((side, side, 3), np.float32)
    padded[:size, :size] = img
    return padded.transpose(2, 0, 1)


# ------------------------------------------------------------------ a tiny test set
SIZES = [(375, 500), (500, 333), (224, 224), (60, 80), (17, 23), (300, 301), (123, 45), (448, 448), (90, 400),
         (33, 33), (250, 180), (1000, 20)]  # (height, width): shrunk, kept and enlarged ones


def _labels(n: int) -> np.ndarray:
    y = (np.random.default_rng(5).random((n, len(CLASSES))) < 0.4).astype(np.uint8)
    y[np.arange(n), np.arange(n) % len(CLASSES)] = 1  # every class positive somewhere
    y[np.arange(n), (np.arange(n) + 1) % len(CLASSES)] = 0  # and negative somewhere
    return y


def write_test_set(root: Path) -> dict:
    """12 PNG images of assorted sizes (smooth gradients plus noise), their label table and a class split."""
    from PIL import Image

    rng = np.random.default_rng(3)
    (root / "images").mkdir(parents=True)
    paths = []
    for i, (h, w) in enumerate(SIZES):
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 / max(w - 1, 1), yy * 255 / max(h - 1, 1), (xx + yy) % 256], -1)
        pixels = np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
        paths.append(f"images/im{i:02d}.png")
        Image.fromarray(pixels).save(root / paths[-1])
    table = LabelTable(image_ids=[f"im{i:02d}" for i in range(len(SIZES))], classes=CLASSES,
                       labels=_labels(len(SIZES)), paths=paths)
    write_labels(table, root / "test_labels.parquet")
    split = {"head": [0, 1], "medium": [2], "tail": [3]}
    (root / "class_split.json").write_text(json.dumps(split))
    return {"labels": root / "test_labels.parquet", "split": root / "class_split.json", "images": root,
            "table": table, "groups": split}


@pytest.fixture(scope="module")
def cl_model():
    torch.manual_seed(0)
    return randomise(stitchup_classifier18(len(CLASSES)), seed=7)


@pytest.fixture(scope="module")
def test_set(tmp_path_factory):
    return write_test_set(tmp_path_factory.mktemp("testset"))


@pytest.fixture(autouse=True)
def torch_threads():
    """The command sets torch's thread count (--cores): give the rest of the session its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _checkpoint(model: nn.Module, path: Path) -> str:
    mmcv_checkpoint(model, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _argv(test_set: dict, checkpoint: Path, digest: str, out: Path, *extra: str) -> list[str]:
    return ["eval-cl-checkpoint", "--checkpoint", str(checkpoint), "--sha256", digest, "--test-labels",
            str(test_set["labels"]), "--test-images", str(test_set["images"]), "--split", str(test_set["split"]),
            "--out", str(out), "--device", "cpu", "--cores", "2", "--no-progress", *extra]


# ------------------------------------------------------------------ the transform
def test_the_transform_is_cls_test_pipeline_not_ours(test_set):
    from PIL import Image

    from noisymlt.training.cl_evaluate import cl_test_tensor
    from noisymlt.training.transforms import eval_transform

    for rel in test_set["table"].paths[:6]:
        rgb = np.asarray(Image.open(test_set["images"] / rel).convert("RGB"))
        for size in (224, 40):  # [CL]'s size, and one it pads
            got = cl_test_tensor(rgb, size).numpy()
            want = _mmcv_test_image(rgb, size)
            assert got.shape == want.shape == (3, -(-size // 32) * 32, -(-size // 32) * 32)
            # one grey level at most (a tie rounded the other way in float32), on a few pixels
            diff = np.abs(got - want) * CL_STD[:, None, None]
            assert diff.max() <= 1.0 + 1e-3 and (diff > 1e-3).mean() < 0.01, (rel, size, diff.max())
            assert (got[:, size:, :] == 0).all() and (got[:, :, size:] == 0).all()  # padded with zeros
    # ours (PIL's bilinear filter, which antialiases a shrunk image) gives other pixels on a 500 x 375 image
    rgb = np.asarray(Image.open(test_set["images"] / test_set["table"].paths[0]).convert("RGB"))
    ours = eval_transform(Image.fromarray(rgb), 224).numpy()  # ImageNet's mean and std: [CL]'s numbers / 255
    assert np.abs(ours - cl_test_tensor(rgb, 224).numpy()).mean() > 0.05


def test_the_exif_orientation_is_applied_as_opencv_does(tmp_path):
    from PIL import Image

    from noisymlt.training.cl_evaluate import _decode

    pixels = np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(pixels).save(tmp_path / "rotated.jpg", exif=exif)
    stored = np.asarray(Image.open(tmp_path / "rotated.jpg").convert("RGB"))  # the pixels as the file holds them
    got = np.asarray(_decode(tmp_path / "rotated.jpg"))
    assert got.shape == (30, 20, 3) and (got == np.rot90(stored, k=-1)).all()


# ------------------------------------------------------------------ the command
def test_the_command_writes_cls_scores_and_their_map(tmp_path, cl_model, test_set, capsys):
    from sklearn.metrics import average_precision_score

    from noisymlt.training.cl_evaluate import CLTestImages

    checkpoint = tmp_path / "epoch_8.pth"
    digest = _checkpoint(cl_model, checkpoint)
    out = tmp_path / "runs/toy/authors/cl"
    size = 72  # padded to 96, as [CL] pads to a multiple of 32 (its 224 needs none; the transform's test runs it)
    assert main(_argv(test_set, checkpoint, digest, out, "--batch-size", "5", "--image-size", str(size))) == 0
    printed = capsys.readouterr().out
    assert "  ensemble: mAP " in printed and "[CL]'s epoch_8.pth on 12 test images" in printed

    pred = np.load(out / "predictions.npz")
    table = test_set["table"]
    assert list(pred["image_ids"]) == table.image_ids
    assert list(pred["heads"]) == ["ensemble", "random", "balanced"]  # Ours' heads (methods.colearning: predict)
    assert str(pred["checkpoint_sha256"]) == digest
    images = torch.stack([CLTestImages(test_set["images"], table.paths, size)[i] for i in range(len(table))])
    with torch.no_grad():
        mixed, random, balance = cl_model.eval().simple_test(images)
    for head, logits in (("ensemble", mixed), ("random", random), ("balanced", balance)):
        assert np.allclose(pred[f"scores_{head}"], torch.sigmoid(logits).numpy(), rtol=1e-4, atol=1e-6), head

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["checkpoint"] == {"file": "epoch_8.pth", "sha256": digest}
    assert metrics["classes"] == CLASSES and metrics["num_test_images"] == len(table)
    summary = json.loads((out / "map.json").read_text())
    for head in ("ensemble", "random", "balanced"):
        aps = average_precision_score(table.labels, pred[f"scores_{head}"], average=None)
        assert np.allclose(metrics["heads"][head]["ap"], aps)
        assert metrics["heads"][head]["map"]["total"] == pytest.approx(aps.mean())
        for group, idx in test_set["groups"].items():
            assert metrics["heads"][head]["map"][group] == pytest.approx(aps[idx].mean())
        assert summary[head]["total"] == pytest.approx(100 * aps.mean())

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["step"] == "eval-cl-checkpoint" and manifest["checkpoint"]["sha256"] == digest
    assert manifest["inputs"]["checkpoint"]["sha256"] == digest
    assert manifest["inputs"]["test_labels"]["sha256"] == hashlib.sha256(test_set["labels"].read_bytes()).hexdigest()
    assert set(manifest["outputs"]) == {"predictions", "metrics", "map"}
    assert manifest["checkpoint"]["backbone"] == "resnet18" and manifest["tau"] == 0.1 and manifest["image_size"] == size
    assert "noisymlt.training.cl_evaluate" in manifest["code_modules"]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "manifest.timing.json", "map.json",
                                                     "metrics.json", "predictions.npz"]


def test_a_wrong_sha256_is_refused_in_one_line_and_nothing_is_written(tmp_path, cl_model, test_set, capsys):
    checkpoint = tmp_path / "epoch_8.pth"
    digest = _checkpoint(cl_model, checkpoint)
    wrong = hashlib.sha256(b"another file").hexdigest()
    out = tmp_path / "runs/toy/authors/cl"
    assert main(_argv(test_set, checkpoint, wrong, out)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(checkpoint) in err and digest in err and wrong in err, err
    assert not (tmp_path / "runs").exists()
    assert main(_argv(test_set, checkpoint, "1234", out)) == 2  # not a sha256 at all
    assert "not a sha256" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):  # --help says where [CL] publishes its models
        main(["eval-cl-checkpoint", "--help"])
    assert "1eGBGqB0BfjMEpXEijBot8Hg7cCM831xr" in capsys.readouterr().out.replace("\n", "")


def test_a_checkpoint_of_another_class_list_is_refused(tmp_path, cl_model, test_set, capsys):
    from noisymlt.training.cl_evaluate import _same_classes

    model = randomise(stitchup_classifier18(5), seed=1)
    checkpoint = tmp_path / "five.pth"
    digest = _checkpoint(model, checkpoint)
    assert main(_argv(test_set, checkpoint, digest, tmp_path / "out")) == 2
    assert "a model of 5 classes" in capsys.readouterr().err and not (tmp_path / "out").exists()
    # [CL]'s tools/train.py saves its dataset's CLASSES in the meta: another order is refused
    swapped = tmp_path / "swapped.pth"
    torch.save({"meta": {"CLASSES": ("dog", "cat", "bird", "fish")}, "state_dict": cl_model.state_dict()}, swapped)
    digest = hashlib.sha256(swapped.read_bytes()).hexdigest()
    assert main(_argv(test_set, swapped, digest, tmp_path / "out")) == 2
    assert "not the test table's 4 in its order (first difference at index 0)" in capsys.readouterr().err
    # its spelling of a name (COCO's traffic_light for the annotation file's "traffic light") is the same class
    _same_classes({"CLASSES": ("traffic_light", "Hair_Drier")}, ["traffic light", "hair drier"], "ck.pth")


def test_a_checkpoint_refused_after_its_predictions_leaves_the_folder_as_it_was(tmp_path, cl_model, test_set,
                                                                               capsys):
    """Its scores are NaN (a diverged model): refused when they are scored, after the predictions are made; the
    folder keeps the earlier evaluation's files, and no temporary file is left beside it."""
    broken = copy.deepcopy(cl_model)
    with torch.no_grad():
        broken.head1.fc_cls.weight.fill_(float("nan"))
    checkpoint = tmp_path / "nan.pth"
    digest = _checkpoint(broken, checkpoint)
    out = tmp_path / "runs" / "cl"
    out.mkdir(parents=True)
    for name in ("predictions.npz", "metrics.json", "map.json", "manifest.json"):
        (out / name).write_text(f"the earlier {name}")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(_argv(test_set, checkpoint, digest, out, "--image-size", "32")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "holds non-finite values" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["cl"]


def test_a_test_image_outside_the_images_folder_is_refused_before_any_prediction(tmp_path, cl_model, test_set,
                                                                                 capsys):
    table = test_set["table"]
    escaped = LabelTable(image_ids=table.image_ids, classes=table.classes, labels=table.labels,
                         paths=["../" + table.paths[0], *table.paths[1:]])
    labels = write_labels(escaped, tmp_path / "test_labels.parquet")
    checkpoint = tmp_path / "epoch_8.pth"
    digest = _checkpoint(cl_model, checkpoint)
    argv = _argv({**test_set, "labels": labels}, checkpoint, digest, tmp_path / "out")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{labels} row 1, image 'im00': image path '../images/im00.png' leads outside the images folder" in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ the pipeline step
def test_the_rule_runs_the_command_on_a_listed_checkpoint(tmp_path):
    """None listed by default (no job); a layer listing one makes `snakemake -n -p` plan the command a user would
    type, on the dataset's test table, class split and test images, the sha256 and the optional settings."""
    from noisymlt.config import load_params
    from noisymlt.pipeline import paths

    assert load_params(REPO / "params.yaml")["authors_checkpoints"] == {}
    checkpoint = tmp_path / "epoch_8.pth"
    checkpoint.write_bytes(b"weights")
    layer = tmp_path / "authors.yaml"
    layer.write_text(yaml.safe_dump({"authors_checkpoints": {"cl_toy": {
        "dataset": "toy", "file": str(checkpoint), "sha256": "ab" * 32, "image_size": 256}}}))
    snakemake = Path(sys.executable).with_name("snakemake")
    plan = subprocess.run([str(snakemake), "-n", "-p", "--cores", "4", "--configfile",
                           "workflow/profiles/demo/params.yaml", str(layer), "--", "runs/toy/authors/cl_toy/map.json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    params = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml", layer)
    assert (f"$NOISYMLT_CLI eval-cl-checkpoint --checkpoint {checkpoint} --sha256 {'ab' * 32} "
            "--test-labels data/toy/test_labels.parquet --split data/toy/class_split.json "
            f"--test-images {paths.image_root(params, 'toy', 'test')} --image-size 256 --out runs/toy/authors/cl_toy "
            "--no-progress --cores 4 > logs/authors/toy_cl_toy.log 2>&1") in plan.stdout


@pytest.mark.slow
def test_the_step_evaluates_a_listed_checkpoint(tmp_path, cl_model, own_data_project):
    """On the own-data page's folder dataset: a layer listing a checkpoint makes `snakemake` (target all) plan its
    evaluation, which runs for real."""
    from helpers import copy_build, run_line as run

    snakemake = Path(sys.executable).with_name("snakemake")
    layers = "--configfile workflow/profiles/demo/params.yaml mydata.yaml"
    target = "runs/mydata/authors/cl_mydata/metrics.json"
    root = copy_build(own_data_project, tmp_path / "smk")  # folder_project, its data made (conftest)
    (root / "checkpoints").mkdir()
    digest = _checkpoint(cl_model, root / "checkpoints" / "epoch_8.pth")
    block = {"cl_mydata": {"dataset": "mydata", "file": "checkpoints/epoch_8.pth", "sha256": digest, "image_size": 64}}
    (root / "authors.yaml").write_text(yaml.safe_dump({"authors_checkpoints": block}))
    without = run(f"{snakemake} -n --profile workflow/profiles/demo {layers}", root)
    assert "authors_eval" not in without  # none listed: `all` plans no such job
    plan = run(f"{snakemake} -n --profile workflow/profiles/demo {layers} authors.yaml", root)
    assert "authors_eval" in plan and target in plan
    run(f"{snakemake} --profile workflow/profiles/demo {layers} authors.yaml -- {target}", root)
    metrics = json.loads((root / target).read_text())
    test = read_labels(root / "data/mydata/test_labels.parquet")
    assert metrics["num_test_images"] == len(test) and metrics["checkpoint"]["sha256"] == digest
    manifest = json.loads((root / "runs/mydata/authors/cl_mydata/manifest.json").read_text())
    assert manifest["image_size"] == 64 and manifest["inputs"]["checkpoint"]["path"] == "checkpoints/epoch_8.pth"
