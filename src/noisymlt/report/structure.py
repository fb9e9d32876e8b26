"""The structure report of a dataset the pipeline builds (`noisymlt structure`): its long-tailed training subset's
statistics (noisymlt.data.structure) beside VOC-MLT's and COCO-MLT's, each checked against its tolerance.

It reads the three files the pipeline's later steps read: the training subset, its class split and the test set.
The groups are the pipeline's: the thresholds come from the label table's record of how ``noisymlt longtail``
split it, and the class split file must hold the groups those thresholds give (a mismatch stops the step). It
writes OUT (JSON: every statistic, the comparison with VOC-MLT, the files and thresholds), the Markdown page
(noisymlt.report.structure_text) and OUT's manifest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from noisymlt.data.labels import GROUPS, read_class_split, read_labels, split_from_counts
from noisymlt.data.structure import (REFERENCE, compare, recorded_thresholds, structure_stats,
                                     threshold_text)
from noisymlt.errors import NoisyMLTError
from noisymlt.report.style import dataset_title

# The statistics of the test set: a reference whose test set is another split may still be the same training subset
TEST_KEYS = ("test_images", "train_test_rank_correlation", "test_hub_share_of_images")


def check_split(split_path: str | Path, labels_path: str | Path, classes: list[str], counts, thresholds: dict) -> None:
    """The class split file holds the groups the recorded thresholds give on the subset's class counts, or the
    report would describe other groups than the tables use."""
    split = read_class_split(split_path)
    if sum(len(split[g]) for g in GROUPS) != len(classes):
        raise NoisyMLTError(f"{split_path}: a split of {sum(len(split[g]) for g in GROUPS)} classes, but {labels_path} "
                            f"has {len(classes)}; rebuild both with `noisymlt longtail`")
    want = split_from_counts(counts, thresholds["head_min"], thresholds["tail_max"])
    for g in GROUPS:
        moved = sorted(set(split[g]) ^ set(want[g]))
        if moved:
            c = moved[0]
            there = next(h for h in GROUPS if c in split[h])
            here = next(h for h in GROUPS if c in want[h])
            raise NoisyMLTError(
                f"{split_path}: class {classes[c]!r} ({int(counts[c])} images) is {there} there, but {here} at the "
                f"thresholds {labels_path} records ({threshold_text(thresholds, len(counts))}); rebuild both with "
                "`noisymlt longtail`")


def same_subset(stats: dict, reference: dict, tol: float = 5e-5) -> bool:
    """Every training statistic equals the reference's recorded one (to its recorded rounding)."""
    def equal(a, b) -> bool:
        if isinstance(b, dict):
            return isinstance(a, dict) and all(equal(a.get(k), v) for k, v in b.items())
        return a is not None and b is not None and abs(a - b) <= tol

    return all(equal(stats.get(k), v) for k, v in reference.items() if k not in TEST_KEYS)


def structure_record(labels: str | Path, split: str | Path, test_labels: str | Path, dataset: str) -> dict:
    train, test = read_labels(labels), read_labels(test_labels)
    if list(test.classes) != list(train.classes):
        raise NoisyMLTError(f"{test_labels}: its classes are not those of {labels} (first of "
                            f"{len(test.classes)}: {test.classes[:2]}; of {len(train.classes)}: {train.classes[:2]})")
    thresholds = recorded_thresholds(train.meta, str(labels))
    counts = train.labels.sum(axis=0)
    check_split(split, labels, train.classes, counts, thresholds)
    stats = structure_stats(train.labels, test_counts=test.labels.sum(axis=0), test_images=len(test),
                            head_min=thresholds["head_min"], tail_max=thresholds["tail_max"])
    return {
        "dataset": dataset,
        "title": dataset_title(dataset).removesuffix("-Noise"),
        "files": {"labels": str(labels), "split": str(split), "test_labels": str(test_labels)},
        "thresholds": {**thresholds, "text": threshold_text(thresholds, len(train))},
        "classes": list(train.classes),
        "class_counts": {"train": [int(c) for c in counts], "test": [int(c) for c in test.labels.sum(axis=0)]},
        "stats": stats,
        "hub_name": train.classes[stats["hub_class"]],
        "compare": compare(stats),  # against VOC-MLT, statistic by statistic (noisymlt.data.structure.TOLERANCE)
        "is_reference": next((name for name, ref in REFERENCE.items() if same_subset(stats, ref)), None),
    }


def readme_entry(record: dict, report: str) -> dict:
    """What the README's block shows of a structure report: the dataset beside VOC-MLT, with the tolerances and
    marks, held in the numbers file so that the block renders from it alone."""
    return {"dataset": record["dataset"], "title": record["title"], "report": report,
            "thresholds": record["thresholds"], "hub_name": record["hub_name"], "stats": record["stats"],
            "reference": REFERENCE["VOC-MLT"], "compare": record["compare"]}


def _cmd_structure(args: argparse.Namespace) -> int:
    from noisymlt.core.codedeps import CLI
    from noisymlt.core.files import write_json, write_text
    from noisymlt.core.manifest import check_inputs, now, write_manifest
    from noisymlt.report.structure_text import render_markdown

    started = now()
    inputs = {"labels": args.labels, "split": args.split, "test_labels": args.test_labels}
    check_inputs(inputs)  # against the records of the steps that wrote them, where they left one
    dataset = args.dataset or Path(args.labels).parent.name
    record = structure_record(args.labels, args.split, args.test_labels, dataset)
    out = Path(args.out)
    md = Path(args.md) if args.md else out.with_suffix(".md")
    write_json(out, record, sort_keys=True)
    write_text(md, render_markdown(record))
    write_manifest(out.with_name(out.stem + ".manifest.json"), step="structure", started=started, inputs=inputs,
                   outputs={"json": out, "md": md}, code=(*CLI, __name__))
    marks = [row["ok"] for row in record["compare"] if row["ok"] is not None]
    print(f"{md}: {record['title']} ({record['stats']['images']} images), {sum(marks)} of {len(marks)} statistics "
          f"within tolerance of VOC-MLT; groups {record['thresholds']['text']}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("structure", help="a dataset's long-tail structure beside VOC-MLT's and COCO-MLT's",
                       description="Statistics of the long-tailed training subset (groups, hub class, tail labels "
                                   "inside head images, class-aware sampling exposure, train-to-test shift), beside "
                                   "VOC-MLT's and COCO-MLT's, each marked within or outside its tolerance of "
                                   "VOC-MLT's. Writes OUT (JSON), the Markdown page and OUT with .manifest.json.")
    p.add_argument("--labels", required=True,
                   help="the long-tailed training subset (data/DATASET/train_labels.parquet)")
    p.add_argument("--split", required=True, help="its class split (data/DATASET/class_split.json)")
    p.add_argument("--test-labels", required=True, help="the test set's labels (data/DATASET/test_labels.parquet)")
    p.add_argument("--out", required=True, help="JSON to write (reports/structure_DATASET.json)")
    p.add_argument("--md", help="Markdown page to write (default: OUT with .md)")
    p.add_argument("--dataset", help="the dataset's name in the report (default: the folder of --labels)")
    p.set_defaults(func=_cmd_structure)
