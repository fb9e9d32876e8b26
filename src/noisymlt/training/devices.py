"""Which device a training job runs on: the slot locks, and the precision a device runs at.

Snakemake's ``--resources gpu=N`` only caps how many GPU jobs run at once; it never says which card a job gets.
Each card has ``runs_per_gpu`` slots, one lock file each (``gpu{idx}.slot{j}.lock``); a job takes a slot of the
least-loaded card and keeps it for its lifetime, so k concurrent jobs per card at most share one card, and jobs
spread over the cards before any card takes a second one. The locks are flock()s: a job that dies releases its
slot, whoever started it (Snakemake, DVC, a shell).

The train command chooses its card with these slots before the trainer starts (``noisymlt.training.cards``, which
also puts a SLURM allocation's slots in a folder of its own) and hands the trainer a concrete ``cuda:N``.
``select_device("auto")`` is the choice for a caller that builds a trainer itself: it takes the first card
whenever CUDA_VISIBLE_DEVICES is set, so several such jobs in one allocation would share it.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from noisymlt.core.locks import release, try_lock

log = logging.getLogger(__name__)

_held_locks: list = []  # keep lock files open for the life of the process


def lock_dir() -> Path:
    return Path(os.environ.get("NOISYMLT_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / "noisymlt-gpu-locks"))


def slot_path(directory: Path, idx: int, slot: int) -> Path:
    return directory / f"gpu{idx}.slot{slot}.lock"


def card_loads(num_gpus: int, slots: int, directory: Path) -> list[int]:
    """Slots held per card, probed by taking and releasing each free lock (a probe can only make a
    card look busier for an instant: it affects the balance, never the cap of ``slots`` per card)."""
    loads = []
    for idx in range(num_gpus):
        held = 0
        for j in range(slots):
            handle = try_lock(slot_path(directory, idx, j))
            if handle is None:
                held += 1
            else:
                release(handle)
        loads.append(held)
    return loads


def acquire_gpu(num_gpus: int, directory: Path | None = None, slots: int = 1) -> int | None:
    """Lock a free slot on the least-loaded card (lowest index among equals); None when every slot of
    every card is taken. The probe and the lock are separate steps, so a slot taken in between by
    another job is skipped and the next one tried: two jobs never hold the same slot."""
    if slots < 1:
        raise ValueError(f"runs per GPU must be at least 1, got {slots}")
    directory = directory or lock_dir()
    for _ in range(5):  # another job's probe can hold a free slot for an instant: look again while one shows free
        loads = card_loads(num_gpus, slots, directory)
        if min(loads, default=slots) >= slots:
            return None
        for idx in sorted(range(num_gpus), key=lambda i: (loads[i], i)):
            for j in range(slots):
                handle = try_lock(slot_path(directory, idx, j))
                if handle is not None:
                    _held_locks.append(handle)
                    return idx
    return None


def runs_per_gpu(given: int | None = None) -> int:
    """k, the training runs one card takes at once: ``given`` (the train step's --runs-per-gpu, which the
    workflow fills from the profile's resource), else $NOISYMLT_RUNS_PER_GPU (DVC, a shell), else 1."""
    if given is not None:
        value = given
    else:
        text = os.environ.get("NOISYMLT_RUNS_PER_GPU", "").strip() or "1"
        if not text.isdigit():
            raise ValueError(f"NOISYMLT_RUNS_PER_GPU={text!r}: expected a whole number >= 1")
        value = int(text)
    if value < 1:
        raise ValueError(f"runs per GPU must be at least 1, got {value}")
    return value


def select_device(requested: str = "auto", runs_per_card: int | None = None):
    """``auto``: a GPU when there is one (see module doc), else the CPU. ``cpu``/``cuda:N`` force."""
    import torch  # here, not at the top: the slot functions serve processes that never load torch

    if requested != "auto":
        return torch.device(requested)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        # The scheduler already restricted this job to its own card(s).
        return torch.device("cuda:0")
    slots = runs_per_gpu(runs_per_card)
    idx = acquire_gpu(torch.cuda.device_count(), slots=slots)
    if idx is None:
        log.warning("every slot of every GPU (%d per card) is locked by other noisymlt jobs; sharing cuda:0", slots)
        idx = 0
    return torch.device(f"cuda:{idx}")


def run_precision(train_cfg: dict, device) -> str:
    """The precision a model runs at on ``device``: ``train.precision`` on a GPU, ``train.cpu_precision`` on
    the CPU."""
    return train_cfg["precision"] if device.type == "cuda" else train_cfg.get("cpu_precision", "fp32")


def autocast(device, precision: str):
    """bf16 / fp16 autocast on a GPU; on the CPU bf16 or none (fp32, the default). CPU bf16 is deterministic for a
    given thread count and kernels (noisymlt.training.numerics), and fast only on a CPU with bf16 units (AMX,
    AVX-512 BF16): without them ATen's reference kernels run it several times slower than fp32."""
    import contextlib

    import torch

    if device.type == "cuda":
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()
