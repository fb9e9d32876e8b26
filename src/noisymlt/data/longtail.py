"""Long-tailed training subsets (SPEC 1.1) and the head/medium/tail class split.

Two sources:

* ``pareto``: the [DB] algorithm re-implemented so that VOC2012 trainval gives exactly the
  published VOC-MLT list, ids and order. Exactness rests on Python ``set`` iteration order (sets of
  int row indices, filled row by row) and on the global ``random`` stream, so this module seeds that
  stream itself and restores the caller's state afterwards.
* ``official``: download the published id list ([DB] repository, pinned commit, sha256-checked) and
  select those rows in the list's order. Use it for COCO: [DB] drew that subset on the stream left
  over after VOC, so a COCO-only pareto run cannot reproduce it.
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from noisymlt.core.files import check_outputs
from noisymlt.data.labels import (GROUPS, HEAD_MIN, TAIL_MAX, LabelTable, read_labels, split_from_counts,
                                  write_class_split, write_labels)
from noisymlt.data.structure import scaled_thresholds
from noisymlt.errors import NoisyMLTError

DB_COMMIT = "14460d0acda6a3e77a8a6a5999b9746243cb1535"
DB_RAW = f"https://raw.githubusercontent.com/wutong16/DistributionBalancedLoss/{DB_COMMIT}"


@dataclass(frozen=True)
class OfficialList:
    url: str
    sha256: str
    max_count: int  # the pareto ``max`` [DB] used for this dataset (b=6, min=1 for both)


# The published lists are the kinds' (noisymlt.data.kinds: official_list); [DB]'s pareto max for VOC2012 is the
# default when no kind names one.
PARETO_MAX = 800


def official_lists() -> dict[str, OfficialList]:
    """Kind -> its published subset's id list, for every kind that has one."""
    from noisymlt.data.kinds import all_kinds

    return {name: kind.official_list for name, kind in all_kinds().items() if kind.official_list is not None}


# ---------------------------------------------------------------------------------------------
# pareto ([DB]) subsampling


def check_pareto_params(b: float, max_count: int, min_count: int, seed: int) -> None:
    """Reject parameters the algorithm cannot use; messages name the CLI option."""
    if not b > 0:
        raise NoisyMLTError(f"--b (pareto shape b) must be > 0, got {b}")
    if min_count < 0:
        raise NoisyMLTError(f"--min must be >= 0, got {min_count}")
    if max_count < min_count:
        raise NoisyMLTError(f"--max ({max_count}) must be >= --min ({min_count})")
    if seed < 0:
        raise NoisyMLTError(f"--seed must be >= 0, got {seed}")


def pareto_reference_counts(num_classes: int, b: float, max_count: int, min_count: int) -> list[int]:
    """Target images per class rank: ``int(pdf(x) * (max - min) / b + min)`` on an even grid of
    ``num_classes`` points from ``pareto.ppf(0, b)`` to ``pareto.ppf(0.99, b)`` (SPEC 1.1 step 1)."""
    from scipy.stats import pareto

    check_pareto_params(b, max_count, min_count, 0)
    if num_classes < 1:
        raise NoisyMLTError(f"need at least one class, got {num_classes}")
    dist = pareto(b)
    grid = np.linspace(pareto.ppf(0, b), pareto.ppf(0.99, b), num_classes)
    return [int(dist.pdf(x) * (max_count - min_count) / b + min_count) for x in grid]


def class_order(Y: np.ndarray) -> np.ndarray:
    """Classes ranked by the column sums of P[i, j] = |i and j| / |i|, descending (SPEC 1.1 step 2).

    A class with no image contributes a zero row (it conditions nothing)."""
    Y = np.asarray(Y, dtype=np.float64)
    co = Y.T @ Y
    per_class = np.diag(co)
    with np.errstate(divide="ignore", invalid="ignore"):
        P = np.where(per_class[:, None] > 0, co / per_class[:, None], 0.0)
    return np.argsort(-P.sum(axis=0))


def pareto_subsample(
    Y: np.ndarray,
    *,
    b: float = 6,
    max_count: int = 800,
    min_count: int = 1,
    seed: int = 0,
    cap_to_available: bool = False,
) -> list[int]:
    """Row indices of the long-tailed subset, in output order (SPEC 1.1 steps 3-5).

    Rows of ``Y`` must be in sorted image-id order for the published result. Without
    ``cap_to_available`` a class that has fewer unselected images than its target is an error
    ([DB] VOC behaviour); with it the draw takes what is there ([DB] COCO behaviour).
    """
    check_pareto_params(b, max_count, min_count, seed)
    Y = np.asarray(Y)
    if Y.ndim != 2 or Y.shape[0] == 0:
        raise NoisyMLTError(f"label matrix must be 2-D with at least one row, got shape {Y.shape}")
    n, num_classes = Y.shape
    ref = pareto_reference_counts(num_classes, b, max_count, min_count)
    order = [int(c) for c in class_order(Y)]
    # Plain Python ints throughout: set iteration order, hence every tuple() handed to
    # random.sample and the final order, must match the published run.
    rows_of_class = [np.flatnonzero(Y[:, c]).tolist() for c in range(num_classes)]
    classes_of_row = [np.flatnonzero(Y[i]).tolist() for i in range(n)]
    chosen: set[int] = set()
    chosen_of_class: list[set[int]] = [set() for _ in range(num_classes)]

    # SPEC 1.1 prescribes random.seed(seed) and the module-level stream: that is how [DB] drew the
    # published subsets (its COCO draw continued the same stream right after VOC), so we follow it
    # literally, let nothing else draw in between, and restore the caller's state afterwards.
    saved = random.getstate()
    random.seed(seed)
    try:
        for rank, c in enumerate(order):
            want = ref[rank] - len(chosen_of_class[c])
            if want < 0:
                for row in random.sample(tuple(chosen_of_class[c]), -want):
                    chosen.remove(row)
                    for k in classes_of_row[row]:
                        chosen_of_class[k].remove(row)
            elif want > 0:
                pool = set(rows_of_class[c]) - chosen_of_class[c]
                if want > len(pool):
                    if not cap_to_available:
                        raise NoisyMLTError(
                            f"class {c} needs {want} more images but only {len(pool)} are left; "
                            "lower --max or pass --cap-to-available"
                        )
                    want = len(pool)
                for row in random.sample(tuple(pool), want):
                    chosen.add(row)
                    for k in classes_of_row[row]:
                        chosen_of_class[k].add(row)
    finally:
        random.setstate(saved)
    return list(chosen)


# ---------------------------------------------------------------------------------------------
# official id lists

_EXTENSION = re.compile(r"\.(jpe?g|png)$", re.IGNORECASE)
_COCO_PREFIX = re.compile(r"^COCO_[A-Za-z]+\d*_(\d+)$")


def normalize_image_id(token: str) -> str:
    """One spelling per image: ``000000123456.jpg`` and ``COCO_train2014_000000123456`` become
    ``123456`` (COCO ids are integers); VOC ids such as ``2008_000023`` are kept as they are."""
    token = _EXTENSION.sub("", token.strip())
    match = _COCO_PREFIX.match(token)
    if match:
        token = match.group(1)
    return str(int(token)) if token.isdigit() else token


def parse_id_list(text: str, source: str = "id list") -> list[str]:
    """Image ids, one per line; blank lines and ``#`` comments skipped.

    Accepts the two published formats: VOC ``img_id.txt`` (``2008_000023``) and COCO ``img_id.pkl``
    (plain text despite its name, one integer id per line), plus file names with ``.jpg`` or a
    ``COCO_<split>_`` prefix (see ``normalize_image_id``).
    """
    ids: list[str] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if len(token.split()) != 1:
            raise NoisyMLTError(f"{source}: line {lineno} holds more than one token: {token!r}")
        image_id = normalize_image_id(token)
        if image_id in seen:
            raise NoisyMLTError(f"{source}: line {lineno} repeats image id {image_id!r}")
        seen.add(image_id)
        ids.append(image_id)
    if not ids:
        raise NoisyMLTError(f"{source}: no image ids")
    return ids


def select_ids(table: LabelTable, ids: list[str], source: str = "id list") -> list[int]:
    """Row indices of ``ids`` in ``table`` in list order; an unknown id is an error naming it."""
    row_of = {normalize_image_id(i): r for r, i in enumerate(table.image_ids)}
    missing = [i for i in ids if i not in row_of]
    if missing:
        raise NoisyMLTError(
            f"{source}: {len(missing)} image id(s) not in the label table, first: {missing[:5]}"
        )
    return [row_of[i] for i in ids]


def official_subset(table: LabelTable, ids_url: str, sha256: str | None, cache_path: str | Path) -> LabelTable:
    """Download (sha256-checked, cached) the published id list and select those rows in its order."""
    from noisymlt.data.download import fetch

    path = fetch(ids_url, Path(cache_path), sha256=sha256, progress=False)
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise NoisyMLTError(f"{path}: cannot read id list ({exc})") from exc
    rows = select_ids(table, parse_id_list(text, str(path)), str(path))
    return table.subset(rows)


# ---------------------------------------------------------------------------------------------
# CLI


def default_split_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}_split.json")


def count_summary(table: LabelTable, split: dict[str, list[int]]) -> str:
    group_of = {c: g for g in GROUPS for c in split[g]}
    counts = table.labels.sum(axis=0)
    width = max(len(c) for c in table.classes)
    lines = [f"{len(table)} images, {table.num_classes} classes; "
             + ", ".join(f"{g} {len(split[g])}" for g in GROUPS)]
    for j, name in enumerate(table.classes):
        lines.append(f"{j:3d} {name:<{width}} {int(counts[j]):6d} {group_of[j]}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_outputs({"--labels": args.labels}, {"--out": out, "--split-out": Path(args.split_out) if args.split_out
                                              else default_split_path(out)})
    table = read_labels(args.labels)
    if args.source == "official":
        lists = official_lists()
        if args.dataset not in lists:
            raise NoisyMLTError(f"--source official needs --dataset, a kind with a published list ({', '.join(lists)})")
        entry = lists[args.dataset]
        url = args.ids_url or entry.url
        sha256 = args.ids_sha256 or (entry.sha256 if args.ids_url is None else None)
        cache = Path(args.ids_cache or out.parent / f"official_{args.dataset}_{url.rsplit('/', 1)[-1]}")
        subset = official_subset(table, url, sha256, cache)
        subset.meta = {**subset.meta, "subset": {"source": "official", "url": url, "sha256": sha256}}
    elif args.source == "all":  # the set as it is (a user's own data that is long-tailed already)
        subset = table.subset(np.arange(len(table)))
        subset.meta = {**subset.meta, "subset": {"source": "all"}}
    else:
        max_count = args.max if args.max is not None else (
            official_lists()[args.dataset].max_count if args.dataset else PARETO_MAX)
        rows = pareto_subsample(
            table.labels,
            b=args.b,
            max_count=max_count,
            min_count=args.min,
            seed=args.seed,
            cap_to_available=args.cap_to_available,
        )
        subset = table.subset(rows)
        subset.meta = {
            **subset.meta,
            "subset": {"source": "pareto", "b": args.b, "max": max_count, "min": args.min,
                       "seed": args.seed, "cap_to_available": args.cap_to_available},
        }
    head_min, tail_max = scaled_thresholds(len(subset)) if args.groups == "scaled" else (HEAD_MIN, TAIL_MAX)
    split = split_from_counts(subset.labels.sum(axis=0), head_min, tail_max)
    subset.meta = {**subset.meta, "groups": {"rule": args.groups, "head_min": head_min, "tail_max": tail_max}}
    write_labels(subset, out)
    write_class_split(split, Path(args.split_out) if args.split_out else default_split_path(out))
    print(count_summary(subset, split))
    print(f"groups: head >= {head_min} images, tail < {tail_max}"
          + (f" (SPEC 1's 100 / 20 scaled to {len(subset)} of VOC-MLT's 1,142 images)" if args.groups == "scaled" else ""))
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "longtail",
        help="draw the long-tailed training subset and its head/medium/tail class split",
        description=(
            "Select the long-tailed training subset of a clean label table (SPEC 1.1) and write it "
            "with the class split (head >= 100 images, medium 20..99, tail < 20). "
            "--source pareto redraws it with the [DB] algorithm (exact for VOC2012 trainval with the "
            "defaults); --source official downloads the published id list and keeps its order; --source all keeps "
            "the table as it is."
        ),
    )
    p.add_argument("--labels", required=True,
                   help="input label table (Parquet, or reference-style CSV), rows in sorted image-id order")
    p.add_argument("--out", required=True, help="output Parquet label table, rows in subset order")
    p.add_argument("--split-out", help="class split JSON (default: <OUT stem>_split.json beside OUT)")
    p.add_argument("--source", choices=("pareto", "official", "all"), default="pareto",
                   help="how to pick the subset: pareto redraws it, official reads a kind's published list, all keeps "
                        "every image (default: pareto)")
    p.add_argument("--dataset", choices=sorted(official_lists()),
                   help="which published list (official) and default --max (voc 800, coco 1200)")
    p.add_argument("--b", type=float, default=6.0, help="pareto shape (default: 6)")
    p.add_argument("--max", type=int, default=None,
                   help="images of the most frequent class (default: 800, or 1200 with --dataset coco)")
    p.add_argument("--min", type=int, default=1, help="offset added to every target count (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="random.seed for the draw (default: 0, as published)")
    p.add_argument("--cap-to-available", action="store_true",
                   help="take fewer images when a class runs out (as [DB] did for COCO) instead of failing")
    p.add_argument("--groups", choices=("fixed", "scaled"), default="fixed",
                   help="group thresholds: fixed = head >= 100 images, tail < 20 (SPEC 1; default); scaled = the "
                        "same times the subset's images / 1,142 (VOC-MLT's size), for a smaller stand-in")
    p.add_argument("--ids-url",
                   help="override the official id-list URL (its sha256 is then unchecked unless --ids-sha256)")
    p.add_argument("--ids-sha256", help="expected sha256 of the id list")
    p.add_argument("--ids-cache", help="where to keep the downloaded id list (default: beside OUT)")
    p.set_defaults(func=_run)
