"""A ranking of a run's training labels by how likely each is wrong (``noisymlt suspects``): the form in which a
method hands its own scorers over (``Method.score_labels``) and in which the suspects step keeps every scorer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LabelScores:
    """Per (training image, class) entry: ``score`` (higher = more likely wrong) and ``flagged``, the scorer's own
    decision that the given label is wrong; ``reach``: the entries it can flag at all, None when every entry."""

    title: str  # its row in the detection table
    how: str  # the score and the flag in one line, for the record
    score: np.ndarray
    flagged: np.ndarray
    reach: np.ndarray | None = None
