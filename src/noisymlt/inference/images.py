"""A user's images for a finished run: which files a folder, a list or a label table names, and each decoded as the
8-bit RGB picture the run's test-time transform takes.

Where the files may be (noisymlt.data.userpaths, the rule every reader of a user's paths follows): a path is
resolved, every ``..`` and symlink followed, and must end inside its folder, the images folder (``--images``) or
the list's own folder (``--list``); an absolute path, a way out or a link leading out is refused with one line that
names the folder or the list and its line. Links to folders are not entered (a loop would never end); a link to an
image inside the folder is read. A listed or tabled path must be a regular file (a FIFO would block the reader).

Each file is decoded by noisymlt.data.images.load_image, the one decode of every step (its conversions are
stated there).
"""

from __future__ import annotations

import os
from pathlib import Path

from noisymlt.errors import NoisyMLTError, cause

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


def _regular(path: Path, where: str) -> None:
    """Refuse PATH, named as WHERE, when it is missing (a link to nothing included) or not a regular file."""
    if not os.path.lexists(path):
        raise NoisyMLTError(f"{where}: no such file")
    if not path.exists():
        raise NoisyMLTError(f"{where}: a link that leads to no file (a missing target or a loop)")
    if not path.is_file():
        raise NoisyMLTError(f"{where}: not a regular file")


def image_files(folder: str | Path) -> list[Path]:
    """Every image file under FOLDER (by suffix, subfolders included, links to folders not entered), in path
    order; each must lie inside FOLDER once resolved."""
    from noisymlt.data.userpaths import ImageFolder

    folder = Path(folder)
    if not folder.is_dir():
        raise NoisyMLTError(f"{folder}: no such folder of images")
    inside = ImageFolder(folder, name=f"the images folder {folder}", noun="image")
    found = []
    for path in sorted(folder.rglob("*")):  # Python 3.11's rglob does not descend into links to folders
        if path.suffix.lower() not in IMAGE_SUFFIXES or (path.is_dir() and not path.is_symlink()):
            continue
        relative = path.relative_to(folder).as_posix()
        _, problem = inside.locate(relative)
        if problem:
            raise NoisyMLTError(f"{folder}: {problem}")
        _regular(path, f"{folder}: image {relative!r}")
        found.append(path)
    if not found:
        raise NoisyMLTError(f"{folder}: no image files in it (suffixes {', '.join(IMAGE_SUFFIXES)})")
    return found


def listed_files(listing: str | Path) -> list[Path]:
    """The images a text file lists, one path a line, each relative to the list's folder and inside it (``#``
    starts a comment; blank lines are skipped)."""
    from noisymlt.data.userpaths import ImageFolder

    listing = Path(listing)
    if not listing.is_file():
        raise NoisyMLTError(f"{listing}: no such image list")
    try:
        text = listing.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NoisyMLTError(f"{listing}: not UTF-8 text ({cause(exc)})") from None
    inside = ImageFolder(listing.parent, name=f"the list's folder {listing.parent}", noun="path")
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        _, problem = inside.locate(line)
        if problem:
            raise NoisyMLTError(f"{listing}, line {number}: {problem}")
        path = listing.parent / line
        _regular(path, f"{listing}, line {number}: {path}")
        out.append(path)
    if not out:
        raise NoisyMLTError(f"{listing}: lists no image")
    return out


def labelled_files(table_path: str | Path, folder: str | Path) -> tuple[list[Path], list[str]]:
    """(the files, the image ids) of a label table's rows, its paths relative to FOLDER and inside it."""
    from noisymlt.data.labels import read_labels
    from noisymlt.data.userpaths import ImageFolder

    folder = Path(folder)
    if not folder.is_dir():
        raise NoisyMLTError(f"{folder}: no such folder of images")
    table = read_labels(table_path)
    if table.paths is None:
        raise NoisyMLTError(f"{table_path}: no 'path' column; cannot find the images")
    inside = ImageFolder(folder, name=f"the images folder {folder}", noun="path")
    files = []
    for image_id, relative in zip(table.image_ids, table.paths):
        _, problem = inside.locate(relative)
        if problem:
            raise NoisyMLTError(f"{table_path}, image {image_id!r}: {problem}")
        _regular(folder / relative, f"{table_path}, image {image_id!r}: {folder / relative}")
        files.append(folder / relative)
    return files, [str(i) for i in table.image_ids]
