"""Noise level of the targets a branch trains on, measured against the clean labels (analysis only).

The paper's Figs. "noise level during training" (VOC/COCO-MLT-Noise, gamma 0.5) show how much of what
each branch is told is wrong, before and after Co-Learning and Stitch-Up. A method that supports it
*publishes* the targets it has already computed for a step (``Method.take_published``): per branch, the
image indices (B, K), the stitched flags (B,), the noisy targets and the corrected targets of every view.
The trainer hands them to a ``NoiseMonitor``, the only object holding the clean labels. Nothing flows
back: the monitor returns nothing to the method, draws no random numbers and never touches a tensor the
loss uses, so training with or without it is bit-identical (tests/test_noise_level.py checks this).

Measures, per (iteration, branch, target kind), summed over the rows of that kind:

- ``noise_level`` = wrong positives / positives: of the target entries that are 1, the fraction whose
  clean label is 0 (the paper's "real noise rate of the training data"); null when there is no positive.
- ``missing_rate`` = missing positives / clean positives: of the clean positives, the fraction the
  targets leave at 0.

Target kinds: ``noisy`` (the anchors' raw noisy labels: no correction, no Stitch-Up), ``corrected`` (the
anchors' labels after Co-Learning, Eq. 3; only when pseudo labels are on), ``noisy_stitched`` and
``corrected_stitched`` (stitched rows only: the union over the anchor and its partners of their noisy /
corrected labels, the target of the stitched sample's positives; its truth is the union of their clean
labels, a class being present in a stitched input if any of its images shows it; only with Stitch-Up).
Counts are logged raw (also per class group), so pooling branches, iterations or seeds stays exact.
``corrected`` records also count what the pseudo labels changed in the anchors' targets (``CHANGES``):
labels added (0 -> 1) and removed (1 -> 0), and how many of each moved toward the clean label, so the
precision of Co-Learning's corrections is measured, not assumed.

The log (``noise_level.jsonl`` in the run folder) is appended once per epoch right before the checkpoint
is saved, and the checkpoint carries a copy of it: a resumed run rewrites the file from that copy (only
the epochs the checkpoint holds), so its log equals an uninterrupted run's. It holds no timestamps.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from noisymlt.data.labels import GROUPS, read_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.base import PublishedTargets
from noisymlt.core.files import write_text

log = logging.getLogger(__name__)

LOG_NAME = "noise_level.jsonl"
KINDS = ("noisy", "corrected", "noisy_stitched", "corrected_stitched")
STATS = ("wrong_positives", "positives", "missing_positives", "clean_positives")
SCOPES = ("total", *GROUPS)
CHANGES = ("added", "added_correct", "removed", "removed_correct")


def stat_columns() -> list[str]:
    """The count columns of a log record, in the order ``count_noise`` returns them."""
    return ["rows", *(s if scope == "total" else f"{s}_{scope}" for scope in SCOPES for s in STATS)]


def count_noise(targets: torch.Tensor, clean: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """int64 counts of ``targets`` vs ``clean`` (both (n, C) bool), laid out as ``stat_columns()``:
    the number of rows, then the STATS per scope; ``groups`` is the (C, len(SCOPES)) 0/1 float matrix
    of class membership (column 0: every class)."""
    per_class = torch.stack([(targets & ~clean).sum(0), targets.sum(0), (~targets & clean).sum(0), clean.sum(0)])
    # float64 matmul (CUDA has no int64 one); counts stay exact far beyond any batch
    scoped = (per_class.double() @ groups).T.reshape(-1).round().long()  # scope-major
    rows = torch.full((1,), targets.shape[0], dtype=torch.long, device=scoped.device)
    return torch.cat([rows, scoped])


def count_changes(noisy: torch.Tensor, corrected: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """int64 counts laid out as CHANGES of what ``corrected`` changed in ``noisy`` (all (n, C) bool):
    labels added and removed, and of those the ones that now agree with ``clean``."""
    added, removed = corrected & ~noisy, noisy & ~corrected
    return torch.stack([added.sum(), (added & clean).sum(), removed.sum(), (removed & ~clean).sum()])


def align_clean_labels(clean_path: Path, noisy_table, noisy_path: Path) -> np.ndarray:
    """The clean long-tail subset's labels in the row order of the noisy table (matched by image id).

    The two tables must hold the same images and classes; a noisy table that carries ``clean_*``
    columns must agree with the subset. Errors name both files.
    """
    clean = read_labels(clean_path)
    both = f"{clean_path} (clean labels) vs {noisy_path} (noisy labels)"
    if clean.classes != noisy_table.classes:
        raise NoisyMLTError(f"{both}: class columns differ")
    where = {image_id: i for i, image_id in enumerate(clean.image_ids)}
    missing = [i for i in noisy_table.image_ids if i not in where]
    if missing or len(clean) != len(noisy_table):
        raise NoisyMLTError(f"{both}: the tables hold different images ({len(clean)} vs {len(noisy_table)} rows; "
                            f"e.g. {missing[:3]} only in the noisy table)")
    labels = clean.labels[[where[i] for i in noisy_table.image_ids]]
    if noisy_table.clean is not None and not np.array_equal(labels, noisy_table.clean):
        raise NoisyMLTError(f"{both}: the clean labels disagree with the noisy table's clean_* columns")
    return labels


class NoiseMonitor:
    """Counts, per iteration, the noise of the targets each branch trained on, and writes the log."""

    def __init__(self, clean: np.ndarray, split: dict[str, list[int]], device: torch.device, iterations: int):
        self._clean = torch.as_tensor(np.asarray(clean) > 0, device=device)  # (N, C) bool, read here only
        groups = torch.zeros(self._clean.shape[1], len(SCOPES), dtype=torch.float64)
        groups[:, 0] = 1
        for j, group in enumerate(GROUPS, start=1):
            groups[split.get(group, []), j] = 1
        self._groups = groups.to(device)
        self.iterations = iterations
        self._pending: list[tuple[int, int, str, str, torch.Tensor]] = []
        self.lines: list[str] = []  # the log written so far
        self.path: Path | None = None

    @classmethod
    def from_files(cls, clean_path: Path, noisy_table, noisy_path: Path, split: dict, device: torch.device,
                   iterations: int) -> "NoiseMonitor":
        return cls(align_clean_labels(Path(clean_path), noisy_table, Path(noisy_path)), split, device, iterations)

    # ------------------------------------------------------------------ counting
    def measure(self, record: PublishedTargets) -> dict[str, torch.Tensor]:
        """Counts per target kind for one published record (kinds that do not apply are left out)."""
        B, K = record.index.shape
        clean = self._clean[record.index]  # (B, K, C)
        views = {"noisy": record.noisy}
        if record.corrected is not None:
            views["corrected"] = record.corrected
        out = {}
        for kind, targets in views.items():
            t = (targets.detach() > 0.5).reshape(B, K, -1)
            out[kind] = count_noise(t[:, 0], clean[:, 0], self._groups)
            if kind == "corrected":
                noisy = (record.noisy.detach() > 0.5).reshape(B, K, -1)[:, 0]
                out[kind] = torch.cat([out[kind], count_changes(noisy, t[:, 0], clean[:, 0])])
            if K > 1:
                rows = record.stitched.to(t.device).bool()
                out[f"{kind}_stitched"] = count_noise(t[rows].any(1), clean[rows].any(1), self._groups)
        return out

    def observe(self, epoch: int, iteration: int, records: list[PublishedTargets]) -> None:
        """Keep one step's counts (on the device: no synchronisation per step)."""
        for record in records:
            for kind, counts in self.measure(record).items():
                self._pending.append((epoch, iteration, record.branch, kind, counts))

    # ------------------------------------------------------------------ the log
    def start(self, path: Path, epochs_done: int, saved: str | None = None) -> None:
        """Open the log of a run that resumes after ``epochs_done`` epochs. ``saved`` is the log as the
        checkpoint holds it (the source of truth: Snakemake deletes a job's declared outputs before it
        reruns, the checkpoint survives); without it, the records the file holds for those epochs."""
        self.path = Path(path)
        self._pending = []
        if saved is not None:
            lines = saved.splitlines()
        else:  # a cut-off last line (killed mid-append) is dropped with a warning
            from noisymlt.core.jsonlog import read_records

            lines = [json.dumps(r) for r in read_records(self.path)]
        self.lines = [line for line in lines if json.loads(line)["epoch"] <= epochs_done]
        if epochs_done and saved is None:
            log.warning("%s: the checkpoint carries no noise log (trained without --clean-labels); the log may "
                        "lack the %d epoch(s) before this resume", self.path, epochs_done)
        write_text(self.path, "".join(line + "\n" for line in self.lines))

    def records(self) -> list[dict]:
        """The pending counts as log records (epoch 1-based as in train_log.jsonl, iteration 0-based)."""
        if not self._pending:
            return []
        # one transfer for the epoch; rows differ in length (corrected ones carry CHANGES)
        flat = torch.cat([p[4] for p in self._pending]).cpu().numpy()
        ends = np.cumsum([len(p[4]) for p in self._pending])
        out = []
        for (epoch, it, branch, kind, _), row in zip(self._pending, np.split(flat, ends[:-1])):
            columns = stat_columns() + (list(CHANGES) if kind == "corrected" else [])
            record = {"epoch": epoch + 1, "iteration": it, "step": epoch * self.iterations + it, "branch": branch,
                      "targets": kind, **{k: int(v) for k, v in zip(columns, row)}}
            record["noise_level"] = _rate(record["wrong_positives"], record["positives"])
            record["missing_rate"] = _rate(record["missing_positives"], record["clean_positives"])
            out.append(record)
        return out

    def append_epoch(self) -> None:
        """Append the epoch's records to the log (the trainer calls this right before the checkpoint,
        which then carries the whole log: ``snapshot``)."""
        if self.path is None:
            raise RuntimeError("NoiseMonitor.start() was not called")
        new = [json.dumps(record) for record in self.records()]
        with open(self.path, "a") as f:
            f.writelines(line + "\n" for line in new)
        self.lines += new
        self._pending = []

    def snapshot(self) -> str:
        return "".join(line + "\n" for line in self.lines)


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 6) if den else None
