"""How a structure report reads (noisymlt.report.structure): the statistics under the names a reader knows, each
value in its unit, the tolerance of each against VOC-MLT, and the Markdown page and README table built from them.
"""

from __future__ import annotations

from noisymlt.data.classes import VOC_CLASSES
from noisymlt.data.structure import REFERENCE, TOLERANCE

# (key, label, unit) in the order a reader goes through them: size and skew, groups, where the tail lives, what
# class-aware sampling does with it, the test set
ROWS = (
    ("images", "training images", "int"),
    ("classes", "classes", "int"),
    ("labels_per_image", "labels per image", "2f"),
    ("largest_class", "largest class (images)", "int"),
    ("smallest_class", "smallest class (images)", "int"),
    ("imbalance_ratio", "imbalance ratio (largest / smallest class)", "1f"),
    ("head_min", "group thresholds (head >= / tail < images)", "thresholds"),
    ("groups", "head / medium / tail classes", "groups"),
    ("head_share_of_positives", "head classes' share of all positive labels", "pct"),
    ("hub_class", "hub class (the most frequent)", "hub"),
    ("hub_share_of_images", "images with the hub class", "pct"),
    ("tail_image_share", "images with a tail label", "pct"),
    ("tail_images_with_head", "of those, with a head label too", "pct"),
    ("tail_images_with_hub", "of those, with the hub class", "pct"),
    ("class_aware_exposure.head", "class-aware / uniform exposure of positives: head", "x"),
    ("class_aware_exposure.medium", "class-aware / uniform exposure of positives: medium", "x"),
    ("class_aware_exposure.tail", "class-aware / uniform exposure of positives: tail", "x"),
    ("test_images", "test images", "int"),
    ("train_test_rank_correlation", "train-to-test class-frequency rank correlation (Spearman)", "2f"),
    ("test_hub_share_of_images", "test images with the (training) hub class", "pct"),
)
LABELS = {key: label for key, label, _ in ROWS}
UNITS = {key: unit for key, _, unit in ROWS}
# The references' hub classes by name: VOC's class 14 and COCO's first category, both person
REFERENCE_HUBS = {"VOC-MLT": VOC_CLASSES[REFERENCE["VOC-MLT"]["hub_class"]], "COCO-MLT": "person"}


def value_of(stats: dict, key: str):
    for part in key.split("."):
        stats = stats.get(part) if isinstance(stats, dict) else None
    return stats


def fmt(stats: dict, key: str, hub: str | None = None) -> str:
    """A statistic in its unit: shares in %, exposures as x factors, counts with thousands separators."""
    unit, value = UNITS[key], value_of(stats, key)
    if unit == "thresholds":
        return f"{stats['head_min']} / {stats['tail_max']}"
    if value is None:
        return "--"
    if unit == "groups":
        return " / ".join(str(value[g]) for g in ("head", "medium", "tail"))
    if unit == "hub":
        return f"{hub} ({value})" if hub else str(value)
    if unit == "pct":
        return f"{100 * value:.1f}%"
    if unit == "x":
        return f"x{value:.2f}"
    if unit == "int":
        return f"{value:,}"
    return f"{value:.{unit[0]}f}"


def tolerance_text(key: str) -> str:
    """A statistic's tolerance against VOC-MLT (noisymlt.data.structure.TOLERANCE) in the statistic's unit."""
    if key not in TOLERANCE:
        return ""
    kind, bound = TOLERANCE[key]
    if kind == "groups":
        return f"± {bound:g} class per group"
    if kind == "ratio":
        return f"within a factor {bound:g}"
    return f"± {100 * bound:g} points" if UNITS[key] == "pct" else f"± {bound:g}"


def mark(ok: bool | None) -> str:
    return "--" if ok is None else "within" if ok else "**outside**"


def render_markdown(record: dict) -> str:
    """The report page: the dataset's statistics beside VOC-MLT's and COCO-MLT's, tolerance and mark per row."""
    stats, files, thr = record["stats"], record["files"], record["thresholds"]
    ok = {row["statistic"]: row["ok"] for row in record["compare"]}
    title = record["title"]
    out = [f"# Benchmark structure: {title}", "",
           f"The training subset `{files['labels']}` ({stats['images']:,} images, {stats['classes']} classes) with its "
           f"class split `{files['split']}`, and the test set `{files['test_labels']}` "
           f"({stats['test_images']:,} images), beside VOC-MLT's and COCO-MLT's statistics computed from their "
           "published label files (`noisymlt.data.structure.REFERENCE`; VOC-MLT's test set is VOC2007 test, "
           "COCO-MLT's val2017 counts are not held offline).", "",
           f"Groups: {thr['text']}"
           + ("" if thr["recorded"] else " (not recorded in the label table: SPEC 1's thresholds, which its class "
                                         "split matches)")
           + f"; the class split `{files['split']}` holds exactly these groups.", "",
           f"| Statistic | {title} (`{record['dataset']}`) | VOC-MLT | COCO-MLT | tolerance vs VOC-MLT | within? |",
           "|---|---|---|---|---|---|"]
    for key, label, _ in ROWS:
        out.append(f"| {label} | {fmt(stats, key, record['hub_name'])} | "
                   + " | ".join(fmt(REFERENCE[name], key, REFERENCE_HUBS[name]) for name in ("VOC-MLT", "COCO-MLT"))
                   + f" | {tolerance_text(key)} | {mark(ok.get(key)) if key in TOLERANCE else ''} |")
    judged = [row for row in record["compare"] if row["ok"] is not None]
    outside = [LABELS[row["statistic"]] for row in judged if not row["ok"]]
    out += ["", f"Within tolerance of VOC-MLT: {len(judged) - len(outside)} of {len(judged)} statistics"
            + (f"; outside: {'; '.join(outside)}." if outside else ".")]
    if record.get("is_reference"):
        out += ["", f"Every training statistic equals {record['is_reference']}'s recorded one: this subset is "
                    f"{record['is_reference']} itself (as its published list, or [DB]'s algorithm with the published "
                    "settings, builds it)."]
    out += ["", "Tolerance (`noisymlt.data.structure.TOLERANCE`): how close a stand-in for VOC-MLT must be. "
                "± a bound: the difference from VOC-MLT's value; a factor: the larger of the two values over the "
                "smaller; groups: each group's class count. What each statistic means and why the paper's methods "
                "depend on it: the manual's page on benchmark structure (docs/structure.md)."]
    return "\n".join(out) + "\n"


# the README's rows: every statistic with a tolerance, with the subset's size and its hub class by name
README_KEYS = ("images", "labels_per_image", "imbalance_ratio", "groups", "head_share_of_positives", "hub_class",
               "hub_share_of_images", "tail_image_share", "tail_images_with_head", "tail_images_with_hub",
               "class_aware_exposure.head", "class_aware_exposure.medium", "class_aware_exposure.tail",
               "train_test_rank_correlation", "test_hub_share_of_images")


def render_readme_table(entry: dict) -> list[str]:
    """The README's compact structure table (from the numbers file's ``structure`` entry): the demo's dataset
    beside VOC-MLT, statistic by statistic, with the tolerance and the mark."""
    stats, ref = entry["stats"], entry["reference"]
    ok = {row["statistic"]: row["ok"] for row in entry["compare"]}
    judged = [v for v in ok.values() if v is not None]
    out = [f"Structure of the demo's training subset beside VOC-MLT's (`{entry['report']}`; groups "
           f"{entry['thresholds']['text']}). {sum(judged)} of {len(judged)} statistics are within tolerance of "
           "VOC-MLT's ([docs/structure.md](docs/structure.md)):", "",
           f"| Statistic | {entry['title']} | VOC-MLT | tolerance | within? |", "|---|---|---|---|---|"]
    for key in README_KEYS:
        ours, theirs = fmt(stats, key, entry["hub_name"]), fmt(ref, key, REFERENCE_HUBS["VOC-MLT"])
        out.append(f"| {LABELS[key]} | {ours} | {theirs} | {tolerance_text(key)} | "
                   f"{mark(ok.get(key)) if key in TOLERANCE else ''} |")
    return out
