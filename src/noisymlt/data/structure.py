"""The structure of a long-tailed multi-label benchmark: what the paper's methods act on.

A stand-in benchmark is judged by these statistics before its results: how skewed the classes are, how many
fall in each group, whether the tail lives inside images of the head (VOC's tail sits in images of its hub
class, person), how much exposure class-aware sampling moves between the groups, and how far the test set's
class frequencies are from the training set's. ``structure_stats`` computes them from label matrices alone;
``REFERENCE`` holds VOC-MLT's and COCO-MLT's, computed by the same function from their published label
files (tests/test_structure.py recomputes them when the files are at hand).
"""

from __future__ import annotations

import numpy as np

from noisymlt.data.labels import GROUPS, HEAD_MIN, TAIL_MAX, split_from_counts
from noisymlt.errors import NoisyMLTError

REFERENCE_IMAGES = 1142  # VOC-MLT's training images, on which SPEC 1's thresholds are counted

# Test-set images per class, VOC2007 test (4,952 images), from the VOC2007 development kit's statistics table
VOC2007_TEST_COUNTS = (204, 239, 282, 172, 212, 174, 721, 322, 417, 127, 190, 418, 274, 222, 2007, 224, 97, 223,
                       259, 229)


def scaled_thresholds(images: int) -> tuple[int, int]:
    """Group thresholds (head_min, tail_max) scaled from VOC-MLT's 100 / 20 to a subset of ``images``: a smaller
    stand-in keeps VOC-MLT's shares of classes per group instead of pushing every class into the tail."""
    scale = images / REFERENCE_IMAGES
    return max(2, round(HEAD_MIN * scale)), max(1, round(TAIL_MAX * scale))


def recorded_thresholds(meta: dict, where: str) -> dict:
    """The group thresholds a label table's class split was built with: ``noisymlt longtail`` records
    ``groups: {rule, head_min, tail_max}`` in the table's metadata (noisymlt.data.labels.read_labels(...).meta).
    A table without the record (written before it existed, or a CSV brought from elsewhere) gets SPEC 1's fixed
    100 / 20, which longtail always used before, with ``recorded`` False so a report can say so."""
    groups = meta.get("groups")
    if groups is None:
        return {"rule": "fixed", "head_min": HEAD_MIN, "tail_max": TAIL_MAX, "recorded": False}
    try:
        rule, head_min, tail_max = str(groups["rule"]), int(groups["head_min"]), int(groups["tail_max"])
    except (KeyError, TypeError, ValueError) as exc:
        raise NoisyMLTError(f"{where}: metadata key 'groups' must hold rule, head_min and tail_max, got {groups!r}; "
                            "rebuild the table with `noisymlt longtail`") from exc
    return {"rule": rule, "head_min": head_min, "tail_max": tail_max, "recorded": True}


def threshold_text(thresholds: dict, images: int) -> str:
    """The group rule as a reader reads it: "head >= 53 images, tail < 11: VOC-MLT's 100 / 20 scaled to 602 of
    its 1,142 images", or "head >= 100 images, tail < 20: SPEC 1's, as VOC-MLT's"."""
    text = f"head >= {thresholds['head_min']} images, tail < {thresholds['tail_max']}"
    if thresholds["rule"] == "scaled":
        return (f"{text}: VOC-MLT's {HEAD_MIN} / {TAIL_MAX} scaled to {images:,} of its {REFERENCE_IMAGES:,} "
                "images")
    if (thresholds["head_min"], thresholds["tail_max"]) == (HEAD_MIN, TAIL_MAX):
        return f"{text}: SPEC 1's, as VOC-MLT's"
    return text


def class_aware_exposure(labels: np.ndarray, groups: dict[str, np.ndarray]) -> dict[str, float]:
    """Per group: positives of its classes in a class-aware draw (a class uniformly, then one of its images
    uniformly; [DB]'s sampler) over the same in a uniform draw of an image. Above 1: re-sampling shows that
    group's labels more often than its share of the data."""
    y = np.asarray(labels, dtype=np.float64)
    counts = y.sum(axis=0)
    present = counts > 0
    # row k: mean label vector of the images of class k (the classes a class-aware draw of k shows)
    per_class = (y.T @ y)[present] / counts[present, None]
    aware = per_class.mean(axis=0)
    uniform = counts / y.shape[0]
    return {g: float(aware[idx].sum() / uniform[idx].sum()) if idx.size and uniform[idx].sum() > 0 else None
            for g, idx in groups.items()}


def spearman(a, b) -> float:
    """Spearman's rank correlation with average ranks for ties (scipy's definition)."""
    from scipy.stats import spearmanr

    return float(spearmanr(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)).statistic)


def structure_stats(train: np.ndarray, *, test_counts=None, test_images: int | None = None,
                    head_min: int | None = None, tail_max: int | None = None) -> dict:
    """Statistics of a training label matrix (images x classes, 0/1) and, when given, the test set's
    per-class image counts. Thresholds default to VOC-MLT's scaled to the subset's size (``scaled_thresholds``)."""
    y = np.asarray(train)
    if y.ndim != 2 or y.shape[0] == 0 or y.shape[1] == 0:
        raise NoisyMLTError(f"structure: a label matrix needs images x classes, got shape {y.shape}")
    y = (y > 0).astype(np.int64)
    n, c = y.shape
    counts = y.sum(axis=0)
    if head_min is None or tail_max is None:
        head_min, tail_max = scaled_thresholds(n)
    groups = {g: np.asarray(idx, dtype=np.int64) for g, idx in split_from_counts(counts, head_min, tail_max).items()}
    hub = int(np.argmax(counts))
    has = {g: y[:, idx].any(axis=1) if idx.size else np.zeros(n, dtype=bool) for g, idx in groups.items()}
    tail_images = int(has["tail"].sum())
    smallest = int(counts[counts > 0].min()) if (counts > 0).any() else 0
    stats = {
        "images": n,
        "classes": c,
        "labels_per_image": float(counts.sum() / n),
        "largest_class": int(counts.max()),
        "smallest_class": smallest,
        "imbalance_ratio": float(counts.max() / smallest) if smallest else None,
        "head_min": int(head_min),
        "tail_max": int(tail_max),
        "groups": {g: int(idx.size) for g, idx in groups.items()},
        "head_share_of_positives": float(counts[groups["head"]].sum() / counts.sum()),
        "hub_class": hub,
        "hub_share_of_images": float(counts[hub] / n),
        "tail_image_share": float(tail_images / n),
        "tail_images_with_head": float((has["tail"] & has["head"]).sum() / tail_images) if tail_images else None,
        "tail_images_with_hub": float(y[has["tail"], hub].mean()) if tail_images else None,
        "class_aware_exposure": class_aware_exposure(y, groups),
    }
    if test_counts is not None:
        test_counts = np.asarray(test_counts)
        if test_counts.shape != (c,):
            raise NoisyMLTError(f"structure: {test_counts.size} test class counts for {c} classes")
        stats["test_images"] = None if test_images is None else int(test_images)
        stats["train_test_rank_correlation"] = spearman(counts, test_counts)
        stats["test_hub_share_of_images"] = (None if test_images is None
                                             else float(test_counts[hub] / test_images))
    return stats


# VOC-MLT and COCO-MLT by structure_stats on their published label files (train subsets; thresholds 100 / 20);
# VOC-MLT's test row from VOC2007_TEST_COUNTS. COCO's val2017 class counts are not held offline: a downloaded
# COCO dataset's own report has them.
REFERENCE: dict[str, dict] = {
    "VOC-MLT": {
        "images": 1142, "classes": 20, "labels_per_image": 2.0543, "largest_class": 775, "smallest_class": 4,
        "imbalance_ratio": 193.75, "head_min": 100, "tail_max": 20, "groups": {"head": 6, "medium": 6, "tail": 8},
        "head_share_of_positives": 0.8512, "hub_class": 14, "hub_share_of_images": 0.6786,
        "tail_image_share": 0.0622, "tail_images_with_head": 1.0, "tail_images_with_hub": 0.9155,
        "class_aware_exposure": {"head": 0.9306, "medium": 1.7013, "tail": 6.7075},
        "test_images": 4952, "train_test_rank_correlation": 0.5143, "test_hub_share_of_images": 0.4053,
    },
    "COCO-MLT": {
        "images": 1909, "classes": 80, "labels_per_image": 4.3562, "largest_class": 1128, "smallest_class": 6,
        "imbalance_ratio": 188.0, "head_min": 100, "tail_max": 20, "groups": {"head": 22, "medium": 33, "tail": 25},
        "head_share_of_positives": 0.7755, "hub_class": 0, "hub_share_of_images": 0.5909,
        "tail_image_share": 0.1409, "tail_images_with_head": 0.9926, "tail_images_with_hub": 0.7212,
        "class_aware_exposure": {"head": 0.9529, "medium": 1.1726, "tail": 2.6089},
    },
}

# How close a stand-in must be to VOC-MLT, per statistic: (kind, bound). "abs": |stand-in - VOC-MLT| <= bound;
# "ratio": max(a / b, b / a) <= bound; "groups": each group's class count within bound. Wide enough for another
# generator seed's draw of the same model, narrow enough that the old scene toy (2 / 4 / 14 groups, 26% of its
# images with a tail label, rank correlation 0.91) fails most of them.
TOLERANCE: dict[str, tuple[str, float]] = {
    "groups": ("groups", 1),
    "labels_per_image": ("abs", 0.3),
    "imbalance_ratio": ("ratio", 1.5),
    "head_share_of_positives": ("abs", 0.05),
    "hub_share_of_images": ("abs", 0.07),
    "tail_image_share": ("abs", 0.03),
    "tail_images_with_head": ("abs", 0.1),
    "tail_images_with_hub": ("abs", 0.15),
    "class_aware_exposure.head": ("abs", 0.1),
    "class_aware_exposure.medium": ("abs", 0.4),
    "class_aware_exposure.tail": ("ratio", 1.3),
    "train_test_rank_correlation": ("abs", 0.15),
    "test_hub_share_of_images": ("abs", 0.07),
}


def _value(stats: dict, key: str):
    for part in key.split("."):
        stats = stats.get(part) if isinstance(stats, dict) else None
    return stats


def compare(stats: dict, reference: dict | None = None) -> list[dict]:
    """One row per TOLERANCE statistic: the stand-in's value, the reference's (VOC-MLT by default), the bound and
    whether it holds (None where either side lacks the statistic)."""
    reference = REFERENCE["VOC-MLT"] if reference is None else reference
    rows = []
    for key, (kind, bound) in TOLERANCE.items():
        ours, ref = _value(stats, key), _value(reference, key)
        if ours is None or ref is None:
            ok = None
        elif kind == "groups":
            ok = all(abs(ours[g] - ref[g]) <= bound for g in GROUPS)
        elif kind == "ratio":
            ok = ours > 0 and ref > 0 and max(ours / ref, ref / ours) <= bound
        else:
            ok = abs(ours - ref) <= bound
        rows.append({"statistic": key, "value": ours, "reference": ref, "kind": kind, "bound": bound, "ok": ok})
    return rows
