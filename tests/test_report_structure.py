"""The structure report (`noisymlt structure`, noisymlt.report.structure): its numbers against a table counted by
hand, its page naming the files, thresholds and values, the groups held to the pipeline's class split, the group
tables stating scaled thresholds, and the rule in the workflow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fakes import SCALED, TRAIN, label_table, structure_files
from noisymlt.cli import main
from noisymlt.data.labels import LabelTable, write_labels
from noisymlt.data.structure import REFERENCE, structure_stats

def _run(tmp_path: Path, files: dict) -> int:
    return main(["structure", "--labels", str(files["labels"]), "--split", str(files["split"]),
                 "--test-labels", str(files["test_labels"]), "--out", str(tmp_path / "reports" / "structure_tiny.json"),
                 "--md", str(tmp_path / "reports" / "structure_tiny.md")])


def test_the_report_holds_the_statistics_counted_by_hand(tmp_path):
    files = structure_files(tmp_path)
    assert _run(tmp_path, files) == 0
    record = json.loads((tmp_path / "reports" / "structure_tiny.json").read_text())
    stats = record["stats"]
    # counted by hand from fakes.TRAIN and fakes.TEST
    assert (stats["images"], stats["classes"], stats["largest_class"], stats["smallest_class"]) == (10, 4, 7, 1)
    assert stats["labels_per_image"] == pytest.approx(1.5) and stats["imbalance_ratio"] == pytest.approx(7.0)
    assert (stats["head_min"], stats["tail_max"]) == (5, 2)  # the thresholds the label table records
    assert stats["groups"] == {"head": 2, "medium": 1, "tail": 1}
    assert stats["head_share_of_positives"] == pytest.approx(12 / 15)
    assert (stats["hub_class"], record["hub_name"]) == (0, "a") and stats["hub_share_of_images"] == pytest.approx(0.7)
    assert stats["tail_image_share"] == pytest.approx(0.1)
    assert stats["tail_images_with_head"] == stats["tail_images_with_hub"] == pytest.approx(1.0)
    # class-aware draw: a class (1/4 each), then one of its images; the mean label vector of each class's images is
    # a (1, 2/7, 1/7, 1/7), b (.4, 1, .2, 0), c (.5, .5, 1, 0), d (1, 0, 0, 1); a uniform draw: (.7, .5, .2, .1)
    aware = {"a": (1 + .4 + .5 + 1) / 4, "b": (2 / 7 + 1 + .5 + 0) / 4, "c": (1 / 7 + .2 + 1 + 0) / 4,
             "d": (1 / 7 + 0 + 0 + 1) / 4}
    assert stats["class_aware_exposure"] == pytest.approx(
        {"head": (aware["a"] + aware["b"]) / 1.2, "medium": aware["c"] / 0.2, "tail": aware["d"] / 0.1})
    # train ranks a 4 b 3 c 2 d 1, test ranks a 3 b 1 c 4 d 2: sum of squared rank differences 10, rho = 1 - 60/60
    assert stats["test_images"] == 6 and stats["train_test_rank_correlation"] == pytest.approx(0.0, abs=1e-12)
    assert stats["test_hub_share_of_images"] == pytest.approx(0.5)
    assert record["class_counts"] == {"train": [7, 5, 2, 1], "test": [3, 1, 4, 2]}
    # and what the library function gives on the same matrices
    want = structure_stats(label_table(TRAIN).labels, test_counts=[3, 1, 4, 2], test_images=6, head_min=5, tail_max=2)
    assert json.loads(json.dumps(want)) == stats
    assert record["thresholds"] == {"rule": "scaled", "head_min": 5, "tail_max": 2, "recorded": True,
                                    "text": "head >= 5 images, tail < 2: VOC-MLT's 100 / 20 scaled to 10 of its "
                                            "1,142 images"}
    assert record["is_reference"] is None
    # every tolerance row judged against VOC-MLT: the hub's share (70% vs 67.9%, ± 7 points) within, the tail's
    # share of images (10% vs 6.2%, ± 3 points) outside
    ok = {row["statistic"]: row["ok"] for row in record["compare"]}
    assert ok["hub_share_of_images"] is True and ok["tail_image_share"] is False and ok["groups"] is False
    # the manifest records the three inputs and two outputs by their hashes
    from noisymlt.core.manifest import file_sha256

    manifest = json.loads((tmp_path / "reports" / "structure_tiny.manifest.json").read_text())
    assert manifest["step"] == "structure"
    assert {k: v["sha256"] for k, v in manifest["inputs"].items()} == {k: file_sha256(p) for k, p in files.items()}
    assert set(manifest["outputs"]) == {"json", "md"}
    assert "started" not in json.dumps(manifest)  # times go to the untracked timing file


def test_the_page_names_its_files_thresholds_and_values_beside_the_references(tmp_path):
    files = structure_files(tmp_path)
    assert _run(tmp_path, files) == 0
    md = (tmp_path / "reports" / "structure_tiny.md").read_text()
    for path in files.values():
        assert f"`{path}`" in md
    assert "Groups: head >= 5 images, tail < 2: VOC-MLT's 100 / 20 scaled to 10 of its 1,142 images" in md
    lines = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ")}
    # the dataset, VOC-MLT, COCO-MLT, the tolerance against VOC-MLT and the mark
    assert lines["labels per image"] == "| labels per image | 1.50 | 2.05 | 4.36 | ± 0.3 | **outside** |"
    assert lines["images with the hub class"] == "| images with the hub class | 70.0% | 67.9% | 59.1% | ± 7 points | within |"
    assert lines["hub class (the most frequent)"].startswith("| hub class (the most frequent) | a (0) | person (14) |")
    assert lines["head / medium / tail classes"].startswith("| head / medium / tail classes | 2 / 1 / 1 | 6 / 6 / 8 |")
    assert "x2.86 | x6.71 | x2.61 | within a factor 1.3 | **outside** |" in lines[
        "class-aware / uniform exposure of positives: tail"]
    assert lines["test images"] == "| test images | 6 | 4,952 | -- |  |  |"  # COCO's test counts are not held
    # within: the hub's share, tail images with a head label and with the hub, the head's and medium's exposure
    assert "Within tolerance of VOC-MLT: 5 of 13 statistics; outside: head / medium / tail classes; labels per image; " in md
    assert "docs/structure.md" in md and "raw" not in md


def test_a_class_split_other_than_the_recorded_thresholds_give_stops_the_step(tmp_path, capsys):
    files = structure_files(tmp_path, split={"head": [0], "medium": [1, 2], "tail": [3]})  # b (5 images) is head at 5 / 2
    assert _run(tmp_path, files) == 2
    err = capsys.readouterr().err
    assert f"{files['split']}: class 'b' (5 images) is medium there, but head at the thresholds" in err
    assert str(files["labels"]) in err and "noisymlt longtail" in err
    bad = structure_files(tmp_path / "bad", groups={"rule": "scaled", "head_min": "many"})
    assert _run(tmp_path / "bad", bad) == 2
    assert "metadata key 'groups' must hold rule, head_min and tail_max" in capsys.readouterr().err


def test_a_table_without_the_record_is_read_with_spec_1s_thresholds_and_says_so(tmp_path):
    files = structure_files(tmp_path, groups=None, split={"head": [], "medium": [], "tail": [0, 1, 2, 3]})
    assert _run(tmp_path, files) == 0
    record = json.loads((tmp_path / "reports" / "structure_tiny.json").read_text())
    assert record["thresholds"]["recorded"] is False and record["stats"]["groups"] == {"head": 0, "medium": 0, "tail": 4}
    md = (tmp_path / "reports" / "structure_tiny.md").read_text()
    assert "head >= 100 images, tail < 20: SPEC 1's, as VOC-MLT's (not recorded in the label table" in md


def test_a_subset_with_a_references_statistics_is_called_that_reference(tmp_path, monkeypatch):
    """How the page tells VOC-MLT built by the pipeline from a stand-in: every training statistic equal to a recorded
    reference's (here a reference made of the tiny table's own statistics; VOC-MLT's own labels: the next test)."""
    from noisymlt.report import structure as report

    files = structure_files(tmp_path)
    assert _run(tmp_path, files) == 0
    stats = json.loads((tmp_path / "reports" / "structure_tiny.json").read_text())["stats"]
    other = {**stats, "test_images": 4952, "train_test_rank_correlation": 0.5}  # its own test set: still the subset
    monkeypatch.setattr(report, "REFERENCE", {**REFERENCE, "TINY-MLT": other})
    assert _run(tmp_path, files) == 0
    assert json.loads((tmp_path / "reports" / "structure_tiny.json").read_text())["is_reference"] == "TINY-MLT"
    assert "this subset is TINY-MLT itself" in (tmp_path / "reports" / "structure_tiny.md").read_text()
    monkeypatch.setattr(report, "REFERENCE", {**REFERENCE, "TINY-MLT": {**other, "labels_per_image": 1.6}})
    assert _run(tmp_path, files) == 0
    assert json.loads((tmp_path / "reports" / "structure_tiny.json").read_text())["is_reference"] is None


def test_voc_mlt_reports_as_voc_mlt_itself(tmp_path, reference_dir):
    """VOC-MLT's published labels, with a test table of VOC2007 test's per-class counts: every statistic equals the
    recorded one, every mark is within, and the page says the subset is VOC-MLT."""
    import pandas as pd

    from noisymlt.data.structure import VOC2007_TEST_COUNTS

    frame = pd.read_csv(reference_dir / "voc_mlt_train_labels.csv", dtype={"image_id": str})
    test = np.zeros((4952, 20), dtype=np.uint8)
    for c, n in enumerate(VOC2007_TEST_COUNTS):
        test[:n, c] = 1
    classes = list(frame.columns[1:])
    write_labels(LabelTable([f"t{i}" for i in range(4952)], classes, test), tmp_path / "test.parquet")
    out = tmp_path / "structure_voc.json"
    assert main(["structure", "--labels", str(reference_dir / "voc_mlt_train_labels.csv"),
                 "--split", str(reference_dir / "voc_mlt_class_split.json"), "--test-labels",
                 str(tmp_path / "test.parquet"), "--out", str(out), "--dataset", "voc"]) == 0
    record = json.loads(out.read_text())
    assert record["is_reference"] == "VOC-MLT" and all(row["ok"] for row in record["compare"])
    assert record["stats"]["groups"] == REFERENCE["VOC-MLT"]["groups"]
    assert "this subset is VOC-MLT itself" in out.with_suffix(".md").read_text()


def test_the_group_table_states_the_thresholds_when_they_are_scaled(tmp_path):
    import html

    from fakes import fake_run

    from noisymlt.report.aggregate import aggregate

    runs = [fake_run(tmp_path, "erm", 0.5, seed, [0.6]) for seed in range(2)]
    results = tmp_path / "results.parquet"
    aggregate(runs).to_parquet(results)
    scaled, fixed = structure_files(tmp_path / "scaled"), structure_files(tmp_path / "fixed", groups={**SCALED, "rule": "fixed"})
    note = "Groups by training images per class: head >= 5 images, tail < 2: VOC-MLT's 100 / 20 scaled to 10 of its"
    for files, shown in ((scaled, True), (fixed, False)):
        out = files["labels"].parent / "table_groups_toy.tex"
        assert main(["table", "--results", str(results), "--out", str(out), "--groups", "toy",
                     "--train-labels", str(files["labels"])]) == 0
        md, tex, page = (out.with_suffix(s).read_text() for s in (".md", ".tex", ".html"))
        assert (note in md) == (html.escape(note) in page) == shown
        assert ("\\footnotesize Groups by training images per class: head $\\geq$ 5 images, tail $<$ 2" in tex) == shown
    # the note stands outside the table body: trace still reads every cell where the renderer put it
    from noisymlt.pipeline.trace import rendered_problems

    assert rendered_problems(scaled["labels"].parent / "table_groups_toy.cells.json") == []


@pytest.mark.slow
def test_the_workflow_writes_the_structure_report_of_its_dataset(tmp_path):
    """The rule through Snakemake on a small toy (seconds): the report of the pipeline's own files, with the groups of
    its class split, and nothing to do on a second call."""
    from helpers import project_copy, snakemake, tiny_layer, write_layer

    wf = project_copy(tmp_path)
    layer = {"datasets": {"toy": {"toy": {"seed": 0, "n_trainval": 300, "n_test": 100, "size": 32, "scenes": "glyph"},
                                  "longtail": {"source": "pareto", "b": 6, "max": 60, "min": 2, "seed": 0,
                                               "groups": "scaled"}}}}
    args = write_layer(wf, tiny_layer(layer))  # the toy's blocks replace TINY's
    snakemake(wf, "reports/structure_toy.md", *args, timeout=300)  # target first: --configfile takes what follows
    record = json.loads((wf / "reports" / "structure_toy.json").read_text())
    split = json.loads((wf / "data" / "toy" / "class_split.json").read_text())
    assert record["stats"]["groups"] == {g: len(split[g]) for g in ("head", "medium", "tail")}
    assert record["thresholds"]["rule"] == "scaled" and record["files"]["labels"] == "data/toy/train_labels.parquet"
    assert "VOC-MLT's 100 / 20 scaled to" in (wf / "reports" / "structure_toy.md").read_text()
    assert (wf / "logs" / "report" / "structure_toy.log").exists()
    assert (wf / "benchmarks" / "report" / "structure_toy.tsv").exists()
    again = snakemake(wf, "reports/structure_toy.md", *args, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
