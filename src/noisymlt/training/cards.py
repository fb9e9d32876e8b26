"""Which GPU a training job takes: the train command chooses its card before it builds the trainer.

A job sees the cards in CUDA_VISIBLE_DEVICES (or every card of the machine) and takes a slot on the least-loaded
one (``noisymlt.training.devices.acquire_gpu``: ``runs_per_gpu`` flock slots a card, held for the job's lifetime).
That holds wherever the job runs, a SLURM allocation included: a packed group job asks for ``--gpus=4`` and runs
its four trainings in one job step, each seeing all four cards, and each takes its own.

Where the slot files live decides who shares a card:
- inside a SLURM job, a folder of that allocation on the node itself (under /dev/shm): SLURM may number every
  job's cards from 0, and on a shared file system two nodes' card 0 would share a lock;
- elsewhere, the machine's folder (``devices.lock_dir``), one subfolder per CUDA_VISIBLE_DEVICES value when that is
  set, since card indices are then that set's.

The command hands the trainer the device it chose: ``cuda:N``, or ``cpu`` where no GPU is visible.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
from pathlib import Path

from noisymlt.training.devices import acquire_gpu, lock_dir, runs_per_gpu

log = logging.getLogger(__name__)

NODE_LOCAL = Path("/dev/shm")  # tmpfs on every Linux node: never on a shared file system


def slot_folder() -> Path:
    """$NOISYMLT_GPU_LOCK_DIR when set; in a SLURM job, the allocation's own folder on the node; else the
    machine's, per CUDA_VISIBLE_DEVICES value."""
    if os.environ.get("NOISYMLT_GPU_LOCK_DIR"):
        return lock_dir()
    if job := os.environ.get("SLURM_JOB_ID", "").strip():
        base = NODE_LOCAL if NODE_LOCAL.is_dir() and os.access(NODE_LOCAL, os.W_OK) else Path(tempfile.gettempdir())
        return base / "noisymlt-gpu-locks" / f"slurm-job{job}-{socket.gethostname().split('.')[0]}"
    if visible := os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        return lock_dir() / ("visible-" + re.sub(r"[^A-Za-z0-9,-]", "_", visible))
    return lock_dir()


def choose_device(requested: str = "auto", runs_per_card: int | None = None) -> str:
    """``auto``: a slot on one of the GPUs this process sees (``cuda:N``), else ``cpu``. Anything else is returned
    as given (``cpu``, ``cuda:N``)."""
    if requested != "auto":
        return requested
    import torch  # here: the command's --help must not wait for it

    if not torch.cuda.is_available():
        return "cpu"
    slots = runs_per_gpu(runs_per_card)
    folder = slot_folder()
    idx = acquire_gpu(torch.cuda.device_count(), folder, slots=slots)
    if idx is None:
        log.warning("every slot of the %d visible GPU(s) (%d per card) is held by other noisymlt jobs (%s); "
                    "sharing cuda:0", torch.cuda.device_count(), slots, folder)
        idx = 0
    return f"cuda:{idx}"
