"""Pipeline step 1: download the raw datasets, verify their checksums and unpack them.

``fetch`` is a resumable, retrying, checksum-verifying download of one URL (stdlib urllib only,
so a mirror can be a plain HTTP server or a ``file://`` folder). ``download_dataset`` fetches
every file of a registry entry, unpacks it safely and writes ``<root>/manifest.json`` (size and
hashes of each file) for provenance. ``fetch_asset`` fetches one of the other external files runs read
(ImageNet weights, GloVe vectors; noisymlt.data.assets names them). COCO-MLT's train images come one by one
through ``fetch`` too (noisymlt.data.coco_images).
"""

from __future__ import annotations

import argparse
import http.client
import logging
import os
import posixpath
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from noisymlt import __version__
from noisymlt.core.files import write_json
from noisymlt.data.archive import file_digests, safe_extract
from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_RETRY_STATUS = frozenset({408, 429})  # plus every 5xx


@dataclass(frozen=True)
class RemoteFile:
    url: str
    filename: str
    md5: str | None = None
    sha256: str | None = None
    extract: bool = True  # unpack into the dataset root after download


_ARCHIVES: dict[str, list[RemoteFile]] = {}


def dataset_archives() -> dict[str, list[RemoteFile]]:
    """Kind -> the archives its raw files come in, for every kind that downloads (noisymlt.data.kinds: archives;
    the URLs and digests live with the kind). One dict per process, so a test may swap an entry."""
    if not _ARCHIVES:
        from noisymlt.data.kinds import all_kinds

        _ARCHIVES.update({name: list(kind.archives) for name, kind in all_kinds().items()
                          if kind.archives})
    return _ARCHIVES


def _local(location: str) -> bool:
    """A location without a URL scheme is a local path ("C:" is a drive, not a scheme)."""
    return len(urlsplit(location).scheme) <= 1


def mirror_url(url: str, mirror: str | None) -> str:
    """``url`` rewritten to ``MIRROR/<filename>``; a mirror without a scheme is a local folder."""
    if not mirror:
        return url
    if _local(mirror):
        mirror = Path(mirror).resolve().as_uri()
    return mirror.rstrip("/") + "/" + posixpath.basename(urlsplit(url).path)


class DownloadFailed(NoisyMLTError):
    """The file could not be fetched from its URL (refused, or retries spent): another source may have it."""


class _Retryable(Exception):
    """A failure worth another attempt: connection trouble, 5xx, a short body."""


def fetch(
    url: str,
    dest: str | Path,
    *,
    md5: str | None = None,
    sha256: str | None = None,
    retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 60,
    progress: bool = True,
) -> Path:
    """Download ``url`` to ``dest`` and return ``dest``.

    Streams into ``<dest>.part`` and resumes it with an HTTP Range request (restarting if the
    server answers 200); retries up to ``retries`` times, waiting ``backoff * 2**k`` seconds;
    verifies the checksum(s) before renaming to ``dest``. An existing ``dest`` with the right
    checksum is kept without any request. A mismatch moves the file aside to ``<dest>.corrupt``
    and raises NoisyMLTError with both digests.
    """
    if retries < 0:
        raise NoisyMLTError(f"retries must be >= 0, got {retries}")
    dest = Path(dest)
    expected = {k: v.lower() for k, v in (("md5", md5), ("sha256", sha256)) if v}
    if dest.exists():
        bad = _mismatches(dest, expected)
        if not bad:
            log.info("%s present%s; not downloading", dest, " and verified" if expected else "")
            return dest
        aside = _set_aside(dest, dest)
        log.warning("%s: %s; moved to %s, downloading again", dest, "; ".join(bad), aside.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")

    error = ""
    for attempt in range(retries + 1):
        if attempt:
            delay = backoff * 2 ** (attempt - 1)
            log.warning("%s: %s; retry %d/%d in %.2f s", url, error, attempt, retries, delay)
            time.sleep(delay)
        try:
            _download_once(url, part, timeout=timeout, progress=progress)
            break
        except _Retryable as exc:
            error = str(exc)
    else:
        kept = part.exists() and part.stat().st_size > 0
        raise DownloadFailed(
            f"{url}: download failed after {retries + 1} attempt(s): {error}"
            + (f"; the {part.stat().st_size} bytes received are kept in {part} and a rerun resumes from them"
               if kept else "; nothing was received")
        )

    bad = _mismatches(part, expected)
    if bad:
        aside = _set_aside(part, dest)
        raise NoisyMLTError(
            f"{dest.name}: checksum mismatch, {'; '.join(bad)} (downloaded from {url}). "
            f"The file is kept as {aside} for inspection; delete it and run again."
        )
    os.replace(part, dest)
    return dest


def _download_once(url: str, part: Path, *, timeout: float, progress: bool) -> None:
    """One request: append to ``part`` from where it stops (or restart), raise _Retryable."""
    from tqdm import tqdm

    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": f"noisymlt/{__version__}"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and offset:  # the .part is not a prefix the server can continue
            part.unlink()
            raise _Retryable("server refused to resume the partial file; restarting") from exc
        if exc.code >= 500 or exc.code in _RETRY_STATUS:
            raise _Retryable(f"HTTP {exc.code} {exc.reason}") from exc
        raise DownloadFailed(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _Retryable(f"cannot connect ({exc})") from exc

    with resp:
        if offset and getattr(resp, "status", None) == 206:
            start = resp.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
            if start != str(offset):
                part.unlink()
                raise _Retryable(f"server resumed at {start!r} instead of byte {offset}; restarting")
            mode = "ab"
        else:
            if offset:
                log.info("%s: server ignored the range request; restarting from byte 0", url)
            offset, mode = 0, "wb"
        length = resp.headers.get("Content-Length")
        remaining = int(length) if length and length.isdigit() else None
        received = 0
        with open(part, mode) as fh, tqdm(
            total=None if remaining is None else offset + remaining,
            initial=offset,
            unit="B",
            unit_scale=True,
            desc=part.name.removesuffix(".part"),
            disable=not (progress and sys.stderr.isatty()),
        ) as bar:
            while True:
                try:
                    chunk = resp.read(_CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise _Retryable(f"connection lost after {offset + received} bytes ({exc})") from exc
                if not chunk:
                    break
                fh.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if remaining is not None and received < remaining:
        raise _Retryable(f"short body: got {received} of {remaining} bytes")


def _mismatches(path: Path, expected: dict[str, str]) -> list[str]:
    if not expected:
        return []
    actual = file_digests(path)
    return [
        f"{algo} expected {want}, actual {actual[algo]}"
        for algo, want in expected.items()
        if actual[algo] != want
    ]


def _set_aside(path: Path, dest: Path) -> Path:
    """Move a bad file to ``<dest>.corrupt`` (``.corrupt.1``, ... if taken): never overwrite."""
    aside = dest.with_name(dest.name + ".corrupt")
    n = 0
    while aside.exists():
        n += 1
        aside = dest.with_name(f"{dest.name}.corrupt.{n}")
    os.replace(path, aside)
    return aside


def download_dataset(
    name: str,
    root: str | Path,
    *,
    mirror: str | None = None,
    retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 60,
    progress: bool = True,
) -> Path:
    """Fetch, verify and unpack every archive of the dataset kind ``name`` under ``root`` (archives in
    ``root/archives``) and return the path of ``root/manifest.json``."""
    archives = dataset_archives()
    if name not in archives:
        raise NoisyMLTError(f"unknown dataset {name!r}; choose one of {sorted(archives)}")
    root = Path(root)
    files = []
    for item in archives[name]:
        try:
            path = fetch(
                mirror_url(item.url, mirror),
                root / "archives" / item.filename,
                md5=item.md5,
                sha256=item.sha256,
                retries=retries,
                backoff=backoff,
                timeout=timeout,
                progress=progress,
            )
        except DownloadFailed as exc:
            raise DownloadFailed(
                f"{exc}. Other ways to get {item.filename}: set download.mirror in params.yaml to a URL or local "
                f"folder that holds it under that name, or place it yourself at {root / 'archives' / item.filename} "
                "(its checksum is verified before use)") from exc
        if item.extract:
            safe_extract(path, root)
        # Content only (no time stamps, no mirror): the manifest's own hash is a provenance input.
        files.append(
            {
                "filename": item.filename,
                "path": path.relative_to(root).as_posix(),
                "url": item.url,
                "size": path.stat().st_size,
                **file_digests(path),
                "extracted": item.extract,
            }
        )
    return write_json(root / "manifest.json", {"dataset": name, "files": files}, sort_keys=True)


# ------------------------------------------------------------------------- external files (assets)

def fetch_asset(url: str, sha256: str, out: str | Path, *, name: str = "asset", mirror: str | None = None,
                retries: int = 5, backoff: float = 1.0, timeout: float = 60, progress: bool = True) -> Path:
    """Fetch ``url`` (through ``mirror``; a local path is copied) to ``out`` and verify its sha256 (or the
    prefix given) before it takes its place. A failure says where else the file can come from."""
    source = Path(url).resolve().as_uri() if _local(url) else mirror_url(url, mirror)
    sha = sha256.lower()
    full = len(sha) == 64
    try:
        dest = fetch(source, out, sha256=sha if full else None, retries=retries, backoff=backoff, timeout=timeout,
                     progress=progress)
    except DownloadFailed as exc:
        raise DownloadFailed(
            f"{name}: {exc}. Other ways to get it: set download.mirror in params.yaml to a URL or local folder "
            f"holding {posixpath.basename(urlsplit(url).path)}, or place the file yourself at {out} (it is then used "
            f"as it is; sha256 {'' if full else 'starting with '}{sha})") from exc
    if not full:
        actual = file_digests(dest)["sha256"]
        if not actual.startswith(sha):
            aside = _set_aside(Path(dest), Path(dest))
            raise NoisyMLTError(f"{name}: {dest}: sha256 {actual} does not start with {sha} (from {source}); "
                                f"the file is kept as {aside} for inspection")
    log.info("%s ready at %s", name, dest)
    return Path(dest)


# ---------------------------------------------------------------------------------------- CLI

_MIRROR_HELP = (
    "fetch every file from MIRROR/<filename> instead of its official URL (an http(s):// or "
    "file:// URL, or a local folder); checksums are still verified"
)


def add_retry_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mirror", metavar="URL", help=_MIRROR_HELP)
    parser.add_argument("--retries", type=int, default=5, metavar="N",
                        help="retries per file after network errors, 5xx answers or short bodies (default 5)")
    parser.add_argument("--backoff", type=float, default=1.0, metavar="SEC",
                        help="first retry delay in seconds, doubled on each retry (default 1)")
    parser.add_argument("--timeout", type=float, default=60, metavar="SEC",
                        help="socket timeout per request in seconds (default 60)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar (it is shown only on a terminal anyway)")


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "download",
        help="download, verify and unpack a raw dataset (VOC or COCO)",
        description=(
            "Download the raw archives of a dataset into ROOT/archives (resuming partial files, "
            "retrying with backoff), verify their md5 checksums, unpack them safely into ROOT and "
            "write ROOT/manifest.json (size, md5, sha256 of each archive). voc: VOC2012 trainval + "
            "VOC2007 test -> ROOT/VOCdevkit/VOC2012, ROOT/VOCdevkit/VOC2007. coco: 2017 annotations "
            "+ val2017 images -> ROOT/annotations, ROOT/val2017 (train images of the subset come "
            "from `noisymlt fetch-coco-images`). Files already present and valid are not fetched again."
        ),
    )
    p.add_argument("--dataset", required=True, choices=sorted(dataset_archives()), help="which dataset kind")
    p.add_argument("--root", required=True, type=Path, metavar="DIR", help="dataset root folder")
    add_retry_args(p)
    p.set_defaults(func=_cmd_download)

    _add_asset_cli(subparsers)


def _cmd_download(args: argparse.Namespace) -> int:
    manifest = download_dataset(
        args.dataset, args.root, mirror=args.mirror, retries=args.retries,
        backoff=args.backoff, timeout=args.timeout, progress=args.progress,
    )
    log.info("%s ready under %s (manifest %s)", args.dataset, args.root, manifest)
    return 0


def _cmd_fetch_asset(args: argparse.Namespace) -> int:
    fetch_asset(args.url, args.sha256, args.out, name=args.name, mirror=args.mirror, retries=args.retries,
                backoff=args.backoff, timeout=args.timeout, progress=args.progress)
    return 0


def _add_asset_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "fetch-asset",
        help="download one external file a run reads (ImageNet weights, GloVe vectors) and verify it",
        description=(
            "Fetch URL into OUT (data/assets/GROUP/FILE for the params' assets entries: the rule fetch_asset "
            "fills the arguments in from them), through MIRROR if given (a URL or a local folder holding the "
            "file under its name), resuming and retrying, and verify its sha256 (or the given prefix of it) "
            "before it takes its place. URL may be a local path. Train jobs read these files and never fetch "
            "anything themselves."
        ),
    )
    p.add_argument("--url", required=True, help="http(s):// or file:// URL, or a local path")
    p.add_argument("--sha256", required=True, help="the file's sha256, or its first 8+ hex digits")
    p.add_argument("--out", required=True, help="where the file goes, e.g. data/assets/imagenet/resnet50-0676ba61.pth")
    p.add_argument("--name", default="asset", help="what the file is, for messages (assets.GROUP.NAME)")
    add_retry_args(p)
    p.set_defaults(func=_cmd_fetch_asset)
