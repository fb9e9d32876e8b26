"""Safe, restartable extraction of the dataset archives (.tar, .tar.gz, .zip) and file digests.

Every member is checked before anything is written: an archive from a mirror is input we do
not control, and ``tarfile``/``zipfile`` alone would follow absolute paths, ``..`` and links
out of the target folder. Extraction goes to a temporary folder inside the target and is moved
into place afterwards; a marker file holding the archive's sha256 is written last, so a re-run
skips finished work and an interrupted extraction is simply redone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
from functools import lru_cache
from pathlib import Path

from noisymlt.errors import NoisyMLTError
from noisymlt.core import codedeps
from noisymlt.core.files import read_json, write_text

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def file_digests(path: str | Path) -> dict[str, str]:
    """md5 and sha256 of a file in one pass (cached while its size and mtime stay the same,
    because fetch, extraction and the manifest all hash the same multi-GB archives)."""
    st = Path(path).stat()
    return dict(_digests(str(Path(path).resolve()), st.st_size, st.st_mtime_ns))


@lru_cache(maxsize=64)
def _digests(path: str, size: int, mtime_ns: int) -> tuple[tuple[str, str], ...]:
    md5, sha = hashlib.md5(), hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            md5.update(chunk)
            sha.update(chunk)
    return (("md5", md5.hexdigest()), ("sha256", sha.hexdigest()))


def marker_path(archive: Path, target: Path) -> Path:
    return target / f".{archive.name}.extracted"


def safe_extract(archive: str | Path, target: str | Path) -> list[Path]:
    """Extract ``archive`` into ``target`` and return the extracted paths (files, links, folders).

    Raises NoisyMLTError naming the archive and the member if any member has an absolute path,
    a ``..`` component, a link leaving ``target``, a path through a link, or is a device/fifo;
    in that case nothing is written.
    """
    archive, target = Path(archive), Path(target)
    if not archive.is_file():
        raise NoisyMLTError(f"{archive}: archive does not exist")
    digest = file_digests(archive)["sha256"]
    marker = marker_path(archive, target)
    done = _read_marker(marker)
    # keyed by the archive's content and by this module's code (what the files extracted from it depend on)
    code = codedeps.digest(__name__)
    if done and done.get("sha256") == digest and done.get("code") == code:
        paths = [target / name for name in done["members"]]
        if all(os.path.lexists(p) for p in paths):  # a user may have deleted some since
            log.info("%s already extracted into %s", archive.name, target)
            return paths

    kind = _archive_kind(archive)
    members = _check_tar(archive) if kind == "tar" else _check_zip(archive)

    target.mkdir(parents=True, exist_ok=True)
    staging = target / f".{archive.name}.partial"
    if staging.exists():  # left over from an interrupted run
        shutil.rmtree(staging)
    staging.mkdir()
    log.info("extracting %s into %s", archive.name, target)
    try:
        if kind == "tar":
            with tarfile.open(archive, "r:*") as tf:
                if hasattr(tarfile, "data_filter"):  # second line of defence on Python >= 3.11.4
                    tf.extractall(staging, filter="data")
                else:
                    tf.extractall(staging)
        else:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(staging)
        _merge_into(staging, target)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise NoisyMLTError(f"{archive}: extraction into {target} failed ({exc})") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    write_text(marker, json.dumps({"archive": archive.name, "sha256": digest, "code": code, "members": members}))
    return [target / name for name in members]


def _archive_kind(archive: Path) -> str:
    name = archive.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith(TAR_SUFFIXES):
        return "tar"
    raise NoisyMLTError(
        f"{archive}: unsupported archive type (expected .zip or one of {', '.join(TAR_SUFFIXES)})"
    )


def _read_marker(marker: Path) -> dict | None:
    try:
        return read_json(marker)
    except NoisyMLTError:  # missing or damaged: unpacked again
        return None


def _clean_name(archive: Path, name: str) -> str:
    """The member's relative POSIX path, or NoisyMLTError if it could land outside the target."""
    if not name:
        raise NoisyMLTError(f"{archive}: member with an empty name")
    unified = name.replace("\\", "/")  # treat backslashes as separators: safe on every OS
    if unified.startswith("/") or (len(unified) > 1 and unified[1] == ":"):
        raise NoisyMLTError(f"{archive}: member {name!r} has an absolute path")
    parts = [p for p in unified.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise NoisyMLTError(f"{archive}: member {name!r} contains a '..' component")
    return "/".join(parts)


def _check_link(archive: Path, name: str, link: str, base: str) -> None:
    """``link`` resolved against ``base`` (a folder inside the target) must stay inside it."""
    unified = link.replace("\\", "/")
    if unified.startswith("/") or (len(unified) > 1 and unified[1] == ":"):
        raise NoisyMLTError(f"{archive}: member {name!r} links to absolute path {link!r}")
    resolved = posixpath.normpath(posixpath.join(base, unified))
    if resolved == ".." or resolved.startswith("../"):
        raise NoisyMLTError(f"{archive}: member {name!r} links to {link!r}, outside the target folder")


def _check_link_chains(archive: Path, symlinks: dict[str, str], links: set[str]) -> None:
    """Refuse a symlink whose target walks through another link member: ``d1/l -> ..`` then ``d1/m -> l/../..``
    each stay inside on their own (normpath folds ``l/..`` away), but ``m`` resolves through ``l`` to outside."""
    for name, link in symlinks.items():
        walked: list[str] = posixpath.dirname(name).split("/") if "/" in name else []
        for part in link.replace("\\", "/").split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if walked:
                    walked.pop()
                continue
            walked.append(part)
            through = "/".join(walked)
            if through in links and through != name:
                raise NoisyMLTError(f"{archive}: member {name!r} links to {link!r} through link {through!r}: "
                                    "a chain of links may leave the target folder")


def _check_through_links(archive: Path, names: list[str], links: set[str]) -> None:
    """Refuse members placed under a link member: a link chain can escape while every name
    looks harmless on its own (``a -> .`` then ``a/a/b -> ../..``)."""
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in links:
                raise NoisyMLTError(f"{archive}: member {name!r} lies under link {'/'.join(parts[:i])!r}")


def _check_tar(archive: Path) -> list[str]:
    try:
        with tarfile.open(archive, "r:*") as tf:
            infos = tf.getmembers()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise NoisyMLTError(f"{archive}: not a readable tar archive ({exc})") from exc
    names, links, symlinks = [], set(), {}
    for info in infos:
        name = _clean_name(archive, info.name)
        if info.issym():
            _check_link(archive, info.name, info.linkname, posixpath.dirname(name))
            links.add(name)
            symlinks[name] = info.linkname
        elif info.islnk():  # hard link targets are archive paths, relative to the root
            _check_link(archive, info.name, info.linkname, "")
            links.add(name)
        elif not (info.isreg() or info.isdir()):
            raise NoisyMLTError(f"{archive}: member {info.name!r} is a device or special file")
        if name:
            names.append(name)
    _check_through_links(archive, names, links)
    _check_link_chains(archive, symlinks, links)
    return names


def _check_zip(archive: Path) -> list[str]:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            names, links = [], set()
            for info in infos:
                name = _clean_name(archive, info.filename)
                mode = info.external_attr >> 16  # Unix mode bits, 0 when made elsewhere
                if stat.S_ISLNK(mode):  # zipfile writes links as files holding the target
                    link = zf.read(info).decode("utf-8", "replace")
                    _check_link(archive, info.filename, link, posixpath.dirname(name))
                    links.add(name)
                elif stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise NoisyMLTError(f"{archive}: member {info.filename!r} is a device or special file")
                if name:
                    names.append(name)
    except (zipfile.BadZipFile, OSError) as exc:
        raise NoisyMLTError(f"{archive}: not a readable zip archive ({exc})") from exc
    _check_through_links(archive, names, links)
    return names


def _merge_into(src: Path, dst: Path) -> None:
    """Move the tree under ``src`` into ``dst``, merging folders (VOC2012 and VOC2007 both
    unpack into VOCdevkit/) and replacing files left by an interrupted earlier run."""
    dst.mkdir(exist_ok=True)
    with os.scandir(src) as entries:
        for entry in entries:
            out = dst / entry.name
            if entry.is_dir(follow_symlinks=False) and out.is_dir() and not out.is_symlink():
                _merge_into(Path(entry.path), out)
            else:
                if out.is_dir() and not out.is_symlink():
                    shutil.rmtree(out)
                os.replace(entry.path, out)
