"""Shared fixtures. The HTTP server stands in for the dataset hosts: no test touches the internet."""

from __future__ import annotations

import http.server
import os
import re
import signal
import threading
from pathlib import Path

import pytest

# A test run started in the background by a shell without job control (`make test &` in a script) inherits
# SIGINT ignored, and so would every process the tests start: the tests of Ctrl-C would then see nothing
# stop. Python's handler here means the default disposition in each process started from here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"


@pytest.fixture(autouse=True)
def checkpoint_every_epoch(request, monkeypatch):
    """In-process trainers save a checkpoint after every epoch, as at paper scale, so that the resume tests can
    stop a seconds-long run between epochs (the default waits 30 s between checkpoints); test_train's
    checkpoint-interval test uses the default."""
    if "default_checkpoint_interval" in request.keywords:
        return
    import noisymlt.training.trainer

    monkeypatch.setattr(noisymlt.training.trainer.Trainer, "checkpoint_seconds", 0.0)


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with single-range support (resume) and two switches the tests flip:
    ``fail_first`` makes the first N requests of a path answer 503 (retry/backoff), and
    ``truncate`` cuts a body short after N bytes while announcing the full length."""

    state: dict = {}

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        st = self.server.state  # type: ignore[attr-defined]
        st.setdefault("requests", []).append((self.path, self.headers.get("Range")))
        fails = st.setdefault("fail_first", {})
        if fails.get(self.path, 0) > 0:
            fails[self.path] -= 1
            self.send_error(503, "try again")
            return
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        match = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        if match and st.get("ranges", True):
            start = int(match.group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        cut = st.get("truncate", {}).pop(self.path, None)
        try:
            self.wfile.write(body if cut is None else body[:cut])
        except (BrokenPipeError, ConnectionResetError):
            pass
        if cut is not None:
            self.close_connection = True


class LocalServer:
    def __init__(self, root: Path):
        self.root = root
        handler = lambda *a, **k: _RangeHandler(*a, directory=str(root), **k)  # noqa: E731
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.state = {}  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def state(self) -> dict:
        return self.httpd.state  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "LocalServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def http_server(tmp_path):
    """A local HTTP server over ``tmp_path / 'www'``; put files there and fetch ``server.url + '/name'``."""
    root = tmp_path / "www"
    root.mkdir()
    with LocalServer(root) as server:
        yield server


@pytest.fixture
def reference_dir() -> Path:
    """The published VOC-MLT / COCO-MLT label files, when this checkout sits beside them."""
    env = os.environ.get("NOISYMLT_REFERENCE")
    path = Path(env) if env else SHARED_REFERENCE
    if not (path / "voc_mlt_train_labels.csv").exists():
        pytest.skip(f"reference label data not found at {path}")
    return path


# ---------------------------------------------------------------- a tiny embedded dataset, built once per session
TINY_TOY = {"n_trainval": 600, "n_test": 200, "size": 32}
TINY_CACHE_SIZE = 40  # the demo's train.cache_size
TINY_LONGTAIL = {"b": 6, "max_count": 150, "min_count": 4, "seed": 0}


@pytest.fixture(scope="session")
def tiny_toy(tmp_path_factory):
    """Toy dataset -> labels -> long-tail subset -> noisy labels (gamma 0.5, seed 0), at 32 px.

    Returns a dict of paths: root (image folder), train_source, test, train, split, noisy, and the
    decoded-image caches train_cache / test_cache at the demo's cache size.
    """
    from noisymlt.data.labels import split_from_counts, write_class_split, write_labels
    from noisymlt.data.longtail import pareto_subsample
    from noisymlt.data.noise import make_noisy_table
    from noisymlt.data.toy import make_toy
    from noisymlt.data.voc import parse_voc

    base = tmp_path_factory.mktemp("tiny_toy")
    root = make_toy(base / "raw", seed=0, n_trainval=TINY_TOY["n_trainval"], n_test=TINY_TOY["n_test"],
                    image_size=TINY_TOY["size"])
    source = parse_voc(root, "trainval")
    test = parse_voc(root, "test")
    rows = pareto_subsample(source.labels, **TINY_LONGTAIL)
    train = source.subset(rows)
    paths = {"root": root, "train_source": base / "train_source.parquet", "test": base / "test.parquet",
             "train": base / "train.parquet", "split": base / "split.json", "noisy": base / "noisy.parquet"}
    write_labels(source, paths["train_source"])
    write_labels(test, paths["test"])
    write_labels(train, paths["train"])
    write_class_split(split_from_counts(train.labels.sum(0)), paths["split"])
    make_noisy_table(paths["train"], 0.5, 0, paths["noisy"])
    from noisymlt.data.imagecache import build_cache

    for part, table in (("train", paths["train"]), ("test", paths["test"])):
        paths[f"{part}_cache"] = base / "cache" / f"{part}.npy"
        build_cache(table, root, TINY_CACHE_SIZE, paths[f"{part}_cache"], progress=False)
    return paths


def interrupt_training(monkeypatch, trainer, at_call: int) -> None:
    """Run ``trainer`` and stop it as Ctrl-C would (KeyboardInterrupt) in its ``at_call``-th training step."""
    original, calls = trainer.method.training_loss, {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer.method, "training_loss", dying)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()


def tiny_params(method: str = "erm", **train_overrides) -> dict:
    """params.yaml + the demo layer, shrunk to seconds-long CPU runs on ``tiny_toy``."""
    from noisymlt.config import deep_merge, load_params

    repo = Path(__file__).resolve().parents[1]
    params = load_params(repo / "params.yaml", repo / "workflow" / "profiles" / "demo" / "params.yaml")
    # A scratch backbone (no pretrained file to make) that trains whole: these tests check mechanics;
    # the demo's pretrained resnet_tiny path has tests of its own (test_models, test_pretrain).
    small = {"epochs": 2, "batch_size": 16, "balanced_batch_size": 32, "image_size": 32, "workers": 0,
             "warmup_iters": 2, "lr_steps": [2], "eval_batch_size": 64, "epoch_length": "batches",
             "backbone": "smallcnn", "weights_path": None, "trainable": "all", "frozen_bn": False}
    overrides = {**small, **train_overrides}
    params["train"] = deep_merge(params["train"], overrides)
    for schedule in params["schedules"].values():  # a schedule's keys would win over the train block
        schedule["train"] = {k: v for k, v in schedule.get("train", {}).items() if k not in overrides}
    params["grid"]["methods"] = [method]
    params["grid"].pop("clean_methods", None)  # the demo's clean column names methods this grid no longer has
    return params


def toy_trainer(tiny_toy: dict, resolved: dict, out_dir, **kwargs):
    """A Trainer over the ``tiny_toy`` files, on the CPU unless ``device`` says otherwise (kwargs:
    train_labels override, limit_iters, keep_stale...)."""
    from noisymlt.training.trainer import Trainer

    kwargs.setdefault("train_labels", tiny_toy["noisy"])
    kwargs.setdefault("device", "cpu")
    if resolved["train"].get("loader") == "cache":
        kwargs.setdefault("train_cache", tiny_toy["train_cache"])
        kwargs.setdefault("test_cache", tiny_toy["test_cache"])
    return Trainer(resolved, test_labels=tiny_toy["test"], split=tiny_toy["split"], train_images=tiny_toy["root"],
                   test_images=tiny_toy["root"], out_dir=out_dir, progress=False, **kwargs)
