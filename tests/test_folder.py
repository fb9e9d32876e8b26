"""`noisymlt parse-folder`: a user's folder of images and its labels table, on tiny images the tests draw."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from noisymlt.cli import main
from noisymlt.data import folder
from noisymlt.data.labels import read_labels
from noisymlt.errors import NoisyMLTError

REPO = Path(__file__).resolve().parents[1]


def _image(path: Path, shade: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (shade % 256, 40, 90)).save(path)  # PNG or JPEG by the suffix


def _csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _parse(capsys, *args) -> tuple[int, str, str]:
    rc = main(["parse-folder", *map(str, args)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


WIDE = [  # image, dog, cat, bird (the file's class order, not sorted), split
    ["pets/a.png", 1, 0, 0, "train"],
    ["pets/b.jpg", 0, 1, 1, "train"],
    ["c.png", 1, 1, 0, "test"],
    ["wild/deep/d.jpeg", 0, 0, 1, "train"],
    ["e.png", 1, 0, 1, "test"],
    ["f.png", 0, 1, 0, "train"],
]


@pytest.fixture
def wide(tmp_path):
    images = tmp_path / "images"
    for k, row in enumerate(WIDE):
        _image(images / row[0], 30 * k)
    labels = _csv(tmp_path / "labels.csv", ["image", "dog", "cat", "bird", "split"], WIDE)
    return labels, images


def test_a_wide_table_round_trips_in_its_class_order_with_relative_paths(wide, tmp_path, capsys):
    labels, images = wide
    for part in folder.PARTS:
        rc, out, err = _parse(capsys, "--labels", labels, "--images", images, "--part", part,
                              "--out", tmp_path / f"{part}.parquet", "--split-column", "split")
        assert rc == 0, err
        assert out.count("\n") == 1 and f"{part} part" in out
    train, test = (read_labels(tmp_path / f"{part}.parquet") for part in folder.PARTS)
    assert train.classes == test.classes == ["dog", "cat", "bird"]
    rows = {part: [r for r in WIDE if (r[4] == "test") == (part == "test")] for part in folder.PARTS}
    for table, part in ((train, "train_source"), (test, "test")):
        assert table.paths == [r[0] for r in rows[part]]  # relative to the images folder, table order
        assert table.image_ids == [r[0].rsplit(".", 1)[0] for r in rows[part]]  # "/" kept, extension gone
        assert table.labels.tolist() == [r[1:4] for r in rows[part]]
        assert table.meta == {"classes": ["dog", "cat", "bird"], "source": "folder", "labels_file": "labels.csv",
                              "part": part, "split": "column", "split_column": "split",
                              "images": {"train_source": 4, "test": 2}}


def test_a_parquet_table_with_an_id_column_reads_the_same_and_counts_rows(tmp_path, capsys):
    images = tmp_path / "img"
    frame = pd.DataFrame({"file": ["x.png", "y.png", "z.png"], "key": ["k1", "k2", "k3"],
                          "a": [1, 0, 1], "b": [True, True, False]})
    for name in frame["file"]:
        _image(images / name)
    frame.to_parquet(tmp_path / "labels.parquet")
    parts = folder.read_folder(tmp_path / "labels.parquet", images, image_column="file", id_column="key",
                               test_fraction=0.34)
    both = {i: (p, y) for t in parts.values() for i, p, y in zip(t.image_ids, t.paths, t.labels.tolist())}
    assert both == {"k1": ("x.png", [1, 1]), "k2": ("y.png", [0, 1]), "k3": ("z.png", [1, 0])}
    frame.loc[1, "a"] = 7
    frame.to_parquet(tmp_path / "labels.parquet")
    with pytest.raises(NoisyMLTError, match=r"labels\.parquet row 2, image 'k2': column 'a' holds '7'") as caught:
        folder.read_folder(tmp_path / "labels.parquet", images, image_column="file", id_column="key")
    assert "a Parquet row is the data row counted from 1" in str(caught.value)


@pytest.mark.parametrize("separator,given", [(" ", None), ("|", None), ("|", "zebra,cow,ant")])
def test_a_list_table_round_trips(tmp_path, capsys, separator, given):
    images = tmp_path / "images"
    rows = [["1.png", ["cow"], "train"], ["2.png", ["ant", "zebra"], "train"], ["3.png", ["zebra", "cow"], "test"],
            ["4.png", ["ant"], "train"]]
    for name, *_ in rows:
        _image(images / name)
    spaced = " " if separator == " " else " | "  # blanks around a separator do not count
    labels = _csv(tmp_path / "labels.csv", ["image", "width", "labels", "split"],
                  [[name, 8, spaced.join(names) + ("  " if separator == " " else ""), split]
                   for name, names, split in rows])  # "width": another column, ignored in list format
    args = ["--labels", labels, "--images", images, "--labels-column", "labels", "--separator", separator,
            "--split-column", "split", "--part", "train_source", "--out", tmp_path / "t.parquet"]
    rc, _, err = _parse(capsys, *args, *(["--classes", given] if given else []))
    assert rc == 0, err
    table = read_labels(tmp_path / "t.parquet")
    classes = given.split(",") if given else ["ant", "cow", "zebra"]  # the names found, sorted
    assert table.classes == classes and table.image_ids == ["1", "2", "4"]
    assert table.labels.tolist() == [[int(c in names) for c in classes] for _, names, split in rows if split == "train"]


def _many(tmp_path: Path, n: int = 300) -> tuple[Path, Path, np.ndarray]:
    """n images over 6 classes of falling frequency (the rarest in about 15 images), each image with a label."""
    rng = np.random.default_rng(5)
    y = (rng.random((n, 6)) < np.array([0.5, 0.3, 0.2, 0.12, 0.08, 0.05])).astype(int)
    y[y.sum(1) == 0, 0] = 1
    images = tmp_path / "images"
    for k in range(n):
        _image(images / f"g{k % 7}" / f"{k:03d}.png", k)
    labels = _csv(tmp_path / "labels.csv", ["image", *[f"c{j}" for j in range(6)]],
                  [[f"g{k % 7}/{k:03d}.png", *y[k]] for k in range(n)])
    return labels, images, y


def test_a_drawn_split_is_stratified_deterministic_and_the_two_runs_agree(tmp_path, capsys):
    labels, images, y = _many(tmp_path)
    common = ["--labels", labels, "--images", images, "--test-fraction", "0.2", "--split-seed", "3"]
    for part, out in (("train_source", "train.parquet"), ("test", "test.parquet"), ("test", "again.parquet")):
        rc, _, err = _parse(capsys, *common, "--part", part, "--out", tmp_path / out)
        assert rc == 0, err
    assert (tmp_path / "test.parquet").read_bytes() == (tmp_path / "again.parquet").read_bytes()
    train, test = read_labels(tmp_path / "train.parquet"), read_labels(tmp_path / "test.parquet")
    ids = [f"g{k % 7}/{k:03d}" for k in range(len(y))]
    assert not set(train.image_ids) & set(test.image_ids)
    assert sorted(train.image_ids + test.image_ids) == sorted(ids)
    for part in (train, test):  # each part in the table's order
        assert part.image_ids == [i for i in ids if i in set(part.image_ids)]
        assert part.meta["split"] == "drawn" and part.meta["test_fraction"] == 0.2 and part.meta["split_seed"] == 3
    assert (train.labels.sum(0) >= 2).all() and (test.labels.sum(0) >= 1).all()
    # iterative stratification: every class's test share near the target, not only "some on both sides" (the top-up
    # rule model selection uses held out 0.38 of a 34-image class here, 0.15 of the images)
    share = test.labels.sum(0) / y.sum(0)
    assert np.abs(test.labels.sum(0) - 0.2 * y.sum(0)).max() <= 1.5, share
    assert len(test) / len(y) == pytest.approx(0.2, abs=0.025), share  # rows: what the classes' shares leave over
    # another seed draws another test part
    rc, _, err = _parse(capsys, *common[:-1], "4", "--part", "test", "--out", tmp_path / "other.parquet")
    assert rc == 0 and read_labels(tmp_path / "other.parquet").image_ids != test.image_ids


def test_a_class_with_one_image_keeps_it_in_training():
    y = np.zeros((12, 3), np.uint8)
    y[:, 0] = 1
    y[3, 1] = 1  # one image
    y[5:8, 2] = 1
    for seed in range(20):
        test = folder._drawn_split(y, 0.5, seed)
        assert y[~test].sum(0).min() >= 1 and not test[3]


def test_a_test_labels_file_gives_the_test_part(wide, tmp_path, capsys):
    labels, images = wide
    train_rows = [r[:4] for r in WIDE if r[4] == "train"]
    test_rows = [[r[0], r[3], r[1], r[2]] for r in WIDE if r[4] == "test"]  # its class columns in another order
    _csv(tmp_path / "train.csv", ["image", "dog", "cat", "bird"], train_rows)
    _csv(tmp_path / "test.csv", ["image", "bird", "dog", "cat"], test_rows)
    args = ["--labels", tmp_path / "train.csv", "--test-labels", tmp_path / "test.csv", "--images", images]
    for part in folder.PARTS:
        rc, _, err = _parse(capsys, *args, "--part", part, "--out", tmp_path / f"{part}.parquet")
        assert rc == 0, err
    train, test = (read_labels(tmp_path / f"{part}.parquet") for part in folder.PARTS)
    assert train.paths == [r[0] for r in train_rows] and test.paths == [r[0] for r in test_rows]
    assert test.classes == ["dog", "cat", "bird"] and test.labels.tolist() == [[1, 1, 0], [1, 0, 1]]
    assert test.meta["split"] == "file" and test.meta["test_labels_file"] == "test.csv"
    # a test image that is also a training image: both files and lines named
    _csv(tmp_path / "test.csv", ["image", "bird", "dog", "cat"], [*test_rows, [WIDE[1][0], 1, 0, 1]])
    rc, _, err = _parse(capsys, *args, "--part", "test", "--out", tmp_path / "x.parquet")
    assert rc == 2 and "test.csv line 4, image 'pets/b': duplicated image id, also on " in err
    assert "train.csv line 3; a test image must not be in the training table" in err
    assert not (tmp_path / "x.parquet").exists()


HEADER = ["image", "dog", "cat", "split"]
GOOD = [["a.png", 1, 0, "train"], ["b.png", 0, 1, "train"], ["c.png", 1, 1, "test"]]


def _bad_case(tmp_path: Path, case: str) -> tuple[list, list[str], str, str]:
    """(rows, extra args, where, what): the one bad row's place and the words of its problem."""
    images = tmp_path / "images"
    rows = [list(r) for r in GOOD]
    extra: list[str] = []
    where, what = "line 5", ""
    if case == "missing image":
        rows.append(["gone.png", 1, 0, "train"])
        what = "image 'gone': image file 'gone.png' does not exist"
    elif case == "unreadable image":
        (images / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
        rows.append(["broken.jpg", 1, 0, "train"])
        what = "image 'broken': image file 'broken.jpg' cannot be read as an image"
    elif case == "label not 0/1":
        rows.append(["d.png", 2, 0, "train"])
        what = "image 'd': column 'dog' holds '2'; labels must be 0 or 1"
    elif case == "empty label":
        rows.append(["d.png", "", 1, "train"])
        what = "image 'd': column 'dog' is empty"
    elif case == "no label":
        rows.append(["d.png", 0, 0, "train"])
        what = "image 'd': no label: every class column is 0"
    elif case == "duplicated id":
        rows.append(["b.png", 0, 1, "train"])
        what = "image 'b': duplicated image id, also on line 3"
    elif case == "empty path":
        rows.append(["", 1, 0, "train"])
        what = "image (none): no image path: column 'image' is empty"
    elif case == "absolute path":
        rows.append([str((images / "d.png").resolve()), 1, 0, "train"])
        what = "is absolute; paths are relative to the images folder"
    elif case == "bad split value":
        rows.append(["d.png", 1, 0, "val"])
        what = "image 'd': column 'split' holds 'val'; expected train or test"
    elif case == "wrong field count":
        rows.append(["d.png", 1, 0])
        what = "image 'd': 3 fields where the header line has 4"
    elif case == "path out by ..":
        _image(tmp_path / "outside.png")
        rows.append(["../outside.png", 1, 0, "train"])
        what = "image path '../outside.png' leads outside the images folder"
    elif case == "symlink out":
        _image(tmp_path / "outside.png")
        (images / "link.png").symlink_to(tmp_path / "outside.png")
        rows.append(["link.png", 1, 0, "train"])
        what = "image 'link': image path 'link.png' leads outside the images folder (to "
    elif case == "one file, two spellings in two parts":
        rows.append(["./c.png", 1, 0, "train"])  # c.png is a test image (line 4)
        what = f"image './c': image path './c.png' is the same file as 'c.png' on {tmp_path / 'labels.csv'} line 4"
    elif case == "a link to another row's image":
        (images / "alias.png").symlink_to(images / "a.png")
        rows.append(["alias.png", 1, 0, "test"])
        what = "image 'alias': image path 'alias.png' is the same file as 'a.png' on"
    elif case == "truncated jpeg":
        pixels = np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / "cut.jpg", quality=90)
        whole = (images / "cut.jpg").read_bytes()
        (images / "cut.jpg").write_bytes(whole[:len(whole) * 2 // 3])  # headers whole, scan data cut
        with Image.open(images / "cut.jpg") as image:
            image.verify()  # passes: only a full decode finds it
        rows.append(["cut.jpg", 1, 0, "train"])
        what = "image 'cut': image file 'cut.jpg' cannot be read as an image (OSError: image file is truncated"
    elif case == "a NUL in the path":
        rows.append(["d.png\0", 1, 0, "train"])
        what = "image 'd': image path 'd.png\\x00' holds a NUL character"
    elif case == "a name too long":
        rows.append(["d" * 5000 + ".png", 1, 0, "train"])
        what = "cannot be looked up (File name too long)"
    elif case == "class only in test":
        rows = [["a.png", 1, 0, "train"], ["b.png", 1, 0, "train"], ["c.png", 1, 1, "test"], ["d.png", 0, 1, "test"]]
        where, what = "", "labels.csv: class 'cat' has no training image (only 2 in the test part)"
    return rows, extra, where, what


BAD_CASES = ["missing image", "unreadable image", "label not 0/1", "empty label", "no label", "duplicated id",
             "empty path", "absolute path", "bad split value", "wrong field count", "class only in test",
             "path out by ..", "symlink out", "one file, two spellings in two parts", "a link to another row's image",
             "truncated jpeg", "a NUL in the path", "a name too long"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_a_bad_row_is_named_by_file_line_image_and_problem(tmp_path, capsys, case):
    images = tmp_path / "images"
    for name in ("a.png", "b.png", "c.png", "d.png"):
        _image(images / name)
    rows, extra, where, what = _bad_case(tmp_path, case)
    labels = _csv(tmp_path / "labels.csv", HEADER, rows)
    rc, out, err = _parse(capsys, "--labels", labels, "--images", images, "--split-column", "split",
                          "--part", "train_source", "--out", tmp_path / "t.parquet", *extra)
    assert rc == 2 and out == ""
    problems = [line.strip() for line in err.splitlines()[1:]]
    assert err.startswith("noisymlt parse-folder: error: ") and "labels.csv: 1 problem(s), nothing written" in err
    assert "the header being line 1" in err
    assert len(problems) == 1 and what in problems[0], err
    if where:
        assert problems[0].startswith(f"{labels} {where}, ")
    assert not (tmp_path / "t.parquet").exists()


def test_the_same_file_in_the_test_labels_file_is_refused_naming_both_rows(wide, tmp_path):
    _, images = wide
    labels = _csv(tmp_path / "train.csv", ["image", "dog", "cat", "bird"], [r[:4] for r in WIDE])
    test = _csv(tmp_path / "test.csv", ["image", "dog", "cat", "bird"], [["pets/../c.png", 1, 0, 0]])
    with pytest.raises(NoisyMLTError) as caught:
        folder.read_folder(labels, images, test_labels=test)
    assert (f"{test} line 2, image 'pets/../c': image path 'pets/../c.png' is the same file as 'c.png' on "
            f"{labels} line 4") in str(caught.value)


def test_links_that_stay_inside_the_folder_and_a_linked_folder_are_read(wide, tmp_path, capsys):
    labels, images = wide
    elsewhere = tmp_path / "disk"
    images.rename(elsewhere)
    images.symlink_to(elsewhere)  # the images folder itself a link to another disk: allowed
    (elsewhere / "pets" / "a.png").rename(elsewhere / "real_a.png")
    (elsewhere / "pets" / "a.png").symlink_to(elsewhere / "real_a.png")  # a link inside to a file inside: allowed
    rc, _, err = _parse(capsys, "--labels", labels, "--images", images, "--split-column", "split", "--part",
                        "train_source", "--out", tmp_path / "t.parquet")
    assert rc == 0, err
    assert read_labels(tmp_path / "t.parquet").paths[0] == "pets/a.png"  # the row's spelling is kept


@pytest.mark.parametrize("split,needle", [("train", "the test part would be empty (no row holds test in column "
                                                    "'split')"),
                                          ("test", "has no training image")])
def test_a_parse_that_leaves_a_part_empty_says_so(tmp_path, split, needle):
    images = tmp_path / "images"
    rows = [[f"{k}.png", 1, 0, split] for k in range(3)] + [[f"{k + 3}.png", 0, 1, split] for k in range(3)]
    for row in rows:
        _image(images / row[0])
    labels = _csv(tmp_path / "labels.csv", HEADER, rows)
    with pytest.raises(NoisyMLTError, match=re.escape(needle)):
        folder.read_folder(labels, images, split_column="split")


def test_list_format_names_an_unknown_class_and_an_image_without_labels(tmp_path):
    images = tmp_path / "images"
    for name in ("a.png", "b.png", "c.png"):
        _image(images / name)
    labels = _csv(tmp_path / "labels.csv", ["image", "labels"], [["a.png", "cat|dog"], ["b.png", "dgo"], ["c.png", ""]])
    with pytest.raises(NoisyMLTError) as caught:
        folder.read_folder(labels, images, labels_column="labels", separator="|", classes=["cat", "dog"])
    lines = str(caught.value).splitlines()[1:]
    assert [line.strip() for line in lines] == [
        f"{labels} line 3, image 'b': unknown class 'dgo' in column 'labels' (classes: cat, dog)",
        f"{labels} line 4, image 'c': no label: column 'labels' names no class"]


def test_every_bad_row_is_reported_at_once_and_the_list_is_capped(tmp_path):
    images = tmp_path / "images"
    _image(images / "a.png")
    rows = [["a.png", 1, 0], ["b.png", 1, 0], ["a.png", 0, 1], ["a2.png", 5, 1]]
    labels = _csv(tmp_path / "labels.csv", ["image", "dog", "cat"], rows)
    with pytest.raises(NoisyMLTError) as caught:
        folder.read_folder(labels, images)
    message = str(caught.value)
    assert message.splitlines()[0].startswith(f"{labels}: 4 problem(s)")
    for needle in ("line 3, image 'b': image file 'b.png' does not exist", "line 4, image 'a': duplicated image id, "
                   "also on line 2", "line 5, image 'a2': image file 'a2.png' does not exist",
                   "line 5, image 'a2': column 'dog' holds '5'"):
        assert needle in message
    many = _csv(tmp_path / "many.csv", ["image", "dog"], [[f"m{k}.png", 1] for k in range(60)])
    with pytest.raises(NoisyMLTError) as caught:
        folder.read_folder(many, images)
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 + folder.MAX_LINES + 1 and lines[-1].strip() == "... and 10 more"


@pytest.mark.parametrize("case,needle", [
    ("missing file", "labels.csv: labels file does not exist"),
    ("suffix", "labels.txt: a labels file must end in .csv or .parquet"),
    ("bad parquet", "labels.parquet: cannot read the Parquet table"),
    ("no image column", "labels.csv: no column 'image' (--image-column); the columns are file, dog"),
    ("header twice", "labels.csv: column(s) ['dog'] appear more than once"),
    ("not utf-8", "labels.csv: not UTF-8 text"),
    ("no rows", "labels.csv: the table has a header but no image rows"),
    ("reserved class", "class name(s) ['image_id'] cannot be used"),
    ("split seed with column", "--split-seed applies to a drawn test part only"),
])
def test_a_bad_file_or_option_is_one_clear_error(tmp_path, case, needle):
    images = tmp_path / "images"
    _image(images / "a.png")
    labels = tmp_path / "labels.csv"
    kwargs: dict = {}
    if case == "suffix":
        labels = tmp_path / "labels.txt"
        labels.write_text("image,dog\na.png,1\n")
    elif case == "bad parquet":
        labels = tmp_path / "labels.parquet"
        labels.write_bytes(b"PAR1 but not really")
    elif case == "no image column":
        labels.write_text("file,dog\na.png,1\n")
    elif case == "header twice":
        labels.write_text("image,dog,dog\na.png,1,1\n")
    elif case == "not utf-8":
        labels.write_bytes("image,chien\xe9\na.png,1\n".encode("latin-1"))
    elif case == "no rows":
        labels.write_text("image,dog\n")
    elif case == "reserved class":
        labels.write_text("image,image_id,dog\na.png,x,1\n")
    elif case == "split seed with column":
        labels.write_text("image,dog,split\na.png,1,train\n")
        kwargs = {"split_column": "split", "split_seed": 1}
    with pytest.raises(NoisyMLTError) as caught:
        folder.read_folder(labels, images, **kwargs)
    assert needle in str(caught.value)


def test_a_failed_run_leaves_an_existing_output_untouched_and_no_temp_file(wide, tmp_path, capsys):
    labels, images = wide
    out = tmp_path / "t.parquet"
    out.write_bytes(b"the previous table")
    (images / WIDE[2][0]).unlink()
    rc, _, err = _parse(capsys, "--labels", labels, "--images", images, "--split-column", "split",
                        "--part", "train_source", "--out", out)
    assert rc == 2 and "labels.csv line 4, image 'c': image file 'c.png' does not exist" in err
    assert out.read_bytes() == b"the previous table"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "labels.csv", "t.parquet"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_an_interrupted_write_leaves_neither_output_nor_temp_file(wide, tmp_path, capsys, monkeypatch, stop):
    import pyarrow.parquet as pq

    labels, images = wide

    def half_written(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half")
        raise stop(28, "No space left on device", str(where)) if stop is OSError else stop()

    monkeypatch.setattr(pq, "write_table", half_written)
    out = tmp_path / "out" / "t.parquet"
    rc, _, err = _parse(capsys, "--labels", labels, "--images", images, "--split-column", "split",
                        "--part", "test", "--out", out)
    assert rc == (130 if stop is KeyboardInterrupt else 2), err
    assert list((tmp_path / "out").iterdir()) == []


def test_the_command_runs_from_the_command_line(wide, tmp_path):
    labels, images = wide
    out = tmp_path / "test.parquet"
    proc = subprocess.run([sys.executable, "-m", "noisymlt", "parse-folder", "--labels", str(labels), "--images",
                           str(images), "--part", "test", "--out", str(out), "--split-column", "split"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{out}: test part, 2 images (4 train_source / 2 test, split: column)")
    assert read_labels(out).image_ids == ["c", "e"]


def test_model_selection_splits_with_the_data_layers_stratified_split():
    from noisymlt.data import splits
    from noisymlt.pipeline import selection

    assert selection.stratified_split is splits.stratified_split


def test_iterative_stratification_keeps_every_class_near_its_share_where_the_top_up_rule_overshoots():
    from noisymlt.data.splits import iterative_stratification, stratified_split

    rng = np.random.default_rng(0)
    y = (rng.random((2000, 12)) < np.geomspace(0.4, 0.01, 12)).astype(np.uint8)
    held = iterative_stratification(y, 0.25, seed=1)
    assert np.abs(y[held].sum(0) - 0.25 * y.sum(0)).max() <= 1.5
    assert held.mean() == pytest.approx(0.25, abs=0.02)
    assert (held == iterative_stratification(y, 0.25, seed=1)).all()
    assert (held != iterative_stratification(y, 0.25, seed=2)).any()
    top_up, _ = stratified_split([y], 0.25, 1)  # the rule that only promises both sides
    assert np.abs(y[top_up].sum(0) - 0.25 * y.sum(0)).max() > 5



def test_iterative_folds_put_each_row_in_one_fold_and_each_class_near_its_share():
    """K folds (cross-fitting's): every row in exactly one, each fold near 1/K of the rows and of each class's
    positives; two subsets are iterative_stratification's held-out mask."""
    from noisymlt.data.splits import iterative_folds, iterative_stratification

    rng = np.random.default_rng(0)
    y = (rng.random((2000, 12)) < np.geomspace(0.4, 0.01, 12)).astype(np.uint8)
    folds = iterative_folds(y, [0.2] * 5, seed=1)
    assert set(np.unique(folds)) == set(range(5)) and len(folds) == len(y)
    assert np.abs(np.bincount(folds) - 400).max() <= 2
    per_fold = np.stack([y[folds == k].sum(0) for k in range(5)])
    assert np.abs(per_fold - 0.2 * y.sum(0)).max() <= 1.5
    assert (iterative_folds(y, [0.25, 0.75], seed=1) == 0).tolist() == iterative_stratification(y, 0.25, 1).tolist()

def test_a_parquet_list_column_reads_as_the_same_table_as_its_text_form(tmp_path):
    """issue 70: a Parquet list column's cells were read as their text, ``['cat',`` a class."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = tmp_path / "images"
    names = [["cat"], ["cat", "dog"], ["bird"], ["dog", "bird", "dog"], ["cat", "bird"]]
    files = [f"{k}.png" for k in range(len(names))]
    for k, name in enumerate(files):
        _image(images / name, 40 * k)
    pq.write_table(pa.table({"image": files, "tags": pa.array(names, pa.list_(pa.string()))}),
                   tmp_path / "l.parquet")
    _csv(tmp_path / "l.csv", ["image", "tags"], [[f, " ".join(n)] for f, n in zip(files, names)])
    read = [folder.read_folder(tmp_path / f"l.{ext}", images, labels_column="tags", test_fraction=0.4)
            for ext in ("parquet", "csv")]
    for part in folder.PARTS:
        listed, text = (r[part] for r in read)
        assert listed.classes == text.classes == ["bird", "cat", "dog"]
        assert listed.image_ids == text.image_ids and listed.labels.tolist() == text.labels.tolist()
    both = {i: y for t in read[0].values() for i, y in zip(t.image_ids, t.labels.tolist())}
    assert both == {str(k): [int(c in n) for c in ("bird", "cat", "dog")] for k, n in enumerate(names)}


@pytest.mark.parametrize("cells,arrow,needle", [
    (["cat", "['cat', 'dog']"], None,
     "line 3, image '1': column 'tags' holds \"['cat', 'dog']\", a list written as text"),
    (["cat", '["cat"]'], None, "line 3, image '1': column 'tags' holds '[\"cat\"]', a list written as text"),
    (["cat", "'cat' 'dog'"], None, "line 3, image '1': column 'tags' holds \"'cat' 'dog'\", a list written as text"),
    ([["cat"], ["dog"]], "list<list<string>>", "row 1, image '0': column 'tags' holds a list with ['cat'] (list)"),
    ([[1], [3]], "list<int64>", "row 1, image '0': column 'tags' holds a list with 1 (int); a list cell holds"),
    ([1, 2], "int64", "row 1, image '0': column 'tags' holds 1 (int); a labels column holds text naming the classes"),
])
def test_a_labels_column_of_another_form_is_refused_naming_file_column_and_row(tmp_path, cells, arrow, needle):
    """issue 70: text (CSV cells, or a Parquet string column) or a Parquet list of text; nothing else."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = tmp_path / "images"
    files = [f"{k}.png" for k in range(len(cells))]
    for name in files:
        _image(images / name)
    if arrow is None:
        labels = _csv(tmp_path / "l.csv", ["image", "tags"], [[f, c] for f, c in zip(files, cells)])
    else:
        types = {"int64": pa.int64(), "list<int64>": pa.list_(pa.int64()),
                 "list<list<string>>": pa.list_(pa.list_(pa.string()))}
        if arrow == "list<list<string>>":
            cells = [[c] for c in cells]
        labels = tmp_path / "l.parquet"
        pq.write_table(pa.table({"image": files, "tags": pa.array(cells, types[arrow])}), labels)
    with pytest.raises(NoisyMLTError) as caught:
        folder.read_folder(labels, images, labels_column="tags", test_fraction=0.5)
    assert f"{labels} {needle}" in str(caught.value), str(caught.value)
