"""Clean, then retrain (noisymlt.pipeline.cleaning): the flags against cleanlab's own call and the truth, the cleaned
table the trainer reads, and a dropped label that never reaches the loss."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import tiny_params, toy_trainer
from noisymlt.config import resolve_run
from noisymlt.data.labels import LabelTable, read_labels, write_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.pipeline.cleaning import clean_labels, flagged_entries


def _noisy_set(rng, n=120, c=6):
    truth = (rng.random((n, c)) < 0.3).astype(np.uint8)
    truth[np.arange(n), rng.integers(0, c, n)] = 1
    noisy = np.where(rng.random(truth.shape) < 0.15, 1 - truth, truth).astype(np.uint8)
    probs = np.clip(0.6 * truth + 0.4 * rng.random(truth.shape), 0, 1).astype(np.float32)
    return truth, noisy, probs


def _write_set(tmp_path, truth, noisy, probs):
    ids, classes = [f"im{i:03d}" for i in range(len(noisy))], [f"c{k}" for k in range(noisy.shape[1])]
    write_labels(LabelTable(ids, classes, noisy, clean=truth), tmp_path / "noisy.parquet")
    write_labels(LabelTable(ids, classes, truth), tmp_path / "clean.parquet")
    order = np.random.default_rng(1).permutation(len(ids))  # gather's rows need not be the table's order
    np.savez(tmp_path / "oos.npz", image_ids=np.array(ids)[order], classes=np.array(classes), probs=probs[order],
             fold=np.zeros(len(ids), np.int64), runs=np.array(["f0", "f1"]), run_ids=np.array(["a", "b"]))
    return ids, classes


def test_the_flags_are_cleanlabs_own_call_the_predictions_or_the_truth():
    from cleanlab.multilabel_classification.filter import find_multilabel_issues_per_class

    truth, noisy, probs = _noisy_set(np.random.default_rng(0))
    labels = [list(np.flatnonzero(row)) for row in noisy]
    cleanlab = find_multilabel_issues_per_class(labels, probs.astype(np.float64), low_memory=False)
    assert np.array_equal(flagged_entries(noisy, "cleanlab", probs), cleanlab)
    assert np.array_equal(flagged_entries(noisy, "model", probs), np.abs(noisy - probs) > 0.5)
    assert np.array_equal(flagged_entries(noisy, "oracle", clean=truth), noisy != truth)


def test_a_cleaned_table_drops_or_flips_exactly_the_flagged_labels_beside_its_input(tmp_path):
    truth, noisy, probs = _noisy_set(np.random.default_rng(2))
    _write_set(tmp_path, truth, noisy, probs)
    before = (tmp_path / "noisy.parquet").read_bytes()
    flagged = flagged_entries(noisy, "cleanlab", probs)
    assert 0 < flagged.sum() < flagged.size
    rec = clean_labels(tmp_path / "noisy.parquet", tmp_path / "drop.parquet", flags="cleanlab", action="drop",
                       out_of_sample=tmp_path / "oos.npz")
    dropped = read_labels(tmp_path / "drop.parquet")
    assert np.array_equal(dropped.labels, noisy) and np.array_equal(dropped.ignored, flagged)
    assert dropped.clean is None  # the cleaned table holds no clean label
    assert rec["changed"] == flagged.sum() and rec["changed_positives"] == (flagged & (noisy == 1)).sum()
    assert rec["images_changed"] == flagged.any(1).sum() and rec["out_of_sample_folds"] == 2
    assert json.loads((tmp_path / "drop.json").read_text()) == rec
    clean_labels(tmp_path / "noisy.parquet", tmp_path / "flip.parquet", flags="oracle", action="flip",
                 clean_labels=tmp_path / "clean.parquet")
    flipped = read_labels(tmp_path / "flip.parquet")
    assert np.array_equal(flipped.labels, truth) and flipped.ignored is None  # the oracle's flips give the truth
    assert (tmp_path / "noisy.parquet").read_bytes() == before
    with pytest.raises(NoisyMLTError, match="never --clean-labels"):
        clean_labels(tmp_path / "noisy.parquet", tmp_path / "x.parquet", flags="cleanlab", action="drop",
                     clean_labels=tmp_path / "clean.parquet")
    with pytest.raises(NoisyMLTError, match="already cleaned"):
        clean_labels(tmp_path / "drop.parquet", tmp_path / "x.parquet", flags="cleanlab", action="drop",
                     out_of_sample=tmp_path / "oos.npz")
    assert not (tmp_path / "x.parquet").exists()


def test_the_command_refuses_to_write_over_its_input(tmp_path, capsys):
    from noisymlt.cli import main

    truth, noisy, probs = _noisy_set(np.random.default_rng(3))
    _write_set(tmp_path, truth, noisy, probs)
    before = (tmp_path / "noisy.parquet").read_bytes()
    assert main(["clean-labels", "--noisy", str(tmp_path / "noisy.parquet"), "--out-of-sample",
                 str(tmp_path / "oos.npz"), "--out", str(tmp_path / "noisy.parquet")]) == 2
    assert "an output never replaces an input" in capsys.readouterr().err
    assert (tmp_path / "noisy.parquet").read_bytes() == before


def test_a_masked_loss_is_the_mean_over_the_labels_it_keeps():
    from noisymlt.losses import build_loss

    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(8, 5, generator=g), (torch.rand(8, 5, generator=g) < 0.4).float()
    keep = (torch.rand(8, 5, generator=g) < 0.7).float()
    for name, params in (("bce", {}), ("focal", {}), ("db_focal", {"neg_scale": 5.0, "map_mu": 0.3})):
        loss = build_loss(name, np.array([30, 9, 5, 3, 1]), 40, **params)
        each = loss.elementwise(logits, targets)
        assert torch.allclose(loss(logits, targets, keep), each[keep > 0].mean())
        assert torch.equal(loss(logits, targets, torch.ones_like(keep)), loss(logits, targets))


def test_a_dropped_label_never_reaches_training(tiny_toy, tmp_path):
    """Two cleaned tables that differ only in the values of the labels they drop train the same weights; the raw
    table under a dropping config, or a drop under a family that cannot, is refused in one line."""
    noisy = read_labels(tiny_toy["noisy"], noisy_only=True)
    ignored = np.zeros_like(noisy.labels)
    ignored[::3, 2] = 1  # every third image's third class
    ignored[5, :] = 1
    ignored[::2, np.argmax(noisy.labels.sum(0))] = 1  # half the largest class: a shorter class-aware epoch, if counted
    other = noisy.labels.copy()
    other[ignored == 1] = 1 - other[ignored == 1]
    resolved = resolve_run(tiny_params("clean_erm", epochs=1), "toy", "clean_erm", 0.5, 0)
    assert resolved["clean"]["action"] == "drop" and resolved["clean"]["crossfit"]["folds"] == 2
    weights = []
    for name, labels in (("a", noisy.labels), ("b", other)):
        table = tmp_path / f"{name}.parquet"
        write_labels(LabelTable(noisy.image_ids, noisy.classes, labels, noisy.paths, ignored=ignored), table)
        trainer = toy_trainer(tiny_toy, resolved, tmp_path / name, train_labels=table)
        trainer.run()
        weights.append(trainer.model.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    with pytest.raises(NoisyMLTError, match="no ignored_\\* columns, but the run's labels are cleaned by dropping"):
        toy_trainer(tiny_toy, resolved, tmp_path / "raw")
    plain = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    with pytest.raises(NoisyMLTError, match="ignored_\\* columns, but the run config drops no labels"):
        toy_trainer(tiny_toy, plain, tmp_path / "c", train_labels=tmp_path / "a.parquet")
    # a class-aware cleaned run keeps its recipe's epochs on the set (the sampler draws from the given labels; a
    # cleaned table with fewer positives made the demo's Clean-DB-Focal epochs shorter than its warm-up), and the
    # class counts its loss is balanced by leave the dropped positives out
    sampled = {"epochs": 1, "epoch_length": "sampler"}  # tiny_params counts epochs in batches
    cleaned = resolve_run(tiny_params("clean_db_focal", **sampled), "toy", "clean_db_focal", 0.5, 0)
    base = resolve_run(tiny_params("db_focal", **sampled), "toy", "db_focal", 0.5, 0)
    dropped = toy_trainer(tiny_toy, cleaned, tmp_path / "cdf", train_labels=tmp_path / "a.parquet")
    assert dropped.iters == toy_trainer(tiny_toy, base, tmp_path / "df").iters
    assert np.array_equal(dropped.ctx.class_counts, (noisy.labels * (1 - ignored)).sum(0))
    ours = resolve_run(tiny_params("ours", epochs=1), "toy", "ours", 0.5, 0)
    ours["clean"] = {"flags": "cleanlab", "action": "drop"}
    with pytest.raises(NoisyMLTError, match="family 'colearning' cannot leave labels out of its loss"):
        toy_trainer(tiny_toy, ours, tmp_path / "d", train_labels=tmp_path / "a.parquet")


def test_the_workflow_retrains_on_the_cleaned_labels_and_reports_what_each_cleaning_changed(tiny_runs_project):
    """tiny_runs_project's Clean-ERM and Oracle-ERM runs (each seed's noisy set, its cross-fitting's two folds):
    each trained on its cleaned table (its manifest's, hash-checked), which drops exactly cleanlab's flags on the
    gathered probabilities or exactly the wrong labels; the detection table's cleaning rows equal an independent
    computation from those files; the paired table has Clean-ERM - ERM."""
    from noisymlt.core.manifest import file_sha256

    project = tiny_runs_project
    clean = read_labels(project / "data/toy/train_labels.parquet")
    precision = {}
    for seed in (0, 1):
        noisy = read_labels(project / f"data/toy/noisy/g0.5_s{seed}.parquet", noisy_only=True)
        truth = clean.labels[[clean.image_ids.index(i) for i in noisy.image_ids]]
        with np.load(project / f"runs/toy/crossfit/erm/g0.5/s{seed}/out_of_sample.npz") as npz:
            assert [str(i) for i in npz["image_ids"]] == noisy.image_ids
            probs = npz["probs"]
        for method, flags in (("clean_erm", "cleanlab"), ("oracle_erm", "oracle")):
            table = f"runs/toy/cleaned/g0.5_s{seed}_{flags}_drop.parquet"
            manifest = json.loads((project / f"runs/toy/g0.5/s{seed}/{method}/manifest.json").read_text())
            entry = manifest["inputs"]["train_labels"]
            assert entry["path"] == table and entry["sha256"] == file_sha256(project / table)
            cleaned = read_labels(project / table)
            expected = flagged_entries(noisy.labels, flags, probs, truth)
            assert np.array_equal(cleaned.ignored, expected) and np.array_equal(cleaned.labels, noisy.labels)
            if flags == "cleanlab":
                precision.setdefault(seed, (noisy.labels != truth)[expected].mean())
    rows = {(r["method"], r["measure"]): r for r in csv.DictReader(open(project / "reports/label_detection_toy.csv"))}
    assert float(rows[("clean:cleanlab/drop", "precision")]["mean"]) == pytest.approx(np.mean(list(precision.values())))
    assert float(rows[("clean:oracle/drop", "precision")]["mean"]) == 1.0  # the oracle changes only wrong labels
    assert float(rows[("clean:oracle/drop", "recall")]["mean"]) == 1.0
    assert "| Clean-ERM − ERM |" in (project / "reports/paired_toy.md").read_text()


def test_trace_walks_from_a_cleaned_run_to_the_fold_runs_behind_its_flags(tiny_runs_project, tmp_path, monkeypatch,
                                                                         capsys):
    """`noisymlt trace` on a Clean-ERM cell checks the cleaning's inputs by their recorded hash and every fold run
    whose probabilities chose its flags (files and code); a gathered file naming a fold run retrained since is a
    problem."""
    from noisymlt.cli import main
    from noisymlt.core.manifest import file_sha256
    from noisymlt.pipeline.trace import cleaning_trace
    from noisymlt.report.aggregate import aggregate
    from noisymlt.report.tables import write_table

    monkeypatch.chdir(tiny_runs_project)
    files = [Path(f"runs/toy/g0.5/s{seed}/clean_erm/metrics.json") for seed in (0, 1)]
    write_table(aggregate(files), tmp_path / "t.tex", {"clean_erm": "Clean-ERM"})
    rc = main(["trace", "clean_erm/main/toy/0.5", "--sidecar", str(tmp_path / "t.cells.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    for seed in (0, 1):
        assert f"runs/toy/crossfit/erm/g0.5/s{seed}/out_of_sample.npz" in out
        for k in (0, 1):
            assert f"runs/toy/crossfit/erm/g0.5/s{seed}/fold{k}/checkpoint.pt" in out
    assert out.count("fold 1   out predictions") == 2

    table = tmp_path / "cleaned.parquet"  # a copy whose gathered file names another run for fold 0
    table.write_bytes(Path("runs/toy/cleaned/g0.5_s0_cleanlab_drop.parquet").read_bytes())
    record = json.loads(Path("runs/toy/cleaned/g0.5_s0_cleanlab_drop.json").read_text())
    with np.load(record["inputs"]["out_of_sample"]["path"]) as npz:
        gathered = dict(npz)
    gathered["run_ids"] = np.array(["0" * 16, gathered["run_ids"][1]])
    np.savez(tmp_path / "oos.npz", **gathered)
    record["inputs"]["out_of_sample"] = {"path": str(tmp_path / "oos.npz"), "sha256": file_sha256(tmp_path / "oos.npz")}
    table.with_suffix(".json").write_text(json.dumps(record))
    problems = cleaning_trace(table)[1]
    assert len(problems) == 1 and problems[0].startswith("RUN ID") and "0000000000000000" in problems[0]
    record["inputs"]["out_of_sample"]["sha256"] = "0" * 64  # the cleaning read another file than this one
    table.with_suffix(".json").write_text(json.dumps(record))
    assert [p.split()[0] for p in cleaning_trace(table)[1]] == ["CHANGED"]
