"""A seeded, stratified multi-label split: one rule for every place that holds images out.

Model selection holds out validation images from the noisy training labels (noisymlt.pipeline.selection) and a
user's own image folder draws its test part (noisymlt.data.folder); both want every class that can be split on
both sides, deterministically for a seed. It lives in the data layer so that both can import it. Cross-fitting
(noisymlt.pipeline.crossfit) cuts the noisy training labels into K folds with the same rule (iterative_folds).
"""

from __future__ import annotations

import numpy as np


def stratified_split(label_sets: list[np.ndarray], fraction: float, seed: int) -> tuple[np.ndarray, list[list[int]]]:
    """(boolean mask of validation rows, per set the classes it could not split). Per (set, class), rarest first,
    round(fraction x positives) rows (at least one) go to validation unless already there, so that every class
    with two or more noisy positives keeps some on both sides; a class with fewer cannot be split, and its AP is
    undefined on one side (left out of the validation mean, as evaluation leaves out a class without test
    positives). Deterministic for a seed; the same rows for every set (one split per dataset)."""
    rng = np.random.default_rng(seed)
    val = np.zeros(len(label_sets[0]), bool)
    unsplit: list[list[int]] = [[] for _ in label_sets]
    order = sorted(((int(y[:, c].sum()), s, c) for s, y in enumerate(label_sets) for c in range(y.shape[1])))
    for count, s, c in order:
        if count < 2:
            unsplit[s].append(c)
            continue
        pos = np.flatnonzero(label_sets[s][:, c])
        want = max(1, round(fraction * count)) - int(val[pos].sum())
        if want > 0:
            val[rng.permutation(pos[~val[pos]])[:want]] = True
        if val[pos].all():  # earlier, rarer classes took every positive: give one back to the fit side
            val[rng.choice(pos)] = False
    for s, y in enumerate(label_sets):
        for c in set(range(y.shape[1])) - set(unsplit[s]):
            if not (y[~val, c].any() and y[val, c].any()):
                unsplit[s].append(c)
    return val, [sorted(u) for u in unsplit]


def iterative_stratification(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the held-out rows: ``iterative_folds`` with two subsets, the held-out one ``fraction`` of the
    rows. Each class's held-out share comes out near ``fraction``, where the top-up rule of ``stratified_split``
    (which only guarantees both sides) overshoots on rare classes."""
    return iterative_folds(labels, [fraction, 1.0 - fraction], seed) == 0


def iterative_folds(labels: np.ndarray, shares: list[float], seed: int) -> np.ndarray:
    """The subset of every row (0 .. len(shares) - 1): Sechidis, Tsoumakas and Vlahavas' iterative stratification
    (ECML PKDD 2011), subset k taking ``shares[k]`` of the rows. The rarest label still unassigned goes first: each
    of its rows goes to the subset that most lacks that label (then the one that most lacks rows, then a seeded
    coin), and every label of the row counts against that subset's wants; rows without a label fill whichever
    subset lacks rows most (the first on a tie). Each class's share in each subset comes out near the subset's
    share. Deterministic for a seed."""
    labels = np.asarray(labels, dtype=bool)
    n, classes = labels.shape
    rng = np.random.default_rng(seed)
    share = np.asarray(shares, dtype=float)
    wants_rows = share * n
    wants = share[:, None] * labels.sum(0)[None, :].astype(float)
    subset = np.full(n, -1, dtype=np.int64)
    left = np.ones(n, bool)
    while True:
        counts = np.where(labels[left].any(0), labels[left].sum(0), n + 1)
        if counts.min() > n:
            break
        rarest = np.flatnonzero(counts == counts.min())
        c = rarest[rng.integers(len(rarest))]
        for i in rng.permutation(np.flatnonzero(left & labels[:, c])):
            best = np.flatnonzero(wants[:, c] == wants[:, c].max())
            if len(best) > 1:
                best = best[wants_rows[best] == wants_rows[best].max()]
            s = best[rng.integers(len(best))]
            subset[i] = s
            wants[s, labels[i]] -= 1
            wants_rows[s] -= 1
            left[i] = False
    for i in rng.permutation(np.flatnonzero(left)):  # rows without a label
        s = int(np.argmax(wants_rows))
        subset[i] = s
        wants_rows[s] -= 1
    return subset
