"""The commands that use a finished run (predict, export, suspects, detection-table), fuzzed as
tests/test_user_files.py fuzzes the readers: whatever a run folder, an image folder, a list, a record or a setting
holds, the command exits non-zero with one line that names the file or the setting, never a traceback; nothing it
read changes, and nothing is left under an output's name.

On conftest's tiny_runs_project (a finished run of each method family), in this process through the CLI's main(),
as `python -m noisymlt` calls it: a subprocess a case would import torch again. The images' stated conversions
(noisymlt.inference.images) are checked by outcome: each converted file scores exactly as the 8-bit RGB picture
the docstring says it becomes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import copy_build, tool_env

RUN = "runs/toy/g0.5/s0/{}"
IMAGES = "data/raw/toy/VOCdevkit/TOY"
JPEG = f"{IMAGES}/JPEGImages/000601.jpg"


@pytest.fixture(scope="module")
def project(tiny_runs_project, tmp_path_factory):
    return copy_build(tiny_runs_project, tmp_path_factory.mktemp("after_training") / "project")


@pytest.fixture
def inside(project, monkeypatch):
    monkeypatch.chdir(project)
    return project


def _state(*roots: Path) -> dict:
    """Every file under ROOTS by (size, mtime, inode): a write, a replacement or a new file shows."""
    out = {}
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                out[path] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def _call(capsys, *argv) -> tuple[int, str]:
    try:
        status = __import__("noisymlt.cli", fromlist=["main"]).main([str(a) for a in argv])
    except SystemExit as exc:  # argparse: a setting refused at the command line
        status = exc.code
    return status, capsys.readouterr().err


def _refused(status: int, err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if "error" in line]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header declares WIDTH x HEIGHT and that holds one empty data chunk: a decompression bomb's
    declaration without its payload."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) +
                     chunk(b"IEND", b""))


# ------------------------------------------------------------------ images: one line each, or a stated conversion
def _bad_images(folder: Path, project: Path, outside: Path) -> dict:
    """case -> (what to put in FOLDER, a word of its one line)."""
    real = (project / JPEG).read_bytes()

    def link(target):
        return lambda p: os.symlink(target, p)

    def fifo(p):
        os.mkfifo(p)

    return {
        "empty": (lambda p: p.with_suffix(".jpg").write_bytes(b""), "corrupt or unreadable"),
        "truncated": (lambda p: p.with_suffix(".jpg").write_bytes(real[: len(real) // 2]), "corrupt or unreadable"),
        "garbage": (lambda p: p.with_suffix(".png").write_bytes(bytes(range(256)) * 4), "corrupt or unreadable"),
        "bomb, over twice the limit": (lambda p: _png_header_only(p.with_suffix(".png"), 40000, 40000), "refused"),
        "bomb, over the limit": (lambda p: _png_header_only(p.with_suffix(".png"), 10000, 10000), "refused"),
        "32-bit integers": (lambda p: Image.new("I", (8, 8), 70000).save(p.with_suffix(".tif")), "32-bit integer"),
        "floats": (lambda p: Image.new("F", (8, 8), 0.5).save(p.with_suffix(".tif")), "floating-point"),
        "a link out": (lambda p: link(outside)(p.with_suffix(".jpg")), "leads outside"),
        "a link up and out": (lambda p: link("../../outside.jpg")(p.with_suffix(".jpg")), "leads outside"),
        "a link to itself": (lambda p: link(p.with_suffix(".jpg").name)(p.with_suffix(".jpg")), "leads to no file"),
        "a dangling link": (lambda p: link("gone.jpg")(p.with_suffix(".jpg")), "leads to no file"),
        "a fifo": (lambda p: fifo(p.with_suffix(".jpg")), "not a regular file"),
    }


CASES = ["empty", "truncated", "garbage", "bomb, over twice the limit", "bomb, over the limit", "32-bit integers",
         "floats", "a link out", "a link up and out", "a link to itself", "a dangling link", "a fifo"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_image_in_a_folder_is_one_line(inside, tmp_path, capsys, case):
    outside = tmp_path / "outside.jpg"
    shutil.copy(inside / JPEG, outside)
    folder = tmp_path / "in" / "images"
    folder.mkdir(parents=True)
    shutil.copy(inside / JPEG, folder / "good.jpg")
    make, says = _bad_images(folder, inside, outside)[case]
    make(folder / "bad")
    before = _state(inside / "runs", tmp_path)
    status, err = _call(capsys, "predict", "--run", RUN.format("erm"), "--images", folder, "--out",
                        tmp_path / "o.csv", "--no-progress")
    _refused(status, err, "bad.", says)
    assert _state(inside / "runs", tmp_path) == before


def test_each_stated_conversion_scores_as_the_rgb_picture_it_states(inside, tmp_path, capsys):
    """Grey, bilevel, RGBA, LA, palette with transparency, CMYK, 16-bit grey and an animation's first frame, each
    beside the 8-bit RGB PNG the docstring says it becomes: equal scores, row by row. A link to a folder (here a
    loop) is not entered."""
    rgb = np.asarray(Image.open(inside / JPEG).convert("RGB"))
    grey = np.asarray(Image.fromarray(rgb).convert("L"))
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    alpha = rng.integers(0, 256, grey.shape, dtype=np.uint8)
    grey16 = grey.astype(np.uint16) * 257 + rng.integers(-128, 128, grey.shape).clip(0).astype(np.uint16)
    frames = [Image.fromarray(rgb).quantize(16), Image.fromarray(255 - rgb).quantize(16)]
    pairs = {  # name -> (the file as written, the RGB array it must score as)
        "grey": (lambda p: Image.fromarray(grey).save(p.with_suffix(".png")), np.stack([grey] * 3, -1)),
        "bilevel": (lambda p: Image.fromarray(grey > 127).save(p.with_suffix(".png")),
                    np.stack([np.where(grey > 127, 255, 0).astype(np.uint8)] * 3, -1)),
        "rgba": (lambda p: Image.fromarray(np.dstack([rgb, alpha])).save(p.with_suffix(".png")), rgb),
        "la": (lambda p: Image.fromarray(np.dstack([grey, alpha]), "LA").save(p.with_suffix(".png")),
               np.stack([grey] * 3, -1)),
        "cmyk": (lambda p: Image.fromarray(rgb).convert("CMYK").save(p.with_suffix(".tif")), rgb),
        "grey16": (lambda p: Image.fromarray(grey16).save(p.with_suffix(".png")),
                   np.stack([np.round(grey16.astype(float) * 255 / 65535).astype(np.uint8)] * 3, -1)),
        "animated": (lambda p: frames[0].save(p.with_suffix(".gif"), save_all=True, append_images=frames[1:]),
                     np.asarray(frames[0].convert("RGB"))),
    }
    palette = Image.fromarray(rgb).quantize(8)
    palette.info["transparency"] = 0
    pairs["palette"] = (lambda p: palette.save(p.with_suffix(".png")), np.asarray(palette.convert("RGB")))
    for name, (write, expected) in pairs.items():
        write(folder / f"{name}_as_written")
        Image.fromarray(expected).save(folder / f"{name}_as_stated.png")
    with Image.open(folder / "grey16_as_written.png") as written:
        assert written.mode == "I;16"  # PIL's own conversion would clip it to white
    os.symlink("..", folder / "loop")  # a link to a folder, a loop: not entered
    out = tmp_path / "o.csv"
    status, err = _call(capsys, "predict", "--run", RUN.format("erm"), "--images", folder, "--out", out,
                        "--no-progress")
    assert status == 0, err[-3000:]
    rows = {r.split(",")[0]: r.split(",")[2:-1] for r in out.read_text().splitlines()[1:]}
    assert len(rows) == 2 * len(pairs)
    for name in pairs:
        written = next(k for k in rows if k.startswith(f"{name}_as_written"))
        assert rows[written] == rows[f"{name}_as_stated.png"], name
    grey_scores = np.array(rows["grey_as_stated.png"], dtype=float)
    assert not np.array_equal(grey_scores, np.array(rows["rgba_as_stated.png"], dtype=float))  # the pairs differ


# ------------------------------------------------------------------ lists and label tables: paths stay inside
def _list_cases(tmp_path: Path, project: Path) -> dict:
    folder = tmp_path / "listed"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(project / JPEG, folder / "sub" / "good.jpg")
    shutil.copy(project / JPEG, tmp_path / "outside.jpg")
    return {
        "an absolute path": (f"sub/good.jpg\n{tmp_path / 'outside.jpg'}\n", "line 2", "is absolute"),
        "a way out": ("sub/good.jpg\n# a comment\n../outside.jpg\n", "line 3", "leads outside"),
        "a link out": (None, "line 1", "leads outside"),
        "a missing file": ("sub/good.jpg\nsub/gone.jpg\n", "line 2", "no such file"),
        "a folder": ("sub\n", "line 1", "not a regular file"),
        "a NUL": ("sub/good.jpg\x00\n", "line 1", "NUL"),
        "nothing": ("# only a comment\n\n", "lists no image", ""),
        "not UTF-8": (b"sub/caf\xe9.jpg\n", "not UTF-8", ""),
    }


@pytest.mark.parametrize("case", ["an absolute path", "a way out", "a link out", "a missing file", "a folder",
                                  "a NUL", "nothing", "not UTF-8"])
def test_a_bad_image_list_is_one_line_naming_its_line(inside, tmp_path, capsys, case):
    content, where, says = _list_cases(tmp_path, inside)[case]
    listing = tmp_path / "listed" / "images.txt"
    if content is None:
        os.symlink(tmp_path / "outside.jpg", tmp_path / "listed" / "out.jpg")
        content = "out.jpg\n"
    listing.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _state(inside / "runs", tmp_path)
    status, err = _call(capsys, "predict", "--run", RUN.format("erm"), "--list", listing, "--out", tmp_path / "o.csv",
                        "--no-progress")
    _refused(status, err, str(listing), where, says)
    assert _state(inside / "runs", tmp_path) == before


def test_a_label_tables_paths_stay_inside_its_images_folder(inside, tmp_path, capsys):
    from noisymlt.data.labels import read_labels, write_labels

    table = read_labels(inside / "data/toy/test_labels.parquet")
    table.paths = ["../../../../../outside.jpg", *table.paths[1:]]
    write_labels(table, tmp_path / "t.parquet")
    status, err = _call(capsys, "predict", "--run", RUN.format("erm"), "--labels", tmp_path / "t.parquet", "--images",
                        inside / IMAGES, "--out", tmp_path / "o.csv", "--no-progress")
    _refused(status, err, "t.parquet", repr(str(table.image_ids[0])), "leads outside")


# ------------------------------------------------------------------ a run folder: damaged, foreign, pointing out
def _damage(run: Path, project: Path) -> dict:
    def edit_manifest(change):
        def apply():
            record = json.loads((run / "manifest.json").read_text())
            change(record)
            (run / "manifest.json").write_text(json.dumps(record))
        return apply

    def flip():
        data = bytearray((run / "checkpoint.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (run / "checkpoint.pt").write_bytes(bytes(data))

    return {
        "manifest not JSON": (lambda: (run / "manifest.json").write_bytes(b"\xff{"), "cannot read it as JSON"),
        "manifest a list": (lambda: (run / "manifest.json").write_text("[1]"), "holds a list"),
        "an absolute input": (edit_manifest(lambda r: r["inputs"]["split"].update(path="/etc/passwd")),
                              "outside the project"),
        "an input up and out": (edit_manifest(lambda r: r["inputs"]["train_labels"].update(
            path="data/../../x.parquet")), "outside the project"),
        "an input without a path": (edit_manifest(lambda r: r["inputs"].update(split=5)), "records no usable path"),
        "a config without train": (lambda: (run / "run_config.json").write_text('{"method": "erm"}'),
                                   "no 'train' block"),
        "a truncated checkpoint": (lambda: (run / "checkpoint.pt").write_bytes(
            (run / "checkpoint.pt").read_bytes()[:4096]), "damaged checkpoint"),
        "a flipped byte": (flip, "damaged checkpoint"),
        "another run's checkpoint": (lambda: shutil.copy(project / RUN.format("erm").replace("s0", "s1") /
                                                         "checkpoint.pt", run / "checkpoint.pt"), "belongs to run"),
        "another checkpoint than the manifest's": (edit_manifest(lambda r: r.update(
            checkpoint_content_sha256="0" * 64)), "not the checkpoint the run's manifest records"),
        "predictions garbage": (lambda: (run / "predictions.npz").write_bytes(b"PK\x03\x04 no zip"),
                                "cannot read its heads"),
    }


RUN_CASES = ["manifest not JSON", "manifest a list", "an absolute input", "an input up and out",
             "an input without a path", "a config without train", "a truncated checkpoint", "a flipped byte",
             "another run's checkpoint", "another checkpoint than the manifest's", "predictions garbage"]


@pytest.mark.parametrize("case,command", [*((case, "predict") for case in RUN_CASES),  # one loader for the three:
                                          ("a flipped byte", "export"), ("an absolute input", "export"),
                                          ("a flipped byte", "suspects"), ("an input up and out", "suspects")])
def test_a_damaged_or_foreign_run_is_refused_in_one_line(inside, tmp_path, capsys, case, command):
    run = inside / RUN.format(f"erm_{RUN_CASES.index(case)}_{command}")
    shutil.copytree(inside / RUN.format("erm"), run)
    try:
        damage, says = _damage(run, inside)[case]
        damage()
        folder = tmp_path / "images"
        folder.mkdir()
        shutil.copy(inside / JPEG, folder / "one.jpg")
        before = _state(run, tmp_path, inside / "data")
        argv = {"predict": ["predict", "--run", run, "--images", folder, "--out", tmp_path / "o.csv", "--no-progress"],
                "export": ["export", "--run", run, "--out", tmp_path / "exported", "--formats", "torchscript"],
                "suspects": ["suspects", "--run", run, "--out", tmp_path / "s.csv"]}[command]
        status, err = _call(capsys, *argv)
        _refused(status, err, says)
        assert _state(run, tmp_path, inside / "data") == before
        assert not list((tmp_path / "exported").glob("*")) if (tmp_path / "exported").exists() else True
    finally:
        shutil.rmtree(run)


# ------------------------------------------------------------------ outputs and settings
def test_outputs_are_never_inputs_nor_in_the_run_folder_and_settings_are_checked(inside, tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(inside / JPEG, folder / "one.jpg")
    listing = tmp_path / "list.csv"  # a list may have any name, .csv too
    listing.write_text("images/one.jpg\n")
    run = RUN.format("erm")
    record = inside / "reports/suspects/toy/g0.5_s0_erm.json"
    records = sorted(str(p) for p in (inside / "reports/suspects/toy").glob("*.json"))
    clean = tmp_path / "clean.csv"
    clean.write_text("image_id,a,b\ni0,1,0\n")
    predict = ["predict", "--run", run, "--images", folder, "--no-progress"]
    cases = {
        "predict --out in the run folder": ([*predict, "--out", f"{run}/manifest.csv"], "lies in the run folder"),
        "predict --out is the list": (["predict", "--run", run, "--list", listing, "--out", listing],
                                      "never replaces an input"),
        "predict --out of another kind": ([*predict, "--out", tmp_path / "o.txt"], "a .csv or .parquet file"),
        "predict --batch-size 0": ([*predict, "--out", tmp_path / "o.csv", "--batch-size", "0"], "at least 1"),
        "predict --batch-size -3": ([*predict, "--out", tmp_path / "o.csv", "--batch-size", "-3"], "at least 1"),
        "predict --batch-size 1.5": ([*predict, "--out", tmp_path / "o.csv", "--batch-size", "1.5"],
                                     "not a whole number"),
        "predict --threshold 0": ([*predict, "--out", tmp_path / "o.csv", "--threshold", "0"], "outside (0, 1)"),
        "predict --threshold 1": ([*predict, "--out", tmp_path / "o.csv", "--threshold", "1"], "outside (0, 1)"),
        "predict --threshold nan": ([*predict, "--out", tmp_path / "o.csv", "--threshold", "nan"], "outside (0, 1)"),
        "predict --threshold high": ([*predict, "--out", tmp_path / "o.csv", "--threshold", "high"], "train-f1"),
        "export --out the run folder": (["export", "--run", run, "--out", run], "lies in the run folder"),
        "export --out a file": (["export", "--run", run, "--out", listing, "--formats", "torchscript"],
                                "export writes a folder"),
        "suspects --out in the run folder": (["suspects", "--run", run, "--out", f"{run}/x.csv"],
                                             "lies in the run folder"),
        "suspects --out is the clean labels": (["suspects", "--run", run, "--out", clean, "--clean-labels", clean],
                                               "never replaces an input"),
        "suspects --out of another kind": (["suspects", "--run", run, "--out", tmp_path / "s.json"], "a .csv file"),
        "suspects, a run and two --out": (["suspects", "--run", run, "--out", tmp_path / "a.csv", tmp_path / "b.csv"],
                                          "one table a run"),
        "suspects --clean-labels of other classes": (["suspects", "--run", run, "--out", tmp_path / "s.csv",
                                                      "--clean-labels", clean], "clean.csv"),
        "detection-table --out's .md is a record": (["detection-table", "--records", *records, tmp_path / "d.md",
                                                     "--out", tmp_path / "d.tex"], "never replaces an input"),
        "detection-table --out not .tex": (["detection-table", "--records", *records, "--out", tmp_path / "d.md"],
                                           "a .tex file"),
    }
    shutil.copy(record, tmp_path / "d.md")  # a record of any name
    for what, (argv, says) in cases.items():
        before = _state(inside / "runs", inside / "reports", tmp_path)
        status, err = _call(capsys, *argv)
        assert status == 2, (what, err[-2000:])
        _refused(status, err, says)
        assert _state(inside / "runs", inside / "reports", tmp_path) == before, what


# ------------------------------------------------------------------ detection-table: records and labels fuzzed
def _record(project: Path) -> dict:
    return json.loads((project / "reports/suspects/toy/g0.5_s0_erm.json").read_text())


def _detection_cases(project: Path) -> dict:
    good = _record(project)

    def edited(change):
        record = json.loads(json.dumps(good))
        change(record)
        return json.dumps(record)

    return {
        "empty": ("", "cannot read a suspects record"),
        "not UTF-8": (b"\xff\xfe{", "cannot read a suspects record"),
        "a list": ("[]", "holds a list"),
        "a number": ("5", "holds a number"),
        "no scorers": (edited(lambda r: r.pop("scorers")), "no 'scorers'"),
        "gamma text": (edited(lambda r: r.update(gamma="half")), "must be numbers"),
        "seed null": (edited(lambda r: r.update(seed=None)), "must be numbers"),
        "scorers a list": (edited(lambda r: r.update(scorers=[1])), "'scorers' must map"),
        "an untitled scorer": (edited(lambda r: r["scorers"]["model"].pop("title")), "has no 'title'"),
        "no detection": (edited(lambda r: r["scorers"]["model"].pop("detection")), "--clean-labels"),
        "detection text": (edited(lambda r: r["scorers"]["model"]["detection"].update(ap="0.5")), "ap must be"),
        "detection NaN": (edited(lambda r: r["scorers"]["model"]["detection"].update(ap=float("nan"))), "ap must be"),
        "detection short": (edited(lambda r: r["scorers"]["model"]["detection"].pop("wrong")), "must hold"),
        "a duplicate run": (json.dumps(good), "the same run as"),
    }


@pytest.mark.parametrize("case", ["empty", "not UTF-8", "a list", "a number", "no scorers", "gamma text", "seed null",
                                  "scorers a list", "an untitled scorer", "no detection", "detection text",
                                  "detection NaN", "detection short", "a duplicate run"])
def test_a_bad_suspects_record_is_one_line(inside, tmp_path, capsys, case):
    content, says = _detection_cases(inside)[case]
    bad = tmp_path / "bad.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    records = sorted(str(p) for p in (inside / "reports/suspects/toy").glob("*.json"))
    before = _state(inside / "reports", tmp_path)
    status, err = _call(capsys, "detection-table", "--records", *records, bad, "--out", tmp_path / "d.tex")
    _refused(status, err, "bad.json", says)
    assert _state(inside / "reports", tmp_path) == before


@pytest.mark.parametrize("labels,says", [("{not json", "not JSON"), ("[1, 2]", "must be text"),
                                         ('{"erm": 5}', "must be text")])
def test_bad_method_labels_are_one_line(inside, tmp_path, capsys, labels, says):
    records = sorted(str(p) for p in (inside / "reports/suspects/toy").glob("*.json"))
    status, err = _call(capsys, "detection-table", "--records", *records, "--out", tmp_path / "d.tex", "--labels",
                        labels)
    _refused(status, err, "--labels", says)
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ written whole or not at all
def test_an_interrupted_write_leaves_no_output_and_the_earlier_one_whole(inside, tmp_path, capsys, monkeypatch):
    """Interrupted (Ctrl-C) while writing its last file, a command leaves none of its new files under their names
    and no temporary file, and an earlier output stays as it was: predict's table and record, export's models and
    model.json, detection-table's .tex, .md and .csv."""
    import noisymlt.core.files as files
    import noisymlt.report.detection as detection

    folder = tmp_path / "images"
    folder.mkdir()
    shutil.copy(inside / JPEG, folder / "one.jpg")
    records = sorted(str(p) for p in (inside / "reports/suspects/toy").glob("*.json"))
    commands = {
        "predict": (["predict", "--run", RUN.format("erm"), "--images", folder, "--out", tmp_path / "o.csv",
                     "--no-progress"], files, "write_json"),
        "export": (["export", "--run", RUN.format("erm"), "--out", tmp_path / "exported", "--formats", "torchscript",
                    "exported_program"], files, "write_json"),
        "detection-table": (["detection-table", "--records", *records, "--out", tmp_path / "d.tex"], detection,
                            "_write_csv"),
    }

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    for name, (argv, module, last) in commands.items():
        assert _call(capsys, *argv)[0] == 0, name  # an earlier, whole output
        before = _state(tmp_path)
        with monkeypatch.context() as patched:
            patched.setattr(module, last, interrupt)
            status, err = _call(capsys, *argv)
        assert status == 130 and "interrupted" in err, (name, err[-2000:])
        assert _state(tmp_path) == before, name  # nothing new, nothing replaced, no temporary file left


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_killed_predict_leaves_nothing_under_the_outputs_names(project, tmp_path, how):
    """A process stopped while it scores (Ctrl-C, or killed outright): no table, no record."""
    folder = tmp_path / "images"
    folder.mkdir()
    for k in range(400):
        shutil.copy(project / JPEG, folder / f"{k:03d}.jpg")
    out = tmp_path / "o.csv"
    proc = subprocess.Popen([sys.executable, "-m", "noisymlt", "predict", "--run", RUN.format("ours"), "--images",
                             str(folder), "--out", str(out), "--batch-size", "1"], cwd=project,
                            env=tool_env(project), stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.monotonic() + 300
    while "predict:" not in seen and time.monotonic() < deadline:  # tqdm's bar: the scoring has begun
        char = proc.stderr.read(1)
        assert char, f"predict ended before it scored: {seen[-2000:]}"  # end of its output: it exited
        seen += char
    proc.send_signal(how)
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == (130 if how == signal.SIGINT else -signal.SIGKILL), seen + rest
    assert "Traceback" not in rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


# ------------------------------------------------------------------ an export used with torch alone, or ONNX alone
CONSUMER = r'''
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
ALONE = sys.argv[1]
for name in ("noisymlt", "torchvision", "onnx", "onnxscript") + (("torch",) if ALONE == "onnxruntime" else ()):
    sys.modules[name] = None  # importing it fails: this Python has only what the export says it needs
spec = json.loads(Path(sys.argv[2], "model.json").read_text())
t = spec["transform"]
files = [Path(p) for p in sys.argv[4:]]
rows = [np.asarray(Image.open(p).convert("RGB").resize((t["cache_size"],) * 2, Image.BILINEAR)) for p in files]
batch = np.stack(rows).transpose(0, 3, 1, 2)
if ALONE == "torch":
    import torch
    x = torch.nn.functional.interpolate(torch.from_numpy(batch.copy()), size=[t["image_size"]] * 2, mode="bilinear",
                                        antialias=True, align_corners=False).float()
    x = (x - torch.tensor(t["mean"]).view(1, 3, 1, 1)) / torch.tensor(t["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        scores = torch.jit.load(str(Path(sys.argv[2], spec["files"]["torchscript"]["file"])))(x).numpy()
else:
    import onnxruntime
    x = np.stack([np.asarray(Image.fromarray(r).resize((t["image_size"],) * 2, Image.BILINEAR)) for r in rows])
    x = (x.transpose(0, 3, 1, 2).astype(np.float32) - np.float32(t["mean"])[None, :, None, None]) \
        / np.float32(t["std"])[None, :, None, None]
    session = onnxruntime.InferenceSession(str(Path(sys.argv[2], spec["files"]["onnx"]["file"])),
                                           providers=["CPUExecutionProvider"])
    scores = session.run(None, {spec["input"]["name"]: x.astype(np.float32)})[0]
np.save(sys.argv[3], scores)
'''


def test_an_export_runs_with_torch_alone_or_onnxruntime_alone_and_gives_predicts_scores(project, tmp_path):
    """A clean Python (-I: no project on the path; noisymlt and torchvision unimportable, and torch too for ONNX)
    follows model.json's words on new images: with torch alone, TorchScript gives predict's scores within its
    stated tolerance; with ONNX Runtime alone (PIL for the last resize, as model.json's without_torch says), within
    the tolerance the export states for that route."""
    from noisymlt.data.labels import read_labels

    run = RUN.format("ours")
    test = read_labels(project / "data/toy/test_labels.parquet")
    files = [str(project / IMAGES / p) for p in test.paths[:40]]
    listing = project / IMAGES / "some.txt"
    listing.write_text("".join(f"{p}\n" for p in test.paths[:40]))
    env = tool_env(project)
    done = subprocess.run([sys.executable, "-m", "noisymlt", "predict", "--run", run, "--list", str(listing), "--out",
                           str(tmp_path / "p.csv"), "--no-progress"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    predicted = np.array([[float(v) for v in r.split(",")[2:-1]] for r in
                          (tmp_path / "p.csv").read_text().splitlines()[1:]], dtype=np.float32)
    done = subprocess.run([sys.executable, "-m", "noisymlt", "export", "--run", run, "--out", str(tmp_path / "e"),
                           "--formats", "torchscript", "onnx"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    spec = json.loads((tmp_path / "e/model.json").read_text())
    (tmp_path / "consumer.py").write_text(CONSUMER)
    for alone in ("torch", "onnxruntime"):
        got = tmp_path / f"{alone}.npy"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        done = subprocess.run([sys.executable, "-I", str(tmp_path / "consumer.py"), alone, str(tmp_path / "e"),
                               str(got), *files], env=clean, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        diff = float(np.abs(np.load(got) - predicted).max())
        if alone == "torch":
            assert diff <= spec["files"]["torchscript"]["tolerance"], diff
        else:
            assert 0 < diff <= spec["transform"]["without_torch_tolerance"], diff
            assert spec["transform"]["without_torch_max_abs_difference"] <= spec["transform"]["without_torch_tolerance"]
