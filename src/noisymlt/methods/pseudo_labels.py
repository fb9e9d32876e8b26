"""Heterogeneous Co-Learning pseudo labels (paper Sec. 3.3, Eq. 3; SPEC 3).

Each branch's training labels are corrected by its peer's sigmoid outputs q on the same views:
a label becomes 1 where q > alpha, 0 where q < beta, and stays noisy otherwise. Thresholds are
set per class group (head/medium/tail) and per *source* branch, the branch whose predictions do
the correcting; a group without a threshold is off (alpha = 1 never fires since q <= 1, beta = 0
never fires since q >= 0). No torch import at module level: tensors and arrays are both accepted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from noisymlt.data.labels import GROUPS
from noisymlt.errors import NoisyMLTError

if TYPE_CHECKING:
    import torch

ALPHA_OFF = 1.0
BETA_OFF = 0.0

# [CL]'s published thresholds are the dataset kinds' (noisymlt.data.kinds: thresholds).


def reference_thresholds(cfg: Mapping) -> dict:
    """The per-branch threshold block a resolved run config stands for: its method's pseudo.thresholds, else
    its dataset's ``colearning.thresholds``, else its kind's (noisymlt.data.kinds: [CL]'s published values for VOC and
    COCO; the toy and a user's folder take VOC's)."""
    from noisymlt.methods.options import THRESHOLDS_SCHEMA
    from noisymlt.core.schema import check_schema

    given = ((cfg.get("method_cfg") or {}).get("pseudo") or {}).get("thresholds")
    if given is None:
        where = f"datasets.{cfg.get('dataset', '?')}.colearning"
        block = cfg.get("colearning") or {}
        unknown = sorted(set(block) - {"thresholds"})
        if unknown:
            raise NoisyMLTError(f"{where}: unknown key(s) {unknown}; accepted: ['thresholds']")
        given = block.get("thresholds")
        if given is not None:
            check_schema(given, THRESHOLDS_SCHEMA, f"{where}.thresholds")
    if given is None:
        from noisymlt.data.kinds import dataset_kind

        given = dataset_kind(cfg).thresholds
        if given is None:
            raise NoisyMLTError(f"datasets.{cfg.get('dataset', '?')}.colearning.thresholds: kind {cfg['kind']} has no "
                                "published thresholds; set them there")
    return given


def _threshold(value: object, key: str, lo: float, hi: float, lo_open: bool, hi_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise NoisyMLTError(f"co-learning {key}: must be a number, got {value!r}")
    v = float(value)
    bad = math.isnan(v) or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi)
    if bad:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise NoisyMLTError(f"co-learning {key}: must lie in {interval}, got {value!r}")
    return v


def group_thresholds(
    split: Mapping[str, Sequence[int]],
    num_classes: int,
    alpha: Mapping[str, float | None] | None = None,
    beta: Mapping[str, float | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-class (alpha_vec, beta_vec), float64 of shape (num_classes,), from per-group values.

    ``split`` maps head/medium/tail to class indices and must cover every class exactly once.
    A group missing from ``alpha``/``beta`` or set to None is off. alpha must lie in (0, 1],
    beta in [0, 1), and beta <= alpha within a group (else a label could be both set and cleared).
    """
    unknown = [g for g in split if g not in GROUPS]
    if unknown:
        raise NoisyMLTError(f"class split: unknown group {unknown[0]!r} (expected {', '.join(GROUPS)})")
    owner = np.full(num_classes, -1, dtype=np.int64)
    for gi, group in enumerate(GROUPS):
        for c in split.get(group, ()):
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < num_classes:
                raise NoisyMLTError(f"class split[{group!r}]: class index {c!r} outside [0, {num_classes})")
            if owner[c] >= 0:
                raise NoisyMLTError(
                    f"class split[{group!r}]: class {int(c)} is also in group {GROUPS[owner[c]]!r}"
                )
            owner[c] = gi
    missing = np.flatnonzero(owner < 0)
    if missing.size:
        raise NoisyMLTError(f"class split: classes {missing.tolist()} belong to no group")

    alpha_vec = np.full(num_classes, ALPHA_OFF)
    beta_vec = np.full(num_classes, BETA_OFF)
    for name, values in (("alpha", alpha or {}), ("beta", beta or {})):
        for group in values:
            if group not in GROUPS:
                raise NoisyMLTError(
                    f"co-learning {name}: unknown group {group!r} (expected {', '.join(GROUPS)})"
                )
    for gi, group in enumerate(GROUPS):
        a = (alpha or {}).get(group)
        b = (beta or {}).get(group)
        a = ALPHA_OFF if a is None else _threshold(a, f"alpha[{group!r}]", 0.0, 1.0, True, False)
        b = BETA_OFF if b is None else _threshold(b, f"beta[{group!r}]", 0.0, 1.0, False, True)
        if b > a:
            raise NoisyMLTError(f"co-learning beta[{group!r}] = {b:g} exceeds alpha[{group!r}] = {a:g}")
        alpha_vec[owner == gi] = a
        beta_vec[owner == gi] = b
    return alpha_vec, beta_vec


def pseudo_labels(
    noisy_targets: np.ndarray | torch.Tensor,
    peer_probs: np.ndarray | torch.Tensor,
    alpha_vec: np.ndarray,
    beta_vec: np.ndarray,
) -> np.ndarray | torch.Tensor:
    """Eq. 3: 1 where q > alpha, 0 where q < beta, the noisy label otherwise (strict inequalities).

    ``noisy_targets`` and ``peer_probs`` are (B, C) torch tensors or numpy arrays (same kind);
    the result has the type, dtype and device of ``noisy_targets``. Since beta <= alpha, the two
    rules never both fire on one entry.
    """
    if tuple(noisy_targets.shape) != tuple(peer_probs.shape):
        raise ValueError(
            f"pseudo_labels: targets {tuple(noisy_targets.shape)} vs probs {tuple(peer_probs.shape)}"
        )
    num_classes = noisy_targets.shape[-1]
    alpha_np = np.asarray(alpha_vec, dtype=np.float64)
    beta_np = np.asarray(beta_vec, dtype=np.float64)
    if alpha_np.shape != (num_classes,) or beta_np.shape != (num_classes,):
        raise ValueError(
            f"pseudo_labels: thresholds must have shape ({num_classes},), "
            f"got {alpha_np.shape} and {beta_np.shape}"
        )
    if isinstance(noisy_targets, np.ndarray):
        q = np.asarray(peer_probs)
        out = np.where(q > alpha_np, 1, noisy_targets)
        return np.where(q < beta_np, 0, out).astype(noisy_targets.dtype)

    import torch

    # compare in at least float32 so a half-precision q does not move the thresholds (0.7 -> 0.6997)
    dtype = torch.promote_types(peer_probs.dtype, torch.float32)
    q = peer_probs.detach().to(dtype)
    alpha_t = torch.as_tensor(alpha_np, dtype=dtype, device=q.device)
    beta_t = torch.as_tensor(beta_np, dtype=dtype, device=q.device)
    one = torch.ones_like(noisy_targets)
    out = torch.where(q > alpha_t, one, noisy_targets)
    return torch.where(q < beta_t, torch.zeros_like(noisy_targets), out)


def pseudo_label_scores(noisy: np.ndarray, corrections: list[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """The rule as a ranking of the given labels (numpy): ``corrections`` holds (source probabilities q, alpha,
    beta) of each trained branch, alpha and beta per class. Score: the larger margin past the threshold over the
    branches' corrections, ``q - alpha`` for a given 0 and ``beta - q`` for a given 1; flagged where some branch's
    correction (``pseudo_labels``) changes the label, which is where that margin is positive."""
    margins = [np.where(noisy > 0.5, beta[None, :] - q, q - alpha[None, :]) for q, alpha, beta in corrections]
    flagged = np.any([pseudo_labels(noisy, q, alpha, beta) != noisy for q, alpha, beta in corrections], axis=0)
    return np.max(margins, axis=0), flagged


def pseudo_label_reach(noisy: np.ndarray, corrections: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """The entries the rule can change at all: a given 0 in a class where some branch's alpha is on (below 1: q can
    pass it), a given 1 where some branch's beta is on (above 0). [CL]'s thresholds turn on alpha for head classes
    and beta for tail ones, so the rest of the wrong labels lie beyond its reach."""
    can_set = np.any([alpha < ALPHA_OFF for _, alpha, _ in corrections], axis=0)
    can_clear = np.any([beta > BETA_OFF for _, _, beta in corrections], axis=0)
    return np.where(noisy > 0.5, can_clear[None, :], can_set[None, :])


def correction_stats(
    noisy: np.ndarray | torch.Tensor,
    corrected: np.ndarray | torch.Tensor,
    clean: np.ndarray | torch.Tensor,
) -> dict[str, int]:
    """How pseudo labelling changed the labels and how often it was right (analysis logging).

    Keys: ``added`` (0 -> 1 flips), ``added_correct`` (of those, clean label 1), ``removed``
    (1 -> 0 flips), ``removed_correct`` (of those, clean label 0), ``entries``.
    """
    arrays = []
    for name, x in (("noisy", noisy), ("corrected", corrected), ("clean", clean)):
        x = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
        arrays.append(x > 0.5)
        if x.shape != arrays[0].shape:
            raise ValueError(f"correction_stats: {name} has shape {x.shape}, expected {arrays[0].shape}")
    before, after, truth = arrays
    added = ~before & after
    removed = before & ~after
    return {
        "added": int(added.sum()),
        "added_correct": int((added & truth).sum()),
        "removed": int(removed.sum()),
        "removed_correct": int((removed & ~truth).sum()),
        "entries": int(before.size),
    }
