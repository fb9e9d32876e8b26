"""A seeded, stratified multi-label split: one rule for every place that holds images out.

Model selection holds out validation images from the noisy training labels (noisymlt.pipeline.selection) and a
user's own image folder draws its test part (noisymlt.data.folder); both want every class that can be split on
both sides, deterministically for a seed. It lives in the data layer so that both can import it.
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
