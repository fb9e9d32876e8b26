"""Every step checks its inputs against the record of the step that wrote them (noisymlt.core.manifest):
content that changed since stops the step before it is used, with one line naming the file, both hashes and
the step that rebuilds it. Restoring the recorded bytes lets the step run again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import tiny_params, toy_trainer
from noisymlt.cli import main
from noisymlt.config import resolve_run
from noisymlt.core.manifest import check_inputs, file_sha256, now, producer_record, write_manifest
from noisymlt.data.labels import read_class_split, write_class_split
from noisymlt.errors import NoisyMLTError


def flip_last_byte(path: Path) -> bytes:
    """Flip the last byte of ``path`` (an image cache's last pixel, a weight's last byte); returns the original."""
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    return data


def test_a_file_is_checked_against_its_producers_record_and_an_unrecorded_one_is_only_hashed(tmp_path):
    out = tmp_path / "thing.bin"
    out.write_bytes(b"recorded bytes")
    write_manifest(tmp_path / "thing.manifest.json", step="cache-images", started=now(), inputs={},
                   outputs={"array": out}, code=("noisymlt.errors",))
    loose = tmp_path / "loose.bin"
    loose.write_bytes(b"nobody recorded me")
    assert producer_record(out)[2]["sha256"] == file_sha256(out) and producer_record(loose) is None
    assert check_inputs({"a": out, "b": loose, "absent": None}) == {"a": file_sha256(out), "b": file_sha256(loose)}
    recorded = file_sha256(out)
    original = flip_last_byte(out)
    with pytest.raises(NoisyMLTError) as err:
        check_inputs({"a": out})
    message = str(err.value)
    assert "\n" not in message and str(out) in message and "cache-images" in message
    assert recorded[:16] in message and file_sha256(out)[:16] in message
    out.write_bytes(original)
    assert check_inputs({"a": out})["a"] == recorded


def test_a_run_folders_manifest_records_its_predictions(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    pred = run / "predictions.npz"
    np.savez(pred, x=np.arange(3))
    write_manifest(run / "manifest.json", step="train", started=now(), inputs={}, outputs={"predictions": pred},
                   code=("noisymlt.errors",))
    flip_last_byte(pred)
    with pytest.raises(NoisyMLTError, match="predictions.npz: content sha256 .* `noisymlt train` wrote"):
        check_inputs({"predictions": pred})


def test_a_changed_image_cache_stops_the_run_before_training_and_the_restored_one_trains(tiny_toy, tmp_path):
    cache = tmp_path / "cache" / "train.npy"
    assert main(["cache-images", "--labels", str(tiny_toy["train"]), "--images", str(tiny_toy["root"]),
                 "--size", str(np.load(tiny_toy["train_cache"], mmap_mode="r").shape[1]), "--out", str(cache),
                 "--no-progress"]) == 0
    resolved = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    original = flip_last_byte(cache)  # one channel of one pixel of the last training image
    with pytest.raises(NoisyMLTError, match=r"train\.npy: content sha256 .* `noisymlt cache-images` wrote"):
        toy_trainer(tiny_toy, resolved, tmp_path / "run", train_cache=cache)
    assert not (tmp_path / "run").exists()  # refused before the run folder was made
    cache.write_bytes(original)
    trainer = toy_trainer(tiny_toy, resolved, tmp_path / "run", train_cache=cache)
    trainer.run()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["inputs"]["train_cache"]["sha256"] == file_sha256(cache)


def test_changed_backbone_weights_are_refused_and_the_manifest_records_the_weights(tiny_toy, tmp_path):
    import torch
    import torchvision

    weights = tmp_path / "backbone.pt"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), weights)
    write_manifest(tmp_path / "backbone.manifest.json", step="pretrain", started=now(), inputs={},
                   outputs={"weights": weights}, code=("noisymlt.errors",))
    overrides = dict(epochs=1, backbone="resnet18", weights_path=str(weights), trainable="layer4", image_size=32)
    resolved = resolve_run(tiny_params("erm", **overrides), "toy", "erm", 0.5, 0)
    original = flip_last_byte(weights)
    with pytest.raises(NoisyMLTError, match=r"backbone\.pt: content sha256 .* `noisymlt pretrain` wrote"):
        toy_trainer(tiny_toy, resolved, tmp_path / "run")
    weights.write_bytes(original)
    toy_trainer(tiny_toy, resolved, tmp_path / "run").run()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["inputs"]["weights"] == {"path": str(weights), "sha256": file_sha256(weights)}


def test_evaluate_and_aggregate_refuse_what_changed_since_it_was_written(tiny_toy, tmp_path, capsys):
    resolved = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    run = tmp_path / "run"
    pred = toy_trainer(tiny_toy, resolved, run).run()
    evaluate = ["evaluate", "--predictions", str(pred), "--test-labels", str(tiny_toy["test"]), "--split",
                str(tiny_toy["split"]), "--out", str(run / "metrics.json")]
    original = flip_last_byte(pred)
    assert main(evaluate) == 2
    assert "predictions.npz: content sha256" in capsys.readouterr().err
    assert not (run / "metrics.json").exists()
    pred.write_bytes(original)
    assert main(evaluate) == 0
    metrics = run / "metrics.json"
    metrics.write_text(metrics.read_text().replace('"total": 0.', '"total": 0.9', 1))  # a hand-edited score
    assert main(["aggregate", str(metrics), "--out", str(tmp_path / "results.parquet")]) == 2
    assert "metrics.json: content sha256" in capsys.readouterr().err


def test_a_class_split_that_no_longer_partitions_the_classes_is_refused(tmp_path):
    path = write_class_split({"head": [0, 2], "medium": [1, 3], "tail": [4, 5]}, tmp_path / "split.json")
    assert read_class_split(path)["medium"] == [1, 3]
    text = path.read_text()
    for edit, words in ((text.replace("3", "2", 1), "in two groups: [2]"), (text.replace("5", "6", 1), "absent: [5]")):
        path.write_text(edit)
        with pytest.raises(NoisyMLTError, match=r"split\.json: the groups do not partition") as err:
            read_class_split(path)
        assert words in str(err.value)


def test_a_class_split_of_another_class_count_stops_the_run(tiny_toy, tmp_path):
    split = read_class_split(tiny_toy["split"])
    short = {g: [i for i in v if i < 10] for g, v in split.items()}
    path = write_class_split(short, tmp_path / "split.json")
    resolved = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    from noisymlt.training.trainer import Trainer

    with pytest.raises(NoisyMLTError, match="a class split of 10 classes"):
        Trainer(resolved, train_labels=tiny_toy["noisy"], test_labels=tiny_toy["test"], split=path,
                train_images=tiny_toy["root"], test_images=tiny_toy["root"], out_dir=tmp_path / "run",
                device="cpu", progress=False, train_cache=tiny_toy["train_cache"], test_cache=tiny_toy["test_cache"])
    shutil.rmtree(tmp_path / "run", ignore_errors=True)
