"""Class-dependent label noise for multi-label training sets (SPEC 2; paper Sec. 4.1.1).

Every clean positive label i of every image is kept with probability ``1 - gamma``; otherwise it
is replaced by a class j != i drawn in proportion to how often i and j co-occur in the clean set,
so noise moves labels towards classes that plausibly share a scene. The noisy label set of an
image is the union of kept and replacement labels. No public code exists for this step: this
module is the specification.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.core.files import write_json


def _check_gamma(gamma: float, what: str = "gamma") -> float:
    try:
        value = float(gamma)
    except (TypeError, ValueError) as exc:
        raise NoisyMLTError(f"{what}: {gamma!r} is not a number") from exc
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise NoisyMLTError(f"{what}: noise rate must lie in [0, 1], got {gamma!r}")
    return value


def _check_seed(seed: int, what: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise NoisyMLTError(f"{what}: must be an integer, got {seed!r}")
    if seed < 0:
        raise NoisyMLTError(f"{what}: must be >= 0, got {seed}")
    return int(seed)


def _check_labels(clean_Y: np.ndarray, what: str = "labels") -> np.ndarray:
    Y = np.asarray(clean_Y)
    if Y.ndim != 2:
        raise NoisyMLTError(f"{what}: label matrix must be 2-D (images x classes), got shape {Y.shape}")
    if not np.isin(Y, (0, 1)).all():
        raise NoisyMLTError(f"{what}: labels must be 0 or 1")
    Y = Y.astype(np.uint8)
    if Y.shape[1] < 2:
        raise NoisyMLTError(f"{what}: noise needs at least 2 classes, got {Y.shape[1]}")
    if Y.shape[0] == 0 or not Y.any():
        raise NoisyMLTError(f"{what}: no positive label at all; noise needs clean positives")
    empty = np.flatnonzero(~Y.any(axis=1))
    if empty.size:
        raise NoisyMLTError(
            f"{what}: {empty.size} image(s) without any positive label (first: row {int(empty[0])}); "
            "every training image needs at least one clean positive"
        )
    return Y


def _replacement_rows(N: np.ndarray) -> np.ndarray:
    """Row i = distribution of the replacement for class i: co-occurrence row, or uniform off-diagonal."""
    C = N.shape[0]
    R = N.astype(np.float64)
    totals = R.sum(axis=1)
    lonely = totals == 0
    R[lonely] = 1.0
    np.fill_diagonal(R, 0.0)
    return R / R.sum(axis=1, keepdims=True) if C > 1 else R


def transition_matrix(clean_Y: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Noise transition matrix T (C x C, rows sum to 1) and co-occurrence counts N (diagonal 0).

    T[i, i] = 1 - gamma; T[i, j] = gamma * N[i, j] / sum_{k != i} N[i, k]. A class that co-occurs
    with nothing spreads gamma uniformly over the other classes.
    """
    gamma = _check_gamma(gamma)
    Y = np.asarray(clean_Y).astype(np.int64)
    N = Y.T @ Y
    np.fill_diagonal(N, 0)
    T = gamma * _replacement_rows(N)
    np.fill_diagonal(T, 1.0 - gamma)
    return T, N


def inject_noise(clean_Y: np.ndarray, gamma: float, seed: int) -> tuple[np.ndarray, dict]:
    """Noisy copy of ``clean_Y`` (n x C, 0/1) and what happened.

    Draws, from ``numpy.random.default_rng(seed)``: one uniform per clean positive (row-major order)
    deciding keep (>= gamma) or flip, then one uniform per flipped positive choosing the replacement
    by inverse CDF over its co-occurrence row. ``info`` holds ``gamma``, ``seed``, ``T``, ``N``,
    ``flipped`` (n x C bool: clean positives that were replaced), ``replacement`` (n x C int: target
    class of a flipped positive, -1 elsewhere) and ``transitions`` (C x C counts of i -> j replacements).
    """
    gamma = _check_gamma(gamma)
    seed = _check_seed(seed)
    Y = _check_labels(clean_Y)
    n, C = Y.shape
    T, N = transition_matrix(Y, gamma)
    cdf = np.cumsum(_replacement_rows(N), axis=1)
    cdf /= cdf[:, -1:]  # last entry exactly 1.0, so a uniform in [0, 1) never runs past the end

    rng = np.random.default_rng(seed)
    rows, cols = np.nonzero(Y)
    flip = rng.random(rows.size) < gamma
    src_rows, src_cols = rows[flip], cols[flip]
    u = rng.random(src_cols.size)
    # index of the first cdf entry > u; zero-probability entries (the diagonal included) are skipped
    targets = (cdf[src_cols] <= u[:, None]).sum(axis=1)

    noisy = np.zeros_like(Y)
    noisy[rows[~flip], cols[~flip]] = 1
    noisy[src_rows, targets] = 1
    # each clean positive leaves either itself or its replacement, so no image can end up empty
    assert noisy.any(axis=1).all(), "an image lost all its labels"

    flipped = np.zeros((n, C), dtype=bool)
    flipped[src_rows, src_cols] = True
    replacement = np.full((n, C), -1, dtype=np.int64)
    replacement[src_rows, src_cols] = targets
    transitions = np.zeros((C, C), dtype=np.int64)
    np.add.at(transitions, (src_cols, targets), 1)
    info = {
        "gamma": gamma,
        "seed": seed,
        "T": T,
        "N": N,
        "flipped": flipped,
        "replacement": replacement,
        "transitions": transitions,
    }
    return noisy, info


def _rate(num: float, den: float) -> float | None:
    return None if den == 0 else float(num) / float(den)


def noise_stats(
    clean: np.ndarray,
    noisy: np.ndarray,
    classes: Sequence[str],
    transitions: np.ndarray,
    *,
    gamma: float | None = None,
    seed: int | None = None,
) -> dict:
    """JSON-able summary of one noisy copy; rates with a zero denominator are ``None``.

    ``flip_rate`` counts replaced clean positives (what gamma controls); ``missing_rate`` counts
    clean positives absent from the noisy set (lower: a replacement from another label may
    restore one); ``wrong_fraction`` is the share of noisy positives that are not clean positives.
    """
    clean = np.asarray(clean).astype(np.int64)
    noisy = np.asarray(noisy).astype(np.int64)
    transitions = np.asarray(transitions).astype(np.int64)
    clean_counts = clean.sum(axis=0)
    noisy_counts = noisy.sum(axis=0)
    flips = transitions.sum(axis=1)
    wrong = (noisy & (1 - clean)).sum(axis=0)
    missing = (clean & (1 - noisy)).sum(axis=0)
    empty = [str(classes[j]) for j in np.flatnonzero(noisy_counts == 0)]
    return {
        "gamma": gamma,
        "seed": seed,
        "num_images": int(clean.shape[0]),
        "classes": [str(c) for c in classes],
        "clean_positives": int(clean_counts.sum()),
        "noisy_positives": int(noisy_counts.sum()),
        "clean_counts": [int(v) for v in clean_counts],
        "noisy_counts": [int(v) for v in noisy_counts],
        "flipped_positives": int(flips.sum()),
        "flip_rate": _rate(flips.sum(), clean_counts.sum()),
        "flip_rate_per_class": [_rate(f, c) for f, c in zip(flips, clean_counts)],
        "missing_rate": _rate(missing.sum(), clean_counts.sum()),
        "wrong_fraction": _rate(wrong.sum(), noisy_counts.sum()),
        "wrong_fraction_per_class": [_rate(w, c) for w, c in zip(wrong, noisy_counts)],
        "transition_counts": transitions.tolist(),
        "classes_without_noisy_positives": len(empty),
        "empty_classes": empty,
    }


def make_noisy_table(
    labels_path: str | Path, gamma: float, seed: int, out: str | Path, stats_out: str | Path | None = None
) -> dict:
    """Read a clean label table, write its noisy copy (Parquet, clean_* columns alongside) and stats JSON."""
    from noisymlt.data.labels import LabelTable, read_labels, write_labels

    labels_path, out = Path(labels_path), Path(out)
    gamma = _check_gamma(gamma, "--gamma")
    seed = _check_seed(seed, "--seed")
    table = read_labels(labels_path)
    if table.clean is not None:
        raise NoisyMLTError(
            f"{labels_path}: already a noisy table (has clean_* columns); pass the clean labels"
        )
    _check_labels(table.labels, str(labels_path))  # so a refusal names the file
    noisy, info = inject_noise(table.labels, gamma, seed)
    stats = noise_stats(table.labels, noisy, table.classes, info["transitions"], gamma=gamma, seed=seed)
    stats["source"] = labels_path.name
    meta = {**table.meta, "gamma": gamma, "seed": seed, "noise_source": labels_path.name}
    write_labels(
        LabelTable(
            image_ids=table.image_ids,
            classes=table.classes,
            labels=noisy,
            paths=table.paths,
            clean=table.labels,
            meta=meta,
        ),
        out,
    )
    write_json(Path(stats_out) if stats_out else out.with_suffix(".json"), stats)
    return stats


def _run(args: argparse.Namespace) -> int:
    stats = make_noisy_table(args.labels, args.gamma, args.seed, args.out, args.stats)
    print(
        f"{args.out}: {stats['num_images']} images, gamma {stats['gamma']}, seed {stats['seed']}: "
        f"flip rate {stats['flip_rate']:.3f}, {stats['wrong_fraction']:.3f} of noisy labels wrong, "
        f"{stats['classes_without_noisy_positives']} class(es) without noisy positives"
    )
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "noise",
        help="inject co-occurrence label noise into a clean training label table",
        description=(
            "Write a noisy copy of a clean multi-label table (SPEC 2): each clean positive is kept "
            "with probability 1-gamma, else replaced by a class drawn from its co-occurrence row. "
            "The output holds the noisy labels in the class columns and the clean ones in clean_* "
            "columns (analysis only). Deterministic for a given (labels, gamma, seed)."
        ),
    )
    p.add_argument(
        "--labels", required=True, type=Path, help="clean label table (Parquet or reference-style CSV)"
    )
    p.add_argument("--gamma", required=True, type=float, help="noise rate in [0, 1], e.g. 0.5")
    p.add_argument(
        "--seed", required=True, type=int, help="non-negative seed; seeds 0..4 give five noisy copies"
    )
    p.add_argument("--out", required=True, type=Path, help="output Parquet table")
    p.add_argument(
        "--stats", type=Path, default=None, help="statistics JSON (default: OUT with .json suffix)"
    )
    p.set_defaults(func=_run)
