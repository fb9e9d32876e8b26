"""Exclusive lock files held for the life of a handle (fcntl.flock: released when the process dies)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


def try_lock(path: Path) -> IO | None:
    """An open handle holding an exclusive lock on ``path`` (which records the holder's pid), or None
    when another handle holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def holder(path: Path) -> str:
    """The pid written by the current holder of ``path`` ('?' when unknown)."""
    try:
        return Path(path).read_text().strip() or "?"
    except OSError:
        return "?"


def release(handle: IO) -> None:
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()
