"""Shared fixtures. The HTTP server stands in for the dataset hosts: no test touches the internet."""

from __future__ import annotations

import http.server
import os
import re
import threading
from pathlib import Path

import pytest

SHARED_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"


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
