"""Download step: resumable checksummed fetch, safe extraction, dataset registry + mirror, COCO images.

Everything runs against the local ``http_server`` fixture; fixture archives and images are built
in tmp folders at test time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from noisymlt.data import archive, coco_images, download
from noisymlt.data.archive import safe_extract
from noisymlt.data.download import RemoteFile, dataset_archives, download_dataset, fetch, mirror_url
from noisymlt.data.labels import LabelTable, write_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.core import codedeps

FAST = dict(backoff=0.01, progress=False)


def _payload(n: int = 50_000, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _serve(server, name: str, data: bytes) -> str:
    path = server.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return f"{server.url}/{name}"


def _requests(server, path: str) -> list:
    return [r for r in server.state.get("requests", []) if r[0] == path]


def _run_cli(argv: list[str]) -> int:
    """Parse with only the download modules' subcommands (the full CLI imports every pipeline step)."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    download.add_cli(sub)
    coco_images.add_cli(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def _tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# ------------------------------------------------------------------------------------- fetch


def test_fetch_downloads_verifies_and_skips_when_present(http_server, tmp_path):
    data = _payload()
    url = _serve(http_server, "blob.bin", data)
    dest = tmp_path / "out" / "blob.bin"
    got = fetch(url, dest, md5=_md5(data), sha256=_sha256(data), **FAST)
    assert got == dest and dest.read_bytes() == data
    assert not dest.with_name("blob.bin.part").exists()
    assert len(_requests(http_server, "/blob.bin")) == 1

    fetch(url, dest, md5=_md5(data), **FAST)  # present and valid: no request at all
    assert len(_requests(http_server, "/blob.bin")) == 1


def test_fetch_replaces_present_file_with_wrong_checksum_keeping_it_aside(http_server, tmp_path):
    data = _payload()
    url = _serve(http_server, "blob.bin", data)
    dest = tmp_path / "blob.bin"
    dest.write_bytes(b"stale")
    fetch(url, dest, md5=_md5(data), **FAST)
    assert dest.read_bytes() == data
    assert (tmp_path / "blob.bin.corrupt").read_bytes() == b"stale"


def test_fetch_resumes_partial_file_with_range_request(http_server, tmp_path):
    data = _payload()
    url = _serve(http_server, "blob.bin", data)
    dest = tmp_path / "blob.bin"
    dest.with_name("blob.bin.part").write_bytes(data[:12_345])
    fetch(url, dest, md5=_md5(data), **FAST)
    assert _requests(http_server, "/blob.bin") == [("/blob.bin", "bytes=12345-")]
    assert dest.read_bytes() == data
    assert not dest.with_name("blob.bin.part").exists()


def test_fetch_restarts_when_server_ignores_range(http_server, tmp_path):
    data = _payload()
    url = _serve(http_server, "blob.bin", data)
    http_server.state["ranges"] = False  # answers 200 with the whole file
    dest = tmp_path / "blob.bin"
    dest.with_name("blob.bin.part").write_bytes(b"x" * 777)  # appending to this would corrupt
    fetch(url, dest, md5=_md5(data), **FAST)
    assert _requests(http_server, "/blob.bin") == [("/blob.bin", "bytes=777-")]
    assert dest.read_bytes() == data


def test_fetch_retries_503_with_exponential_backoff(http_server, tmp_path, monkeypatch):
    data = _payload()
    url = _serve(http_server, "blob.bin", data)
    http_server.state["fail_first"] = {"/blob.bin": 3}
    delays: list[float] = []
    monkeypatch.setattr(download.time, "sleep", delays.append)
    fetch(url, tmp_path / "blob.bin", md5=_md5(data), retries=5, backoff=0.5, progress=False)
    assert (tmp_path / "blob.bin").read_bytes() == data
    assert len(_requests(http_server, "/blob.bin")) == 4
    assert delays == [0.5, 1.0, 2.0]


def test_fetch_gives_up_after_retries_and_names_url(http_server, tmp_path):
    url = _serve(http_server, "blob.bin", _payload())
    http_server.state["fail_first"] = {"/blob.bin": 10}
    with pytest.raises(NoisyMLTError, match=r"blob\.bin: download failed after 3 attempt\(s\): HTTP 503"):
        fetch(url, tmp_path / "blob.bin", retries=2, **FAST)
    assert len(_requests(http_server, "/blob.bin")) == 3
    assert not (tmp_path / "blob.bin").exists()
    # nothing arrived: the message says so, and claims no partial file
    with pytest.raises(NoisyMLTError, match=r"HTTP 503 try again; nothing was received$"):
        fetch(url, tmp_path / "blob.bin", retries=0, **FAST)
    assert not (tmp_path / "blob.bin.part").exists()
    # some bytes arrived before the connection broke: they are kept, and the message says how many and where
    http_server.state["fail_first"] = {}
    http_server.state["truncate"] = {"/blob.bin": 20_000}
    with pytest.raises(NoisyMLTError, match=rf"the 20000 bytes received are kept in {tmp_path / 'blob.bin.part'} "
                                            "and a rerun resumes from them$"):
        fetch(url, tmp_path / "blob.bin", retries=0, **FAST)
    assert (tmp_path / "blob.bin.part").stat().st_size == 20_000


def test_a_failed_dataset_download_names_the_mirror_and_the_manual_place(http_server, tmp_path, monkeypatch):
    official = dataset_archives()["voc"][0]
    monkeypatch.setitem(dataset_archives(), "voc", [RemoteFile(f"{http_server.url}/gone/{official.filename}",
                                                     official.filename, md5=official.md5)])
    root = tmp_path / "raw" / "voc"
    with pytest.raises(NoisyMLTError) as failed:
        download_dataset("voc", root, retries=0, progress=False)
    message = str(failed.value)
    assert "HTTP 404" in message and "set download.mirror in params.yaml" in message
    assert f"place it yourself at {root / 'archives' / official.filename}" in message
    assert "kept in" not in message  # no partial file to speak of


def test_fetch_does_not_retry_404(http_server, tmp_path):
    with pytest.raises(NoisyMLTError, match="HTTP 404"):
        fetch(f"{http_server.url}/missing.bin", tmp_path / "missing.bin", retries=3, **FAST)
    assert len(_requests(http_server, "/missing.bin")) == 1


def test_fetch_truncated_body_is_resumed(http_server, tmp_path):
    data = _payload()
    url = _serve(http_server, "blob.bin", data)
    http_server.state["truncate"] = {"/blob.bin": 20_000}
    dest = tmp_path / "blob.bin"
    fetch(url, dest, sha256=_sha256(data), retries=2, **FAST)
    assert _requests(http_server, "/blob.bin") == [("/blob.bin", None), ("/blob.bin", "bytes=20000-")]
    assert dest.read_bytes() == data


def test_fetch_checksum_mismatch_raises_and_keeps_corrupt_file(http_server, tmp_path):
    data = _payload()
    url = _serve(http_server, "blob.bin", data)
    dest = tmp_path / "blob.bin"
    wrong = "0" * 32
    with pytest.raises(NoisyMLTError) as err:
        fetch(url, dest, md5=wrong, **FAST)
    msg = str(err.value)
    assert "blob.bin" in msg and wrong in msg and _md5(data) in msg
    assert not dest.exists() and not dest.with_name("blob.bin.part").exists()
    assert (tmp_path / "blob.bin.corrupt").read_bytes() == data
    with pytest.raises(NoisyMLTError):  # a second bad copy never overwrites the first
        fetch(url, dest, md5=wrong, **FAST)
    assert (tmp_path / "blob.bin.corrupt.1").read_bytes() == data


def test_fetch_from_local_folder_mirror(tmp_path):
    data = _payload(3000)
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "blob.bin").write_bytes(data)
    url = mirror_url("http://example.invalid/some/dir/blob.bin", str(tmp_path / "mirror"))
    assert url.startswith("file://") and url.endswith("/mirror/blob.bin")
    fetch(url, tmp_path / "blob.bin", md5=_md5(data), **FAST)
    assert (tmp_path / "blob.bin").read_bytes() == data


def test_mirror_url_replaces_scheme_host_and_dir():
    official = "http://host.robots.ox.ac.uk/pascal/VOC/voc2012/X.tar"
    assert mirror_url(official, "https://m.org/d/") == "https://m.org/d/X.tar"
    assert mirror_url("http://a/b/c.zip", None) == "http://a/b/c.zip"


# ---------------------------------------------------------------------------------- archives


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def test_safe_extract_tar_gz_and_zip(tmp_path):
    tgz = _tar(tmp_path / "a.tar.gz", [_file("top/x.txt", b"x"), _file("top/sub/y.txt", b"yy"),
                                       _link("top/sub/lx", "../x.txt")], mode="w:gz")
    out = tmp_path / "out"
    paths = safe_extract(tgz, out)
    names = sorted(p.relative_to(out).as_posix() for p in paths)
    assert names == ["top/sub/lx", "top/sub/y.txt", "top/x.txt"]
    assert (out / "top/sub/y.txt").read_bytes() == b"yy"
    assert (out / "top/sub/lx").is_symlink() and (out / "top/sub/lx").read_bytes() == b"x"

    zpath = tmp_path / "b.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("top/z.txt", b"zzz")  # merges into the existing top/
    safe_extract(zpath, out)
    assert (out / "top/z.txt").read_bytes() == b"zzz" and (out / "top/x.txt").exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".partial")]


def test_safe_extract_skips_finished_work_and_redoes_interrupted(tmp_path):
    tar = _tar(tmp_path / "a.tar", [_file("d/f.txt", b"original")])
    out = tmp_path / "out"
    safe_extract(tar, out)
    marker = archive.marker_path(tar, out)
    assert json.loads(marker.read_text())["sha256"] == _sha256(tar.read_bytes())

    (out / "d/f.txt").write_bytes(b"edited")
    safe_extract(tar, out)  # marker matches the archive: nothing is redone
    assert (out / "d/f.txt").read_bytes() == b"edited"
    (out / "d/f.txt").unlink()  # ... unless extracted files have gone missing
    safe_extract(tar, out)
    assert (out / "d/f.txt").read_bytes() == b"original"
    (out / "d/f.txt").write_bytes(b"edited")

    marker.unlink()  # as after a crash before the marker was written
    (out / ".a.tar.partial" / "junk").parent.mkdir()
    (out / ".a.tar.partial" / "junk").write_bytes(b"half")
    safe_extract(tar, out)
    assert (out / "d/f.txt").read_bytes() == b"original"
    assert not (out / ".a.tar.partial").exists() and marker.exists()

    # the extraction code changed since (another digest in the marker): the files are extracted again
    (out / "d/f.txt").write_bytes(b"edited")
    record = json.loads(marker.read_text())
    assert record["code"] == codedeps.digest("noisymlt.data.archive")
    marker.write_text(json.dumps({**record, "code": "0123456789abcdef"}))
    safe_extract(tar, out)
    assert (out / "d/f.txt").read_bytes() == b"original"


def _device() -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo("dev/evil")
    info.type = tarfile.CHRTYPE
    return info, None


# case -> (members, offending member, reason in the message)
MALICIOUS_TARS = {
    "absolute": ([_file("ok.txt", b"ok"), _file("/tmp/evil_abs.txt", b"pwn")], "/tmp/evil_abs.txt",
                 "has an absolute path"),
    "dotdot": ([_file("ok.txt", b"ok"), _file("a/../../evil.txt", b"pwn")], "a/../../evil.txt",
               "contains a '..' component"),
    "symlink_out": ([_file("ok.txt", b"ok"), _link("d/escape", "../../outside")], "d/escape",
                    "outside the target folder"),
    "symlink_abs": ([_file("ok.txt", b"ok"), _link("escape", "/etc/passwd")], "escape",
                    "links to absolute path"),
    "hardlink_out": ([_file("ok.txt", b"ok"), _link("hl", "../outside.txt", tarfile.LNKTYPE)], "hl",
                     "outside the target folder"),
    # each name looks harmless alone; together a/a/b resolves two levels above the target
    "through_link": ([_link("a", "."), _link("a/a/b", "../..")], "a/a/b", "lies under link 'a'"),
    "device": ([_file("ok.txt", b"ok"), _device()], "dev/evil", "device or special file"),
    # issue 40: d1/l stays inside, and d1/m -> l/../.. folds to d1 on paper, but through l it is the target's parent;
    # refused by the project's own check, not only by Python's tarfile filter
    "link_chain": ([_file("ok.txt", b"ok"), _link("d1/l", ".."), _link("d1/m", "l/../..")], "d1/m",
                   "through link 'd1/l'"),
}


@pytest.mark.parametrize("case", sorted(MALICIOUS_TARS))
def test_malicious_tar_is_refused_before_writing(tmp_path, case):
    members, bad_name, reason = MALICIOUS_TARS[case]
    tar = _tar(tmp_path / f"{case}.tar", members)
    out = tmp_path / "sandbox" / "out"
    out.mkdir(parents=True)
    before = _tree(tmp_path)
    with pytest.raises(NoisyMLTError) as err:
        safe_extract(tar, out)
    assert str(err.value).startswith(f"{tar}: member {bad_name!r}") and reason in str(err.value)
    assert _tree(tmp_path) == before  # nothing inside the target, nothing next to it


@pytest.mark.parametrize("name", ["../evil.txt", "/abs/evil.txt", "a\\..\\..\\evil.txt"])
def test_malicious_zip_is_refused_before_writing(tmp_path, name):
    zpath = tmp_path / "bad.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("ok.txt", b"ok")
        zf.writestr(zipfile.ZipInfo(name), b"pwn")
    out = tmp_path / "sandbox" / "out"
    before = _tree(tmp_path)
    with pytest.raises(NoisyMLTError, match=r"bad\.zip: member") as err:
        safe_extract(zpath, out)
    assert repr(name) in str(err.value)
    assert _tree(tmp_path) == before


def test_zip_symlink_escaping_is_refused(tmp_path):
    zpath = tmp_path / "link.zip"
    info = zipfile.ZipInfo("link")
    info.external_attr = (0o120777) << 16  # S_IFLNK
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr(info, b"../../etc")
    with pytest.raises(NoisyMLTError, match=r"link\.zip: member 'link' links to '\.\./\.\./etc'"):
        safe_extract(zpath, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- dataset + mirror (CLI)


def test_download_voc_from_mirror_end_to_end(http_server, tmp_path, monkeypatch):
    tars = {
        "VOCtrainval_11-May-2012.tar": [_file("VOCdevkit/VOC2012/Annotations/2008_000001.xml", b"<a/>"),
                                        _file("VOCdevkit/VOC2012/JPEGImages/2008_000001.jpg", b"img12")],
        "VOCtest_06-Nov-2007.tar": [_file("VOCdevkit/VOC2007/Annotations/000001.xml", b"<b/>")],
    }
    registry = []
    for name, members in tars.items():
        data = _tar(tmp_path / name, members).read_bytes()
        _serve(http_server, f"mirror/{name}", data)
        official = next(f for f in dataset_archives()["voc"] if f.filename == name)
        registry.append(RemoteFile(official.url, name, md5=_md5(data)))
    monkeypatch.setitem(dataset_archives(), "voc", registry)

    root = tmp_path / "raw" / "voc"
    argv = ["download", "--dataset", "voc", "--root", str(root), "--mirror", f"{http_server.url}/mirror",
            "--retries", "1", "--backoff", "0.01", "--no-progress"]
    http_server.state["fail_first"] = {"/mirror/VOCtest_06-Nov-2007.tar": 1}
    assert _run_cli(argv) == 0
    assert (root / "VOCdevkit/VOC2012/JPEGImages/2008_000001.jpg").read_bytes() == b"img12"
    assert (root / "VOCdevkit/VOC2007/Annotations/000001.xml").read_bytes() == b"<b/>"
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["dataset"] == "voc"
    by_name = {f["filename"]: f for f in manifest["files"]}
    for name in tars:
        data = (http_server.root / "mirror" / name).read_bytes()
        entry = by_name[name]
        assert (entry["size"], entry["sha256"], entry["md5"]) == (len(data), _sha256(data), _md5(data))
        assert entry["url"].startswith("http://host.robots.ox.ac.uk/")  # canonical source, not the mirror
    n_requests = len(http_server.state["requests"])
    assert n_requests == 3  # one 503 retried

    text = (root / "manifest.json").read_text()
    assert _run_cli(argv) == 0  # second run: everything present, nothing fetched, same manifest
    assert len(http_server.state["requests"]) == n_requests
    assert (root / "manifest.json").read_text() == text


def test_download_wrong_checksum_via_cli_reports_file(http_server, tmp_path, monkeypatch):
    data = _tar(tmp_path / "x.tar", [_file("VOCdevkit/a", b"a")]).read_bytes()
    _serve(http_server, "VOCtest_06-Nov-2007.tar", data)
    monkeypatch.setitem(dataset_archives(), "voc", [RemoteFile("http://x/VOCtest_06-Nov-2007.tar",
                                                     "VOCtest_06-Nov-2007.tar", md5="f" * 32)])
    root = tmp_path / "root"
    expected = rf"VOCtest_06-Nov-2007\.tar: checksum mismatch, md5 expected f{{32}}, actual {_md5(data)}"
    with pytest.raises(NoisyMLTError, match=expected):
        _run_cli(["download", "--dataset", "voc", "--root", str(root), "--mirror", http_server.url,
                  "--no-progress"])
    assert (root / "archives" / "VOCtest_06-Nov-2007.tar.corrupt").exists()
    assert not (root / "VOCdevkit").exists() and not (root / "manifest.json").exists()


def test_registry_holds_the_spec_checksums():
    md5s = {f.filename: f.md5 for files in dataset_archives().values() for f in files}
    assert md5s == {
        "VOCtrainval_11-May-2012.tar": "6cd6e144f989b92b3379bac3b3de84fd",
        "VOCtest_06-Nov-2007.tar": "b6e924de25625d8de591ea690078ad9f",
        "annotations_trainval2017.zip": "f4bbac642086de4f52a3fdda2de5fa2c",
        "val2017.zip": "442b8da7639aecaf257c1dceb8ba8c80",
    }


# ------------------------------------------------------------------------------- COCO images


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def _coco_fixture(server, tmp_path: Path, host: str | None = None) -> tuple[Path, dict[int, bytes]]:
    """Annotation JSON with ids 1, 2, 3 (valid JPEGs) and 4 (a JPEG header followed by garbage)."""
    images = {1: _jpeg(1), 2: _jpeg(2), 3: _jpeg(3), 4: _jpeg(4)[:40] + b"\x00garbage" * 20}
    entries = []
    for img_id, data in images.items():
        name = f"{img_id:012d}.jpg"
        _serve(server, f"train2017/{name}", data)
        url = f"{host or server.url}/train2017/{name}"
        entries.append({"id": img_id, "file_name": name, "coco_url": url})
    ann = tmp_path / "instances_train2017.json"
    ann.write_text(json.dumps({"images": entries, "annotations": [], "categories": []}))
    return ann, images


def test_fetch_coco_images_retries_and_reports_corrupt(http_server, tmp_path):
    ann, images = _coco_fixture(http_server, tmp_path)
    ids = tmp_path / "ids.txt"
    ids.write_text("# subset\n1\n2\n\n4\n3\n")
    out = tmp_path / "train2017"
    http_server.state["fail_first"] = {"/train2017/000000000002.jpg": 1}
    argv = ["fetch-coco-images", "--annotations", str(ann), "--ids", str(ids), "--out", str(out),
            "--retries", "2", "--backoff", "0.01", "--workers", "3", "--no-progress"]
    with pytest.raises(NoisyMLTError) as err:
        _run_cli(argv)
    msg = str(err.value)
    assert "1 of 4 COCO image(s)" in msg and "ids [4]" in msg and "does not decode" in msg
    for img_id in (1, 2, 3):
        assert (out / f"{img_id:012d}.jpg").read_bytes() == images[img_id]
    assert not (out / "000000000004.jpg").exists()
    assert (out / "000000000004.jpg.corrupt").read_bytes() == images[4]
    assert len(_requests(http_server, "/train2017/000000000004.jpg")) == 3  # retries + 1
    assert len(_requests(http_server, "/train2017/000000000002.jpg")) == 2  # one 503, then OK
    assert not (out / "manifest.json").exists()

    # the same subset as a label table, without the broken image: present files are not refetched
    table = LabelTable(image_ids=["3", "1", "2"], classes=["a"], labels=np.zeros((3, 1)))
    before = len(http_server.state["requests"])
    assert _run_cli([*argv[:4], str(write_labels(table, tmp_path / "sub.parquet")), *argv[5:]]) == 0
    assert len(http_server.state["requests"]) == before
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(m["image_id"], m["sha256"]) for m in manifest["images"]] == [
        (i, _sha256(images[i])) for i in (1, 2, 3)
    ]


def test_fetch_coco_images_from_mirror_and_replaces_undecodable_present_file(http_server, tmp_path):
    ann, images = _coco_fixture(http_server, tmp_path, host="http://images.invalid")
    out = tmp_path / "imgs"
    out.mkdir()
    (out / "000000000001.jpg").write_bytes(b"not a jpeg")
    paths = coco_images.download_coco_images(ann, [2, "1"], out, mirror=f"{http_server.url}/train2017",
                                          retries=0, **FAST)
    assert paths == [out / "000000000002.jpg", out / "000000000001.jpg"]
    assert [p.read_bytes() for p in paths] == [images[2], images[1]]


def test_fetch_coco_images_unknown_id_fails_before_downloading(http_server, tmp_path):
    ann, _ = _coco_fixture(http_server, tmp_path)
    expected = r"1 requested image id\(s\) are not in its 'images' list, e.g. \[99\]"
    with pytest.raises(NoisyMLTError, match=expected):
        coco_images.download_coco_images(ann, [1, 99], tmp_path / "out", **FAST)
    assert http_server.state.get("requests", []) == []


def test_read_image_ids_names_bad_line(tmp_path):
    ids = tmp_path / "img_id.pkl"  # the [DB] list is text despite its name
    ids.write_text("139\n285\nabc\n")
    with pytest.raises(NoisyMLTError, match=r"img_id\.pkl: line 3: 'abc' is not a COCO image id"):
        coco_images.read_image_ids(ids)
    ids.write_text("139\n 285 \n")
    assert coco_images.read_image_ids(ids) == [139, 285]
