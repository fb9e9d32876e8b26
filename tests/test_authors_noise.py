"""[CL]'s published noisy-label pickle -> a noisy label table: read safely, checked against the clean table."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import numpy as np
import pytest

from noisymlt.cli import main
from noisymlt.data.authors_noise import authors_noisy_table, make_authors_noisy_table, read_authors_pickle
from noisymlt.data.labels import LabelTable, read_labels, write_labels
from noisymlt.errors import NoisyMLTError

CLASSES = ["cat", "dog", "car", "bus"]


def _clean_table(n: int = 12, seed: int = 0) -> LabelTable:
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, len(CLASSES))) < 0.4).astype(np.uint8)
    labels[np.arange(n), rng.integers(0, len(CLASSES), n)] = 1  # every image has a positive
    ids = [f"2008_{i:06d}" for i in range(n)]
    return LabelTable(image_ids=ids, classes=list(CLASSES), labels=labels,
                      paths=[f"JPEGImages/{i}.jpg" for i in ids], meta={"subset": "test"})


def _noisy(clean: np.ndarray, seed: int = 1) -> np.ndarray:
    flip = np.random.default_rng(seed).random(clean.shape) < 0.3
    return np.where(flip, 1 - clean, clean).astype(np.uint8)


def _authors_file(tmp_path, table: LabelTable, order: np.ndarray, *, protocol: int = 2, name="class_freq_0.5noise.pkl",
                  **override):
    """Write a file laid out as [CL]'s (a dict of numpy arrays, rows in the id list's order) and its id list."""
    clean = table.labels[order]
    noisy = _noisy(clean)
    obj = {"labels": noisy, "clean_labels": clean, "class_freq": noisy.sum(axis=0),
           "neg_class_freq": len(order) - noisy.sum(axis=0), **override}
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    ids = tmp_path / "img_id.txt"
    ids.write_text("".join(table.image_ids[r] + "\n" for r in order))
    return path, ids, noisy, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("protocol", [2, 4])
def test_round_trip_puts_each_noisy_row_on_its_image_when_the_orders_differ(tmp_path, protocol):
    table = _clean_table()
    clean_path = write_labels(table, tmp_path / "clean.parquet")
    order = np.random.default_rng(3).permutation(len(table))  # the id list's order is not the table's
    pkl, ids, noisy, sha = _authors_file(tmp_path, table, order, protocol=protocol)
    out = tmp_path / "noisy.parquet"
    stats = make_authors_noisy_table(pkl, sha.upper(), clean_path, ids, out, tmp_path / "stats.json", gamma=0.5)

    got = read_labels(out)
    assert got.image_ids == table.image_ids and got.paths == table.paths and got.classes == CLASSES
    np.testing.assert_array_equal(got.clean, table.labels)
    for k, r in enumerate(order):  # file row k is image order[k]
        np.testing.assert_array_equal(got.labels[r], noisy[k])
    assert got.meta["noise"] == {"model": "authors", "file": pkl.name, "sha256": sha, "gamma": 0.5}
    assert got.meta["subset"] == "test"

    on_disk = json.loads((tmp_path / "stats.json").read_text())
    assert on_disk == json.loads(json.dumps(stats))
    assert stats["num_images"] == len(table) and stats["noise_model"] == "authors"
    assert stats["flip_rate"] is None and stats["transition_counts"] is None  # the file cannot tell them
    clean, noisy_rows = got.clean.astype(int), got.labels.astype(int)
    assert stats["missing_rate"] == pytest.approx((clean & (1 - noisy_rows)).sum() / clean.sum())
    assert stats["wrong_fraction"] == pytest.approx((noisy_rows & (1 - clean)).sum() / noisy_rows.sum())
    assert stats["file_keys"]["class_freq"] == "counts the noisy labels"
    assert stats["file_keys"]["neg_class_freq"] == "counts the noisy labels"


def test_the_cli_writes_the_table_and_names_the_archive_in_its_help(tmp_path, capsys):
    table = _clean_table()
    clean_path = write_labels(table, tmp_path / "clean.parquet")
    pkl, ids, _, sha = _authors_file(tmp_path, table, np.arange(len(table)))
    rc = main(["authors-noise", "--pickle", str(pkl), "--sha256", sha, "--clean-labels", str(clean_path),
               "--ids", str(ids), "--out", str(tmp_path / "n.parquet"), "--stats", str(tmp_path / "n.json")])
    assert rc == 0 and (tmp_path / "n.parquet").is_file() and (tmp_path / "n.json").is_file()
    with pytest.raises(SystemExit):
        main(["authors-noise", "--help"])
    assert "appendix.tar.gz" in capsys.readouterr().out


def test_a_sha256_mismatch_names_the_file_and_both_digests(tmp_path):
    table = _clean_table()
    pkl, _, _, sha = _authors_file(tmp_path, table, np.arange(len(table)))
    wrong = "0" * 64
    with pytest.raises(NoisyMLTError) as err:
        read_authors_pickle(pkl, wrong)
    msg = str(err.value)
    assert "\n" not in msg and str(pkl) in msg and wrong in msg and sha in msg
    with pytest.raises(NoisyMLTError, match="64 hex digits"):
        read_authors_pickle(pkl, sha[:16])


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Custom:  # any class outside the allow-list, harmless or not
    def __init__(self):
        self.x = 1


@pytest.mark.parametrize("payload, named", [("evil", "system"), ("custom", "_Custom")])
def test_a_disallowed_global_is_refused_in_one_line_and_nothing_runs(tmp_path, payload, named):
    marker = tmp_path / "pwned"
    table = _clean_table()
    evil = _Evil(marker) if payload == "evil" else _Custom()
    pkl, _, _, sha = _authors_file(tmp_path, table, np.arange(len(table)), extra=evil)
    with pytest.raises(NoisyMLTError) as err:
        read_authors_pickle(pkl, sha)
    msg = str(err.value)
    assert "\n" not in msg and str(pkl) in msg and named in msg and "not allowed" in msg
    assert not marker.exists()


def test_clean_rows_that_differ_from_the_table_are_named(tmp_path):
    table = _clean_table(n=20)
    order = np.arange(len(table))
    clean = table.labels.copy()
    changed = [2, 5, 7, 11, 13, 17]
    clean[changed, 0] ^= 1
    pkl, ids, _, sha = _authors_file(tmp_path, table, order, clean_labels=clean)
    found = read_authors_pickle(pkl, sha)
    with pytest.raises(NoisyMLTError) as err:
        authors_noisy_table(table, [table.image_ids[i] for i in order], found["labels"], found["clean_labels"],
                            source=str(pkl))
    msg = str(err.value)
    assert "\n" not in msg and str(pkl) in msg and "6 of 20 images" in msg
    assert str([table.image_ids[i] for i in changed[:5]]) in msg and table.image_ids[17] not in msg
    # the same file with its class columns in another order: said so
    swapped = table.labels[:, [1, 0, 2, 3]]
    with pytest.raises(NoisyMLTError, match="another order"):
        authors_noisy_table(table, table.image_ids, _noisy(swapped), swapped, source=str(pkl))


def test_shape_errors(tmp_path):
    table = _clean_table()
    ids = list(table.image_ids)
    order = np.arange(len(table))
    pkl, _, noisy, sha = _authors_file(tmp_path, table, order, labels=table.labels[:, :3])
    with pytest.raises(NoisyMLTError, match=r"'labels' has shape \(12, 3\) but 'clean_labels' \(12, 4\)"):
        read_authors_pickle(pkl, sha)
    pkl, _, _, sha = _authors_file(tmp_path, table, order, labels=np.full((12, 4), 2))
    with pytest.raises(NoisyMLTError, match="other than 0 and 1"):
        read_authors_pickle(pkl, sha)
    pkl, _, _, sha = _authors_file(tmp_path, table, order, clean_labels=table.labels.reshape(-1))
    with pytest.raises(NoisyMLTError, match="expected \\(images, classes\\)"):
        read_authors_pickle(pkl, sha)
    path = tmp_path / "list.pkl"
    path.write_bytes(pickle.dumps([table.labels], protocol=2))
    with pytest.raises(NoisyMLTError, match="holds a list"):
        read_authors_pickle(path, hashlib.sha256(path.read_bytes()).hexdigest())
    path.write_bytes(pickle.dumps({"labels": table.labels}, protocol=2))
    with pytest.raises(NoisyMLTError, match=r"no key\(s\) \['clean_labels'\]"):
        read_authors_pickle(path, hashlib.sha256(path.read_bytes()).hexdigest())
    # rows against the id list and the table
    with pytest.raises(NoisyMLTError, match="12 label rows but ids lists 11"):
        authors_noisy_table(table, ids[:11], noisy, table.labels, ids_source="ids")
    with pytest.raises(NoisyMLTError, match="3 classes per row but the clean table has 4"):
        authors_noisy_table(table, ids, noisy[:, :3], table.labels[:, :3])
    with pytest.raises(NoisyMLTError, match="holds 12 images"):
        authors_noisy_table(table, ids[:11], noisy[:11], table.labels[:11], ids_source="ids")
    with pytest.raises(NoisyMLTError, match="not in the label table"):
        authors_noisy_table(table, [*ids[:11], "2099_000000"], noisy, table.labels, ids_source="ids")
    # a list of per-image rows (how a pickle may hold them) reads as the matrix
    pkl, _, _, sha = _authors_file(tmp_path, table, order, labels=list(noisy))
    np.testing.assert_array_equal(read_authors_pickle(pkl, sha)["labels"], noisy)
