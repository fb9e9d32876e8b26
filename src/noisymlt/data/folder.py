"""``noisymlt parse-folder``: a user's own folder of images and its labels table -> a Parquet label table.

The benchmark's datasets come with their own parsers (VOC, COCO); a user's data comes as a folder of images and a
spreadsheet. This reads that sheet (CSV or Parquet; wide: one 0/1 column per class, or list: one column of class
names, as text or a Parquet list), checks every row and every image before anything is written, and writes one
part: ``train_source`` (the pool the long-tail step subsamples) or ``test``. The two parts come from two
independent runs, so the test part is fixed by the inputs: a split column, a second table, or a seeded stratified
draw (noisymlt.data.splits).
Every bad row is reported at once, one line each, so that a sheet is fixed in one go rather than one error a run.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from noisymlt.core.files import check_outputs
from noisymlt.data.labels import CLEAN_PREFIX, RESERVED, LabelTable, write_labels
from noisymlt.data.userpaths import ImageFolder
from noisymlt.errors import NoisyMLTError

PARTS = ("train_source", "test")
SPLIT_VALUES = ("train", "test")
MAX_LINES = 50  # problem lines shown; the rest are counted
DEFAULT_TEST_FRACTION = 0.2


@dataclass
class Sheet:
    """A labels table as read: every cell, and where each row sits in the file (CSV: the file's line, the header
    being line 1; Parquet: the data row counted from 1)."""

    path: Path
    columns: list[str]
    rows: list[list]
    numbers: list[int]
    unit: str  # "line" or "row"
    bad_width: dict[int, str] = field(default_factory=dict)  # CSV rows with another number of fields than the header

    def where(self, i: int) -> str:
        return f"{self.path} {self.unit} {self.numbers[i]}"


def _read_csv(path: Path) -> Sheet:
    records, numbers, previous = [], [], 0
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            for fields in reader:
                start, previous = previous + 1, reader.line_num  # a quoted field may span lines: its first counts
                if any(x.strip() for x in fields):  # blank lines and a spreadsheet's trailing ",,," rows
                    records.append(fields)
                    numbers.append(start)
    except UnicodeDecodeError as exc:
        raise NoisyMLTError(f"{path}: not UTF-8 text ({exc}); save the sheet as CSV UTF-8") from exc
    except csv.Error as exc:
        raise NoisyMLTError(f"{path}: malformed CSV at line {previous + 1} ({exc})") from exc
    except OSError as exc:
        raise NoisyMLTError(f"{path}: cannot read the labels file ({exc.strerror or exc})") from exc
    if not records:
        raise NoisyMLTError(f"{path}: the file is empty; it needs a header line and one line per image")
    header = [name.strip() for name in records[0]]
    rows = records[1:]
    sheet = Sheet(path, header, rows, numbers[1:], "line")
    for i, row in enumerate(rows):
        if len(row) != len(header):
            sheet.bad_width[i] = f"{len(row)} fields where the header line has {len(header)}"
    return sheet


def _read_parquet(path: Path) -> Sheet:
    try:
        import pyarrow.parquet as pq

        arrow = pq.read_table(path)
    except Exception as exc:  # pyarrow raises many types for a damaged or foreign file
        raise NoisyMLTError(f"{path}: cannot read the Parquet table ({exc})") from exc
    columns = [str(name) for name in arrow.column_names]
    data = [arrow.column(k).to_pylist() for k in range(arrow.num_columns)]
    rows = [list(cells) for cells in zip(*data)]
    return Sheet(path, columns, rows, list(range(1, len(rows) + 1)), "row")


def read_sheet(path: str | Path) -> Sheet:
    """The labels table at ``path``, by its suffix (.csv or .parquet); every cell kept as read."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise NoisyMLTError(f"{path}: a labels file must end in .csv or .parquet (it ends in {suffix or 'nothing'!r})")
    if not path.is_file():
        raise NoisyMLTError(f"{path}: labels file does not exist")
    sheet = _read_csv(path) if suffix == ".csv" else _read_parquet(path)
    unnamed = [k + 1 for k, name in enumerate(sheet.columns) if not name]
    if unnamed:
        raise NoisyMLTError(f"{path}: column(s) number {unnamed} have no name in the header")
    twice = sorted({name for name in sheet.columns if sheet.columns.count(name) > 1})
    if twice:
        raise NoisyMLTError(f"{path}: column(s) {twice} appear more than once in the header")
    if not sheet.rows:
        raise NoisyMLTError(f"{path}: the table has a header but no image rows")
    return sheet


def _text(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return str(value).strip()


def _flag(value) -> int | None:
    """0 or 1 from a cell (text, number or bool), else None."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    try:
        number = float(_text(value))
    except ValueError:
        return None
    return int(number) if number in (0.0, 1.0) else None


def default_id(path: str) -> str:
    """``cats/001.jpg`` -> ``cats/001``: the relative path without its extension, folders kept."""
    folder, slash, name = path.rpartition("/")
    if "." in name.lstrip("."):
        name = name.rsplit(".", 1)[0]
    return folder + slash + name


def check_image(file: Path, relative: str) -> str | None:
    """None if ``file`` (the row's path ``relative``, resolved) is an image PIL decodes in full, else the problem.
    A full decode, not verify(): verify reads headers and chunk checksums only, so a truncated JPEG passed it and
    failed later in a cache job, far from its row."""
    from PIL import Image

    try:
        exists, regular = file.exists(), file.is_file()
    except OSError as exc:  # a name too long for the file system, a folder it may not enter
        return f"image path {relative[:120]!r} cannot be looked up ({exc.strerror or exc})"
    if not exists:
        return f"image file {relative!r} does not exist in the images folder"
    if not regular:
        return f"image path {relative!r} is not a file"
    try:
        with Image.open(file) as image:
            image.load()
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ... for a bad file
        return f"image file {relative!r} cannot be read as an image ({type(exc).__name__}: {exc})"
    return None


@dataclass
class Layout:
    """The columns' roles, fixed from the header(s) before any row is read."""

    image: str
    id: str | None
    split: str | None
    labels: str | None  # list format: the column of class names; None: wide format
    classes: list[str] | None  # None: list format without --classes (the names found, sorted)


def _layout(sheets: list[Sheet], classes: list[str] | None, image_column: str, id_column: str | None,
            labels_column: str | None, split_column: str | None) -> Layout:
    for k, sheet in enumerate(sheets):
        wanted = [("--image-column", image_column), ("--id-column", id_column), ("--labels-column", labels_column),
                  ("--split-column", split_column if k == 0 else None)]
        for option, name in wanted:
            if name is not None and name not in sheet.columns:
                raise NoisyMLTError(f"{sheet.path}: no column {name!r} ({option}); the columns are "
                                    f"{', '.join(sheet.columns)}")
    if labels_column is not None:
        return Layout(image_column, id_column, split_column, labels_column, classes)
    roles = {image_column, id_column, split_column}
    found = [[name for name in sheet.columns if name not in roles] for sheet in sheets]
    if not found[0]:
        raise NoisyMLTError(f"{sheets[0].path}: no class column besides {sorted(r for r in roles if r)}; a wide table "
                            "has one 0/1 column per class (or pass --labels-column for a column of class names)")
    if classes is not None:
        unknown = [name for name in found[0] if name not in classes]
        if unknown:
            raise NoisyMLTError(f"{sheets[0].path}: column(s) {unknown} are not in --classes; in a wide table every "
                                "column but the image, id and split columns is a class")
    else:
        classes = found[0]
    for sheet, names in zip(sheets, found):
        missing = [name for name in classes if name not in names]
        extra = [name for name in names if name not in classes]
        if missing or extra:
            raise NoisyMLTError(f"{sheet.path}: the class columns differ from the classes "
                                f"{', '.join(classes)}: missing {missing or 'none'}, extra {extra or 'none'}")
    return Layout(image_column, id_column, split_column, None, list(classes))


def _check_class_names(classes: list[str], where: str) -> None:
    bad = [name for name in classes if not name or name in RESERVED or name.startswith(CLEAN_PREFIX)]
    if bad:
        raise NoisyMLTError(f"{where}: class name(s) {bad} cannot be used: a label table reserves {list(RESERVED)} "
                            f"and names starting with {CLEAN_PREFIX!r} (pass --id-column or --image-column if one "
                            "of these columns holds ids or paths)")
    if len(set(classes)) != len(classes):
        raise NoisyMLTError(f"{where}: class name(s) {sorted({c for c in classes if classes.count(c) > 1})} repeat")


@dataclass
class Row:
    sheet: int  # 0: the labels file, 1: the --test-labels file
    index: int
    image_id: str
    path: str
    file: Path | None = None  # the image, resolved, once it is inside the folder and readable
    names: list[str] | None = None  # list format: the class names of the row
    vector: np.ndarray | None = None  # wide format: the 0/1 labels
    test: bool | None = None  # from the split column or the file (False until drawn); None: a bad split value


def _split_names(cell: str, separator: str) -> list[str]:
    tokens = cell.split() if not separator.strip() else cell.split(separator)
    return list(dict.fromkeys(t.strip() for t in tokens if t.strip()))


def _quoted(token: str) -> bool:
    return len(token) >= 2 and token[0] == token[-1] and token[0] in "'\""


def label_names(value, separator: str, column: str) -> tuple[list[str], str | None]:
    """The class names of a list-format cell, and the problem when there is one. Two forms, and nothing else:
    text naming the classes between separators (CSV, or a Parquet string column), or a Parquet list of text. A
    list written out as text (``['cat', 'dog']``, JSON's ``["cat"]``) would give names with brackets and quotes
    in them, so it is refused, as is a number, a nested list or any other cell type."""
    how = (f"text naming the classes separated by {separator!r}" if separator.strip()
           else "text naming the classes separated by blanks")
    forms = f"{how}, or a Parquet list of text"
    if isinstance(value, (list, tuple, np.ndarray)):
        names = []
        for item in list(value):
            if not isinstance(item, str):
                return [], (f"column {column!r} holds a list with {item!r} ({type(item).__name__}); "
                            f"a list cell holds class names as text")
            if item.strip():
                names.append(item.strip())
        return list(dict.fromkeys(names)), None
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return [], None
    if not isinstance(value, str):
        return [], f"column {column!r} holds {value!r} ({type(value).__name__}); a labels column holds {forms}"
    text = value.strip()
    names = _split_names(text, separator)
    if text.startswith(("[", "{")) or text.endswith(("]", "}")) or any(_quoted(n) for n in names):
        return [], (f"column {column!r} holds {text[:60]!r}, a list written as text; write {how} (cat"
                    f"{separator if separator.strip() else ' '}dog), or store the column as a Parquet list of text")
    return names, None


def _read_row(sheet: Sheet, k: int, i: int, layout: Layout, images: ImageFolder, separator: str,
              problems: list[str]) -> Row:
    cell = dict(zip(sheet.columns, sheet.rows[i]))
    path = _text(cell.get(layout.image))  # a row short of fields lacks some cells
    image_id = _text(cell.get(layout.id)) if layout.id else default_id(path)
    row = Row(k, i, image_id, path)
    found: list[str] = []
    if i in sheet.bad_width:
        found.append(sheet.bad_width[i])
    elif not path:
        found.append(f"no image path: column {layout.image!r} is empty")
    else:
        file, trouble = images.locate(path)
        trouble = trouble or check_image(file, path)
        if trouble:
            found.append(trouble)
        else:
            row.file = file
    if i not in sheet.bad_width:
        if layout.id and not image_id:
            found.append(f"no image id: column {layout.id!r} is empty")
        if layout.labels is not None:
            names, wrong = label_names(cell[layout.labels], separator, layout.labels)
            unknown = [n for n in names if layout.classes is not None and n not in layout.classes]
            for name in unknown:
                shown = ", ".join(layout.classes[:20]) + (", ..." if len(layout.classes) > 20 else "")
                found.append(f"unknown class {name!r} in column {layout.labels!r} (classes: {shown})")
            if wrong or not names:
                found.append(wrong or f"no label: column {layout.labels!r} names no class")
            row.names = None if wrong or unknown else names
        else:
            values = [_flag(cell[name]) for name in layout.classes]
            for name, value in zip(layout.classes, values):
                if value is None:
                    raw = _text(cell[name])
                    found.append(f"column {name!r} is empty; labels must be 0 or 1" if not raw
                                 else f"column {name!r} holds {raw!r}; labels must be 0 or 1")
            if None not in values:
                row.vector = np.array(values, np.uint8)
                if not row.vector.any():
                    found.append("no label: every class column is 0")
        if layout.split is not None and k == 0:
            value = _text(cell[layout.split]).lower()
            if value in SPLIT_VALUES:
                row.test = value == "test"
            else:
                found.append(f"column {layout.split!r} holds {_text(cell[layout.split])!r}; expected train or test")
        else:  # the --test-labels file holds the test part; a drawn split decides later
            row.test = k == 1
    shown_id = f"image {image_id!r}" if image_id else "image (none)"
    problems += [f"{sheet.where(i)}, {shown_id}: {p}" for p in found]
    return row


def _conventions(sheets: list[Sheet]) -> str:
    words = {"line": "a CSV line is the file's line, the header being line 1",
             "row": "a Parquet row is the data row counted from 1"}
    return "; ".join(words[u] for u in dict.fromkeys(s.unit for s in sheets))


def _fail(problems: list[str], sheets: list[Sheet]) -> None:
    lines = [f"{sheets[0].path}: {len(problems)} problem(s), nothing written ({_conventions(sheets)}):"]
    lines += ["  " + p for p in problems[:MAX_LINES]]
    if len(problems) > MAX_LINES:
        lines.append(f"  ... and {len(problems) - MAX_LINES} more")
    raise NoisyMLTError("\n".join(lines))


def _drawn_split(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The test rows: noisymlt.data.splits.iterative_stratification's held-out rows (each class's test share near
    the fraction), then, for a class left with no training image (a class of one image), its first test image goes
    back to training."""
    from noisymlt.data.splits import iterative_stratification

    test = iterative_stratification(labels, fraction, seed)
    for c in range(labels.shape[1]):
        if labels[:, c].any() and not labels[~test, c].any():
            test[np.flatnonzero(labels[:, c])[0]] = False
    return test


def read_folder(labels: str | Path, images: str | Path, *, classes: list[str] | None = None,
                image_column: str = "image", id_column: str | None = None, labels_column: str | None = None,
                separator: str = " ", split_column: str | None = None, test_labels: str | Path | None = None,
                test_fraction: float | None = None, split_seed: int | None = None) -> dict[str, LabelTable]:
    """Both parts ({"train_source": ..., "test": ...}) of a labels table over an images folder; every row and image
    of both checked first, all problems raised in one NoisyMLTError (one line each)."""
    labels, images = Path(labels), Path(images)
    given = [name for name, value in (("--split-column", split_column), ("--test-labels", test_labels),
                                      ("--test-fraction", test_fraction)) if value is not None]
    if len(given) > 1:
        raise NoisyMLTError(f"{labels}: the test part comes from one of {' / '.join(given)}, not several")
    kind = "column" if split_column else "file" if test_labels else "drawn"
    if kind != "drawn" and split_seed is not None:
        raise NoisyMLTError(f"{labels}: --split-seed applies to a drawn test part only (not with {given[0]})")
    fraction = DEFAULT_TEST_FRACTION if test_fraction is None else float(test_fraction)
    seed = 0 if split_seed is None else int(split_seed)
    if kind == "drawn" and not 0.0 < fraction < 1.0:
        raise NoisyMLTError(f"{labels}: --test-fraction {fraction} must lie strictly between 0 and 1")
    if not separator:
        raise NoisyMLTError(f"{labels}: --separator is empty")
    if classes is not None:
        _check_class_names(classes, "--classes")
    sheets = [read_sheet(labels)] + ([read_sheet(test_labels)] if test_labels is not None else [])
    if not images.is_dir():
        raise NoisyMLTError(f"{images}: the images folder does not exist")
    layout = _layout(sheets, classes, image_column, id_column, labels_column, split_column)
    if layout.classes is not None:
        _check_class_names(layout.classes, str(labels))

    problems: list[str] = []
    rows: list[Row] = []
    seen: dict[str, tuple[int, int]] = {}
    folder = ImageFolder(images)
    for k, sheet in enumerate(sheets):
        for i in range(len(sheet.rows)):
            row = _read_row(sheet, k, i, layout, folder, separator, problems)
            rows.append(row)
            if not row.image_id or i in sheet.bad_width:
                continue
            if row.image_id in seen:
                k0, i0 = seen[row.image_id]
                first = (f"{sheets[k0].unit} {sheets[k0].numbers[i0]}" if k0 == k
                         else f"{sheets[k0].where(i0)}; a test image must not be in the training table")
                problems.append(f"{sheet.where(i)}, image {row.image_id!r}: duplicated image id, also on {first}")
                continue
            seen[row.image_id] = (k, i)
            twice = row.file and folder.claim(row.file, sheet.where(i), row.path)
            if twice:  # another id, the same file: the ids alone would let one image into both parts
                problems.append(f"{sheet.where(i)}, image {row.image_id!r}: {twice}")

    if layout.classes is None:  # list format without --classes: every name found, sorted
        layout.classes = sorted({n for row in rows if row.names for n in row.names})
        _check_class_names(layout.classes, f"{labels}: column {labels_column!r}")
    index = {name: j for j, name in enumerate(layout.classes)}
    for row in rows:
        if row.names is not None:
            row.vector = np.zeros(len(index), np.uint8)
            row.vector[[index[n] for n in row.names]] = 1
    # a class no training image holds cannot be learnt (a drawn split keeps one of each class's images in training);
    # judged once every row's labels and part are known, else a row's bad cell would read as a missing class
    if all(r.vector is not None and r.test is not None for r in rows):
        train = sum((r.vector for r in rows if not r.test), np.zeros(len(index), np.int64))
        test = sum((r.vector for r in rows if r.test), np.zeros(len(index), np.int64))
        for name, j in index.items():
            if train[j] == 0:
                problems.append(f"{labels}: class {name!r} has no training image"
                                + (f" (only {test[j]} in the test part)" if test[j] else " (no image at all)"))
    if layout.labels is None:  # a wide column without a single 0/1 is likelier a column of something else
        k = sheets[0].columns.index
        for name in layout.classes:
            if all(_flag(row[k(name)]) is None for row in sheets[0].rows if len(row) == len(sheets[0].columns)):
                problems.insert(0, f"{labels}: column {name!r} holds no 0/1 value in any row; if it is not a class, "
                                   "name its role (--split-column, --id-column, --image-column)")
    if problems:
        _fail(problems, sheets)

    matrix = np.stack([r.vector for r in rows])
    if kind == "drawn":
        is_test = _drawn_split(matrix, fraction, seed)
    else:
        is_test = np.array([bool(r.test) for r in rows])
    meta: dict = {"source": "folder", "labels_file": labels.name, "split": kind}
    if kind == "column":
        meta["split_column"] = split_column
    elif kind == "file":
        meta["test_labels_file"] = Path(test_labels).name
    else:
        meta.update(test_fraction=fraction, split_seed=seed)
    meta["images"] = {"train_source": int((~is_test).sum()), "test": int(is_test.sum())}
    for part, count in meta["images"].items():
        if count == 0:  # a part without images makes no table a later step can use
            how = {"column": f"no row holds {'test' if part == 'test' else 'train'} in column {split_column!r}",
                   "file": f"{test_labels} holds every row", "drawn": f"the test fraction {fraction} drew "
                   f"{'none' if part == 'test' else 'all'} of {len(rows)} image(s)"}[kind]
            raise NoisyMLTError(f"{labels}: the {part} part would be empty ({how}); each part needs one image or more")
    parts = {}
    for part, chosen in zip(PARTS, (~is_test, is_test)):
        picked = [r for r, keep in zip(rows, chosen) if keep]
        parts[part] = LabelTable(image_ids=[r.image_id for r in picked], classes=list(layout.classes),
                                 labels=matrix[chosen].reshape(len(picked), len(index)),
                                 paths=[r.path for r in picked], meta={**meta, "part": part})
    return parts


def _classes_arg(text: str) -> list[str]:
    return [name.strip() for name in text.split(",")]


def _run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix.lower() != ".parquet":
        raise NoisyMLTError(f"{out}: --out must end in .parquet (a label table is written as Parquet)")
    check_outputs({"--labels": args.labels, "--test-labels": args.test_labels}, {"--out": out})
    parts = read_folder(args.labels, args.images, classes=args.classes, image_column=args.image_column,
                        id_column=args.id_column, labels_column=args.labels_column, separator=args.separator,
                        split_column=args.split_column, test_labels=args.test_labels,
                        test_fraction=args.test_fraction, split_seed=args.split_seed)
    table = parts[args.part]
    write_labels(table, out)
    counts = table.labels.sum(axis=0)
    print(f"{out}: {args.part} part, {len(table)} images ({len(parts['train_source'])} train_source / "
          f"{len(parts['test'])} test, split: {table.meta['split']}), {table.num_classes} classes, "
          f"{int((counts == 0).sum())} class(es) without images in this part")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "parse-folder",
        help="turn a folder of images and a labels table (CSV/Parquet) into a Parquet label table",
        description=(
            "Read a labels table over a folder of images and write one part of it (train_source or test) as a "
            "label table (image_id, path, one 0/1 column per class). Wide tables have one 0/1 column per class "
            "(every column but the image, id and split columns); list tables name the classes in one column "
            "(--labels-column). Every row is checked (image exists and opens, labels, ids) and all problems are "
            "reported at once; nothing is written unless all pass. Run it once per part with the same inputs: "
            "the split is the same in both runs."
        ),
    )
    p.add_argument("--labels", required=True, help="labels table, .csv or .parquet")
    p.add_argument("--images", required=True, help="images folder; the table's image paths are relative to it")
    p.add_argument("--part", required=True, choices=PARTS, help="which part to write")
    p.add_argument("--out", required=True, help="output Parquet file")
    p.add_argument("--classes", type=_classes_arg,
                   help="class names in order, comma-separated (default: wide: the class columns in file order; "
                        "list: the sorted names found)")
    p.add_argument("--image-column", default="image", help="column of image paths (default: image)")
    p.add_argument("--id-column", help="column of image ids (default: the image path without its extension)")
    p.add_argument("--labels-column",
                   help="list format: column of class names, as text separated by --separator or as a Parquet "
                        "list of text; a list written out as text (['cat', 'dog']) is refused (default: wide format)")
    p.add_argument("--separator", default=" ",
                   help="list format: what separates class names (default: a space, runs of blanks count once)")
    test = p.add_mutually_exclusive_group()
    test.add_argument("--split-column", help="column holding train or test for each image")
    test.add_argument("--test-labels", help="a second table, laid out like --labels, holding the test images")
    test.add_argument("--test-fraction", type=float,
                      help=f"draw the test part: this fraction of each class's images, stratified (the default, "
                           f"{DEFAULT_TEST_FRACTION}, when no split column or test table is given)")
    p.add_argument("--split-seed", type=int, help="seed of a drawn test part (default: 0)")
    p.set_defaults(func=_run)
