"""Writing a file so that no reader ever sees half of it: the one way every step writes its outputs.

The bytes go to a temporary name beside the target, which one rename then puts in place; until that rename
the previous file (a checkpoint, a manifest) stays whole. A write that fails removes its temporary file and
raises an OSError that names the file, told apart as a full disk where it is one (torch and numpy word that
differently, or not at all). Before a command writes anything, ``check_outputs`` refuses an output that is one of
its inputs or another of its outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from noisymlt.errors import NoisyMLTError, cause


def _same(a: str, b: str) -> bool:
    """One file under two names: the same resolved path (symlinks, '..', './' followed), or, where both exist, the
    same inode (a hard link; a case-insensitive file system's two spellings)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def check_outputs(inputs: Mapping[str, str | Path | None], outputs: Mapping[str, str | Path | None]) -> None:
    """Refuse, before anything is written, an output that would replace one of the command's inputs or that another
    of its outputs names too (``inputs``, ``outputs``: option -> path; None: not given)."""
    given_in = [(k, str(v)) for k, v in inputs.items() if v is not None]
    given_out = [(k, str(v)) for k, v in outputs.items() if v is not None]
    for j, (name, out) in enumerate(given_out):
        for other, path in given_in:
            if _same(out, path):
                raise NoisyMLTError(f"{out}: {name} is the input {other} ({path}); an output never replaces an input: "
                                    f"give {name} another file")
        for other, path in given_out[:j]:
            if _same(out, path):
                raise NoisyMLTError(f"{out}: {name} is also {other} ({path}); each output needs a file of its own")


def write_failed(path: Path, exc: BaseException) -> OSError:
    """An OSError naming ``path`` for a failed write: the cause's errno where it has one, else a full disk
    when its file system has no space left, else an I/O error quoting the cause."""
    import errno
    import shutil

    if isinstance(exc, OSError) and exc.errno is not None:
        return OSError(exc.errno, exc.strerror, str(path))
    free = shutil.disk_usage(path.parent).free
    if free < 1 << 20:
        return OSError(errno.ENOSPC, f"No space left on device ({free} bytes free)", str(path))
    return OSError(errno.EIO, f"write failed ({str(exc).splitlines()[0][:200]})", str(path))


@contextlib.contextmanager
def unlinked_on_failure(path: Path):
    """A temporary file that is removed when writing it fails (a half-written file is never left to trust)."""
    try:
        yield
    except (OSError, RuntimeError, ValueError) as exc:
        error = write_failed(Path(path), exc)  # before the unlink frees the space it filled
        Path(path).unlink(missing_ok=True)
        raise error from exc
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def replacing(path: str | Path, tmp: str | Path | None = None):
    """Yield a temporary path beside ``path`` (default ``<name>.tmp``) for the block to write; when the block
    returns, it replaces ``path`` in one rename, and when it fails, it is removed."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(path.name + ".tmp")
    with unlinked_on_failure(tmp):
        yield tmp
    tmp.replace(path)


def write_text(path: str | Path, text: str) -> Path:
    """Replace ``path`` with ``text``, atomically."""
    with replacing(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | Path, obj, *, indent: int | None = 1, sort_keys: bool = False) -> Path:
    """Replace ``path`` with ``obj`` as JSON and a final newline, atomically; its folder is made first."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def _parsed(read, where: str, what: str, require_object: bool):
    """The JSON that ``read()`` returns (text or bytes), or one line naming ``where`` and the cause."""
    try:
        data = json.loads(read())
    except (OSError, ValueError) as exc:  # missing, unreadable, not UTF-8, not JSON
        raise NoisyMLTError(f"{where}: cannot read {what} ({cause(exc)})") from None
    if require_object and not isinstance(data, dict):
        raise NoisyMLTError(f"{where}: holds a {type(data).__name__}, not a JSON object")
    return data


def read_json(path: str | Path, what: str = "it as JSON", *, require_object: bool = False):
    """The JSON in ``path``, the reader beside ``write_json``: a missing, unreadable or damaged file is one
    NoisyMLTError naming it, what it is (``what``: "cannot read a suspects record") and the cause; with
    ``require_object``, anything but a JSON object is refused too."""
    return _parsed(Path(path).read_bytes, str(path), what, require_object)


def json_object_arg(value: str, option: str) -> dict:
    """A command-line JSON object given as the text itself (starting with '{') or as a file."""
    read = (lambda: value) if value.lstrip().startswith("{") else Path(value).read_bytes
    return _parsed(read, f"{option} {value[:80]}", "it as JSON", require_object=True)
