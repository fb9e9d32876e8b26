"""COCO-MLT's train images, fetched one by one from each image's ``coco_url`` (``noisymlt fetch-coco-images``)
instead of the 18 GB train zip: resumable and retried through noisymlt.data.download's ``fetch``, every file
decoded before it counts, and ``manifest.json`` (size and sha256 of each image) written beside them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from noisymlt.core.files import read_json, write_json
from noisymlt.data.archive import file_digests
from noisymlt.data.download import add_retry_args, fetch, mirror_url
from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)


def read_image_ids(path: str | Path) -> list[int]:
    """COCO image ids from a label table (.parquet/.csv, ``image_id`` column) or a text file
    with one id per line (blank lines and ``#`` comments ignored)."""
    path = Path(path)
    if path.suffix.lower() in (".parquet", ".csv"):
        from noisymlt.data.labels import read_labels

        rows = list(enumerate(read_labels(path).image_ids, start=2))  # row 1 is the header
        where = "row"
    else:
        try:
            rows = list(enumerate(path.read_text().splitlines(), start=1))
        except OSError as exc:
            raise NoisyMLTError(f"{path}: cannot read id file ({exc})") from exc
        where = "line"
    ids = []
    for n, raw in rows:
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        try:
            ids.append(int(text))
        except ValueError:
            raise NoisyMLTError(
                f"{path}: {where} {n}: {text!r} is not a COCO image id (an integer)"
            ) from None
    return ids


def _coco_image_index(annotation_json: Path) -> dict[int, tuple[str, str]]:
    """image id -> (coco_url, file_name) from a COCO instances JSON."""
    data = read_json(annotation_json, "annotation file")
    try:
        images = data["images"]
        return {int(im["id"]): (im.get("coco_url", ""), im["file_name"]) for im in images}
    except (ValueError, KeyError, TypeError) as exc:
        raise NoisyMLTError(
            f"{annotation_json}: not a COCO annotation file with an 'images' list of id/file_name "
            f"entries ({type(exc).__name__}: {exc})"
        ) from exc


def is_valid_image(path: Path) -> bool:
    """True if PIL can parse and fully decode the file (verify() alone misses truncation)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            im.load()
    except Exception:  # PIL raises many types (OSError, SyntaxError, ValueError, ...) for bad data
        return False
    return True


def download_coco_images(
    annotation_json: str | Path,
    image_ids: Iterable[int | str],
    out_dir: str | Path,
    *,
    retries: int = 5,
    backoff: float = 1.0,
    workers: int = 4,
    mirror: str | None = None,
    timeout: float = 60,
    progress: bool = True,
) -> list[Path]:
    """Fetch the images ``image_ids`` (via each image's ``coco_url``) into ``out_dir`` and write
    ``out_dir/manifest.json``. Files already present and decodable are kept. Each download is
    checked with PIL and retried; ids that still fail are named in one NoisyMLTError at the end.
    Returns the image paths in the order of ``image_ids``."""
    if workers < 1:
        raise NoisyMLTError(f"workers must be >= 1, got {workers}")
    annotation_json, out_dir = Path(annotation_json), Path(out_dir)
    try:
        wanted = list(dict.fromkeys(int(str(i).strip()) for i in image_ids))
    except ValueError as exc:
        raise NoisyMLTError(f"image ids must be integers ({exc})") from None
    index = _coco_image_index(annotation_json)
    unknown = [i for i in wanted if i not in index]
    if unknown:
        raise NoisyMLTError(
            f"{annotation_json}: {len(unknown)} requested image id(s) are not in its 'images' list, "
            f"e.g. {unknown[:10]}"
        )
    no_url = [i for i in wanted if not index[i][0]]
    if no_url:
        raise NoisyMLTError(f"{annotation_json}: image(s) {no_url[:10]} have no 'coco_url'")
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(img_id: int) -> Path:
        url, file_name = index[img_id]
        dest = out_dir / file_name
        if dest.exists():
            if is_valid_image(dest):
                return dest
            log.warning("%s exists but does not decode; downloading again", dest)
            dest.unlink()
        source, problem = mirror_url(url, mirror), ""
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(backoff * 2 ** (attempt - 1))
            fetch(source, dest, retries=retries, backoff=backoff, timeout=timeout, progress=False)
            if is_valid_image(dest):
                return dest
            aside = dest.with_name(dest.name + ".corrupt")  # keep only the latest bad copy
            os.replace(dest, aside)
            problem = f"downloaded file does not decode as an image (last copy kept as {aside.name})"
        raise NoisyMLTError(f"{problem}; gave up after {retries + 1} attempt(s)")

    from tqdm import tqdm

    paths: dict[int, Path] = {}
    failed: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool, tqdm(
        total=len(wanted), unit="img", disable=not (progress and sys.stderr.isatty())
    ) as bar:
        futures = {pool.submit(one, i): i for i in wanted}
        for fut in as_completed(futures):
            img_id = futures[fut]
            try:
                paths[img_id] = fut.result()
            except NoisyMLTError as exc:
                failed[img_id] = str(exc)
            bar.update(1)
    if failed:
        ids = sorted(failed)
        detail = "; ".join(f"{i}: {failed[i]}" for i in ids[:5])
        raise NoisyMLTError(
            f"{len(failed)} of {len(wanted)} COCO image(s) could not be fetched into {out_dir}: "
            f"ids {ids[:50]}{' ...' if len(ids) > 50 else ''}. First errors: {detail}. "
            "Run the command again to retry only these."
        )
    images = [
        {"image_id": i, "file_name": paths[i].name, "size": paths[i].stat().st_size,
         "sha256": file_digests(paths[i])["sha256"]}
        for i in sorted(wanted)
    ]
    write_json(out_dir / "manifest.json", {"annotations": annotation_json.name, "images": images}, sort_keys=True)
    return [paths[i] for i in wanted]


# ---------------------------------------------------------------------------------------- CLI

def add_cli(subparsers) -> None:
    q = subparsers.add_parser(
        "fetch-coco-images",
        help="download the COCO train images of a subset one by one",
        description=(
            "Download the images listed in --ids from each image's coco_url in --annotations "
            "(e.g. ROOT/annotations/instances_train2017.json) into --out, skipping files already "
            "present and decodable, checking every download with PIL and retrying. Ids that still "
            "fail are listed at the end (exit status 2); run again to retry them. Writes "
            "OUT/manifest.json (size and sha256 of each image)."
        ),
    )
    q.add_argument("--annotations", required=True, type=Path, metavar="FILE",
                   help="COCO instances JSON holding the images' coco_url and file_name")
    q.add_argument("--ids", required=True, type=Path, metavar="FILE",
                   help="image ids: a label table (.parquet/.csv with an image_id column) or a text "
                        "file with one id per line")
    q.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder for the images")
    q.add_argument("--workers", type=int, default=4, metavar="N", help="parallel downloads (default 4)")
    add_retry_args(q)
    q.set_defaults(func=_cmd_fetch_coco_images)


def _cmd_fetch_coco_images(args: argparse.Namespace) -> int:
    paths = download_coco_images(
        args.annotations, read_image_ids(args.ids), args.out, retries=args.retries,
        backoff=args.backoff, workers=args.workers, mirror=args.mirror,
        timeout=args.timeout, progress=args.progress,
    )
    log.info("%d images ready in %s", len(paths), args.out)
    return 0
