"""How far a run fitted what it was taught (analysis only: nothing here steers training).

A comparison of methods means something only in a regime where the models learn: their training labels
are fitted beyond what the class priors alone give, every run reaches its learning rate, and the
mechanisms under test act. The trainer computes these measures once, after training, and records them in
the run's manifest (``fit``); ``noisymlt aggregate`` carries them into results.parquet (metrics
``fit_*``) and the report shows them per method (``noisymlt fit-table``).

- ``prior_bce``: mean BCE of the run's own (noisy) training labels against a model that predicts each
  class's frequency in those labels, whatever the image: the loss a model reaches without seeing images.
- per prediction head, on the training images with the test transform (no augmentation):
  ``train_bce`` against the noisy labels (below ``prior_bce`` once the images are used) and
  ``train_map``, the mAP against the noisy labels (how far the model fits what it is told);
  ``test_score_p05`` / ``p50`` / ``p95``: the spread of the sigmoid outputs on the test set (outputs that
  sit near 0.5 mean nothing was fitted, and pseudo-label thresholds such as 0.7 / 0.1 never fire).
- ``final_loss``: the method's own objective, mean over its last epoch.
- ``lr_nominal`` and ``lr_peak``: the schedule's learning rate and the highest rate the run reached
  (a warm-up longer than the run never reaches it); ``warmup_share``: warm-up iterations / all iterations.
- ``pseudo_labels`` (co-learning family, from the noise log): per epoch and branch, the labels the pseudo
  labels added and removed in the anchors' targets, and the share of those changes that moved toward the
  clean label (``precision``).
"""

from __future__ import annotations

import json

import numpy as np

EPS = 1e-7
QUANTILES = {"test_score_p05": 0.05, "test_score_p50": 0.5, "test_score_p95": 0.95}


def bce(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy over every (image, class) entry, probabilities clipped to [EPS, 1 - EPS]."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), EPS, 1 - EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def prior_bce(labels: np.ndarray) -> float:
    """BCE of the labels against each class's own frequency in them (the best image-blind model)."""
    y = np.asarray(labels, dtype=np.float64)
    return bce(y, np.broadcast_to(y.mean(0), y.shape))


def noisy_map(labels: np.ndarray, scores: np.ndarray) -> float:
    """mAP against the given labels over the classes that have a positive among them."""
    from noisymlt.evaluation.metrics import average_precisions

    return float(np.nanmean(average_precisions(np.asarray(labels) > 0.5, scores)))


def lr_profile(train_cfg: dict, rates: list[float]) -> dict:
    """The schedule's nominal rate, the highest of the run's per-iteration ``rates``, and the warm-up's
    share of the run."""
    total = len(rates)
    return {"lr_nominal": float(train_cfg["lr"]), "lr_peak": float(max(rates)),
            "warmup_share": round(min(train_cfg["warmup_iters"], total) / total, 4)}


def pseudo_label_changes(noise_log: str) -> list[dict]:
    """Per (epoch, branch): labels added / removed by the pseudo labels and how many moved toward the
    clean label, summed over the iterations of the noise log's ``corrected`` records."""
    sums: dict[tuple[int, str], dict] = {}
    for line in filter(None, noise_log.splitlines()):
        rec = json.loads(line)
        if rec.get("targets") != "corrected" or "added" not in rec:
            continue
        acc = sums.setdefault((rec["epoch"], rec["branch"]), dict.fromkeys(
            ("anchors", "added", "added_correct", "removed", "removed_correct"), 0))
        acc["anchors"] += rec["rows"]
        for key in ("added", "added_correct", "removed", "removed_correct"):
            acc[key] += rec[key]
    out = []
    for (epoch, branch), acc in sorted(sums.items()):
        changed = acc["added"] + acc["removed"]
        correct = acc["added_correct"] + acc["removed_correct"]
        out.append({"epoch": epoch, "branch": branch, **acc, "changed": changed,
                    "precision": round(correct / changed, 6) if changed else None})
    return out


def diagnose(*, train_cfg: dict, lr_rates: list[float], history: list[dict], noisy: np.ndarray,
             train_scores: dict[str, np.ndarray], test_scores: dict[str, np.ndarray],
             noise_log: str | None = None) -> dict:
    """The fit record of one finished run (see the module docstring)."""
    heads = {}
    for head, scores in train_scores.items():
        heads[head] = {"train_bce": round(bce(noisy, scores), 6), "train_map": round(noisy_map(noisy, scores), 6),
                       **{k: round(float(np.quantile(test_scores[head], q)), 6) for k, q in QUANTILES.items()}}
    last = history[-1] if history else {}
    return {"prior_bce": round(prior_bce(noisy), 6),
            "final_loss": round(float(last["loss"]), 6) if "loss" in last else None,
            **lr_profile(train_cfg, lr_rates),
            "heads": heads,
            "pseudo_labels": pseudo_label_changes(noise_log) if noise_log else []}
