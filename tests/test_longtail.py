"""Long-tail subsampling: the [DB] pareto algorithm (exact against the published lists) and the
official id lists served by the local HTTP server."""

from __future__ import annotations

import argparse
import hashlib
import json
import random

import numpy as np
import pytest

from noisymlt.data import longtail
from noisymlt.data.longtail import (
    class_order,
    normalize_image_id,
    official_subset,
    parse_id_list,
    pareto_reference_counts,
    pareto_subsample,
)
from noisymlt.data.labels import LabelTable, read_class_split, read_labels, split_from_counts, write_labels
from noisymlt.errors import NoisyMLTError

VOC_REF = [800, 529, 359, 248, 175, 125, 91, 67, 50, 38, 29, 23, 18, 14, 11, 9, 7, 6, 5, 4]


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    longtail.add_cli(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_reference_counts_voc():
    assert pareto_reference_counts(20, 6, 800, 1) == VOC_REF
    assert pareto_reference_counts(1, 6, 50, 2) == [50]
    coco = pareto_reference_counts(80, 6, 1200, 1)
    assert coco[0] == 1200 and coco[-1] == 6 and coco == sorted(coco, reverse=True)


def test_class_order_by_conditional_cooccurrence():
    # class 2 is in every image, so P[i, 2] = 1 for all i: it ranks first; class 0 co-occurs least
    Y = np.array([[1, 0, 1], [0, 1, 1], [0, 1, 1], [0, 0, 1]])
    # column sums: c0 = 1 + 0 + 1/4, c1 = 0 + 1 + 2/4, c2 = 3
    assert class_order(Y).tolist() == [2, 1, 0]
    # a class without images must not produce NaN and ranks last
    assert class_order(np.array([[1, 0], [1, 0]])).tolist() == [0, 1]


def test_pareto_matches_published_voc_mlt(reference_dir):
    source = read_labels(reference_dir / "voc2012_trainval_labels.csv")
    published = read_labels(reference_dir / "voc_mlt_train_labels.csv")
    random.seed(12345)
    before = random.getstate()
    rows = pareto_subsample(source.labels, b=6, max_count=800, min_count=1, seed=0)
    assert random.getstate() == before  # the caller's global stream is untouched
    assert [source.image_ids[r] for r in rows] == published.image_ids
    np.testing.assert_array_equal(source.labels[rows], published.labels)
    assert split_from_counts(published.labels.sum(axis=0)) == read_class_split(reference_dir / "voc_mlt_class_split.json")
    # another seed draws another subset
    assert pareto_subsample(source.labels, seed=1) != rows


def test_pareto_cli_reproduces_voc_mlt(reference_dir, tmp_path, capsys):
    out = tmp_path / "voc_mlt.parquet"
    assert _cli(["longtail", "--labels", str(reference_dir / "voc2012_trainval_labels.csv"), "--out", str(out)]) == 0
    got = read_labels(out)
    published = read_labels(reference_dir / "voc_mlt_train_labels.csv")
    assert got.image_ids == published.image_ids and got.classes == published.classes
    np.testing.assert_array_equal(got.labels, published.labels)
    assert read_class_split(tmp_path / "voc_mlt_split.json") == read_class_split(reference_dir / "voc_mlt_class_split.json")
    assert got.meta["subset"]["source"] == "pareto" and got.meta["subset"]["max"] == 800
    summary = capsys.readouterr().out
    assert "1142 images, 20 classes; head 6, medium 6, tail 8" in summary
    assert " 14 person " in summary and " 775 head" in summary


def test_coco_split_from_published_counts(reference_dir):
    published = read_labels(reference_dir / "coco_mlt_train_labels.csv")
    assert len(published) == 1909
    assert split_from_counts(published.labels.sum(axis=0)) == read_class_split(reference_dir / "coco_mlt_class_split.json")


def _toy_table() -> LabelTable:
    rng = np.random.default_rng(0)
    Y = (rng.random((60, 4)) < [0.9, 0.5, 0.2, 0.05]).astype(np.uint8)
    Y[Y.sum(axis=1) == 0, 0] = 1
    return LabelTable(
        image_ids=[f"2008_{i:06d}" for i in range(60)],
        classes=["a", "b", "c", "d"],
        labels=Y,
        paths=[f"JPEGImages/2008_{i:06d}.jpg" for i in range(60)],
    )


def test_pareto_caps_only_when_asked():
    Y = _toy_table().labels
    rare = int(np.argmin(Y.sum(axis=0)))
    with pytest.raises(NoisyMLTError, match="--cap-to-available"):
        pareto_subsample(Y, b=6, max_count=40, min_count=30, seed=0)
    rows = pareto_subsample(Y, b=6, max_count=40, min_count=30, seed=0, cap_to_available=True)
    assert len(set(rows)) == len(rows)
    assert Y[rows, rare].sum() == Y[:, rare].sum()  # took every image of the class that ran short
    assert rows == pareto_subsample(Y, b=6, max_count=40, min_count=30, seed=0, cap_to_available=True)


@pytest.mark.parametrize(
    "kwargs, option",
    [
        (dict(b=0), "--b"),
        (dict(b=-1), "--b"),
        (dict(max_count=5, min_count=6), "--max"),
        (dict(min_count=-1), "--min"),
        (dict(seed=-3), "--seed"),
    ],
)
def test_pareto_rejects_bad_params(kwargs, option):
    with pytest.raises(NoisyMLTError, match=option):
        pareto_subsample(_toy_table().labels, **{"max_count": 20, **kwargs})


def test_id_list_formats():
    assert parse_id_list("2008_000023\n 2010_002361 \n\n") == ["2008_000023", "2010_002361"]
    assert parse_id_list("# coco\n554625\n118113\r\n") == ["554625", "118113"]
    assert [normalize_image_id(t) for t in ("000000123456.jpg", "COCO_train2014_000000123456", " 123456 ")] == ["123456"] * 3
    with pytest.raises(NoisyMLTError, match="line 2 repeats image id '7'"):
        parse_id_list("7\n000000000007.jpg\n", "ids")
    with pytest.raises(NoisyMLTError, match="line 1 holds more than one token"):
        parse_id_list("1 2\n", "ids")


def _serve(server, name: str, text: str) -> tuple[str, str]:
    (server.root / name).write_text(text)
    return f"{server.url}/{name}", hashlib.sha256(text.encode()).hexdigest()


def test_official_voc_list_selects_in_list_order(http_server, tmp_path):
    table = _toy_table()
    url, sha = _serve(http_server, "img_id.txt", "2008_000031\n2008_000002\n2008_000017\n")
    subset = official_subset(table, url, sha, tmp_path / "cache" / "img_id.txt")
    assert subset.image_ids == ["2008_000031", "2008_000002", "2008_000017"]
    np.testing.assert_array_equal(subset.labels, table.labels[[31, 2, 17]])
    assert subset.paths == [f"JPEGImages/{i}.jpg" for i in subset.image_ids]


def test_official_coco_list_and_refusals(http_server, tmp_path):
    table = LabelTable(image_ids=["9", "42", "300", "555"], classes=["x", "y"],
                       labels=np.array([[1, 0], [0, 1], [1, 1], [0, 0]]))
    url, sha = _serve(http_server, "img_id.pkl", "300\n000000000009.jpg\nCOCO_train2014_000000000555\n")
    assert official_subset(table, url, sha, tmp_path / "a" / "ids").image_ids == ["300", "9", "555"]
    with pytest.raises(NoisyMLTError, match="checksum mismatch"):
        official_subset(table, url, "0" * 64, tmp_path / "b" / "ids")
    assert not (tmp_path / "b" / "ids").exists()  # a list with the wrong checksum is never kept
    url, sha = _serve(http_server, "missing.pkl", "300\n77\n")
    with pytest.raises(NoisyMLTError, match=r"not in the label table, first: \['77'\]"):
        official_subset(table, url, sha, tmp_path / "c" / "ids")


def test_official_cli(http_server, tmp_path, capsys):
    table = _toy_table()
    write_labels(table, tmp_path / "source.parquet")
    url, sha = _serve(http_server, "img_id.txt", "2008_000005\n2008_000001\n")
    out = tmp_path / "mlt.parquet"
    split = tmp_path / "split.json"
    argv = ["longtail", "--labels", str(tmp_path / "source.parquet"), "--out", str(out), "--split-out", str(split),
            "--source", "official", "--dataset", "voc", "--ids-url", url, "--ids-sha256", sha]
    assert _cli(argv) == 0
    got = read_labels(out)
    assert got.image_ids == ["2008_000005", "2008_000001"]
    assert got.paths == ["JPEGImages/2008_000005.jpg", "JPEGImages/2008_000001.jpg"]
    assert got.meta["subset"] == {"source": "official", "url": url, "sha256": sha}
    counts = table.labels[[5, 1]].sum(axis=0)
    assert json.loads(split.read_text())["tail"] == [int(i) for i in np.flatnonzero(counts < 20)]
    with pytest.raises(NoisyMLTError, match="--dataset"):
        _cli(argv[:9] + ["--ids-url", url])


def test_official_registry_pins_db_commit():
    for entry in longtail.official_lists().values():
        assert entry.url.startswith(
            "https://raw.githubusercontent.com/wutong16/DistributionBalancedLoss/14460d0acda6a3e77a8a6a5999b9746243cb1535/appendix/"
        )
        assert len(entry.sha256) == 64
    assert longtail.official_lists()["coco"].url.endswith("longtail2017/img_id.pkl")
