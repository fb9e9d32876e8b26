"""Label noise for multi-label training sets: a noisy copy of the clean subset per noise model, rate and seed.

The model (noisymlt.data.noise_models; default: the paper's co-occurrence model, SPEC 2 and paper Sec. 4.1.1)
draws the fate of every clean positive label: kept (probability 1 - gamma for every model here), replaced by
another class, or dropped. This module applies the draws the same way for every model, writes the noisy table and
measures what happened. No public code exists for the paper's step: its model module is the specification.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.core.files import check_outputs, write_json
from noisymlt.data.noise_models import DROP, KEEP, NOISE_MODULES, PAPER, noise_model


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


def transition_matrix(clean_Y: np.ndarray, gamma: float, model: str = PAPER, prepared: object = None
                      ) -> np.ndarray:
    """The model's definition as a matrix: T[i, j] = probability that a clean positive of class i ends as class j
    (column C: dropped), rows summing to 1 (noisymlt.data.noise_models, ``NoiseModel.transition``)."""
    gamma = _check_gamma(gamma)
    return noise_model(model).transition(_check_labels(clean_Y), gamma, prepared)


def inject_noise(clean_Y: np.ndarray, gamma: float, seed: int, model: str = PAPER, prepared: object = None
                 ) -> tuple[np.ndarray, dict]:
    """Noisy copy of ``clean_Y`` (n x C, 0/1) under a noise model, and what happened.

    The model draws, from ``numpy.random.default_rng(seed)``, the fate of every clean positive in row-major order
    (``NoiseModel.draw``: kept, dropped or replaced); the noisy label set of an image is the union of its kept labels
    and its replacements. ``prepared``: the model's inputs (``NoiseModel.prepare``: a matrix). ``info`` holds
    ``gamma``, ``seed``, ``model``, ``flipped`` (n x C bool: clean positives that left, replaced or dropped),
    ``replacement`` (n x C int: target class of a replaced positive, -1 elsewhere), ``transitions`` (C x C counts
    of i -> j replacements) and ``dropped`` (C counts of positives lost without replacement).
    """
    gamma = _check_gamma(gamma)
    seed = _check_seed(seed)
    Y = _check_labels(clean_Y)
    n, C = Y.shape
    chosen = noise_model(model)
    rows, cols = np.nonzero(Y)
    fate = chosen.draw(Y, rows, cols, gamma, np.random.default_rng(seed), prepared)
    if fate.shape != cols.shape or ((fate < DROP) | (fate >= C)).any():
        raise NoisyMLTError(f"noise model {model}: draw must give one outcome per clean positive, KEEP, DROP or a "
                            f"class in 0..{C - 1}")
    kept, gone = fate == KEEP, fate != KEEP
    moved = fate >= 0

    noisy = np.zeros_like(Y)
    noisy[rows[kept], cols[kept]] = 1
    noisy[rows[moved], fate[moved]] = 1
    # each clean positive leaves either itself or its replacement, so only a dropping model can empty an image
    assert not chosen.keeps_every_image_labelled or noisy.any(axis=1).all(), "an image lost all its labels"

    flipped = np.zeros((n, C), dtype=bool)
    flipped[rows[gone], cols[gone]] = True
    replacement = np.full((n, C), -1, dtype=np.int64)
    replacement[rows[moved], cols[moved]] = fate[moved]
    transitions = np.zeros((C, C), dtype=np.int64)
    np.add.at(transitions, (cols[moved], fate[moved]), 1)
    dropped = np.bincount(cols[fate == DROP], minlength=C).astype(np.int64)
    info = {"gamma": gamma, "seed": seed, "model": chosen.name, "flipped": flipped, "replacement": replacement,
            "transitions": transitions, "dropped": dropped}
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
    model: str = PAPER,
    dropped: np.ndarray | None = None,
) -> dict:
    """JSON-able summary of one noisy copy; rates with a zero denominator are ``None``.

    ``flip_rate`` counts replaced clean positives (what gamma controls); ``missing_rate`` counts
    clean positives absent from the noisy set (lower: a replacement from another label may
    restore one); ``wrong_fraction`` is the share of noisy positives that are not clean positives. Another model
    than the paper's adds its name, the positives it dropped and the labels per image, clean and noisy (the paper's
    model's files keep the bytes finished results were made from).
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
    stats = {
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
    if model != PAPER:
        drops = np.zeros(clean.shape[1], dtype=np.int64) if dropped is None else np.asarray(dropped)
        per_image = {"clean": clean.sum(axis=1), "noisy": noisy.sum(axis=1)}
        top = int(max(v.max() for v in per_image.values()))
        stats.update({
            "model": model,
            "dropped_positives": int(drops.sum()),
            "drop_rate": _rate(drops.sum(), clean_counts.sum()),
            "dropped_per_class": [int(v) for v in drops],
            "images_without_noisy_labels": int((per_image["noisy"] == 0).sum()),
            # images holding k labels, k = 0..max
            "labels_per_image": {k: np.bincount(v, minlength=top + 1).tolist() for k, v in per_image.items()},
        })
    return stats


def make_noisy_table(
    labels_path: str | Path, gamma: float, seed: int, out: str | Path, stats_out: str | Path | None = None,
    model: str = PAPER, options: dict | None = None,
) -> dict:
    """Read a clean label table, write its noisy copy (Parquet, clean_* columns alongside) and stats JSON.

    ``options``: the model's settings (params ``noise.MODEL``). The table's metadata names the model and its
    settings, unless it is the paper's (whose files keep their bytes)."""
    from noisymlt.data.labels import LabelTable, read_labels, write_labels

    labels_path, out = Path(labels_path), Path(out)
    stats_out = Path(stats_out) if stats_out else out.with_suffix(".json")
    if out.suffix.lower() != ".parquet":
        raise NoisyMLTError(f"{out}: --out must end in .parquet (a label table is written as Parquet)")
    check_outputs({"--labels": labels_path, "--option matrix": (options or {}).get("matrix")},
                  {"--out": out, "--stats": stats_out})
    gamma = _check_gamma(gamma, "--gamma")
    seed = _check_seed(seed, "--seed")
    chosen, options = noise_model(model), dict(options or {})
    unknown = sorted(set(options) - set(chosen.options))
    if unknown:
        raise NoisyMLTError(f"noise model {model}: unknown option(s) {', '.join(unknown)}; it reads "
                            f"{', '.join(chosen.options) or 'none'}")
    table = read_labels(labels_path)
    if table.clean is not None:
        raise NoisyMLTError(
            f"{labels_path}: already a noisy table (has clean_* columns); pass the clean labels"
        )
    _check_labels(table.labels, str(labels_path))  # so a refusal names the file
    prepared = chosen.prepare(options, list(table.classes), f"noise model {model}")
    noisy, info = inject_noise(table.labels, gamma, seed, model, prepared)
    if not noisy.any():  # a table of negatives only trains nothing
        raise NoisyMLTError(f"{labels_path}: noise model {chosen.name} at gamma {gamma} leaves no image with a "
                            "positive label; nothing written")
    stats = noise_stats(table.labels, noisy, table.classes, info["transitions"], gamma=gamma, seed=seed,
                        model=chosen.name, dropped=info["dropped"])
    stats["source"] = labels_path.name
    meta = {**table.meta, "gamma": gamma, "seed": seed, "noise_source": labels_path.name}
    if chosen.name != PAPER:
        meta["noise"] = {"model": chosen.name, **options}
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
    write_json(stats_out, stats)
    return stats


def _options(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise NoisyMLTError(f"--option {pair!r}: write KEY=VALUE (e.g. matrix=data/voc/transitions.csv)")
        out[key] = value
    return out


def _run(args: argparse.Namespace) -> int:
    stats = make_noisy_table(args.labels, args.gamma, args.seed, args.out, args.stats, args.model,
                             _options(args.option))
    print(
        f"{args.out}: {stats['num_images']} images, {args.model} noise, gamma {stats['gamma']}, seed {stats['seed']}: "
        f"flip rate {stats['flip_rate']:.3f}, {stats['wrong_fraction']:.3f} of noisy labels wrong, "
        f"{stats['classes_without_noisy_positives']} class(es) without noisy positives"
        + (f", drop rate {stats['drop_rate']:.3f}" if stats.get("dropped_positives") else "")
        + (f", {stats['images_without_noisy_labels']} image(s) left without any label"
           if stats.get("images_without_noisy_labels") else "")
    )
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "noise",
        help="inject label noise (the paper's co-occurrence model or another) into a clean training label table",
        description=(
            "Write a noisy copy of a clean multi-label table: each clean positive is kept with probability "
            "1-gamma, else the noise model replaces or drops it (default: the paper's, SPEC 2: a class drawn from "
            "its co-occurrence row; docs/noise-models.md defines the others). The output holds the noisy labels in "
            "the class columns and the clean ones in clean_* columns (analysis only). Deterministic for a given "
            "(labels, model, options, gamma, seed)."
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
    p.add_argument("--model", default=PAPER, choices=sorted(NOISE_MODULES),
                   help=f"noise model (default: {PAPER}, the paper's)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the model, e.g. matrix=FILE for class_conditional (repeatable)")
    p.add_argument(
        "--stats", type=Path, default=None, help="statistics JSON (default: OUT with .json suffix)"
    )
    p.set_defaults(func=_run)
