"""ML-GCN: the label-graph adjacency against hand-computed numbers, GCN shapes and arithmetic, the
GloVe download (checksum before unpickling, restricted unpickler, COCO reordering, offline fallback),
and a short Trainer run on the tiny toy data."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from helpers import tiny_params, toy_trainer
from noisymlt.data import glove
from noisymlt.data.kinds import kind_of
from noisymlt.data.classes import VOC_CLASSES
from noisymlt.errors import NoisyMLTError
from noisymlt.models.backbones import SmallCNN
from noisymlt.models.mlgcn import LabelGCN, MLGCNNet, code_adjacency, label_adjacency, normalize_adjacency
from noisymlt.config import resolve_run, validate_params

MLGCN_BLOCK = {"family": "mlgcn", "label": "ML-GCN", "description": "test block", "sampler": "random",
               "loss": "bce", "t": 0.4, "p": 0.2, "embeddings": "glove"}

# 5 images, 4 classes; class 3 has no positive (possible at high noise rates).
LABELS = np.array([[1, 1, 0, 0],
                   [1, 0, 0, 0],
                   [1, 1, 1, 0],
                   [0, 1, 1, 0],
                   [1, 0, 0, 0]])


# ------------------------------------------------------------------ adjacency
def test_adjacency_by_hand():
    # counts n = (4, 3, 2, 0); co-occurrences (0,1)=2, (0,2)=1, (1,2)=2.
    # P(j|i): row 0 = (1, 2/4, 1/4, 0), row 1 = (2/3, 1, 2/3, 0), row 2 = (1/2, 1, 1, 0), row 3 = 0.
    # Binarised at 0.4 off the diagonal: row 0 -> {1}, row 1 -> {0, 2}, row 2 -> {0, 1}, row 3 -> {}.
    expected = np.array([[0.8, 0.2, 0.0, 0.0],
                         [0.1, 0.8, 0.1, 0.0],
                         [0.1, 0.1, 0.8, 0.0],
                         [0.0, 0.0, 0.0, 0.8]])
    a = label_adjacency(LABELS, t=0.4, p=0.2)
    np.testing.assert_allclose(a, expected, atol=1e-12)
    # t = 0.6 drops P = 1/2 edges: row 0 has no neighbour left, row 2 keeps only class 1.
    np.testing.assert_allclose(label_adjacency(LABELS, t=0.6, p=0.2),
                               [[0.8, 0, 0, 0], [0.1, 0.8, 0.1, 0], [0, 0.2, 0.8, 0], [0, 0, 0, 0.8]], atol=1e-12)
    # Row sums 1, 1, 1, 0.8 -> D = diag(1, 1, 1, 0.8^-1/2); D A^T D transposes the 3x3 block and
    # scales the isolated class's self-loop to 0.8 / 0.8 = 1.
    norm = normalize_adjacency(a)
    np.testing.assert_allclose(norm, [[0.8, 0.1, 0.1, 0.0],
                                      [0.2, 0.8, 0.1, 0.0],
                                      [0.0, 0.1, 0.8, 0.0],
                                      [0.0, 0.0, 0.0, 1.0]], atol=1e-12)


def test_adjacency_threshold_is_inclusive_and_normalisation_scales():
    # P(1|0) = 2/5 = t exactly: an edge (ML-GCN binarises with >= t).
    y = np.array([[1, 1], [1, 1], [1, 0], [1, 0], [1, 0]])
    np.testing.assert_allclose(label_adjacency(y, t=0.4, p=0.3), [[0.7, 0.3], [0.3, 0.7]])
    np.testing.assert_allclose(label_adjacency(y, t=0.41, p=0.3), [[0.7, 0.0], [0.3, 0.7]])
    # Row sums 0.7 and 1 -> entry (i, j) = A[j, i] / sqrt(s_i s_j).
    np.testing.assert_allclose(normalize_adjacency(label_adjacency(y, t=0.41, p=0.3)),
                               [[1.0, 0.3 / np.sqrt(0.7)], [0.0, 0.7]])
    with pytest.raises(NoisyMLTError):
        label_adjacency(y, t=0.4, p=1.0)


# ------------------------------------------------------------------ GCN
def test_gcn_shapes_and_arithmetic():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((4, 300)).astype(np.float32)
    adj = normalize_adjacency(label_adjacency(LABELS))
    gcn = LabelGCN(emb, adj, out_dim=256)
    assert gcn.gc1.weight.shape == (300, 1024) and gcn.gc2.weight.shape == (1024, 256)
    w = gcn()
    assert w.shape == (4, 256)
    a, e = torch.tensor(adj, dtype=torch.float32), torch.tensor(emb)
    h = a @ (e @ gcn.gc1.weight)
    expected = a @ (torch.where(h > 0, h, 0.2 * h) @ gcn.gc2.weight)
    torch.testing.assert_close(w, expected)

    torch.manual_seed(0)
    net = MLGCNNet(SmallCNN(width=8), LabelGCN(emb, adj, out_dim=64)).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        logits = net(x)  # ML-GCN's code max-pools the last feature map
        torch.testing.assert_close(logits, net.backbone(x).amax(dim=(2, 3)) @ net.gcn().T)
        net.pool = "avg"
        torch.testing.assert_close(net(x), net.backbone(x).mean(dim=(2, 3)) @ net.gcn().T)
    assert logits.shape == (3, 4)
    with pytest.raises(NoisyMLTError, match="do not match"):
        LabelGCN(emb, adj[:3, :3], out_dim=8)


# ------------------------------------------------------------------ embeddings
class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_restricted_unpickler_loads_arrays_and_refuses_code(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    for protocol in (2, 3, 4, 5):
        np.testing.assert_array_equal(glove.load_array_pickle(pickle.dumps(arr, protocol=protocol)), arr)
    marker = tmp_path / "pwned"
    with pytest.raises(NoisyMLTError, match="posix.system|os.system|not allowed"):
        glove.load_array_pickle(pickle.dumps(_Evil(marker)), "evil.pkl")
    assert not marker.exists()
    with pytest.raises(NoisyMLTError, match="holds dict"):
        glove.load_array_pickle(pickle.dumps({"adj": 1}))


def test_glove_is_read_from_its_file_only(tmp_path, monkeypatch):
    # A run reads the file its config names and nothing else; a missing file names the step that fetches it
    # and the offline fallback.
    missing = tmp_path / "voc_glove.pkl"
    with pytest.raises(NoisyMLTError, match="embeddings: random") as err:
        glove.class_embeddings("voc", list(VOC_CLASSES), "glove", missing)
    assert f"snakemake {missing}" in str(err.value)
    with pytest.raises(NoisyMLTError, match="assets.glove.voc"):
        glove.class_embeddings("voc", list(VOC_CLASSES), "glove", None)
    # A file that is not a plain array pickle is refused without running anything.
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(NoisyMLTError, match="not allowed"):
        glove.read_glove("voc", list(VOC_CLASSES), evil)
    assert not marker.exists()
    wrong = tmp_path / "wrong.pkl"
    wrong.write_bytes(pickle.dumps(np.zeros((20, 299), np.float32)))
    with pytest.raises(NoisyMLTError, match=r"expected a float \(20, 300\) array"):
        glove.read_glove("voc", list(VOC_CLASSES), wrong)


def test_coco_rows_follow_alphabetical_names(tmp_path, monkeypatch):
    # The published file's rows are the class names sorted alphabetically; the project's classes
    # come in category-id order.
    rows = {"airplane": 1.0, "bicycle": 2.0, "person": 3.0}
    published = np.stack([np.full(300, rows[name], np.float32) for name in sorted(rows)])
    path = tmp_path / "coco_glove.pkl"
    path.write_bytes(pickle.dumps(published))
    monkeypatch.setattr(kind_of("coco"), "glove_rows", 3)
    classes = ["person", "bicycle", "airplane"]
    np.testing.assert_array_equal(glove.glove_row_order("coco", classes), [2, 1, 0])
    emb = glove.class_embeddings("coco", classes, "glove", path)
    assert emb.dtype == np.float32 and emb.shape == (3, 300)
    np.testing.assert_array_equal(emb[:, 0], [3.0, 2.0, 1.0])


def test_pseudo_embeddings_are_deterministic_per_name():
    a = glove.pseudo_embeddings(["cat", "dog", "red_disc"])
    b = glove.pseudo_embeddings(["red_disc", "cat"])
    assert a.shape == (3, 300) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(a[[2, 0]], b)
    assert abs(float(a[0] @ a[1])) < 0.3  # unrelated names: nearly orthogonal, no semantic prior
    # The toy dataset has no words: glove mode falls back without any download.
    np.testing.assert_array_equal(glove.class_embeddings("toy", ["cat", "dog"], "glove", "unused"), a[:2])
    with pytest.raises(NoisyMLTError):
        glove.class_embeddings("voc", ["cat"], "word2vec", "unused")


# ------------------------------------------------------------------ method
def mlgcn_params(**train):
    params = tiny_params("mlgcn", **train)
    params["methods"]["mlgcn"] = dict(MLGCN_BLOCK)
    validate_params(params)
    return params


def test_schema_rejects_bad_options():
    for key, value in (("t", 1.5), ("p", 1.0), ("embeddings", "word2vec"), ("adjacency", "learned"), ("pool", "sum")):
        params = mlgcn_params()
        params["methods"]["mlgcn"][key] = value
        with pytest.raises(NoisyMLTError, match=key):
            validate_params(params)


def test_trainer_run_on_tiny_toy(tiny_toy, tmp_path):
    from noisymlt.data.labels import read_labels
    resolved = resolve_run(mlgcn_params(epochs=2, lr_steps=[2], image_size=16), "toy", "mlgcn", 0.5, 0)
    trainer = toy_trainer(tiny_toy, resolved, tmp_path / "run")
    model = trainer.model
    noisy = read_labels(tiny_toy["noisy"]).labels
    expected_adj = normalize_adjacency(code_adjacency(noisy, 0.4))  # ML-GCN's gen_A by default
    np.testing.assert_allclose(model.gcn.adjacency.numpy(), expected_adj, rtol=1e-6)
    assert model.gcn.embeddings.shape == (20, 300) and model.gcn.gc2.weight.shape == (1024, 256)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.run()
    after = model.state_dict()
    for key in ("gcn.gc1.weight", "gcn.gc2.weight", "backbone.body.0.weight"):
        assert not torch.equal(before[key], after[key]), key
    for key in ("gcn.adjacency", "gcn.embeddings"):  # fixed inputs of the GCN
        assert torch.equal(before[key], after[key]), key
    log = (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()
    assert len(log) == 2 and all(np.isfinite(json.loads(r)["loss"]) for r in log)
    pred = np.load(tmp_path / "run" / "predictions.npz")
    assert list(pred["heads"]) == ["main"]
    scores = pred["scores_main"]
    assert scores.shape == (200, 20) and np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()
