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

# Under pytest-xdist the workers share the cores, so a job with two torch threads (the pretraining) may find them
# taken: OpenMP's idle threads then spin for their peers instead of sleeping. Two demo pretrainings at once on 2
# cores took 24 s an epoch each so, 7 s with passive waiting, and the same losses: how an idle thread waits changes
# no number. Set before torch loads its OpenMP, here and in every process the tests start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The tests that train in this process keep the memory a step frees, as every `noisymlt` command does
# (noisymlt.core.heap): no result depends on it (tests/test_heap.py).
from noisymlt.core.heap import keep_freed_memory  # noqa: E402

keep_freed_memory()


# The tests that use the one local SLURM cluster or SSH server (.ci/run starts both): under pytest-xdist they run in
# one worker, one after another, as they would without it. test_dvc.py goes whole: its SSH test shares the module's
# DVC repository with the others, which is then made once. (xdist's own --dist loadgroup reads xdist_group marks
# through the test ids, which pytest 9.2 no longer lets it change: pytest-xdist issue 1386.)
LOCAL_SERVICES = ("tests/test_profile_slurm.py::", "tests/test_dvc.py::")


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist (-p no:xdist) must not refuse it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: each test its own unit of work but the LOCAL_SERVICES tests, which are one."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LocalServicesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "local_services" if nodeid.startswith(LOCAL_SERVICES) else nodeid

    return LocalServicesTogether(config, log)


def _recorded_seconds() -> dict[str, float]:
    """Each test's seconds in the committed reading of the suite (docs/benchmarks/tests.json), if there is one."""
    import json

    try:
        return json.loads((Path(__file__).resolve().parents[1] / "docs/benchmarks/tests.json").read_text())["tests"]
    except (OSError, ValueError, KeyError):
        return {}


def pytest_collection_modifyitems(config, items):
    """The long tests first, longest first (their seconds in the committed reading; a slow test it does not know yet
    counts a minute; LOCAL_SERVICES as one, their sum), so that the workers of `make test` (pytest-xdist, one a core)
    do not end on one long test each. Tests under 10 s keep their order after them, beside their module's (its
    fixtures are made once). And every test marked slurm or ssh is among LOCAL_SERVICES, which keeps them in one
    worker."""
    recorded = _recorded_seconds()

    def seconds(item) -> float:
        slow = item.get_closest_marker("slow") or item.get_closest_marker("slurm")
        return recorded.get(item.nodeid, 60.0 if slow else 0.0)

    own = {item.nodeid: seconds(item) for item in items}
    together = sum(s for nodeid, s in own.items() if nodeid.startswith(LOCAL_SERVICES))
    first = {nodeid: together if nodeid.startswith(LOCAL_SERVICES) else s if s >= 10 else 0.0
             for nodeid, s in own.items()}
    items.sort(key=lambda item: -first[item.nodeid])
    stray = [item.nodeid for item in items if (item.get_closest_marker("slurm") or item.get_closest_marker("ssh"))
             and not item.nodeid.startswith(LOCAL_SERVICES)]
    if stray:
        raise pytest.UsageError(f"tests of the local SLURM cluster or SSH server outside LOCAL_SERVICES "
                                f"(tests/conftest.py): {stray}")


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


@pytest.fixture(scope="session")
def tiny_toy(tmp_path_factory):
    """Toy dataset -> labels -> long-tail subset -> noisy labels (gamma 0.5, seed 0), at 32 px.

    Returns a dict of paths: root (image folder), train_source, test, train, split, noisy, and the
    decoded-image caches train_cache / test_cache at the demo's cache size.
    """
    from helpers import TINY_CACHE_SIZE, TINY_LONGTAIL, TINY_TOY
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


# ---------------------------------------------------------------- projects built once per run, copied per test
@pytest.fixture(scope="session")
def demo_pretrained(tmp_path_factory) -> Path:
    """A project copy with the demo profile's pretrained backbone made (`snakemake --profile workflow/profiles/demo
    -- data/pretrained/toy_glyphs.pt`: the synthetic source task, a minute on two threads), which every demo run
    and every run of the own-data page fine-tunes. Copy it with copy_build."""
    from helpers import DEMO_PROFILE, project_copy, shared_build, snakemake

    def build(folder: Path) -> None:
        project_copy(folder)
        snakemake(folder, *DEMO_PROFILE, "--", "data/pretrained/toy_glyphs.pt", timeout=900)

    return shared_build(tmp_path_factory, "demo_pretrained", build)


@pytest.fixture(scope="session")
def own_data_project(tmp_path_factory, demo_pretrained) -> Path:
    """docs/own-data.md's project (helpers.folder_project) with the page's data built: the folder dataset parsed,
    split into train and test, its class split and noisy set, by the page's own command with the data targets; and
    the demo's pretrained backbone, which its runs start from (demo_pretrained). Copy it with copy_build."""
    from helpers import OWN_DATA_PAGE, commands, copy_build, folder_project, page, run_line, shared_build

    text = page(OWN_DATA_PAGE, "Add your own data")
    (command,) = commands(text)
    targets = "reports/structure_mydata.md runs/mydata/g0.5/s0/erm/metrics.json"
    assert targets in command, "the page's command changed"
    data = ("data/mydata/train_labels.parquet data/mydata/test_labels.parquet data/mydata/class_split.json "
            "data/mydata/noisy/g0.5_s0.parquet")

    def build(folder: Path) -> None:
        folder_project(copy_build(demo_pretrained, folder), text)
        run_line(command.replace(targets, data), folder)

    return shared_build(tmp_path_factory, "own_data", build)


@pytest.fixture(scope="session")
def own_data_runs(tmp_path_factory, own_data_project) -> Path:
    """own_data_project after the page's own command, whole (`snakemake ... reports/structure_mydata.md
    runs/mydata/g0.5/s0/erm/metrics.json`): its structure report and its ERM run, trained and evaluated. The own-data
    page's test checks what the command wrote; the trained-model page starts where the own-data page ends. Copy it
    with copy_build."""
    from helpers import OWN_DATA_PAGE, commands, copy_build, page, run_line, shared_build

    (command,) = commands(page(OWN_DATA_PAGE, "Add your own data"))

    def build(folder: Path) -> None:
        run_line(command, copy_build(own_data_project, folder))

    return shared_build(tmp_path_factory, "own_data_runs", build)


@pytest.fixture(scope="session")
def tiny_runs_project(tmp_path_factory, tiny_data_project) -> Path:
    """tiny_data_project with helpers.TINY_RUNS as its layer (tiny.yaml) and its detection and paired tables made: a
    finished run of each method family and of clean, then retrain at gamma 0.5, seeds 0 and 1, with their suspect
    labels, the cross-fitting (two folds) and the cleaned tables. Copy it with copy_build."""
    from helpers import TINY_RUNS, copy_build, shared_build, snakemake, tiny_layer, write_layer

    def build(folder: Path) -> None:
        copy_build(tiny_data_project, folder)
        snakemake(folder, *write_layer(folder, tiny_layer(TINY_RUNS)), "--", "reports/label_detection_toy.tex",
                  "reports/paired_toy.tex", timeout=900)

    return shared_build(tmp_path_factory, "tiny_runs", build)


@pytest.fixture(scope="session")
def tiny_data_project(tmp_path_factory) -> Path:
    """A project copy with helpers.TINY as its layer (tiny.yaml) and the workflow's data phase made (`snakemake
    ... -- data`: the toy, its labels, long-tail subset, noisy sets, image caches, the selection's split and the
    pretrained backbone): what every TINY run reads. Copy it with copy_build; a test's own layer over TINY (the
    same data blocks) finds its data made."""
    from helpers import TINY, project_copy, shared_build, snakemake, write_layer

    def build(folder: Path) -> None:
        project_copy(folder)
        snakemake(folder, *write_layer(folder, TINY), "--", "data", timeout=900)

    return shared_build(tmp_path_factory, "tiny_data", build)
