"""Which device a training job runs on.

Snakemake's ``--resources gpu=N`` only caps how many GPU jobs run at once; it never says which
card a job gets. SLURM does (it sets CUDA_VISIBLE_DEVICES), so that is honoured first. Otherwise
the job takes an exclusive lock file per GPU and keeps it for its lifetime, so two concurrent jobs
land on two different cards.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import torch

from noisymlt.core.locks import try_lock

log = logging.getLogger(__name__)

_held_locks: list = []  # keep lock files open for the life of the process


def lock_dir() -> Path:
    return Path(os.environ.get("NOISYMLT_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / "noisymlt-gpu-locks"))


def acquire_gpu(num_gpus: int, directory: Path | None = None) -> int | None:
    """Lock the first free GPU index; None when all are taken."""
    directory = directory or lock_dir()
    for idx in range(num_gpus):
        handle = try_lock(directory / f"gpu{idx}.lock")
        if handle is not None:
            _held_locks.append(handle)
            return idx
    return None


def select_device(requested: str = "auto") -> torch.device:
    """``auto``: a GPU when there is one (see module doc), else the CPU. ``cpu``/``cuda:N`` force."""
    if requested != "auto":
        return torch.device(requested)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        # The scheduler already restricted this job to its own card(s).
        return torch.device("cuda:0")
    idx = acquire_gpu(torch.cuda.device_count())
    if idx is None:
        log.warning("every GPU is locked by another noisymlt job; sharing cuda:0")
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

    if device.type == "cuda":
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()
