"""A run folder's checkpoint and its files: saved with a content hash, read back checked, set aside.

A checkpoint records the run id (the resolved configuration), the inputs digest and the code digest of the
run that saved it. ``foreign`` says why a checkpoint is not the job's own; the trainer then refuses it or, in
the workflow, moves the run's files to ``previous/<run id>-<inputs>-<code>/`` (``archive_run``), from where a
run of exactly that configuration, inputs and code is brought back later (``bring_back``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)

RUN_FILES = ("checkpoint.pt", "train_log.jsonl", "noise_level.jsonl", "predictions.npz", "manifest.json",
             "run_config.json", "metrics.json", "map.json", "metrics.manifest.json", "manifest.timing.json",
             "metrics.manifest.timing.json")


class Damaged(NoisyMLTError):
    """A checkpoint that cannot be read or whose content does not match its hash."""


def content_sha256(state: dict) -> str:
    """sha256 of a checkpoint's content: tensors by dtype, shape and bytes, other values by repr, keys in
    order. The same for the state saved and the state loaded back, on any device, so a damaged file (one
    flipped byte in a weight) is told from a good one before a run resumes from it."""
    import torch

    h = hashlib.sha256()

    def walk(obj) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous().reshape(-1)
            h.update(f"tensor {t.dtype} {tuple(obj.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, dict):
            h.update(b"{")
            for key in sorted(obj, key=repr):
                h.update(repr(key).encode())
                walk(obj[key])
            h.update(b"}")
        elif isinstance(obj, (list, tuple)):
            h.update(b"[")
            for value in obj:
                walk(value)
            h.update(b"]")
        else:
            h.update(repr(obj).encode())

    walk(state)
    return h.hexdigest()


# Snakemake and DVC delete a train job's declared outputs before they rerun it, so by the time the trainer
# sets a finished run aside its predictions and manifest are gone. A second link to each, made when the run
# finishes, keeps them for archive_run (the same bytes, no copy).
FINISHED = ".finished"
FINISHED_FILES = ("predictions.npz", "manifest.json", "run_config.json", "noise_level.jsonl")


def keep_finished(out: Path) -> None:
    """Link a finished run's outputs into OUT/.finished/, replacing the links of an earlier run."""
    import shutil

    kept = Path(out) / FINISHED
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir()
    for name in FINISHED_FILES:
        if (Path(out) / name).exists():
            try:
                os.link(Path(out) / name, kept / name)
            except OSError:  # a file system without hard links
                shutil.copy2(Path(out) / name, kept / name)


def archive_run(out: Path, tag: str) -> Path:
    """Move a run folder's files to OUT/previous/TAG/ (nothing is deleted) and return that folder. Outputs
    that Snakemake or DVC deleted before rerunning the job come from OUT/.finished/ (keep_finished)."""
    import shutil

    aside = Path(out) / "previous" / tag
    aside.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        for source in (Path(out) / name, Path(out) / FINISHED / name):
            if source.exists():
                source.replace(aside / name)
                break
    shutil.rmtree(Path(out) / FINISHED, ignore_errors=True)
    return aside


def save(path: Path, state: dict) -> str:
    """Write ``state`` with its content hash to ``path`` (the last complete checkpoint stays in place until
    the new one is whole) and return the hash."""
    import torch

    from noisymlt.core.files import replacing

    state["content_sha256"] = digest = content_sha256(state)
    with replacing(path) as tmp:  # torch reports a full disk as a RuntimeError ("unexpected pos")
        torch.save(state, tmp)
    return digest


def read_checked(path: Path, device) -> tuple[dict, str | None]:
    """The state saved in ``path`` and its recorded content hash (None for an older version's checkpoint,
    which cannot be checked); ``Damaged`` when it cannot be read or its content does not match the hash."""
    import torch

    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 (any failure to read it means it is damaged)
        raise Damaged(f"unreadable ({str(exc).splitlines()[0][:200]})") from exc
    recorded = state.pop("content_sha256", None)
    if recorded is None:
        log.warning("%s has no content hash (written by an older version): it cannot be checked", path)
    elif content_sha256(state) != recorded:
        raise Damaged("its content does not match the content hash it was saved with")
    return state, recorded


def foreign(state: dict, *, run_id: str, inputs: str, code: str) -> str | None:
    """Why a loaded checkpoint is not this run's (None when it is): another configuration, other inputs
    or other code."""
    if state.get("run_id") != run_id:
        return (f"checkpoint belongs to run {state.get('run_id')}, not {run_id} "
                "(the configuration changed)")
    if state.get("inputs") != inputs:
        return ("checkpoint was trained on other inputs (train labels, class split, decoded training images or "
                "backbone weights changed)")
    if state.get("code") != code:
        return (f"checkpoint was trained by other code ({state.get('code') or 'not recorded: an older version'}"
                f", this job runs {code})")
    return None


def tag_of(state: dict) -> str:
    """The previous/ folder name of a checkpoint's run: its run id, inputs and code."""
    return "-".join(str(state.get(k) or "unknown")[:n] for k, n in (("run_id", 64), ("inputs", 8), ("code", 8)))


def bring_back(out: Path, tag: str) -> bool:
    """Move the checkpoint and epoch logs kept in OUT/previous/TAG/ back into OUT (False when none is kept)."""
    kept = Path(out) / "previous" / tag / "checkpoint.pt"
    if not kept.exists():
        return False
    kept.replace(Path(out) / "checkpoint.pt")
    for name in ("train_log.jsonl", "noise_level.jsonl"):
        if kept.with_name(name).exists():
            kept.with_name(name).replace(Path(out) / name)
    log.warning("reusing the checkpoint of this configuration kept in %s", kept.parent)
    return True


def log_restart(out: Path, reason: str, aside: Path) -> None:
    """The first line of the new epoch log: why the run starts over and where the old one went."""
    from noisymlt.core.jsonlog import write_records

    write_records(Path(out) / "train_log.jsonl", [{"event": "restart", "reason": reason, "previous_run": str(aside)}])
