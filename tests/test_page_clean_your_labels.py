"""docs/clean-your-labels.md, followed to the letter on a copy of the own-data page's project: its layer, then every
command line of the page in order, each checked for what the page says it writes, and nothing the project had
before changed."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from helpers import REPO, blocks, commands, copy_build, page, run_line

PAGE = REPO / "docs" / "clean-your-labels.md"


@pytest.mark.slow
def test_the_page_cross_fits_cleans_and_retrains_your_labels(own_data_runs, tmp_path):
    from noisymlt.core.manifest import file_sha256
    from noisymlt.data.labels import read_labels
    from noisymlt.pipeline.cleaning import flagged_entries

    text = page(PAGE, "Clean your labels")
    project = copy_build(own_data_runs, tmp_path / "project")  # where the own-data page ends
    (layer,) = blocks(text, "yaml")
    (project / layer.splitlines()[0].removeprefix("# ").strip()).write_text(layer)
    before = {p: p.read_bytes() for p in (project / "runs/mydata/g0.5/s0/erm").iterdir() if p.is_file()}
    lines = commands(text)
    assert [line.split()[:2] for line in lines] == [["snakemake", "--profile"], ["noisymlt", "suspects"],
                                                   ["noisymlt", "clean-labels"]], lines
    for line in lines:
        run_line(line, project)

    noisy = read_labels(project / "data/mydata/noisy/g0.0_s0.parquet", noisy_only=True)
    with np.load(project / "runs/mydata/crossfit/erm/g0.0/s0/out_of_sample.npz") as npz:
        order = [list(npz["image_ids"]).index(i) for i in noisy.image_ids]
        probs = npz["probs"][order]
    flags = flagged_entries(noisy.labels, "cleanlab", probs)  # cleanlab's own call on the gathered probabilities
    table = "runs/mydata/cleaned/g0.0_s0_cleanlab_drop.parquet"
    cleaned = read_labels(project / table)
    assert np.array_equal(cleaned.ignored, flags) and np.array_equal(cleaned.labels, noisy.labels)
    record = json.loads((project / table).with_suffix(".json").read_text())
    assert record["changed"] == flags.sum() and record["images_changed"] == flags.any(1).sum()
    manifest = json.loads((project / "runs/mydata/g0.0/s0/clean_erm/manifest.json").read_text())
    assert manifest["inputs"]["train_labels"]["sha256"] == file_sha256(project / table)
    for method in ("erm", "clean_erm"):
        metrics = json.loads((project / f"runs/mydata/g0.0/s0/{method}/metrics.json").read_text())
        assert 0.0 < metrics["heads"]["main"]["map"]["total"] <= 1.0

    with open(project / "suspects/my_labels_oos.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and "image_quality" in rows[0] and "wrong" not in rows[0]
    where = {i: k for k, i in enumerate(noisy.image_ids)}
    column = {c: k for k, c in enumerate(noisy.classes)}
    assert {(where[r["image"]], column[r["class"]]) for r in rows if r["cleanlab_oos_flagged"] == "1"} == \
        set(zip(*np.nonzero(flags)))
    mine = read_labels(project / "mydata/labels.cleaned.parquet")
    assert np.array_equal(mine.labels, np.where(flags, 1 - noisy.labels, noisy.labels)) and mine.ignored is None
    assert {p: p.read_bytes() for p in before} == before  # the ERM run of the own-data page is as it was
