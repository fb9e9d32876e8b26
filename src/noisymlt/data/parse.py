"""``noisymlt parse``: raw annotations (VOC XML tree or COCO instances JSON) -> Parquet label table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from noisymlt.core.files import check_outputs
from noisymlt.data.labels import write_labels
from noisymlt.errors import NoisyMLTError


def _coco_image_dir(annotation_json: Path) -> str:
    """``instances_val2017.json`` -> ``val2017``, the folder name COCO's zips unpack to."""
    match = re.fullmatch(r"instances_(\w+)\.json", annotation_json.name)
    if not match:
        raise NoisyMLTError(f"{annotation_json}: cannot infer the image folder from the file name; pass --image-dir")
    return match.group(1)


def _run(args: argparse.Namespace) -> int:
    source = Path(args.source)
    if not source.exists():
        raise NoisyMLTError(f"{source}: --source does not exist")
    check_outputs({"--source": source}, {"--out": args.out})
    if args.format == "voc":
        from noisymlt.data.voc import parse_voc

        table = parse_voc(source, args.image_set)
    else:
        from noisymlt.data.coco import parse_coco

        table = parse_coco(source, args.image_dir or _coco_image_dir(source))
    write_labels(table, args.out)
    counts = table.labels.sum(axis=0)
    print(f"{args.out}: {len(table)} images, {table.num_classes} classes, "
          f"{int((counts == 0).sum())} class(es) without images, "
          f"{int((table.labels.sum(axis=1) == 0).sum())} all-negative image(s)")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "parse",
        help="turn VOC or COCO annotations into a Parquet label table",
        description=(
            "Read raw annotations and write one row per image (image_id, path, one 0/1 column per class). "
            "VOC: every <object> is a positive, difficult ones included; rows follow the image-set file. "
            "COCO: annotations with ignore, area <= 0 or a box side < 1 are skipped, crowd ones kept; "
            "classes in sorted category-id order; rows sorted by image id."
        ),
    )
    p.add_argument("--format", required=True, choices=("voc", "coco"), help="annotation format")
    p.add_argument("--source", required=True,
                   help="VOC year folder (with Annotations/, ImageSets/Main/) or COCO instances JSON")
    p.add_argument("--image-set", default="trainval", help="VOC: ImageSets/Main/<name>.txt to read (default: trainval)")
    p.add_argument("--image-dir",
                   help="COCO: image folder name used in the path column (default: from the JSON name, e.g. val2017)")
    p.add_argument("--out", required=True, help="output Parquet file")
    p.set_defaults(func=_run)
