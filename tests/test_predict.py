"""`noisymlt predict` (noisymlt.inference.predict): a finished run's scores for images of one's own.

On conftest's tiny_runs_project (a run of each method family): the run's own test table, read from its JPEG files
through predict, gives back predictions.npz bit for bit (the same batches); a folder of unlabelled copies of test
images gives those images' rows within float32 rounding (other batches); the train-f1 thresholds equal an independent F1 search (sklearn's precision-recall curve); bad input
gets one line and writes nothing.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import copy_build, run_tool, tool_env

RUN = "runs/toy/g0.5/s0/{}"
TEST_IMAGES = "data/raw/toy/VOCdevkit/TOY"  # the toy's image folder, which its test table's paths start from


@pytest.fixture(scope="module")
def project(tiny_runs_project, tmp_path_factory):
    return copy_build(tiny_runs_project, tmp_path_factory.mktemp("predict") / "project")


def _predict(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "noisymlt", "predict", *args, "--no-progress"], cwd=project,
                          env=tool_env(project), capture_output=True, text=True, timeout=600)


def _table(path) -> tuple[list[str], dict[str, np.ndarray], list[str], list[str]]:
    """(classes, scores per head in row order, image names, predicted labels) of a predict CSV."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header, rows = rows[0], rows[1:]
    classes = header[2:-1]
    scores: dict[str, list] = {}
    for row in rows:
        scores.setdefault(row[1], []).append([np.float32(v) for v in row[2:-1]])
    first = rows[0][1]
    return (classes, {h: np.array(v, dtype=np.float32) for h, v in scores.items()},
            [r[0] for r in rows if r[1] == first], [r[-1] for r in rows if r[1] == first])


@pytest.mark.parametrize("method", ["erm", "dividemix", "ours"])
def test_the_runs_test_table_gives_back_its_predictions_bit_for_bit(project, tmp_path, method):
    out = tmp_path / "test.csv"
    done = _predict(project, "--run", RUN.format(method), "--labels", "data/toy/test_labels.parquet",
                    "--images", TEST_IMAGES, "--out", str(out), "--heads", "all")
    assert done.returncode == 0, done.stderr[-3000:]
    classes, scores, names, _ = _table(out)
    with np.load(project / RUN.format(method) / "predictions.npz") as npz:
        assert list(scores) == [str(h) for h in npz["heads"]]  # every head, the reported one first
        assert names == [str(i) for i in npz["image_ids"]]
        for head in scores:
            assert np.array_equal(scores[head], npz[f"scores_{head}"]), head  # 9 digits hold a float32 exactly
    record = json.loads(out.with_suffix(".json").read_text())
    manifest = json.loads((project / RUN.format(method) / "manifest.json").read_text())
    assert record["run_id"] == manifest["run_id"] and record["images"] == len(names)
    assert record["checkpoint_sha256"] == manifest["checkpoint_content_sha256"]
    assert classes == list(record["threshold"]["per_class"][next(iter(scores))])


def test_a_folder_of_unlabelled_images_gets_the_same_scores_and_labels_at_the_threshold(project, tmp_path):
    from noisymlt.data.labels import read_labels

    test = read_labels(project / "data/toy/test_labels.parquet")
    folder = tmp_path / "new"
    picked = {3: "a/first.jpg", 10: "b/c/second.jpg", 42: "third.JPG"}  # any names, subfolders, suffix case
    for row, name in picked.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(project / TEST_IMAGES / test.paths[row], folder / name)
    (folder / "notes.txt").write_text("not an image\n")
    out = tmp_path / "new.csv"
    done = _predict(project, "--run", RUN.format("ours"), "--images", str(folder), "--out", str(out),
                    "--threshold", "0.4")
    assert done.returncode == 0, done.stderr[-3000:]
    classes, scores, names, predicted = _table(out)
    assert list(scores) == ["ensemble"] and names == sorted(picked.values())
    order = sorted(picked, key=picked.get)
    with np.load(project / RUN.format("ours") / "predictions.npz") as npz:
        expected = npz["scores_ensemble"][order]
    # three images a batch instead of the run's 64: the same model and pixels, float32 sums in another blocking
    assert np.abs(scores["ensemble"] - expected).max() <= 1e-6
    assert all(labels == ";".join(c for c, s in zip(classes, row) if s >= 0.4)
               for row, labels in zip(scores["ensemble"], predicted))
    assert any(predicted) and not all(len(p.split(";")) == len(classes) for p in predicted)  # the cut did cut


def test_train_f1_thresholds_are_the_f1_best_scores_on_the_training_images(project, tmp_path):
    """Per class, the threshold is the score that maximises F1 against the run's noisy training labels; checked
    with sklearn's precision-recall curve on the run's training-image scores, read through predict itself."""
    from sklearn.metrics import precision_recall_curve

    from noisymlt.data.labels import read_labels

    run = RUN.format("erm")
    noisy_path = json.loads((project / run / "manifest.json").read_text())["inputs"]["train_labels"]["path"]
    train_scores = tmp_path / "train.csv"
    assert _predict(project, "--run", run, "--labels", noisy_path, "--images", TEST_IMAGES,
                    "--out", str(train_scores)).returncode == 0
    _, scores, _, _ = _table(train_scores)
    out = tmp_path / "f1.csv"
    assert _predict(project, "--run", run, "--labels", "data/toy/test_labels.parquet", "--images", TEST_IMAGES,
                    "--out", str(out), "--threshold", "train-f1").returncode == 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["threshold"]["rule"] == "train-f1"
    got = record["threshold"]["per_class"]["main"]
    noisy = read_labels(project / noisy_path)
    checked = 0
    for c, name in enumerate(noisy.classes):
        y = noisy.labels[:, c] > 0.5
        if not y.any():
            assert got[name] is None
            continue
        precision, recall, cuts = precision_recall_curve(y, scores["main"][:, c].astype(np.float64))
        f1 = 2 * precision[:-1] * recall[:-1] / np.maximum(precision[:-1] + recall[:-1], 1e-300)
        best = cuts[f1 == f1.max()].max()  # the highest of the best: fewer predicted labels at the same F1
        assert got[name] == pytest.approx(float(best), abs=0), name
        checked += 1
    assert checked >= 10


def test_bad_input_gets_one_line_and_writes_nothing(project, tmp_path, monkeypatch, capsys):
    """In this process (the command's main, as `noisymlt` calls it): a subprocess a case would pay for importing
    torch four times; an exception that escaped main would fail the test as a traceback would reach a user."""
    from noisymlt.cli import main

    monkeypatch.chdir(project)
    folder = tmp_path / "bad"
    folder.mkdir()
    shutil.copy(project / TEST_IMAGES / "JPEGImages/000601.jpg", folder / "good.jpg")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    cases = {
        "a missing run": (["--run", "runs/toy/g0.5/s0/nothing", "--images", str(folder)], "no such run folder"),
        "an unreadable image": (["--run", RUN.format("erm"), "--images", str(folder)], "broken.jpg"),
        "an unknown head": (["--run", RUN.format("erm"), "--images", str(folder), "--heads", "ensemble"],
                            "the run's heads are main"),
        "a bad threshold": (["--run", RUN.format("erm"), "--images", str(folder), "--threshold", "1.5"],
                            "outside (0, 1)"),
    }
    for what, (args, says) in cases.items():
        out = tmp_path / f"{what}.csv"
        try:
            status = main(["predict", *args, "--out", str(out), "--no-progress"])
        except SystemExit as exc:  # argparse refuses a setting out of range at the command line
            status = exc.code
        stderr = capsys.readouterr().err
        lines = [line for line in stderr.splitlines() if "error" in line or "Traceback" in line]
        assert status == 2 and len(lines) == 1 and says in lines[0], (what, stderr[-2000:])
        assert "Traceback" not in stderr and not out.exists() and not out.with_suffix(".json").exists(), what


@pytest.mark.parametrize("workers", [0, 1])
def test_an_unreadable_image_is_named_in_one_line_by_the_loader_in_process_or_in_a_worker(project, tmp_path,
                                                                                         monkeypatch, workers):
    """scores_of with the run's loader in this process (workers 0, the toy's) or in a worker process, which sends
    a file's error back as the text of a traceback: either way one line that names the file, and no traceback."""
    from noisymlt.errors import NoisyMLTError
    from noisymlt.inference.run_model import image_dataset, load_run, scores_of

    monkeypatch.chdir(project)
    folder = tmp_path / "bad"
    folder.mkdir()
    shutil.copy(project / TEST_IMAGES / "JPEGImages/000601.jpg", folder / "good.jpg")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    trainer = load_run(RUN.format("erm"))
    trainer.workers = workers
    files = [folder / "good.jpg", folder / "broken.jpg"]
    with pytest.raises(NoisyMLTError) as raised:
        scores_of(trainer, image_dataset(files, trainer.cfg), ["main"], batch_size=1)
    message = str(raised.value)
    assert "broken.jpg" in message and "\n" not in message and "Traceback" not in message, message
    assert len(scores_of(trainer, image_dataset(files[:1], trainer.cfg), ["main"])["main"]) == 1  # the good one reads


def test_a_run_of_other_code_is_refused_in_one_line(tiny_runs_project, tmp_path):
    """An edit of the code that trains ERM's runs (its family module): the checkpoint is not this code's model."""
    project = copy_build(tiny_runs_project, tmp_path / "project")
    family = project / "src/noisymlt/methods/single.py"
    family.write_text(family.read_text() + "\nEDITED = True  # code, not a comment: another digest\n")
    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(project / TEST_IMAGES / "JPEGImages/000601.jpg", folder / "one.jpg")
    out = tmp_path / "out.csv"
    done = _predict(project, "--run", RUN.format("erm"), "--images", str(folder), "--out", str(out))
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "trained by other code" in lines[0] and "retrain the run" in lines[0], lines[0]
    assert "Traceback" not in done.stderr and not out.exists()
    # DivideMix's code does not import the edited module: its run is still this code's, and predicts
    run_tool([sys.executable, "-m", "noisymlt", "predict", "--run", RUN.format("dividemix"), "--images", str(folder),
              "--out", str(out), "--no-progress"], project)
    assert out.exists()
