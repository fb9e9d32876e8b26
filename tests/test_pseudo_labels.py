"""Co-Learning pseudo labels (Eq. 3): per-group thresholds, strict inequalities, statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from noisymlt.data.labels import read_class_split
from noisymlt.errors import NoisyMLTError
from noisymlt.data.kinds import kind_of
from noisymlt.methods.pseudo_labels import correction_stats, group_thresholds, pseudo_labels

VOC_SPLIT = {  # SPEC 1, expected VOC-MLT split
    "head": [4, 6, 8, 10, 14, 15],
    "medium": [1, 7, 11, 13, 17, 19],
    "tail": [0, 2, 3, 5, 9, 12, 16, 18],
}
SMALL_SPLIT = {"head": [0], "medium": [1], "tail": [2, 3]}


def test_group_thresholds_voc_defaults():
    cfg = kind_of("voc").thresholds["random"]
    alpha, beta = group_thresholds(VOC_SPLIT, 20, cfg["alpha"], cfg["beta"])
    assert alpha.shape == beta.shape == (20,)
    assert np.flatnonzero(alpha < 1).tolist() == VOC_SPLIT["head"]
    assert np.allclose(alpha[VOC_SPLIT["head"]], 0.7)
    assert np.flatnonzero(beta > 0).tolist() == VOC_SPLIT["tail"]
    assert np.allclose(beta[VOC_SPLIT["tail"]], 0.1)
    assert np.all(alpha[VOC_SPLIT["medium"] + VOC_SPLIT["tail"]] == 1.0)
    assert np.all(beta[VOC_SPLIT["head"] + VOC_SPLIT["medium"]] == 0.0)


def test_defaults_match_the_published_runs():
    for branch in ("random", "balanced"):
        assert kind_of("voc").thresholds[branch] == {"alpha": {"head": 0.7}, "beta": {"tail": 0.1}}
        assert kind_of("coco").thresholds[branch] == {"alpha": {"head": 0.9}, "beta": {}}


def test_coco_defaults_on_the_reference_split(reference_dir):
    split = read_class_split(reference_dir / "coco_mlt_class_split.json")
    cfg = kind_of("coco").thresholds["balanced"]
    alpha, beta = group_thresholds(split, 80, cfg["alpha"], cfg["beta"])
    assert np.flatnonzero(alpha == 0.9).tolist() == split["head"]
    assert len(split["head"]) == 22 and np.all(beta == 0.0)


def test_group_thresholds_none_and_missing_groups_are_off():
    alpha, beta = group_thresholds(SMALL_SPLIT, 4, {"head": 0.8, "tail": None}, None)
    assert alpha.tolist() == [0.8, 1.0, 1.0, 1.0]
    assert beta.tolist() == [0.0, 0.0, 0.0, 0.0]
    alpha, beta = group_thresholds(SMALL_SPLIT, 4, {}, {"medium": 0.3, "tail": 0.2})
    assert alpha.tolist() == [1.0] * 4
    assert beta.tolist() == [0.0, 0.3, 0.2, 0.2]
    # edges of the allowed ranges: alpha = 1 and beta = 0 are legal (they mean "off")
    alpha, beta = group_thresholds(SMALL_SPLIT, 4, {"head": 1.0}, {"head": 0.0})
    assert alpha[0] == 1.0 and beta[0] == 0.0


@pytest.mark.parametrize(
    "alpha, beta, match",
    [
        ({"head": 0.0}, None, r"alpha\['head'\].*\(0, 1\]"),
        ({"head": 1.2}, None, r"alpha\['head'\]"),
        ({"tail": float("nan")}, None, r"alpha\['tail'\]"),
        (None, {"tail": 1.0}, r"beta\['tail'\].*\[0, 1\)"),
        (None, {"medium": -0.1}, r"beta\['medium'\]"),
        ({"tail": "0.7"}, None, r"alpha\['tail'\]: must be a number"),
        (None, {"head": True}, r"beta\['head'\]: must be a number"),
        ({"head": 0.3}, {"head": 0.4}, r"beta\['head'\] = 0.4 exceeds alpha\['head'\] = 0.3"),
        ({"middle": 0.7}, None, r"alpha: unknown group 'middle'"),
        (None, {"rare": 0.1}, r"beta: unknown group 'rare'"),
    ],
)
def test_group_thresholds_validation(alpha, beta, match):
    with pytest.raises(NoisyMLTError, match=match):
        group_thresholds(SMALL_SPLIT, 4, alpha, beta)


@pytest.mark.parametrize(
    "split, match",
    [
        ({"head": [0], "medium": [1], "tail": [2]}, r"classes \[3\] belong to no group"),
        ({"head": [0, 1], "medium": [1], "tail": [2, 3]}, r"split\['medium'\]: class 1 is also in group 'head'"),
        ({"head": [0], "medium": [1], "tail": [2, 4]}, r"split\['tail'\]: class index 4 outside \[0, 4\)"),
        ({"head": [0], "middle": [1], "tail": [2, 3]}, r"unknown group 'middle'"),
    ],
)
def test_group_thresholds_split_validation(split, match):
    with pytest.raises(NoisyMLTError, match=match):
        group_thresholds(split, 4, {"head": 0.7}, None)


def test_pseudo_labels_rules_and_strict_edges():
    alpha = np.array([0.7, 0.7, 1.0, 0.9])
    beta = np.array([0.1, 0.1, 0.2, 0.0])
    noisy = np.array(
        [
            [0, 1, 0, 1],
            [1, 0, 1, 0],
            [0, 1, 1, 1],
        ],
        dtype=np.uint8,
    )
    q = np.array(
        [
            [0.71, 0.05, 1.00, 0.00],  # 0->1 (q > alpha); 1->0 (q < beta); alpha=1 never fires; beta=0 never fires
            [0.70, 0.10, 0.19, 0.95],  # q == alpha keeps 1; q == beta keeps 0; 1->0 (0.19 < 0.2); 0->1
            [0.50, 0.50, 0.50, 0.50],  # between the thresholds: noisy label kept
        ]
    )
    expected = np.array(
        [
            [1, 0, 0, 1],
            [1, 0, 0, 1],
            [0, 1, 1, 1],
        ],
        dtype=np.uint8,
    )
    out = pseudo_labels(noisy, q, alpha, beta)
    assert out.dtype == np.uint8 and np.array_equal(out, expected)

    noisy_t = torch.tensor(noisy, dtype=torch.float32)
    q_t = torch.tensor(q, dtype=torch.float32, requires_grad=True)
    out_t = pseudo_labels(noisy_t, q_t, alpha, beta)
    assert out_t.dtype == torch.float32 and not out_t.requires_grad
    assert torch.equal(out_t, torch.tensor(expected, dtype=torch.float32))


def test_pseudo_labels_with_group_vectors_from_a_split():
    alpha, beta = group_thresholds(SMALL_SPLIT, 4, {"head": 0.7}, {"tail": 0.1})
    noisy = torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    q = torch.tensor([[0.8, 0.99, 0.05, 0.5], [0.01, 0.01, 0.2, 0.95]])
    # head (class 0): only alpha; medium (1): off; tail (2, 3): only beta
    expected = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    assert torch.equal(pseudo_labels(noisy, q, alpha, beta), expected)


def test_pseudo_labels_half_precision_probabilities_use_exact_thresholds():
    # 0.7002 in float16 is 0.70019531 > 0.7001; 0.7001 itself rounds to the same float16 value,
    # so comparing in float16 would miss this correction.
    q = torch.tensor([[0.7002]], dtype=torch.float16)
    out = pseudo_labels(torch.zeros(1, 1), q, np.array([0.7001]), np.array([0.0]))
    assert out.item() == 1.0


def test_pseudo_labels_shape_checks():
    with pytest.raises(ValueError, match="thresholds must have shape"):
        pseudo_labels(np.zeros((2, 3)), np.zeros((2, 3)), np.ones(2), np.zeros(3))
    with pytest.raises(ValueError, match="targets"):
        pseudo_labels(np.zeros((2, 3)), np.zeros((3, 3)), np.ones(3), np.zeros(3))


def test_correction_stats():
    noisy = np.array([[1, 0, 0, 1], [0, 1, 0, 1]])
    corrected = np.array([[0, 1, 1, 1], [0, 0, 1, 0]])
    clean = np.array([[0, 1, 0, 1], [1, 1, 1, 0]])
    # added: (0,1) right, (0,2) wrong, (1,2) right; removed: (0,0) right, (1,1) wrong, (1,3) right
    expected = {"added": 3, "added_correct": 2, "removed": 3, "removed_correct": 2, "entries": 8}
    assert correction_stats(noisy, corrected, clean) == expected
    as_tensors = [torch.tensor(x, dtype=torch.float32) for x in (noisy, corrected, clean)]
    assert correction_stats(*as_tensors) == expected
    with pytest.raises(ValueError, match="clean has shape"):
        correction_stats(noisy, corrected, clean[:1])
