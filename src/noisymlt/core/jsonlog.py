"""Append-only JSON-lines logs (a run's ``train_log.jsonl`` and ``noise_level.jsonl``), read back on resume.

A process killed mid-append, or a full disk, leaves a cut-off last line. It is the record of an epoch the
checkpoint does not hold, which the resume trains again: it is dropped with a warning. A damaged line
before the last is not such a leftover and is reported, naming the file and line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from noisymlt.errors import NoisyMLTError
from noisymlt.core.files import write_text

log = logging.getLogger(__name__)


def read_records(path: str | Path) -> list[dict]:
    """The records of the JSON-lines file ``path`` (none if it does not exist), without a cut-off last line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            if number < len(lines):
                raise NoisyMLTError(f"{path}: line {number} is not JSON ({exc}); the log is damaged: move it "
                                    "away to resume the run") from exc
            log.warning("%s: dropped a cut-off last line (%d characters; written when the process stopped "
                        "mid-append): the epoch it began is trained again", path, len(line))
    return records


def write_records(path: str | Path, records: list[dict]) -> None:
    """Replace ``path`` with ``records`` as JSON lines, atomically (own temp name, then rename)."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))
