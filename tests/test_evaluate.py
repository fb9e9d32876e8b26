"""AP and mAP against an independent implementation, groups, and input checks."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from noisymlt.data.labels import LabelTable, write_class_split, write_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.evaluation.evaluate import evaluate_predictions
from noisymlt.evaluation.metrics import average_precisions, summarise


def ap_by_hand(y: np.ndarray, s: np.ndarray) -> float:
    """Non-interpolated AP: mean over positives of the precision at each positive's rank (ties broken
    pessimistically by grouping equal scores, as sklearn's step-wise curve does)."""
    order = np.argsort(-s, kind="stable")
    y, s = y[order], s[order]
    ap, tp, prev_recall = 0.0, 0, 0.0
    npos = y.sum()
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        tp += y[i:j].sum()
        precision, recall = tp / j, tp / npos
        ap += (recall - prev_recall) * precision
        prev_recall = recall
        i = j
    return ap


def test_ap_matches_hand_computation_on_a_worked_example():
    y = np.array([[1], [0], [1], [0], [1]])
    s = np.array([[0.9], [0.8], [0.7], [0.6], [0.2]])
    # ranks of positives 1, 3, 5 -> precisions 1, 2/3, 3/5 -> AP = (1 + 0.6667 + 0.6) / 3
    assert average_precisions(y, s)[0] == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)


def test_ap_matches_independent_implementation_with_ties():
    rng = np.random.default_rng(3)
    y = (rng.random((300, 6)) < 0.2).astype(np.uint8)
    s = np.round(rng.random((300, 6)) * 0.5 + 0.5 * y * rng.random((300, 6)), 2)  # many ties
    ours = average_precisions(y, s)
    for c in range(6):
        assert ours[c] == pytest.approx(ap_by_hand(y[:, c], s[:, c]), abs=1e-12)


def test_ap_equals_sklearn(tmp_path):
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(5)
    y = (rng.random((500, 8)) < np.linspace(0.02, 0.4, 8)).astype(np.uint8)
    y[0] = 1
    for s in (rng.random((500, 8)), np.round(rng.random((500, 8)), 1), np.zeros((500, 8)) + y * 0.5):
        ours = average_precisions(y, s.astype(np.float32))
        ref = [average_precision_score(y[:, c], s[:, c].astype(np.float32)) for c in range(8)]
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_class_without_positives_is_left_out_of_the_means():
    y = np.array([[1, 0, 1], [0, 0, 1], [1, 0, 0]])
    s = np.array([[0.9, 0.1, 0.2], [0.1, 0.5, 0.8], [0.8, 0.3, 0.1]])
    aps = average_precisions(y, s)
    assert np.isnan(aps[1])
    m = summarise(aps, {"head": [0], "medium": [1], "tail": [2]})
    assert m["total"] == pytest.approx(np.mean([aps[0], aps[2]]))
    assert np.isnan(m["medium"]) and m["head"] == pytest.approx(1.0)


def _write_case(tmp_path, ids, labels, scores, heads=("main",)):
    table = LabelTable(ids, ["a", "b", "c"], labels, paths=[f"{i}.jpg" for i in ids])
    write_labels(table, tmp_path / "test.parquet")
    write_class_split({"head": [0], "medium": [1], "tail": [2]}, tmp_path / "split.json")
    np.savez(tmp_path / "pred.npz", image_ids=np.array(ids), heads=np.array(heads),
             **{f"scores_{h}": scores for h in heads})


def test_evaluate_predictions_groups(tmp_path):
    rng = np.random.default_rng(0)
    labels = (rng.random((50, 3)) < 0.4).astype(np.uint8)
    labels[0] = 1
    scores = rng.random((50, 3))
    _write_case(tmp_path, [str(i) for i in range(50)], labels, scores, heads=("ensemble", "random"))
    res = evaluate_predictions(tmp_path / "pred.npz", tmp_path / "test.parquet", tmp_path / "split.json")
    assert list(res["heads"]) == ["ensemble", "random"]
    aps = [ap_by_hand(labels[:, c], scores[:, c]) for c in range(3)]
    m = res["heads"]["ensemble"]["map"]
    assert m["total"] == pytest.approx(np.mean(aps))
    assert (m["head"], m["medium"], m["tail"]) == pytest.approx(tuple(aps))
    json.dumps(res)  # serialisable


def test_evaluate_refuses_predictions_of_another_test_set(tmp_path):
    labels = np.eye(3, dtype=np.uint8)
    _write_case(tmp_path, ["x", "y", "z"], labels, np.eye(3))
    np.savez(tmp_path / "pred.npz", image_ids=np.array(["x", "z", "y"]), heads=np.array(["main"]),
             scores_main=np.eye(3))
    with pytest.raises(NoisyMLTError, match="image ids do not match"):
        evaluate_predictions(tmp_path / "pred.npz", tmp_path / "test.parquet", tmp_path / "split.json")


def test_damaged_or_incomplete_predictions_name_the_file(tmp_path, capsys):
    from noisymlt.cli import main

    labels = np.eye(3, dtype=np.uint8)
    _write_case(tmp_path, ["x", "y", "z"], labels, np.eye(3))
    pred = tmp_path / "pred.npz"
    args = ["evaluate", "--predictions", str(pred), "--test-labels", str(tmp_path / "test.parquet"),
            "--split", str(tmp_path / "split.json"), "--out", str(tmp_path / "m.json")]
    whole = pred.read_bytes()
    cases = [
        (whole[: len(whole) // 2], "damaged or incomplete"),  # a copy cut short
        (b"not a zip file", "damaged or incomplete"),
    ]
    for content, message in cases:
        pred.write_bytes(content)
        assert main(args) == 2
        err = capsys.readouterr().err
        assert str(pred) in err and message in err
    np.savez(pred, image_ids=np.array(["x", "y", "z"]), heads=np.array(["main"]))  # a head without scores
    assert main(args) == 2 and "head 'main' has no 'scores_main' array" in capsys.readouterr().err
    np.savez(pred, image_ids=np.array(["x", "y", "z"]), heads=np.array(["main"]), scores_main=np.eye(2))
    assert main(args) == 2 and "shape (2, 2), expected (3, 3)" in capsys.readouterr().err
    np.savez(pred, heads=np.array(["main"]), scores_main=np.eye(3))
    assert main(args) == 2 and "no 'image_ids' array" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_a_label_table_that_lost_columns_is_refused_naming_them(tmp_path):
    import pyarrow.parquet as pq

    from noisymlt.data.labels import read_labels

    table = LabelTable(["1", "2"], ["a", "b", "c"], np.eye(3, dtype=np.uint8)[:2], paths=["1.jpg", "2.jpg"])
    write_labels(table, tmp_path / "t.parquet")
    arrow = pq.read_table(tmp_path / "t.parquet")
    for dropped in (["b"], ["path"], ["path", "a"]):  # named in the order the table had them
        pq.write_table(arrow.drop_columns(dropped), tmp_path / "edited.parquet")  # keeps the metadata
        with pytest.raises(NoisyMLTError, match=rf"edited.parquet: column\(s\) {re.escape(str(dropped))} missing"):
            read_labels(tmp_path / "edited.parquet")
    assert read_labels(tmp_path / "t.parquet").classes == ["a", "b", "c"]
