"""glibc's heap, set for PyTorch on the CPU: the memory a step frees is kept for the next one.

By default glibc gives a freed block of more than its (growing, at most 32 MiB) mmap threshold back to the kernel,
and trims the heap's free top; the next batch's activations then fault the same memory back in, one zeroed page
at a time. Predicting a smoke run's 36 training images in one batch (ResNet-50 at 224 px: layers of 100 MiB and
more) spent a sixth of its job in the kernel that way. With every block from the heap and up to 1 GiB of free top
kept, one such job (a smoke Ours run) faulted in 549k pages instead of 1.82M and took 21.0 s instead of 24.4; the
arithmetic and so every result are the same (tests/test_heap.py), and the peak memory stays the job's own (the
demo's largest train peak: docs/benchmarks/demo_memory.json). A MALLOC_MMAP_MAX_ or MALLOC_TRIM_THRESHOLD_ in
the environment (glibc's own switches) wins.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
SETTINGS = {"MALLOC_MMAP_MAX_": (M_MMAP_MAX, 0), "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, 1 << 30)}


def keep_freed_memory() -> dict[str, int]:
    """Set glibc's switches (above) where the environment does not; returns those set (none off glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to ask, or one without mallopt
        return {}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = {}
    for variable, (option, value) in SETTINGS.items():
        if variable not in os.environ and mallopt(option, value) == 1:
            done[variable] = value
    return done
