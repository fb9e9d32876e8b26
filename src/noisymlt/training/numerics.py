"""Which arithmetic a run's numbers came from: its numerics fingerprint.

A CPU run is bit-reproducible for a given seed only on the same kernels: torch's build, the instruction set
its matrix products and convolutions run on, the thread count and the precision. bf16 autocast runs on AMX
tiles on an Intel Xeon with AMX, on AVX-512 BF16 instructions on an AMD EPYC of that kind, and through ATen's
reference kernels where oneDNN has no bf16 path (AVX2 only); fp32 runs AVX-512 or AVX2 kernels. Over a
training run the rounding differences between these grow into a different draw (whole mAP points on the demo),
so every manifest records the fingerprint, results.parquet carries it, and the demo's exact numbers are held
only where the fingerprint is the one that made them (tests/test_readme.py).
"""

from __future__ import annotations

import os
from functools import lru_cache

# The keys that decide the numbers. The CPU's model name (``cpu``, which manifests add) counts too: two models with
# the same instruction set may still block their kernels differently (cache sizes), so exactness is only claimed
# for the model that was measured.
IDENTITY = ("torch", "device", "kernels", "aten", "threads", "precision", "cpu")

# oneDNN's own cap on the instruction set (ONEDNN_MAX_CPU_ISA, older name DNNL_MAX_CPU_ISA), as a rank
_ISA_RANK = {"sse41": 0, "avx": 1, "avx2": 2, "avx2_vnni": 2, "avx2_vnni_2": 2, "avx512_core": 3,
             "avx512_core_vnni": 3, "avx512_core_bf16": 4, "avx512_core_fp16": 4, "avx10_1_512": 4,
             "avx512_core_amx": 5, "avx512_core_amx_fp16": 5, "avx10_1_512_amx": 5, "avx10_1_512_amx_fp16": 5,
             "avx10_2_512": 5, "avx10_2_512_amx_2": 5, "default": 9, "all": 9}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (descriptive only: not part of the fingerprint's identity)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _onednn_cap() -> int:
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "all").strip().lower()
    return _ISA_RANK.get(cap, 9)


def cpu_kernels(precision: str, flags: frozenset[str] | None = None, cap: int | None = None) -> str:
    """The instruction set a CPU run's convolutions and matrix products take at ``precision`` (oneDNN's choice,
    capped by ONEDNN_MAX_CPU_ISA): ``amx``, ``avx512_bf16``, ``avx512`` (bf16 converted to fp32 in AVX-512
    registers), ``avx2``, or ``aten`` (bf16 without a oneDNN path: ATen's reference kernels)."""
    flags = cpu_flags() if flags is None else flags
    cap = _onednn_cap() if cap is None else cap
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags and cap >= 3
    if precision == "bf16":
        if {"amx_tile", "amx_bf16"} <= flags and avx512 and cap >= 5:
            return "amx"
        if "avx512_bf16" in flags and avx512 and cap >= 4:
            return "avx512_bf16"
        return "avx512" if avx512 else "aten"
    if avx512:
        return "avx512"
    return "avx2" if "avx2" in flags and cap >= 2 else "sse"


def fingerprint(device, precision: str, threads: int) -> dict:
    """What a run's numbers depend on besides its code, configuration and inputs (IDENTITY's keys)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        kernels = f"{torch.cuda.get_device_name(index)} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})"
        aten = "cuda"
    else:
        kernels = cpu_kernels(precision)
        aten = torch.backends.cpu.get_cpu_capability()
    return {"torch": torch.__version__, "device": device.type, "kernels": kernels, "aten": aten,
            "threads": int(threads), "precision": precision}


def identity(fp: dict | None) -> tuple | None:
    """The comparable part of a fingerprint (None for a run recorded before fingerprints existed)."""
    return None if not fp else tuple(fp.get(k) for k in IDENTITY)
