"""Suspect labels (noisymlt.inference.suspects) and the detection table (noisymlt.report.detection).

Each scorer against the rule it stands for, written out here: the pseudo-label scorer flags exactly the labels
noisymlt.methods.pseudo_labels changes, the DivideMix scorer those its label refinement moves across 0.5, cleanlab's
ranking is the model's (self-confidence of a binary label); the detection numbers against sklearn; and on conftest's
tiny_runs_project, a cell of the detection table against an independent computation from a run's scores (read
through `noisymlt predict`) and the clean labels.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import copy_build, tool_env


def _labels(rng, n=60, c=7):
    noisy = (rng.random((n, c)) < 0.3).astype(np.float64)
    noisy[np.arange(n), rng.integers(0, c, n)] = 1.0  # every image a label
    return noisy


def test_the_pseudo_label_scorer_flags_what_the_rule_changes():
    import torch

    from noisymlt.methods.pseudo_labels import pseudo_label_scores
    from noisymlt.methods.pseudo_labels import pseudo_labels

    rng = np.random.default_rng(0)
    noisy = _labels(rng)
    qs = [rng.random(noisy.shape) for _ in range(2)]
    thresholds = [(rng.uniform(0.5, 1.0, noisy.shape[1]), rng.uniform(0.0, 0.5, noisy.shape[1])) for _ in range(2)]
    thresholds[1][0][2], thresholds[1][1][3] = 1.0, 0.0  # one group's thresholds off (alpha 1, beta 0)
    score, flagged = pseudo_label_scores(noisy, [(q, a, b) for q, (a, b) in zip(qs, thresholds)])
    changed = np.zeros(noisy.shape, dtype=bool)
    for q, (alpha, beta) in zip(qs, thresholds):
        corrected = pseudo_labels(torch.as_tensor(noisy), torch.as_tensor(q), torch.as_tensor(alpha),
                                  torch.as_tensor(beta)).numpy()
        changed |= corrected != noisy
    assert np.array_equal(flagged, changed) and changed.any() and not changed.all()
    assert np.array_equal(flagged, score > 0)  # the ranking's margin is positive exactly where the rule fires
    # the margin past the threshold that fired: a given 0 by q - alpha, a given 1 by beta - q
    r, c = np.argwhere(flagged & (noisy == 0))[0]
    assert score[r, c] == pytest.approx(max(q[r, c] - a[c] for q, (a, _) in zip(qs, thresholds)))

    # its reach: the entries some q could change (every q from 0 to 1 tried), which holds every flag
    from noisymlt.methods.pseudo_labels import pseudo_label_reach

    off = [(np.ones(noisy.shape[1]), np.zeros(noisy.shape[1]))] * 2  # alpha 1 and beta 0 everywhere: no reach
    assert not pseudo_label_reach(noisy, [(q, a, b) for q, (a, b) in zip(qs, off)]).any()
    thresholds[0] = (np.ones(noisy.shape[1]), np.zeros(noisy.shape[1]))
    thresholds[1][0][:3], thresholds[1][1][3:] = 1.0, 0.0  # alpha on for classes 3.., beta for 0..2 only
    reach = pseudo_label_reach(noisy, [(q, a, b) for q, (a, b) in zip(qs, thresholds)])
    can = np.zeros(noisy.shape, dtype=bool)
    for level in (0.0, 1.0):
        for alpha, beta in thresholds:
            full = np.full(noisy.shape, level)
            can |= pseudo_labels(torch.as_tensor(noisy), torch.as_tensor(full), torch.as_tensor(alpha),
                                 torch.as_tensor(beta)).numpy() != noisy
    assert np.array_equal(reach, can) and reach.any() and not reach.all()


def test_the_dividemix_scorer_flags_what_its_refinement_moves_across_one_half():
    import torch

    from noisymlt.methods.dividemix import refine_labels, refinement_scores

    rng = np.random.default_rng(1)
    noisy = _labels(rng)
    nets = [(rng.random(len(noisy)), rng.random(noisy.shape)) for _ in range(2)]
    score, flagged = refinement_scores(noisy, nets)
    moved = np.mean([np.abs(refine_labels(torch.as_tensor(noisy), torch.as_tensor(w), torch.as_tensor(p)).numpy()
                            - noisy) for w, p in nets], axis=0)
    assert np.allclose(score, moved) and np.array_equal(flagged, moved > 0.5) and flagged.any()


def test_cleanlabs_ranking_is_the_models_own_and_its_flags_are_confident_learnings():
    from cleanlab.multilabel_classification.filter import find_multilabel_issues_per_class

    from noisymlt.inference.suspects import cleanlab_scores, model_scores, ranks

    rng = np.random.default_rng(2)
    truth = _labels(rng, n=200)
    noisy = np.where(rng.random(truth.shape) < 0.15, 1 - truth, truth)  # labels a model trained on the truth disputes
    probs = np.clip(0.6 * truth + 0.4 * rng.random(truth.shape), 0, 1)
    cleanlab, model = cleanlab_scores(noisy, probs), model_scores(noisy, probs)
    score, flagged, model_flags, model = cleanlab.score, cleanlab.flagged, model.flagged, model.score
    assert np.allclose(score, model) and np.array_equal(ranks(score), ranks(model))
    labels = [list(np.flatnonzero(row)) for row in noisy]
    assert np.array_equal(flagged, find_multilabel_issues_per_class(labels, probs, low_memory=False))
    assert not np.array_equal(flagged, model_flags)  # confident learning's thresholds are not 0.5


def test_detection_numbers_against_sklearn_and_by_hand():
    from sklearn.metrics import average_precision_score

    from noisymlt.inference.suspects import detection

    rng = np.random.default_rng(3)
    wrong = rng.random((50, 6)) < 0.1
    score = rng.random(wrong.shape) + 0.5 * wrong
    flagged = score > 0.9
    got = detection(score, flagged, wrong)
    n = int(wrong.sum())
    top = np.argsort(-score.ravel())[:n]  # no ties among random floats
    assert got["wrong"] == n and got["entries"] == wrong.size and got["flagged"] == int(flagged.sum())
    assert got["precision_at_wrong"] == pytest.approx(wrong.ravel()[top].mean())
    assert got["flag_precision"] == pytest.approx(wrong[flagged].mean())
    assert got["flag_recall"] == pytest.approx((wrong & flagged).sum() / n)
    assert got["ap"] == pytest.approx(average_precision_score(wrong.ravel(), score.ravel()))
    assert detection(score, flagged, np.zeros_like(wrong))["ap"] is None  # no wrong label: nothing to find
    k = int(np.ceil(0.01 * wrong.size))  # the budget: a person checks the top 1% of the labels
    assert got["budget"] == k == 3
    assert got["precision_at_budget"] == pytest.approx(wrong.ravel()[np.argsort(-score.ravel())[:k]].mean())
    # by kind of wrong label, written out: a given 1 the clean labels lack was added, a given 0 they hold dropped
    given = rng.random(wrong.shape) < 0.3
    groups = {"head": [0, 1], "medium": [2], "tail": [3, 4, 5]}
    reach = rng.random(wrong.shape) < 0.5  # the entries a scorer can flag at all
    got = detection(score, flagged, wrong, given=given, groups=groups, reach=reach)
    in_top = np.zeros(wrong.size, bool)
    in_top[top] = True
    in_top = in_top.reshape(wrong.shape)
    column = np.broadcast_to(np.arange(wrong.shape[1]), wrong.shape)
    kinds = {"added": wrong & given, "dropped": wrong & ~given,
             **{g: wrong & np.isin(column, classes) for g, classes in groups.items()}, "reach": wrong & reach}
    assert sum(got[f"{g}_wrong"] for g in groups) == got["added_wrong"] + got["dropped_wrong"] == n
    for kind, members in kinds.items():
        assert got[f"{kind}_wrong"] == int(members.sum()) > 0, kind
        assert got[f"{kind}_recall_at_n"] == pytest.approx((members & in_top).sum() / members.sum()), kind
        assert got[f"{kind}_flag_recall"] == pytest.approx((members & flagged).sum() / members.sum()), kind


@pytest.fixture(scope="module")
def project(tiny_runs_project, tmp_path_factory):
    return copy_build(tiny_runs_project, tmp_path_factory.mktemp("suspects") / "project")


def test_the_suspects_table_lists_the_flagged_labels_in_rank_order(project):
    from noisymlt.data.labels import read_labels

    noisy = read_labels(project / "data/toy/noisy/g0.5_s0.parquet")
    clean = read_labels(project / "data/toy/train_labels.parquet")
    where = {str(i): k for k, i in enumerate(noisy.image_ids)}
    column = {c: k for k, c in enumerate(noisy.classes)}
    for method, natural in (("erm", "model"), ("dividemix", "dividemix"), ("ours", "pseudo_labels")):
        with open(project / f"reports/suspects/toy/g0.5_s0_{method}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        record = json.loads((project / f"reports/suspects/toy/g0.5_s0_{method}.json").read_text())
        oos = {"model_oos", "cleanlab_oos"} if method == "erm" else set()  # the cross-fitting's base method
        assert set(record["scorers"]) == {"model", "cleanlab", *({natural} - {"model"}), *oos}, method
        assert rows and [int(r[f"{natural}_rank"]) for r in rows] == sorted(int(r[f"{natural}_rank"]) for r in rows)
        for row in rows:
            i, c = where[row["image"]], column[row["class"]]
            assert int(row["given"]) == int(noisy.labels[i, c] > 0.5)
            assert int(row["wrong"]) == int((noisy.labels[i, c] > 0.5) != (clean.labels[i, c] > 0.5))
            assert any(row[f"{s}_flagged"] == "1" for s in record["scorers"])
        for scorer, rec in record["scorers"].items():  # every flagged label is a row, and only those
            assert sum(r[f"{scorer}_flagged"] == "1" for r in rows) == rec["flagged"], (method, scorer)


def test_a_cell_of_the_detection_table_equals_an_independent_computation(project, tmp_path):
    """ERM's AP at gamma 0.5: for each seed, the run's training-image scores (through `noisymlt predict`), scored
    |noisy - p| against the labels where noisy and clean differ, by sklearn; then the mean over the seeds."""
    from sklearn.metrics import average_precision_score

    from noisymlt.data.labels import read_labels

    clean = read_labels(project / "data/toy/train_labels.parquet")
    aps, hits, counts = [], [], []
    for seed in (0, 1):
        noisy_file = f"data/toy/noisy/g0.5_s{seed}.parquet"
        out = tmp_path / f"s{seed}.csv"
        done = subprocess.run([sys.executable, "-m", "noisymlt", "predict", "--run", f"runs/toy/g0.5/s{seed}/erm",
                               "--labels", noisy_file, "--images", "data/raw/toy/VOCdevkit/TOY", "--out", str(out),
                               "--no-progress"], cwd=project, env=tool_env(project), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        with open(out, newline="") as fh:
            rows = list(csv.reader(fh))[1:]
        probs = np.array([[float(v) for v in row[2:-1]] for row in rows])
        noisy = read_labels(project / noisy_file)
        assert [r[0] for r in rows] == [str(i) for i in noisy.image_ids] == [str(i) for i in clean.image_ids]
        wrong = (noisy.labels > 0.5) != (clean.labels > 0.5)
        score = np.abs(noisy.labels - probs)
        aps.append(average_precision_score(wrong.ravel(), score.ravel()))
        counts.append(int(wrong.sum()))
        top = np.argsort(-score.ravel(), kind="stable")[:wrong.sum()]
        hits.append(wrong.ravel()[top].mean())
    table = {(r["method"], r["scorer"], r["measure"]): r
             for r in csv.DictReader(open(project / "reports/label_detection_toy.csv", newline=""))}
    assert float(table[("erm", "model", "ap")]["mean"]) == pytest.approx(np.mean(aps), rel=1e-5)
    assert float(table[("erm", "model", "precision_at_wrong")]["mean"]) == pytest.approx(np.mean(hits), rel=1e-5)
    assert float(table[("erm", "model", "wrong")]["mean"]) == pytest.approx(np.mean(counts), rel=1e-6)  # a count
    # Ours' prediction paired by seed with ERM's (the reference; the same noisy set a seed): the mean and the
    # Student-t 95% interval of the differences
    from scipy import stats

    ours = []
    for seed in (0, 1):
        noisy_file = f"data/toy/noisy/g0.5_s{seed}.parquet"
        out = tmp_path / f"ours{seed}.csv"
        assert subprocess.run([sys.executable, "-m", "noisymlt", "predict", "--run", f"runs/toy/g0.5/s{seed}/ours",
                               "--labels", noisy_file, "--images", "data/raw/toy/VOCdevkit/TOY", "--out", str(out),
                               "--no-progress"], cwd=project, env=tool_env(project), capture_output=True,
                              timeout=600).returncode == 0
        with open(out, newline="") as fh:
            probs = np.array([[float(v) for v in row[2:-1]] for row in list(csv.reader(fh))[1:]])
        noisy = read_labels(project / noisy_file)
        wrong = (noisy.labels > 0.5) != (clean.labels > 0.5)
        score = np.abs(noisy.labels - probs)
        ours.append(wrong.ravel()[np.argsort(-score.ravel(), kind="stable")[:wrong.sum()]].mean())
    diffs = np.subtract(ours, hits)
    half = stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs))
    row = table[("ours", "model", "precision_at_wrong")]
    assert float(row["vs_reference"]) == pytest.approx(diffs.mean(), rel=1e-5, abs=1e-9)
    assert float(row["vs_reference_ci95"]) == pytest.approx(half, rel=1e-5)
    assert int(row["paired_seeds"]) == 2 and row["decided"] == str(int(abs(diffs.mean()) > half))
    assert table[("erm", "model", "precision_at_wrong")]["vs_reference"] == ""  # the reference itself
    md = (project / "reports/label_detection_toy.md").read_text()
    erm = next(line for line in md.splitlines() if line.startswith("| ERM | its prediction |"))
    assert erm.split(" | ")[2].startswith(f"{100 * np.mean(aps):.2f} ± "), erm


def _train_images(trainer):
    """The training images as the run's predict loop hands them to the model (its memory format)."""
    import torch

    for _, images in trainer.iterate_train_eval():
        if trainer.cfg["train"]["channels_last"]:
            images = images.contiguous(memory_format=torch.channels_last)
        yield images


def test_one_pass_gives_the_heads_and_each_branch_as_the_branch_alone(project, monkeypatch):
    """The scoring pass (the run's predict loop over predict_for_scoring) reads the reported heads and both
    branches' logits from one forward pass of the model; each equals what it stands for, bit for bit: the heads the
    method's predict gives, each branch that branch run alone on the same images (the pseudo-label rule's _probs)."""
    import torch

    from noisymlt.inference.run_model import load_run

    monkeypatch.chdir(project)
    trainer = load_run("runs/toy/g0.5/s0/ours")
    method, model = trainer.method, trainer.model
    got = trainer.predict(part="train", forward=method.predict_for_scoring)
    assert set(got) == {"ensemble", "random", "balanced", "branch:random", "branch:balanced"}
    heads = trainer.predict(part="train")
    assert all(np.array_equal(got[name], heads[name]) for name in heads)
    branches = {name: [] for name in ("random", "balanced")}
    with torch.no_grad(), trainer.autocast():
        for images in _train_images(trainer):
            for name in branches:
                branches[name].append(method._probs(model, name, images, None))
    for name, parts in branches.items():
        assert np.array_equal(got[f"branch:{name}"], torch.cat(parts).numpy()), name


def test_one_pass_gives_dividemix_head_and_each_net_as_before(project, monkeypatch):
    """For DivideMix the scoring pass reads the reported head and each net's logits from one pass of the two nets:
    the head as predict gives it, each net as that net alone on the shared frozen prefix, bit for bit."""
    import torch

    from noisymlt.inference.run_model import load_run
    from noisymlt.methods.dividemix import NETS, net_logits

    monkeypatch.chdir(project)
    trainer = load_run("runs/toy/g0.5/s0/dividemix")
    method, model = trainer.method, trainer.model
    got = trainer.predict(part="train", forward=method.predict_for_scoring)
    assert set(got) == {"main", *(f"net:{name}" for name in NETS)}
    assert np.array_equal(got["main"], trainer.predict(part="train")["main"])
    nets = {name: [] for name in NETS}
    with torch.no_grad(), trainer.autocast():
        for images in _train_images(trainer):
            frozen = method.shared_prefix(model, images)
            for name in NETS:
                nets[name].append(torch.sigmoid(net_logits(model[name], images, frozen).float()))
    for name, parts in nets.items():
        assert np.array_equal(got[f"net:{name}"], torch.cat(parts).numpy()), name


def test_records_of_two_noise_models_make_two_columns_and_lose_none(project, tmp_path):
    """A grid of two noise models feeds one table a dataset: each (noise model, rate) is its own column, and a seed's
    records of one model never stand in for the other's (the table keys a cell's seeds by its level)."""
    import copy

    from noisymlt.report.detection import read_records, write_tables

    records = read_records(sorted(str(p) for p in (project / "reports/suspects/toy").glob("*.json")))
    other = copy.deepcopy(records)
    for record in other:
        record["noise_model"] = "uniform"
        record["scorers"]["model"]["detection"]["ap"] = 0.5  # told apart from the first model's
    write_tables(records + other, tmp_path / "t.tex", {}, ["erm"])
    rows = list(csv.DictReader(open(tmp_path / "t.csv", newline="")))
    ap = {r["noise_model"]: r for r in rows if (r["method"], r["scorer"], r["measure"]) == ("ours", "model", "ap")}
    first = [r["scorers"]["model"]["detection"]["ap"] for r in records if r["method"] == "ours"]
    assert float(ap["uniform"]["mean"]) == 0.5 and int(ap["uniform"]["seeds"]) == 2
    assert float(ap[records[0]["noise_model"]]["mean"]) == pytest.approx(np.mean(first), rel=1e-5)
    header = (tmp_path / "t.md").read_text().splitlines()[2]
    assert "AP uniform γ=0.5" in header and header.count("γ=0.5") == 8, header


def test_out_of_sample_scorers_are_cleanlabs_own_calls_on_the_same_arrays():
    """The cross-fitted rows: the prediction's |y - p| and cleanlab's per-class quality and flags on the same
    out-of-sample probabilities, called as cleanlab's docs call them; the per-image score is its
    get_label_quality_scores."""
    from cleanlab.multilabel_classification.filter import find_multilabel_issues_per_class
    from cleanlab.multilabel_classification.rank import get_label_quality_scores, get_label_quality_scores_per_class

    from noisymlt.inference.suspects import image_quality, out_of_sample_scores

    rng = np.random.default_rng(4)
    truth = _labels(rng, n=150)
    noisy = np.where(rng.random(truth.shape) < 0.15, 1 - truth, truth)
    probs = np.clip(0.6 * truth + 0.4 * rng.random(truth.shape), 0, 1)
    got = out_of_sample_scores(noisy, probs)
    labels = [list(np.flatnonzero(row)) for row in noisy]
    assert np.array_equal(got["model_oos"].score, np.abs(noisy - probs))
    assert np.allclose(got["cleanlab_oos"].score, 1 - np.asarray(get_label_quality_scores_per_class(labels, probs)))
    assert np.array_equal(got["cleanlab_oos"].flagged, find_multilabel_issues_per_class(labels, probs,
                                                                                          low_memory=False))
    assert np.allclose(image_quality(noisy, probs), get_label_quality_scores(labels, probs))


def test_cross_fitting_predicts_every_training_image_by_a_run_that_never_trained_on_it(project):
    """The workflow's cross-fitting (crossfit.smk, the demo's two folds) on each noisy set of tiny_runs_project:
    every training image's gathered probability is the prediction of the fold run that held it out, read from that
    run's own files, and the table the run trained on (its manifest's, hash-checked) excludes the image; each fold
    run is ERM's final run but for its training rows, a shorter warm-up and its crossfit block, and reads no clean
    label. Suspects scores ERM's labels on them: rows beside the in-sample ones, which they differ from."""
    from noisymlt.core.manifest import file_sha256
    from noisymlt.data.labels import read_labels

    for seed in (0, 1):
        ids = [str(i) for i in read_labels(project / f"data/toy/noisy/g0.5_s{seed}.parquet").image_ids]
        base = project / f"runs/toy/crossfit/erm/g0.5/s{seed}"
        gathered = np.load(base / "out_of_sample.npz")
        assert [str(i) for i in gathered["image_ids"]] == ids and set(gathered["fold"].tolist()) == {0, 1}
        final = json.loads((project / f"runs/toy/g0.5/s{seed}/erm/requested_config.json").read_text())
        warmup = max(1, round(final["train"].pop("warmup_iters") / 2))  # the warm-up's share of a half-size run
        for k in range(2):
            run = base / f"fold{k}"
            manifest = json.loads((run / "manifest.json").read_text())
            tables = {key: manifest["inputs"][key] for key in ("train_labels", "test_labels")}
            for entry in tables.values():
                assert file_sha256(project / entry["path"]) == entry["sha256"]
            trained = {str(i) for i in read_labels(project / tables["train_labels"]["path"]).image_ids}
            with np.load(run / "predictions.npz") as npz:
                predicted = {str(i): row for i, row in zip(npz["image_ids"], npz["scores_main"])}
            rows = [r for r, i in enumerate(ids) if gathered["fold"][r] == k]
            assert rows and {ids[r] for r in rows} == set(predicted) and not trained & set(predicted)
            assert trained | set(predicted) == set(ids)
            assert all(np.array_equal(gathered["probs"][r], predicted[ids[r]]) for r in rows)
            config = json.loads((run / "requested_config.json").read_text())
            assert config.pop("crossfit") == {"folds": 2, "fold": k, "split_seed": 0}
            assert config["train"].pop("warmup_iters") == warmup
            assert config == final
            assert "clean_subset" not in json.dumps(manifest) and "train_labels.parquet" not in json.dumps(manifest)
        record = json.loads((project / f"reports/suspects/toy/g0.5_s{seed}_erm.json").read_text())
        own, oos = record["scorers"]["cleanlab"]["detection"], record["scorers"]["cleanlab_oos"]["detection"]
        assert own["ap"] != oos["ap"] and record["scorers"]["cleanlab_oos"]["same_ranking_as"] == "model_oos"
        assert record["out_of_sample"] == str(base.relative_to(project) / "out_of_sample.npz")
        assert 0 <= record["scorers"]["cleanlab_oos"]["image_detection"]["ap"] <= 1
