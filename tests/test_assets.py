"""External files (ImageNet weights, GloVe vectors): named by hash, fetched by their own step, read offline."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from noisymlt.data import assets
from noisymlt.data.download import fetch_asset
from noisymlt.errors import NoisyMLTError
from noisymlt.config import load_params, resolve_run
from noisymlt.pipeline.paths import asset_entry

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "params.yaml"
DEMO = REPO / "workflow/profiles/demo/params.yaml"


def test_asset_files_carry_their_hash_and_keep_torchvision_names():
    assert assets.asset_path("imagenet", "https://download.pytorch.org/models/resnet50-0676ba61.pth", "0676ba61") == \
        "data/assets/imagenet/resnet50-0676ba61.pth"
    assert assets.asset_path("glove", "https://x/data/voc/voc_glove_word2vec.pkl", "0CA7081Aee") == \
        "data/assets/glove/voc_glove_word2vec-0ca7081a.pkl"
    assert assets.asset_path("glove", "some/dir/fixture.pkl", "bbcef318" * 8) == "data/assets/glove/fixture-bbcef318.pkl"


def test_runs_name_the_asset_files_they_read():
    params = load_params(PAPER)
    erm = resolve_run(params, "voc", "erm", 0.5, 0)
    assert erm["train"]["weights_path"] == "data/assets/imagenet/resnet50-0676ba61.pth"
    assert "embeddings_file" not in erm["method_cfg"]
    assert assets.run_files(erm) == ["data/assets/imagenet/resnet50-0676ba61.pth"]
    for dataset, digest in (("voc", "0ca7081a"), ("coco", "a1215dd1")):
        mlgcn = resolve_run(params, dataset, "mlgcn", 0.5, 0)
        assert mlgcn["method_cfg"]["embeddings_file"] == f"data/assets/glove/{dataset}_glove_word2vec-{digest}.pkl"
    # Other weights named by the user win over ImageNet's; `embeddings: random` reads no file.
    params["train"]["weights_path"] = "my/weights.pt"
    params["methods"]["mlgcn"]["embeddings"] = "random"
    mlgcn = resolve_run(params, "voc", "mlgcn", 0.5, 0)
    assert assets.run_files(mlgcn) == ["my/weights.pt"]
    # The demo reads its own pretrained backbone and, on the toy set, no GloVe file.
    demo = load_params(PAPER, DEMO)
    assert assets.run_files(resolve_run(demo, "toy", "mlgcn", 0.5, 0)) == ["data/pretrained/toy_glyphs.pt"]


def test_fetch_verifies_the_digest_or_its_prefix(http_server, tmp_path):
    data = b"weights" * 1000
    full = hashlib.sha256(data).hexdigest()
    (http_server.root / "w.pth").write_bytes(data)
    out = tmp_path / "a" / "w.pth"
    fetch_asset(f"{http_server.url}/w.pth", full, out, progress=False)
    assert out.read_bytes() == data
    prefixed = tmp_path / "b" / "w.pth"
    fetch_asset(f"{http_server.url}/w.pth", full[:8], prefixed, progress=False)
    assert prefixed.read_bytes() == data
    # Bytes that do not match are set aside, never put in place.
    for sha in ("0" * 64, "00000000"):
        bad = tmp_path / f"bad{len(sha)}" / "w.pth"
        with pytest.raises(NoisyMLTError, match="sha256|checksum"):
            fetch_asset(f"{http_server.url}/w.pth", sha, bad, retries=0, progress=False)
        assert not bad.exists() and list(bad.parent.glob("w.pth.corrupt*"))


def test_mirror_and_local_paths(http_server, tmp_path, monkeypatch):
    data = pickle.dumps(np.zeros((20, 300), np.float32))
    sha = hashlib.sha256(data).hexdigest()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "voc_glove_word2vec.pkl").write_bytes(data)
    out = tmp_path / "x" / "v.pkl"
    # The official URL is never asked: the mirror folder has the file under its name.
    fetch_asset("http://unreachable.invalid/data/voc_glove_word2vec.pkl", sha, out, mirror=str(mirror),
                       retries=0, progress=False)
    assert out.read_bytes() == data
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "y" / "v.pkl"
    fetch_asset("mirror/voc_glove_word2vec.pkl", sha, local, progress=False)  # a path, no scheme
    assert local.read_bytes() == data


def test_a_failed_fetch_says_what_else_to_do(http_server, tmp_path):
    out = tmp_path / "data/assets/glove/v-0ca7081a.pkl"
    with pytest.raises(NoisyMLTError) as err:
        fetch_asset(f"{http_server.url}/missing.pkl", "0ca7081a" * 8, out, name="assets.glove.voc",
                           retries=0, progress=False)
    text = str(err.value)
    assert text.startswith("assets.glove.voc: ") and "HTTP 404" in text
    assert "download.mirror" in text and f"place the file yourself at {out}" in text
    assert "kept in" not in text and ".." not in text and not out.exists()


def test_step_asset_runs_the_fetch_of_the_params_entry(tmp_path, monkeypatch):
    data = b"vectors"
    (tmp_path / "v.pkl").write_bytes(data)
    params = {"assets": {"glove": {"voc": {"url": "v.pkl", "sha256": hashlib.sha256(data).hexdigest()}}},
              "download": {"retries": 0}}
    path = assets.glove_file(params, "voc")
    entry = asset_entry(params, path)
    assert entry == {"group": "glove", "name": "voc", **params["assets"]["glove"]["voc"]}
    with pytest.raises(NoisyMLTError, match="not an asset of the params"):
        asset_entry(params, "data/assets/glove/other.pkl")
    # the fetch_asset rule's words (tests/test_workflow.py holds the rule to them)
    argv = ["fetch-asset", "--url", entry["url"], "--sha256", entry["sha256"], "--out", path, "--name",
            f"assets.{entry['group']}.{entry['name']}", "--retries", "0"]
    monkeypatch.chdir(tmp_path)
    from noisymlt.cli import main

    assert main(argv) == 0 and Path(path).read_bytes() == data


# ------------------------------------------------------------------ train jobs never open a connection
BLOCKER = '''
import os, socket
_LOG = os.environ["NOISYMLT_NET_LOG"]
_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex

def _note(what):
    with open(_LOG, "a") as fh:
        fh.write(what + "\\n")

def _inet(sock):
    return sock.family in (socket.AF_INET, socket.AF_INET6)

def connect(self, address):
    if _inet(self):
        _note(f"connect {address!r}")
        raise OSError("network blocked by the test")
    return _connect(self, address)

def connect_ex(self, address):
    if _inet(self):
        _note(f"connect_ex {address!r}")
        raise OSError("network blocked by the test")
    return _connect_ex(self, address)

def getaddrinfo(host, *args, **kwargs):
    _note(f"getaddrinfo {host!r}")
    raise socket.gaierror("network blocked by the test")

socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
'''


def _blocked_env(tmp_path: Path) -> tuple[dict, Path]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / "net.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "src")]),
           "NOISYMLT_NET_LOG": str(log), "TORCH_HOME": str(tmp_path / "torch_home")}
    return env, log


@pytest.mark.slow
def test_mlgcn_and_imagenet_runs_train_offline_from_placed_files(tmp_path):
    import torch
    import torchvision

    from noisymlt.data.classes import VOC_CLASSES
    from noisymlt.data.glove import pseudo_embeddings
    from noisymlt.data.labels import split_from_counts, write_class_split, write_labels
    from noisymlt.data.noise import make_noisy_table
    from noisymlt.data.toy import make_voc_standin
    from noisymlt.data.voc import parse_voc

    env, log = _blocked_env(tmp_path)
    # The blocker works: torchvision's own download of ImageNet weights is stopped and noted.
    probe = subprocess.run([sys.executable, "-c", "import torchvision; torchvision.models.resnet18(weights='IMAGENET1K_V1')"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode != 0 and "download.pytorch.org" in log.read_text()
    log.unlink()

    work = tmp_path / "work"
    raw = make_voc_standin(work / "data/raw/voc_toy", seed=0, n_trainval=120, n_test=40, image_size=32)
    train = parse_voc(raw / "VOCdevkit/VOC2012", "trainval")
    write_labels(train, work / "train.parquet")
    write_labels(parse_voc(raw / "VOCdevkit/VOC2007", "test"), work / "test.parquet")
    write_class_split(split_from_counts(train.labels.sum(0)), work / "split.json")
    make_noisy_table(work / "train.parquet", 0.5, 0, work / "noisy.parquet")

    # The asset files where their rule would put them: a GloVe-shaped array and resnet18 weights.
    glove = pickle.dumps(pseudo_embeddings(list(VOC_CLASSES)))
    weights = work / "w.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    params = load_params(PAPER)
    params["assets"]["glove"]["voc"] = {"url": "g.pkl", "sha256": hashlib.sha256(glove).hexdigest()}
    params["assets"]["imagenet"]["resnet18"] = {"url": "w.pth", "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    params["train"].update(backbone="resnet18", pretrained=True, image_size=32, batch_size=16, epochs=1, lr_steps=[1],
                           warmup_iters=1, workers=0, loader="pil", cpu_threads=1, eval_batch_size=40)
    for schedule in params["schedules"].values():
        schedule["train"] = {k: v for k, v in schedule.get("train", {}).items() if k not in params["train"]}
    cfg = resolve_run(params, "voc", "mlgcn", 0.5, 0)
    glove_path, weights_path = cfg["method_cfg"]["embeddings_file"], cfg["train"]["weights_path"]
    assert weights_path == assets.imagenet_file(params, "resnet18")
    (work / glove_path).parent.mkdir(parents=True)
    (work / glove_path).write_bytes(glove)
    (work / weights_path).parent.mkdir(parents=True)
    weights.replace(work / weights_path)
    (work / "run_config.json").write_text(json.dumps(cfg))

    image_root = raw / "VOCdevkit"
    cmd = [sys.executable, "-m", "noisymlt", "train", "--run-config", "run_config.json", "--train-labels", "noisy.parquet",
           "--test-labels", "test.parquet", "--split", "split.json", "--train-images", str(image_root / "VOC2012"),
           "--test-images", str(image_root / "VOC2007"), "--out", "run", "--device", "cpu", "--no-progress"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not log.exists(), log.read_text()  # no connection was even attempted
    assert (work / "run/predictions.npz").is_file()
    # Both files are inputs of the trained model: other GloVe bytes make its checkpoint foreign.
    first = json.loads((work / "run/manifest.json").read_text())
    (work / glove_path).write_bytes(pickle.dumps(pseudo_embeddings([f"x{c}" for c in VOC_CLASSES])))
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "other inputs" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert json.loads((work / "run/manifest.json").read_text()) == first and not log.exists()
