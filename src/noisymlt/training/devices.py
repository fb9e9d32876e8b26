"""Which device a training job runs on.

Snakemake's ``--resources gpu=N`` only caps how many GPU jobs run at once; it never says which
card a job gets, and neither does SLURM when several runs share one allocation (a packed group job
asks for ``--gpus=4`` and runs four trainings that each see the same four cards). So a job always
picks its own card among the cards it can see: each visible card has ``runs_per_gpu`` slots, one
lock file each (``gpu{card}.slot{j}.lock``, where ``card`` is the card's entry in
CUDA_VISIBLE_DEVICES, or its index when that is unset); a job takes a slot of the least-loaded card
and keeps it for its lifetime, so k concurrent jobs per card at most share one card, and jobs spread
over the cards before any card takes a second one. The locks are flock()s: a job that dies releases
its slot, whoever started it (Snakemake, DVC, a shell, a SLURM job step).

Inside a SLURM allocation the lock folder is private to the allocation and on the node itself
(``slurm-job<id>-<host>`` under /dev/shm): card "0" of one job is not card "0" of another when the
scheduler renumbers each job's cards, and a shared file system would make two nodes' card 0 collide.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path

from noisymlt.core.locks import release, try_lock

log = logging.getLogger(__name__)

_held_locks: list = []  # keep lock files open for the life of the process


NODE_LOCAL = Path("/dev/shm")  # tmpfs on every Linux node: never on a shared file system


def lock_dir() -> Path:
    """$NOISYMLT_GPU_LOCK_DIR when set; in a SLURM job a folder of that allocation on the node itself;
    else the system's temporary folder (a workstation: every job of the machine shares its cards)."""
    if given := os.environ.get("NOISYMLT_GPU_LOCK_DIR"):
        return Path(given)
    if job := os.environ.get("SLURM_JOB_ID", "").strip():
        base = NODE_LOCAL if NODE_LOCAL.is_dir() and os.access(NODE_LOCAL, os.W_OK) else Path(tempfile.gettempdir())
        return base / "noisymlt-gpu-locks" / f"slurm-job{job}-{socket.gethostname().split('.')[0]}"
    return Path(tempfile.gettempdir()) / "noisymlt-gpu-locks"


def visible_cards(count: int) -> list[str]:
    """A name for each of the ``count`` cards this process sees: its CUDA_VISIBLE_DEVICES entry (an index or a
    UUID, so that card 2 has one lock whether a job sees it as cuda:0 or cuda:2), else its index."""
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    return entries if len(entries) == count else [str(i) for i in range(count)]


def slot_path(directory: Path, card: int | str, slot: int) -> Path:
    return directory / f"gpu{card}.slot{slot}.lock"


def card_loads(cards: list[str], slots: int, directory: Path) -> list[int]:
    """Slots held per card, probed by taking and releasing each free lock (a probe can only make a
    card look busier for an instant: it affects the balance, never the cap of ``slots`` per card)."""
    loads = []
    for card in cards:
        held = 0
        for j in range(slots):
            handle = try_lock(slot_path(directory, card, j))
            if handle is None:
                held += 1
            else:
                release(handle)
        loads.append(held)
    return loads


def acquire_gpu(num_gpus: int, directory: Path | None = None, slots: int = 1,
                cards: list[str] | None = None) -> int | None:
    """Lock a free slot on the least-loaded card (lowest index among equals) and return the card's index;
    None when every slot of every card is taken. ``cards`` names the cards' lock files (default: their
    indices). The probe and the lock are separate steps, so a slot taken in between by another job is
    skipped and the next one tried: two jobs never hold the same slot."""
    if slots < 1:
        raise ValueError(f"runs per GPU must be at least 1, got {slots}")
    directory = directory or lock_dir()
    cards = cards or [str(i) for i in range(num_gpus)]
    for _ in range(5):  # another job's probe can hold a free slot for an instant: look again while one shows free
        loads = card_loads(cards, slots, directory)
        if min(loads, default=slots) >= slots:
            return None
        for idx in sorted(range(num_gpus), key=lambda i: (loads[i], i)):
            for j in range(slots):
                handle = try_lock(slot_path(directory, cards[idx], j))
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
    """``auto``: a slot on one of the GPUs this process sees (see module doc), else the CPU.
    ``cpu``/``cuda:N`` force."""
    import torch  # here, not at the top: the slot functions serve processes that never load torch

    if requested != "auto":
        return torch.device(requested)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    slots = runs_per_gpu(runs_per_card)
    count = torch.cuda.device_count()
    directory = lock_dir()
    idx = acquire_gpu(count, directory, slots=slots, cards=visible_cards(count))
    if idx is None:
        log.warning("every slot of the %d visible GPU(s) (%d per card) is locked by other noisymlt jobs (%s); "
                    "sharing cuda:0", count, slots, directory)
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
