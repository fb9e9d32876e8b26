"""A user's own files, fuzzed reader by reader: whatever a file holds, the command exits non-zero with one line
naming the file, never a Python traceback; and no command writes an output over one of its inputs.

Each case writes one bad file into tmp_path and runs the command through the CLI's main(), as `python -m noisymlt`
does (an exception the CLI does not turn into its one line fails the test with that exception).
"""

from __future__ import annotations

import hashlib
import io
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from noisymlt.cli import main
from noisymlt.data.labels import LabelTable, write_labels

CLASSES = ["a", "b", "c"]
GARBAGE = bytes(range(256)) * 3  # not UTF-8, not Parquet, not a pickle, not a zip


def _run(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return rc, err


def _one_line(rc: int, err: str, *needles: str) -> None:
    assert rc != 0, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.fixture
def clean(tmp_path):
    table = LabelTable(image_ids=[f"i{k}" for k in range(6)], classes=CLASSES,
                       labels=np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]]))
    return write_labels(table, tmp_path / "clean.parquet")


# ------------------------------------------------------------------ label tables (CSV and Parquet)
def _parquet(path, frame: pd.DataFrame, metadata: bytes | None = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = pa.Table.from_pandas(frame, preserve_index=False)
    if metadata is not None:
        arrow = arrow.replace_schema_metadata({b"noisymlt": metadata})
    pq.write_table(arrow, path)


LABEL_CASES = {
    "empty csv": ("x.csv", lambda p: p.write_bytes(b""), "cannot read label table"),
    "empty parquet": ("x.parquet", lambda p: p.write_bytes(b""), "cannot read label table"),
    "binary csv": ("x.csv", lambda p: p.write_bytes(GARBAGE), "x.csv"),
    "binary parquet": ("x.parquet", lambda p: p.write_bytes(GARBAGE), "cannot read label table"),
    "latin-1 csv": ("x.csv", lambda p: p.write_bytes("image_id,caf\xe9,b\ni0,1,0\n".encode("latin-1")), "x.csv"),
    "a folder": ("x.csv", lambda p: p.mkdir(), "x.csv"),
    "wrong suffix": ("x.txt", lambda p: p.write_text("image_id,a,b\ni0,1,0\n"), "x.txt"),
    "header only": ("x.csv", lambda p: p.write_text("image_id,a,b\n"), "no positive label"),
    "one column": ("x.csv", lambda p: p.write_text("image_id\ni0\ni1\n"), "no class columns"),
    "no id column": ("x.csv", lambda p: p.write_text("a,b\n1,0\n"), "no 'image_id' column"),
    "one class": ("x.csv", lambda p: p.write_text("image_id,a\ni0,1\n"), "at least 2 classes"),
    "text labels": ("x.csv", lambda p: p.write_text("image_id,a,b\ni0,yes,no\n"), "labels must be 0 or 1"),
    "fractions": ("x.csv", lambda p: p.write_text("image_id,a,b\ni0,0.5,1\n"), "labels must be 0 or 1"),
    "empty cell": ("x.csv", lambda p: p.write_text("image_id,a,b\ni0,,1\n"), "missing label values"),
    "duplicate ids": ("x.csv", lambda p: p.write_text("image_id,a,b\ni0,1,0\ni0,0,1\n"), "duplicate image_id"),
    "all zero": ("x.csv", lambda p: p.write_text("image_id,a,b\ni0,0,0\n"), "no positive label"),
    "ragged csv": ("x.csv", lambda p: p.write_text("image_id,a,b\ni0,1,0,1,1\n"), "x.csv"),
    "string labels": ("x.parquet", lambda p: _parquet(p, pd.DataFrame({"image_id": ["i0"], "a": ["1"], "b": ["0"]})),
                      "labels must be 0 or 1"),
    "list cells": ("x.parquet", lambda p: _parquet(p, pd.DataFrame({"image_id": ["i0", "i1"], "a": [[1], [0]],
                                                                    "b": [0, 1]})), "labels must be 0 or 1"),
    "integer ids": ("x.parquet", lambda p: _parquet(p, pd.DataFrame({"image_id": [7, 7], "a": [1, 0], "b": [0, 1]})),
                    "duplicate image_id"),
    "metadata not json": ("x.parquet", lambda p: _parquet(p, pd.DataFrame({"image_id": ["i0"], "a": [1], "b": [0]}),
                                                          b"\xff{"), "x.parquet"),
    "metadata a list": ("x.parquet", lambda p: _parquet(p, pd.DataFrame({"image_id": ["i0"], "a": [1], "b": [0]}),
                                                        b"[1, 2]"), "x.parquet"),
    "metadata odd columns": ("x.parquet", lambda p: _parquet(p, pd.DataFrame({"image_id": ["i0"], "a": [1], "b": [0]}),
                                                             b'{"columns": 5, "classes": "ab", "digests": 3}'),
                             "x.parquet"),
}


@pytest.mark.parametrize("case", LABEL_CASES)
def test_a_bad_labels_table_is_one_line(tmp_path, capsys, case):
    name, write, needle = LABEL_CASES[case]
    path = tmp_path / name
    write(path)
    rc, err = _run(capsys, "noise", "--labels", path, "--gamma", "0.5", "--seed", "0", "--out", tmp_path / "o.parquet")
    _one_line(rc, err, str(path), needle)
    assert not (tmp_path / "o.parquet").exists()


# ------------------------------------------------------------------ transition-matrix files (class_conditional)
def _npy(array):
    def write(path):
        with open(path, "wb") as f:
            np.save(f, array, allow_pickle=True)
    return write


IDENTITY_CSV = "class,a,b,c\na,1,0,0\nb,0,1,0\nc,0,0,1\n"
MATRIX_CASES = {
    "missing": ("m.csv", lambda p: None, "no such file"),
    "empty csv": ("m.csv", lambda p: p.write_bytes(b""), "empty file"),
    "binary csv": ("m.csv", lambda p: p.write_bytes(GARBAGE), "not UTF-8 text"),
    "binary, upper-case suffix": ("m.NPY", lambda p: p.write_bytes(GARBAGE), "m.NPY"),
    "no suffix": ("m", lambda p: p.write_bytes(GARBAGE), "m"),
    "a folder": ("m.csv", lambda p: p.mkdir(), "m.csv"),
    "wrong header": ("m.csv", lambda p: p.write_text("class,x,y,z\na,1,0,0\nb,0,1,0\nc,0,0,1\n"), "header row"),
    "not a number": ("m.csv", lambda p: p.write_text(IDENTITY_CSV.replace("a,1,0,0", "a,one,0,0")), "not a number"),
    "ragged": ("m.csv", lambda p: p.write_text(IDENTITY_CSV.replace("a,1,0,0", "a,1,0")), "has 2 values"),
    "rows off": ("m.csv", lambda p: p.write_text(IDENTITY_CSV.replace("a,1,0,0", "a,1,1,0")), "sums to 2"),
    "negative": ("m.csv", lambda p: p.write_text(IDENTITY_CSV.replace("a,1,0,0", "a,2,-1,0")), "probabilities"),
    "nan": ("m.csv", lambda p: p.write_text(IDENTITY_CSV.replace("a,1,0,0", "a,nan,0,1")), "probabilities"),
    "header only": ("m.csv", lambda p: p.write_text("class,a,b,c\n"), "m.csv"),
    "npy garbage": ("m.npy", lambda p: p.write_bytes(GARBAGE), "not a readable .npy"),
    "npy empty": ("m.npy", lambda p: p.write_bytes(b""), "not a readable .npy"),
    "npy pickle": ("m.npy", _npy(np.array([{"a": 1}], dtype=object)), "not a readable .npy"),
    "npy strings": ("m.npy", _npy(np.array([["1", "0", "0"]] * 3)), "numbers"),
    "npy complex": ("m.npy", _npy(np.eye(3) * (1 + 1j)), "numbers"),
    "npy structured": ("m.npy", _npy(np.zeros(3, dtype=[("x", "f8"), ("y", "f8")])), "numbers"),
    "npy 1-d": ("m.npy", _npy(np.ones(3) / 3), "shape (3,)"),
    "npy 3-d": ("m.npy", _npy(np.ones((3, 3, 1)) / 3), "shape (3, 3, 1)"),
    "npy 0-d": ("m.npy", _npy(np.float64(1.0)), "shape ()"),
    "npy nan": ("m.npy", _npy(np.full((3, 3), np.nan, np.float16)), "probabilities"),
    "npz": ("m.npz", lambda p: np.savez(p, m=np.eye(3)), "m.npz"),
}


@pytest.mark.parametrize("case", MATRIX_CASES)
def test_a_bad_matrix_file_is_one_line(tmp_path, capsys, clean, case):
    name, write, needle = MATRIX_CASES[case]
    path = tmp_path / name
    write(path)
    rc, err = _run(capsys, "noise", "--labels", clean, "--gamma", "0.5", "--seed", "0", "--out",
                   tmp_path / "o.parquet", "--model", "class_conditional", "--option", f"matrix={path}")
    _one_line(rc, err, str(path), needle)
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("dtype", ["int64", "bool", "float32"])
def test_a_matrix_of_any_numeric_dtype_reads(tmp_path, capsys, clean, dtype):
    path = tmp_path / "m.npy"
    np.save(path, np.eye(3).astype(dtype))
    rc, err = _run(capsys, "noise", "--labels", clean, "--gamma", "0.5", "--seed", "0", "--out",
                   tmp_path / "o.parquet", "--model", "class_conditional", "--option", f"matrix={path}")
    assert rc == 0, err


# ------------------------------------------------------------------ [CL]'s noisy-label pickles (authors-noise)
def _pickled(obj):
    return lambda p: p.write_bytes(pickle.dumps(obj, protocol=2))


ROWS = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]], np.uint8)


class _Hostile:
    def __reduce__(self):
        import os

        return os.system, ("echo ran",)


PICKLE_CASES = {
    "empty": (lambda p: p.write_bytes(b""), "not a readable pickle"),
    "garbage": (lambda p: p.write_bytes(GARBAGE), "not a readable pickle"),
    "a list": (_pickled([1, 2]), "holds a list"),
    "no keys": (_pickled({"x": 1}), "no key(s)"),
    "int keys": (_pickled({1: ROWS, 2: ROWS}), "no key(s)"),
    "labels a string": (_pickled({"labels": "101", "clean_labels": ROWS}), "'labels'"),
    "labels 3-d": (_pickled({"labels": ROWS[None], "clean_labels": ROWS}), "'labels' has shape"),
    "labels of 2s": (_pickled({"labels": ROWS * 2, "clean_labels": ROWS}), "other than 0 and 1"),
    "ragged rows": (_pickled({"labels": [[1, 0], [1, 0, 0]], "clean_labels": ROWS}), "not a matrix"),
    "rows of text": (_pickled({"labels": [["1", "0", "0"]] * 6, "clean_labels": ROWS}), "other than 0 and 1"),
    "rows of dicts": (_pickled({"labels": [{"a": 1}] * 6, "clean_labels": ROWS}), "'labels'"),
    "none rows": (_pickled({"labels": None, "clean_labels": ROWS}), "'labels'"),
    "empty rows": (_pickled({"labels": np.zeros((0, 3)), "clean_labels": np.zeros((0, 3))}), "has shape"),
    "bytes with an argument": (lambda p: p.write_bytes(b"c__builtin__\nbytes\n(J\x00\x10\x00\x00tR."),
                               "not a readable pickle"),
    "shapes differ": (_pickled({"labels": ROWS[:5], "clean_labels": ROWS}), "but 'clean_labels'"),
    "clean rows differ": (_pickled({"labels": ROWS, "clean_labels": 1 - ROWS}), "differ from the clean table's"),
    "hostile": (_pickled(_Hostile()), "refused to unpickle"),
    "odd class_freq": (_pickled({"labels": ROWS, "clean_labels": ROWS, "class_freq": {"a": 1}}), None),
}


@pytest.mark.parametrize("case", PICKLE_CASES)
def test_a_bad_authors_pickle_is_one_line(tmp_path, capsys, clean, case):
    write, needle = PICKLE_CASES[case]
    path = tmp_path / "class_freq_0.5noise.pkl"
    write(path)
    ids = tmp_path / "img_id.txt"
    ids.write_text("".join(f"i{k}\n" for k in range(6)))
    rc, err = _run(capsys, "authors-noise", "--pickle", path, "--sha256", hashlib.sha256(path.read_bytes()).hexdigest(),
                   "--clean-labels", clean, "--ids", ids, "--out", tmp_path / "o.parquet")
    if needle is None:  # a key the command only reports on
        assert rc == 0, err
        return
    _one_line(rc, err, str(path), needle)
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("content,needle", [(GARBAGE, "cannot read the image id list"), (b"", "img_id.txt"),
                                            (b"i0\ni1\n", "2 image ids")])
def test_a_bad_id_list_is_one_line(tmp_path, capsys, clean, content, needle):
    path = tmp_path / "class_freq_0.5noise.pkl"
    path.write_bytes(pickle.dumps({"labels": ROWS, "clean_labels": ROWS}, protocol=2))
    ids = tmp_path / "img_id.txt"
    ids.write_bytes(content)
    rc, err = _run(capsys, "authors-noise", "--pickle", path, "--sha256", hashlib.sha256(path.read_bytes()).hexdigest(),
                   "--clean-labels", clean, "--ids", ids, "--out", tmp_path / "o.parquet")
    _one_line(rc, err, needle)


# ------------------------------------------------------------------ [CL]'s checkpoints (convert-cl-checkpoint)
def _saved(obj):
    def write(path):
        import torch

        torch.save(obj, path)
    return write


def _keys_of_cl():
    """[CL]'s state dict of a 3-class ResNet-18 StitchUpClassifier (random weights), as its checkpoints hold it."""
    from cl_network import stitchup_classifier18

    return dict(stitchup_classifier18(len(CLASSES)).state_dict())


def _checkpoint_cases():
    import torch

    keys = _keys_of_cl()
    return {
        "empty": (lambda p: p.write_bytes(b""), "not readable as a checkpoint"),
        "garbage": (lambda p: p.write_bytes(GARBAGE), "not readable as a checkpoint"),
        "a numpy pickle": (lambda p: p.write_bytes(pickle.dumps(np.zeros(3), protocol=2)), "not readable as a checkpoint"),
        "truncated zip": (lambda p: (_saved(keys)(p), p.write_bytes(p.read_bytes()[:200])),
                          "not readable as a checkpoint"),
        "a list": (_saved([torch.zeros(1)]), "holds a list"),
        "an empty dict": (_saved({}), "not a mapping of names to tensors"),
        "state_dict a list": (_saved({"state_dict": [torch.zeros(1)]}), "not a mapping of names to tensors"),
        "int keys": (_saved({"state_dict": {1: torch.zeros(1), 2: torch.zeros(1)}}), "not a mapping of names"),
        "non-tensor values": (_saved({"state_dict": {"a": 1.0}}), "not a mapping of names to tensors"),
        "ours, not [CL]'s": (_saved({"model": {"branches.random.head.fc.weight": torch.zeros(3, 8)}, "meta": {}}),
                             "not a mapping of names to tensors"),
        "missing keys": (_saved({"state_dict": {"backbone.conv1.weight": torch.zeros(64, 3, 7, 7)}}), "no key"),
        "0-d head": (_saved({"state_dict": {**keys, "head.fc_cls.weight": torch.tensor(1.0)}}), "head.fc_cls.weight"),
        "1-d neck": (_saved({"state_dict": {**keys, "neck.fc.weight": torch.zeros(8)}}), "neck.fc.weight"),
        "unknown depth": (_saved({"state_dict": {**keys, "backbone.layer1.7.conv1.weight": torch.zeros(1)}}),
                          "this project builds only"),
        "a tensor short": (_saved({"state_dict": {k: v for k, v in keys.items() if k != "neck1.bn.weight"}}),
                           "lacks 1 tensor(s)"),
        "a shape off": (_saved({"state_dict": {**keys, "neck1.fc.bias": torch.zeros(5)}}), "differ in shape"),
        "an extra key": (_saved({"state_dict": {**keys, "module.x": torch.zeros(1)}}), "map to nothing"),
        "meta not a dict": (_saved({"state_dict": {**keys, "x": torch.zeros(1)}, "meta": [1, 2]}), "map to nothing"),
    }


@pytest.mark.parametrize("case", ["empty", "garbage", "a numpy pickle", "truncated zip", "a list", "an empty dict",
                                  "state_dict a list", "int keys", "non-tensor values", "ours, not [CL]'s",
                                  "missing keys", "0-d head", "1-d neck", "unknown depth", "a tensor short",
                                  "a shape off", "an extra key", "meta not a dict"])
def test_a_bad_checkpoint_is_one_line(tmp_path, capsys, case):
    write, needle = _checkpoint_cases()[case]
    path = tmp_path / "epoch_8.pth"
    write(path)
    rc, err = _run(capsys, "convert-cl-checkpoint", "--checkpoint", path, "--out", tmp_path / "ours.pt")
    _one_line(rc, err, str(path), needle)
    assert not (tmp_path / "ours.pt").exists()


@pytest.mark.parametrize("content", ["garbage", "a list", "shapes off", "int keys"])
def test_a_bad_backbone_weights_file_is_one_line(tmp_path, content):
    """train.weights_path: a local file of ImageNet weights, or the toy's pretrained trunk."""
    import torch

    from noisymlt.errors import NoisyMLTError
    from noisymlt.models.backbones import build_backbone

    path = tmp_path / "weights.pth"
    if content == "garbage":
        path.write_bytes(GARBAGE)
    else:
        torch.save({"a list": [torch.zeros(1)], "int keys": {1: torch.zeros(1)},
                    "shapes off": {"conv1.weight": torch.zeros(2, 2), "bn1.weight": torch.zeros(5)}}[content], path)
    with pytest.raises(NoisyMLTError, match="weights.pth") as caught:
        build_backbone("resnet18", weights_path=str(path))
    assert "\n" not in str(caught.value), caught.value


# ------------------------------------------------------------------ a class split (evaluate, eval-cl-checkpoint)
@pytest.mark.parametrize("content,needle", [(b"5", "(it holds 5)"), (b'"head"', 'holds "head"'),
                                            (b"[1, 2]", "holds [1, 2]"), (GARBAGE, "cannot read class split"),
                                            (b'{"head": 1, "medium": [], "tail": []}', "non-integer"),
                                            (b'{"head": [0], "medium": [0], "tail": [1, 2]}', "do not partition")])
def test_a_bad_class_split_is_one_line(tmp_path, content, needle):
    from noisymlt.data.labels import read_class_split
    from noisymlt.errors import NoisyMLTError

    path = tmp_path / "split.json"
    path.write_bytes(content)
    with pytest.raises(NoisyMLTError, match="split.json") as caught:
        read_class_split(path)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


# ------------------------------------------------------------------ outputs never inputs
def _noise(clean, out, stats=None, matrix=None):
    argv = ["noise", "--labels", clean, "--gamma", "0.5", "--seed", "0", "--out", out]
    argv += ["--stats", stats] if stats else []
    argv += ["--model", "class_conditional", "--option", f"matrix={matrix}"] if matrix else []
    return argv


def _writing_commands(tmp_path, clean):
    """command -> (argv, the input it names as an output): each a case the issue found or its kin."""
    matrix = tmp_path / "m.csv"
    matrix.write_text(IDENTITY_CSV)
    pkl = tmp_path / "p.pkl"
    pkl.write_bytes(pickle.dumps({"labels": ROWS, "clean_labels": ROWS}, protocol=2))
    sha = hashlib.sha256(pkl.read_bytes()).hexdigest()
    ids = tmp_path / "img_id.txt"
    ids.write_text("".join(f"i{k}\n" for k in range(6)))
    ckpt = tmp_path / "epoch_8.pth"
    ckpt.write_bytes(b"a checkpoint")
    split = tmp_path / "split.json"
    split.write_text('{"head": [0], "medium": [1], "tail": [2]}')
    authors = ["authors-noise", "--pickle", pkl, "--sha256", sha, "--clean-labels", clean, "--ids", ids]
    alias = tmp_path / "sub" / ".." / "clean.parquet"  # another spelling of the same file
    (tmp_path / "sub").mkdir()
    return {
        "noise --stats names the labels": (_noise(clean, tmp_path / "o.parquet", stats=clean), clean),
        "noise --out names the labels": (_noise(clean, alias), clean),
        "noise --out and its stats": (_noise(clean, tmp_path / "o.parquet", stats=tmp_path / "o.parquet"), None),
        "noise --stats names the matrix": (_noise(clean, tmp_path / "o.parquet", stats=matrix, matrix=matrix), matrix),
        "authors-noise --out names the pickle": ([*authors, "--out", tmp_path / "p.parquet", "--stats", pkl], pkl),
        "authors-noise --out names the clean table": ([*authors, "--out", clean], clean),
        "authors-noise --stats names the ids": ([*authors, "--out", tmp_path / "o.parquet", "--stats", ids], ids),
        "longtail --split-out names the labels": (["longtail", "--labels", clean, "--out", tmp_path / "lt.parquet",
                                                   "--split-out", clean, "--source", "pareto"], clean),
        "parse-folder --out names the labels": (["parse-folder", "--labels", clean, "--images", tmp_path, "--part",
                                                 "test", "--out", alias], clean),
        "convert-cl-checkpoint --out names the checkpoint": (["convert-cl-checkpoint", "--checkpoint", ckpt, "--out",
                                                              ckpt], ckpt),
        "eval-cl-checkpoint --out holds the checkpoint": (
            ["eval-cl-checkpoint", "--checkpoint", tmp_path / "manifest.json", "--sha256", "0" * 64, "--test-labels",
             clean, "--test-images", tmp_path, "--split", split, "--out", tmp_path], tmp_path / "manifest.json"),
        "evaluate --out names the split": (["evaluate", "--predictions", tmp_path / "predictions.npz", "--test-labels",
                                            clean, "--split", split, "--out", split], split),
    }


CASES = ["noise --stats names the labels", "noise --out names the labels", "noise --out and its stats",
         "noise --stats names the matrix", "authors-noise --out names the pickle",
         "authors-noise --out names the clean table", "authors-noise --stats names the ids",
         "longtail --split-out names the labels", "parse-folder --out names the labels",
         "convert-cl-checkpoint --out names the checkpoint", "eval-cl-checkpoint --out holds the checkpoint",
         "evaluate --out names the split"]


@pytest.mark.parametrize("case", CASES)
def test_no_command_writes_over_its_inputs(tmp_path, capsys, clean, case):
    argv, victim = _writing_commands(tmp_path, clean)[case]
    if case.startswith("eval-cl"):
        (tmp_path / "manifest.json").write_text("{}")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    rc, err = _run(capsys, *argv)
    _one_line(rc, err, "never replaces an input" if victim else "needs a file of its own")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing written, nothing new


# ------------------------------------------------------------------ params: files and settings checked at params time
def _project(tmp_path, folder: dict, noise: dict | None = None):
    """A project (params.yaml beside a layer naming a folder dataset) and a working folder elsewhere."""
    import shutil

    import yaml

    repo = Path(__file__).resolve().parents[1]
    project = tmp_path / "project"
    (project / "mine" / "images").mkdir(parents=True)
    (project / "mine" / "labels.csv").write_text("image,a,b\n")
    (project / "mine" / "test.csv").write_text("image,a,b\n")
    (project / "m.csv").write_text(IDENTITY_CSV)
    shutil.copy(repo / "params.yaml", project / "params.yaml")
    layer = {"grid": {"datasets": ["mine"], "gammas": [0.5], "seeds": [0], "methods": ["erm"], "clean_methods": [],
                      "ablations": []},
             "datasets": {"mine": {"kind": "folder", "folder": {"root": "mine", "labels": "labels.csv", **folder},
                                   "longtail": {"source": "all", "groups": "scaled"},
                                   "db_loss": {"neg_scale": 5.0, "map_mu": 0.3}}}}
    if noise:
        layer["grid"]["noise_models"] = list(noise)
        layer["noise"] = noise
    (project / "mine.yaml").write_text(yaml.safe_dump(layer))
    (tmp_path / "elsewhere").mkdir()
    return project


PARAMS_CASES = {
    "no root folder": ({"root": "gone"}, None, "datasets.mine.folder.root: gone: no such folder in the project"),
    "no labels file": ({"labels": "nope.csv"}, None, "datasets.mine.folder.labels: nope.csv: no such file under mine"),
    "no images folder": ({"images": "pics"}, None, "datasets.mine.folder.images: pics: no such folder under mine"),
    "images outside root": ({"images": "../.."}, None, "datasets.mine.folder.images: path '../..' leads outside the "
                                                       "dataset's root mine"),
    "no test table": ({"test_labels": "t.csv"}, None, "datasets.mine.folder.test_labels: t.csv: no such file"),
    "two test sources": ({"split_column": "split", "test_labels": "test.csv"}, None,
                         "datasets.mine.folder.test_labels: the test part comes from one of split_column, test_labels, "
                         "not several"),
    "three test sources": ({"split_column": "split", "test_labels": "test.csv", "test_fraction": 0.3}, None,
                           "not several"),
    "a seed without a draw": ({"test_labels": "test.csv", "split_seed": 2}, None,
                              "datasets.mine.folder.split_seed: seeds a drawn test part only"),
    "no matrix file": ({}, {"class_conditional": {"matrix": "gone.csv"}},
                       "noise.class_conditional: gone.csv: no such file in the project"),
}


@pytest.mark.parametrize("case", PARAMS_CASES)
def test_params_naming_a_missing_file_or_two_exclusive_settings_are_refused_at_params_time(tmp_path, monkeypatch,
                                                                                          case):
    from noisymlt.config import load_params
    from noisymlt.errors import NoisyMLTError

    folder, noise, needle = PARAMS_CASES[case]
    project = _project(tmp_path, {"images": "images", **folder} if "images" not in folder else folder, noise)
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(NoisyMLTError) as caught:
        load_params(project / "params.yaml", project / "mine.yaml")
    message = str(caught.value)
    assert message.startswith(f"{project / 'mine.yaml'}: ") and needle in message and "\n" not in message, message


def test_relative_paths_in_params_are_the_projects_not_the_current_folders(tmp_path, monkeypatch):
    from noisymlt.config import load_params

    project = _project(tmp_path, {"images": "images", "test_labels": "test.csv"},
                       {"class_conditional": {"matrix": "m.csv"}})
    monkeypatch.chdir(tmp_path / "elsewhere")  # nothing of the project here: found under the project all the same
    load_params(project / "params.yaml", project / "mine.yaml")
    monkeypatch.chdir(project)
    load_params("params.yaml", "mine.yaml")
