"""The embedded toy dataset: a small, offline, deterministic stand-in for Pascal VOC.

It is written in real VOC layout (``VOCdevkit/TOY/{JPEGImages,Annotations,ImageSets/Main}``) so the
VOC parser reads it unchanged; ``ImageSets/Main/classes.txt`` replaces VOC's class list. Each class
is a distinct glyph (shape x colour x texture) drawn with PIL on a noisy textured background, so a
small CNN can tell them apart at 64 px. Each image's labels are drawn from a scene model fit to VOC2012
trainval's labels (glyph i standing for VOC class i), so the pool has VOC's class frequencies and
co-occurrence, and the [DB] long-tail subsampling turns it into a subset with VOC-MLT's structure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from functools import lru_cache
from io import BytesIO
from pathlib import Path

import numpy as np

from noisymlt.core.files import read_json
from noisymlt.data import toy_scenes
from noisymlt.data.toy_scenes import DEFAULT_SIZES, LABEL_MODELS, label_draws
from noisymlt.errors import NoisyMLTError

DEFAULT_MODEL = "glyph"  # the demo's toy until it moves to the voc label model (issue 37)
GENERATOR_VERSION = 1  # bump whenever the bytes a given seed produces change
DATASET_NAME = "TOY"
SUPERSAMPLE = 4  # glyph masks are drawn at 4x and box-filtered down: smooth edges
JPEG_QUALITY = 85

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (30, 160, 50),
    "blue": (35, 70, 215),
    "yellow": (240, 210, 20),
    "magenta": (205, 40, 205),
    "cyan": (20, 200, 215),
    "orange": (245, 135, 15),
    "white": (245, 245, 245),
    "black": (25, 25, 25),
    "purple": (120, 40, 170),
    "brown": (140, 80, 30),
    "pink": (255, 140, 190),
}


@dataclass(frozen=True)
class Glyph:
    name: str
    shape: str
    colour: str
    texture: str  # solid | hstripes | vstripes | checker


# Class order = index order. No two classes share (shape, colour, texture); shared shapes differ in
# colour and texture, shared colours differ in shape.
GLYPHS: tuple[Glyph, ...] = (
    Glyph("red_disc", "disc", "red", "solid"),
    Glyph("blue_ring", "ring", "blue", "solid"),
    Glyph("green_square", "square", "green", "solid"),
    Glyph("yellow_triangle", "triangle", "yellow", "solid"),
    Glyph("magenta_star", "star", "magenta", "solid"),
    Glyph("cyan_plus", "plus", "cyan", "solid"),
    Glyph("orange_diamond", "diamond", "orange", "solid"),
    Glyph("white_hexagon", "hexagon", "white", "solid"),
    Glyph("blue_striped_square", "square", "blue", "hstripes"),
    Glyph("purple_checker_disc", "disc", "purple", "checker"),
    Glyph("green_xcross", "xcross", "green", "solid"),
    Glyph("yellow_crescent", "crescent", "yellow", "solid"),
    Glyph("black_heart", "heart", "black", "solid"),
    Glyph("orange_striped_disc", "disc", "orange", "vstripes"),
    Glyph("cyan_tri_down", "tri_down", "cyan", "solid"),
    Glyph("white_frame", "frame", "white", "solid"),
    Glyph("magenta_hourglass", "hourglass", "magenta", "solid"),
    Glyph("red_arrow", "arrow", "red", "solid"),
    Glyph("brown_tshape", "tshape", "brown", "solid"),
    Glyph("pink_lshape", "lshape", "pink", "solid"),
)
TOY_CLASSES: tuple[str, ...] = tuple(g.name for g in GLYPHS)

FULL_SIZE_OBJECTS = 4  # glyphs shrink by sqrt(4 / k) in an image of k > 4 objects, so that they still fit


def _shape_mask(shape: str, size: int):
    """An L-mode mask (255 inside) of ``shape`` filling a size x size box."""
    from PIL import Image, ImageDraw

    mask = Image.new("L", (size, size), 0)
    d = ImageDraw.Draw(mask)
    s = size - 1

    def poly(points: list[tuple[float, float]], fill: int = 255) -> None:
        d.polygon([(x * s, y * s) for x, y in points], fill=fill)

    def box(x0: float, y0: float, x1: float, y1: float, fill: int = 255) -> None:
        d.rectangle([x0 * s, y0 * s, x1 * s, y1 * s], fill=fill)

    def ellipse(x0: float, y0: float, x1: float, y1: float, fill: int = 255) -> None:
        d.ellipse([x0 * s, y0 * s, x1 * s, y1 * s], fill=fill)

    if shape == "disc":
        ellipse(0.02, 0.02, 0.98, 0.98)
    elif shape == "ring":
        ellipse(0.02, 0.02, 0.98, 0.98)
        ellipse(0.27, 0.27, 0.73, 0.73, fill=0)
    elif shape == "square":
        box(0.08, 0.08, 0.92, 0.92)
    elif shape == "frame":
        box(0.05, 0.05, 0.95, 0.95)
        box(0.28, 0.28, 0.72, 0.72, fill=0)
    elif shape == "triangle":
        poly([(0.5, 0.04), (0.97, 0.94), (0.03, 0.94)])
    elif shape == "tri_down":
        poly([(0.03, 0.06), (0.97, 0.06), (0.5, 0.96)])
    elif shape == "diamond":
        poly([(0.5, 0.02), (0.98, 0.5), (0.5, 0.98), (0.02, 0.5)])
    elif shape == "hexagon":
        poly([(0.27, 0.06), (0.73, 0.06), (0.98, 0.5), (0.73, 0.94), (0.27, 0.94), (0.02, 0.5)])
    elif shape == "star":
        angles = np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, 0.49, 0.2)
        poly([(0.5 + r * np.cos(a), 0.53 - r * np.sin(a)) for r, a in zip(radii, angles)])
    elif shape == "plus":
        box(0.35, 0.03, 0.65, 0.97)
        box(0.03, 0.35, 0.97, 0.65)
    elif shape == "xcross":
        t = 0.15
        poly([(0.03, 0.03 + t), (0.03 + t, 0.03), (0.97, 0.97 - t), (0.97 - t, 0.97)])
        poly([(0.97 - t, 0.03), (0.97, 0.03 + t), (0.03 + t, 0.97), (0.03, 0.97 - t)])
    elif shape == "crescent":
        ellipse(0.02, 0.02, 0.98, 0.98)
        ellipse(0.3, -0.05, 1.15, 0.8, fill=0)
    elif shape == "heart":
        ellipse(0.03, 0.08, 0.53, 0.56)
        ellipse(0.47, 0.08, 0.97, 0.56)
        poly([(0.06, 0.42), (0.94, 0.42), (0.5, 0.96)])
    elif shape == "hourglass":
        poly([(0.05, 0.03), (0.95, 0.03), (0.5, 0.5)])
        poly([(0.5, 0.5), (0.95, 0.97), (0.05, 0.97)])
    elif shape == "arrow":
        poly([(0.02, 0.36), (0.55, 0.36), (0.55, 0.08), (0.98, 0.5), (0.55, 0.92), (0.55, 0.64),
              (0.02, 0.64)])
    elif shape == "tshape":
        box(0.03, 0.05, 0.97, 0.36)
        box(0.35, 0.05, 0.65, 0.97)
    elif shape == "lshape":
        box(0.08, 0.03, 0.4, 0.97)
        box(0.08, 0.66, 0.95, 0.97)
    else:  # a new glyph without a drawing is a programming error, not user input
        raise ValueError(f"unknown toy shape {shape!r}")
    return mask


def _pattern(texture: str, size: int, period: int) -> np.ndarray:
    """Boolean (size, size): where a textured glyph shows its colour (elsewhere a dark shade)."""
    yy, xx = np.mgrid[0:size, 0:size]
    if texture == "solid":
        return np.ones((size, size), dtype=bool)
    if texture == "hstripes":
        return (yy // period) % 2 == 0
    if texture == "vstripes":
        return (xx // period) % 2 == 0
    if texture == "checker":
        return ((yy // period) + (xx // period)) % 2 == 0
    raise ValueError(f"unknown toy texture {texture!r}")


@lru_cache(maxsize=None)
def _glyph_masks(glyph: Glyph | int, side: int):
    """Anti-aliased L masks (colour part, dark part) of ``glyph`` (or the index of a toy class) at
    ``side`` pixels. Drawn at SUPERSAMPLE x and box-filtered down; cached because only a few sizes occur.
    """
    from PIL import Image

    glyph = GLYPHS[glyph] if isinstance(glyph, int) else glyph
    big = side * SUPERSAMPLE
    shape = np.asarray(_shape_mask(glyph.shape, big), dtype=np.float32)
    on = _pattern(glyph.texture, big, period=max(2, round(big / 6)))
    masks = []
    for part in (shape * on, shape * ~on):
        masks.append(Image.fromarray(part.round().astype(np.uint8)).resize((side, side), Image.BOX))
    return masks[0], masks[1] if glyph.texture != "solid" else None


BLOTCH_GRID = 8  # low-frequency background texture: an 8 x 8 random grid, smoothly upsampled


@lru_cache(maxsize=None)
def _upsampler(size: int) -> np.ndarray:
    """(size, BLOTCH_GRID) rows of Gaussian weights: ``A @ grid @ A.T`` is a smooth upsampling."""
    centres = (np.arange(size) + 0.5) * BLOTCH_GRID / size - 0.5
    weights = np.exp(-0.5 * ((centres[:, None] - np.arange(BLOTCH_GRID)[None, :]) / 0.7) ** 2)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Muted random colour + low-frequency blotches + mild pixel noise, (size, size, 3) uint8."""
    base = rng.uniform(70, 180, size=3).astype(np.float32)
    base = 0.5 * base + 0.5 * base.mean()  # desaturate so glyph colours stand out
    grid = rng.normal(0.0, 30.0, size=(3, BLOTCH_GRID, BLOTCH_GRID)).astype(np.float32)
    A = _upsampler(size)
    out = (A @ grid @ A.T).transpose(1, 2, 0)  # (size, size, 3)
    out += (rng.random((size, size, 1), dtype=np.float32) - 0.5) * 14.0  # uniform, sd ~4
    out += base + 0.5  # +0.5 rounds in the cast below
    return np.clip(out, 0, 255, out=out).astype(np.uint8)


PLACEMENT_TRIES = 12


def _place(rng: np.random.Generator, size: int, boxes: list[tuple[int, int, int]],
           shrink: float = 1.0) -> tuple[int, int, int]:
    """A (x, y, side) square box in pixels: the first of a few random candidates that overlaps the
    earlier boxes by at most 15% of the smaller box, else the least overlapping one. Sides span 28-47% of
    the image, times ``shrink``."""
    lo, hi = max(8, round(size * 0.28 * shrink)), max(9, round(size * 0.47 * shrink))
    tries = PLACEMENT_TRIES if boxes else 1
    side = rng.integers(lo, hi + 1, size=tries)
    x = (rng.random(tries) * (size - side + 1)).astype(np.int64)
    y = (rng.random(tries) * (size - side + 1)).astype(np.int64)
    if not boxes:
        return int(x[0]), int(y[0]), int(side[0])
    bx, by, bs = (np.array(v)[None, :] for v in zip(*boxes))
    s = side[:, None]
    ix = np.clip(np.minimum(x[:, None] + s, bx + bs) - np.maximum(x[:, None], bx), 0, None)
    iy = np.clip(np.minimum(y[:, None] + s, by + bs) - np.maximum(y[:, None], by), 0, None)
    overlap = (ix * iy / np.minimum(s, bs) ** 2).max(axis=1)
    ok = np.flatnonzero(overlap <= 0.15)
    k = int(ok[0]) if ok.size else int(np.argmin(overlap))
    return int(x[k]), int(y[k]), int(side[k])


def _render(
    rng: np.random.Generator, classes: list[int], size: int, glyphs: tuple[Glyph, ...] = GLYPHS
) -> tuple[bytes, list[tuple[int, int, int, int, int]]]:
    """One JPEG with instances of ``glyphs[c]`` for c in ``classes``: its bytes and
    (class, xmin, ymin, xmax, ymax), 1-based."""
    from PIL import Image

    image = Image.fromarray(_background(rng, size))
    boxes: list[tuple[int, int, int]] = []
    objects = []
    shrink = min(1.0, (FULL_SIZE_OBJECTS / len(classes)) ** 0.5) if classes else 1.0
    for c in classes:
        x, y, side = _place(rng, size, boxes, shrink)
        boxes.append((x, y, side))
        colour = np.asarray(COLOURS[glyphs[c].colour], dtype=np.float64) + rng.uniform(-15, 15, size=3)
        on, off = _glyph_masks(glyphs[c], side)
        image.paste(tuple(int(v) for v in colour.round().clip(0, 255)), (x, y, x + side, y + side), on)
        if off is not None:
            dark = tuple(int(v) for v in (colour * 0.35).round().clip(0, 255))
            image.paste(dark, (x, y, x + side, y + side), off)
        objects.append((c, x + 1, y + 1, x + side, y + side))
    buf = BytesIO()
    image.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue(), objects


def _annotation(image_id: str, size: int, objects: list[tuple[int, int, int, int, int]]) -> str:
    """VOC-style XML with only the fields VOC parsers read (kept small: thousands of these files)."""
    parts = [
        f"<annotation>\n<folder>{DATASET_NAME}</folder>\n<filename>{image_id}.jpg</filename>\n"
        f"<size><width>{size}</width><height>{size}</height><depth>3</depth></size>\n"
    ]
    for c, x0, y0, x1, y1 in objects:
        parts.append(
            f"<object><name>{TOY_CLASSES[c]}</name><truncated>0</truncated><difficult>0</difficult>"
            f"<bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>\n"
        )
    parts.append("</annotation>\n")
    return "".join(parts)


def make_toy(
    out_dir: str | Path, *, seed: int = 0, n_trainval: int | None = None, n_test: int | None = None,
    image_size: int = 64, scenes: str = DEFAULT_MODEL, progress: bool = False,
) -> Path:
    """Write the toy dataset under ``out_dir/VOCdevkit/TOY`` and return that folder. ``scenes``: the label model
    (noisymlt.data.toy_scenes); image counts default to the model's (DEFAULT_SIZES).

    Same arguments -> identical bytes in every file. Image ids ``000001``.. run through trainval
    first, then test. The folder is built beside its final place and swapped in, so a crash never
    leaves a half-written dataset and a rerun never keeps stale files.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise NoisyMLTError(f"--seed: must be a non-negative integer, got {seed!r}")
    if scenes not in LABEL_MODELS:
        raise NoisyMLTError(f"--scenes: unknown label model {scenes!r}; choose one of {', '.join(LABEL_MODELS)}")
    n_trainval = DEFAULT_SIZES[scenes][0] if n_trainval is None else n_trainval
    n_test = DEFAULT_SIZES[scenes][1] if n_test is None else n_test
    if n_trainval < 1 or n_test < 1:
        raise NoisyMLTError(f"--n-trainval/--n-test: need at least 1 image each, got {n_trainval}/{n_test}")
    if not 32 <= image_size <= 512:
        raise NoisyMLTError(f"--size: image side must lie in 32..512 pixels, got {image_size}")
    from PIL import Image  # noqa: F401  (fail early with a clear import error)
    from tqdm import tqdm

    root = Path(out_dir) / "VOCdevkit" / DATASET_NAME
    tmp = root.with_name(f".{DATASET_NAME}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (tmp / sub).mkdir(parents=True)

    rng = np.random.default_rng(seed)
    n_total = n_trainval + n_test
    ids = [f"{i:06d}" for i in range(1, n_total + 1)]
    labels = np.zeros((n_total, len(TOY_CLASSES)), dtype=np.int64)
    scene_of = np.zeros(n_total, dtype=np.int64)
    about: dict = {}
    draws = label_draws(scenes, rng, n_trainval, n_test, len(TOY_CLASSES), about)
    for row, (image_id, (scene, classes)) in enumerate(
            zip(tqdm(ids, desc="toy images", unit="img", disable=not progress), draws)):
        jpeg, objects = _render(rng, classes, image_size)
        (tmp / "JPEGImages" / f"{image_id}.jpg").write_bytes(jpeg)
        (tmp / "Annotations" / f"{image_id}.xml").write_text(_annotation(image_id, image_size, objects))
        labels[row, classes] = 1
        scene_of[row] = scene

    main = tmp / "ImageSets" / "Main"
    (main / "trainval.txt").write_text("".join(f"{i}\n" for i in ids[:n_trainval]))
    (main / "test.txt").write_text("".join(f"{i}\n" for i in ids[n_trainval:]))
    (main / "classes.txt").write_text("".join(f"{c}\n" for c in TOY_CLASSES))
    manifest = {
        "generator": "noisymlt.data.toy",
        "generator_version": GENERATOR_VERSION,
        "seed": int(seed),
        "image_size": image_size,
        "num_trainval": n_trainval,
        "num_test": n_test,
        "classes": list(TOY_CLASSES),
        "trainval_class_counts": [int(v) for v in labels[:n_trainval].sum(axis=0)],
        "test_class_counts": [int(v) for v in labels[n_trainval:].sum(axis=0)],
    }
    if scenes == "glyph":  # the first toy's manifest, byte for byte
        manifest["scene_counts"] = {name: int((scene_of == s).sum()) for s, name in enumerate(about["scene_names"])}
    else:
        scene_file = toy_scenes.SCENES_FILE
        manifest.update(label_model=scenes, scene_counts=np.bincount(scene_of).tolist(),
                        scene_model={"file": about["scene_model"],
                                     "sha256": hashlib.sha256(scene_file.read_bytes()).hexdigest()},
                        test_scene_weights=about["test_scene_weights"])
    (tmp / "toy_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    if root.exists():
        shutil.rmtree(root)
    tmp.replace(root)
    return root


def make_voc_standin(
    out_dir: str | Path, *, seed: int = 0, n_trainval: int | None = None, n_test: int | None = None,
    image_size: int = 64, scenes: str = DEFAULT_MODEL, progress: bool = False,
) -> Path:
    """The toy set in Pascal VOC's own layout, under VOC's class names: trainval in ``VOCdevkit/VOC2012``,
    test in ``VOCdevkit/VOC2007``, glyph class i named VOC class i, no ``classes.txt``, and ``manifest.json``
    where a download would write it. Every VOC-specific path of the pipeline reads it as VOC (the parser,
    the image folders, ML-GCN's GloVe rows), so a smoke run of the paper's configuration needs no download.
    Same arguments -> identical bytes; the whole folder is built beside ``out_dir`` and swapped in."""
    from noisymlt.data.classes import VOC_CLASSES

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    toy = make_toy(tmp / "build", seed=seed, n_trainval=n_trainval, n_test=n_test, image_size=image_size,
                   scenes=scenes, progress=progress)
    rename = {f"<name>{t}</name>": f"<name>{v}</name>" for t, v in zip(TOY_CLASSES, VOC_CLASSES)}
    for year, image_set in (("VOC2012", "trainval"), ("VOC2007", "test")):
        ids = (toy / "ImageSets/Main" / f"{image_set}.txt").read_text().split()
        dest = tmp / "VOCdevkit" / year
        for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
            (dest / sub).mkdir(parents=True)
        for image_id in ids:
            (toy / "JPEGImages" / f"{image_id}.jpg").replace(dest / "JPEGImages" / f"{image_id}.jpg")
            xml = (toy / "Annotations" / f"{image_id}.xml").read_text().replace(
                f"<folder>{DATASET_NAME}</folder>", f"<folder>{year}</folder>")
            for old, new in rename.items():
                xml = xml.replace(old, new)
            (dest / "Annotations" / f"{image_id}.xml").write_text(xml)
        (dest / "ImageSets/Main" / f"{image_set}.txt").write_text("".join(f"{i}\n" for i in ids))
    manifest = read_json(toy / "toy_manifest.json", "the toy's manifest")
    manifest.update(layout="voc", classes=list(VOC_CLASSES), glyphs=list(TOY_CLASSES))
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(tmp / "build")
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return out


def tree_digest(root: str | Path) -> dict[str, str]:
    """sha256 of every file under ``root``, keyed by relative path: the determinism fingerprint."""
    root = Path(root)
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    make = make_voc_standin if args.layout == "voc" else make_toy
    root = make(args.out, seed=args.seed, n_trainval=args.n_trainval, n_test=args.n_test, image_size=args.size,
                scenes=args.scenes, progress=True)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    n_trainval, n_test = (sum(len(f.read_text().split()) for f in root.rglob(f"ImageSets/Main/{part}.txt"))
                          for part in ("trainval", "test"))
    print(f"{root}: {n_trainval} trainval + {n_test} test images ({args.scenes} label model), {len(TOY_CLASSES)} classes, "
          f"{size / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "make-toy",
        help="generate the embedded toy dataset (offline, deterministic, VOC layout)",
        description=(
            "Write a small synthetic multi-label dataset in Pascal VOC layout under "
            "OUT/VOCdevkit/TOY: 20 glyph classes drawn on textured backgrounds, images sampled "
            "from scenes so classes co-occur and their frequencies are skewed. Parse it with the "
            "VOC parser; the same seed always gives identical files."
        ),
    )
    p.add_argument("--out", required=True, type=Path, help="output folder (VOCdevkit/TOY is created inside)")
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--n-trainval", type=int, default=None,
                   help="trainval images, the pool the long-tail subset is drawn from (default: the label model's, "
                        + ", ".join(f"{m} {n[0]}" for m, n in DEFAULT_SIZES.items()) + ")")
    p.add_argument("--n-test", type=int, default=None, help="test images (default: the label model's, "
                   + ", ".join(f"{m} {n[1]}" for m, n in DEFAULT_SIZES.items()) + ")")
    p.add_argument("--scenes", choices=LABEL_MODELS, default=DEFAULT_MODEL,
                   help="label model (noisymlt.data.toy_scenes): voc = a scene mixture fit to VOC2012 trainval's "
                        "labels, whose long-tail subset has VOC-MLT's structure; glyph = the first toy's six "
                        f"hand-made scenes (default {DEFAULT_MODEL})")
    p.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
    p.add_argument("--layout", choices=("toy", "voc"), default="toy",
                   help="toy: OUT/VOCdevkit/TOY with the glyph class names (default); voc: Pascal VOC's own layout "
                        "(OUT/VOCdevkit/VOC2012 trainval, VOC2007 test) under VOC's 20 class names, a stand-in for "
                        "VOC in smoke runs of the paper's configuration")
    p.set_defaults(func=_run)
