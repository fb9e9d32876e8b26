"""A user's image paths, the one way in for every step that reads file paths from a user's table.

The rule (docs/own-data.md, "Image paths"): a row's path is relative to its images folder; it is resolved, every
``..`` and symlink followed, and must end inside the images folder, itself resolved (a folder that is a link to a
disk elsewhere is fine, a link inside it that leads out is not). A file outside the folder is a dependency that
neither DVC nor Snakemake track, so a run would depend on what nobody versions. Two rows that resolve to the same
file (two spellings, a link to another row's image, a hard link) are refused with both rows named: in the training
and the test part, one image would leak from one into the other unseen by any table.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath


class ImageFolder:
    """The images folder of a table: where each row's path leads, and which row already claimed each file."""

    def __init__(self, root: str | Path, name: str = "the images folder", noun: str = "image path"):
        self.root, self.name, self.noun = Path(root), name, noun
        self.real = os.path.realpath(self.root)
        self._claimed: dict[tuple[int, int], tuple[str, str]] = {}  # (device, inode) -> (row, spelling)

    def locate(self, relative: str) -> tuple[Path | None, str | None]:
        """(the file, None) when ``relative`` stays inside the folder once resolved, else (None, the problem)."""
        if "\0" in relative:  # no file system takes it (os calls raise ValueError)
            return None, f"{self.noun} {relative!r} holds a NUL character"
        if PurePosixPath(relative).is_absolute() or PureWindowsPath(relative).is_absolute():
            return None, f"{self.noun} {relative!r} is absolute; paths are relative to {self.name}"
        real = os.path.realpath(os.path.join(self.root, relative))
        if os.path.commonpath([self.real, real]) != self.real:
            return None, (f"{self.noun} {relative!r} leads outside {self.name} (to {real}); every file, and every "
                          "symlink's target, must lie inside the folder")
        return Path(real), None

    def claim(self, file: Path, row: str, spelling: str) -> str | None:
        """None when no earlier row resolved to ``file``, else the problem naming that row and its spelling."""
        try:
            stat = os.stat(file)
        except OSError:  # a missing file is reported by the caller's own check
            return None
        key = (stat.st_dev, stat.st_ino)
        if key in self._claimed:
            first, written = self._claimed[key]
            return (f"{self.noun} {spelling!r} is the same file as {written!r} on {first}; one image may appear "
                    "once (in one part)")
        self._claimed[key] = (row, spelling)
        return None
