"""noisymlt.preload: commands run in children of a preloaded server behave as fresh processes do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import tiny_params

from noisymlt import preload

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server():
    path, proc = preload.start_server(idle_timeout=300)
    yield path, proc
    preload.stop_server(path, proc)


def cli(args, env_extra=None, **kwargs):
    """`noisymlt ARGS` in a new process; through a server only when ``env_extra`` names one."""
    env = {k: v for k, v in os.environ.items() if k != preload.ENV}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "noisymlt", *args], env=env, capture_output=True, text=True,
                          **kwargs)


def served_children(proc) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children()


def test_streams_and_exit_status_are_the_commands(server, tmp_path):
    path, proc = server
    env = {preload.ENV: path}
    ok = cli(["--version"], env)
    assert ok.returncode == 0 and ok.stdout.startswith("noisymlt ")
    bad = cli(["evaluate", "--predictions", str(tmp_path / "none.npz"), "--test-labels", "t.parquet", "--split",
               "s.json", "--out", str(tmp_path / "m.json")], env, cwd=tmp_path)
    plain = cli(["evaluate", "--predictions", str(tmp_path / "none.npz"), "--test-labels", "t.parquet", "--split",
                 "s.json", "--out", str(tmp_path / "m.json")], cwd=tmp_path)
    assert bad.returncode == plain.returncode == 2
    assert bad.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]
    assert "t.parquet: label file does not exist" in bad.stderr  # read relative to the caller's folder
    assert served_children(proc) == []  # both children reaped


def test_a_training_run_through_the_server_equals_a_plain_run(server, tiny_toy, tmp_path):
    from noisymlt.config import resolve_run

    path, _ = server
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(resolve_run(tiny_params("ours", epochs=1), "toy", "ours", 0.5, 0)))
    outs = {}
    for how, env in (("plain", None), ("served", {preload.ENV: path})):
        outs[how] = tmp_path / how
        r = cli(["train", "--run-config", str(cfg), "--train-labels", str(tiny_toy["noisy"]), "--test-labels",
                 str(tiny_toy["test"]), "--split", str(tiny_toy["split"]), "--train-images", str(tiny_toy["root"]),
                 "--test-images", str(tiny_toy["root"]), "--train-cache", str(tiny_toy["train_cache"]),
                 "--test-cache", str(tiny_toy["test_cache"]), "--out", str(outs[how]), "--device", "cpu",
                 "--no-progress"], env)
        assert r.returncode == 0, r.stderr
        assert "epoch 1/1" in r.stderr  # the child's log reached the caller's stderr
    for name in ("predictions.npz", "checkpoint.pt", "run_config.json"):
        assert (outs["plain"] / name).read_bytes() == (outs["served"] / name).read_bytes(), name


def test_killing_the_command_kills_its_child(server, tmp_path):
    path, proc = server
    # a command that runs a while: `noisymlt train` on a config file that is a fifo nobody writes
    fifo = tmp_path / "never.json"
    os.mkfifo(fifo)
    client = subprocess.Popen([sys.executable, "-m", "noisymlt", "train", "--run-config", str(fifo),
                               "--train-labels", "x", "--test-labels", "x", "--split", "x", "--train-images", "x",
                               "--test-images", "x", "--out", str(tmp_path / "o")],
                              env={**os.environ, preload.ENV: path}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not served_children(proc):
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.05)
    child = served_children(proc)[0]
    client.send_signal(signal.SIGKILL)
    client.wait()
    child.wait(timeout=15)  # raises if the child outlives its command
    assert not child.is_running()


def test_without_a_usable_server_the_command_runs_itself(tmp_path, monkeypatch):
    monkeypatch.setenv(preload.ENV, str(tmp_path / "no-socket"))
    assert preload.run_via_server(["--version"]) is None
    r = cli(["--version"], {preload.ENV: str(tmp_path / "no-socket")})
    assert r.returncode == 0 and r.stdout.startswith("noisymlt ")


def test_a_server_refuses_other_interpreters_and_edited_sources(tmp_path):
    server = preload.Server(tmp_path / "s", idle_timeout=1, parent=None)
    try:
        fds = [os.dup(0), os.dup(1), os.dup(2)]
        good = {"argv": [], "cwd": ".", "env": {}, **preload._identity()}
        assert server._refusal(good, fds) is None
        assert "interpreter" in server._refusal({**good, "executable": "/usr/bin/python2"}, fds)
        server.fingerprint = {**server.fingerprint, "train.py": [0, 0]}
        assert "source changed" in server._refusal(good, fds)
        assert server.idle_timeout == 0  # stale for good: it stops taking work
        for fd in fds:
            os.close(fd)
    finally:
        server.listener.close()


def test_the_server_exits_with_the_workflow_that_started_it(tmp_path):
    # a parent that exits at once: the server notices it was orphaned and removes its socket
    sock = tmp_path / "s"
    starter = tmp_path / "starter.py"
    starter.write_text(
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-m', 'noisymlt', 'preload', '--socket', sys.argv[1],\n"
        "                  '--parent', str(os.getpid())], start_new_session=True)\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.05)\n")
    subprocess.run([sys.executable, str(starter), str(sock)], timeout=120, check=True)
    deadline = time.monotonic() + 15
    while sock.exists():
        assert time.monotonic() < deadline, "the server outlived its parent"
        time.sleep(0.1)


def test_manifests_record_the_same_environment_in_a_preloaded_process():
    """A step's manifest lists the installed library versions, not what its process happened to import:
    a light step run in the server (torch already imported) records what a fresh process records."""
    code = "import json; from noisymlt.provenance import environment; print(json.dumps(environment()))"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = subprocess.run([sys.executable, "-c", "import torch, torchvision, sklearn; " + code],
                            capture_output=True, text=True, check=True).stdout
    assert json.loads(fresh) == json.loads(loaded)
    assert {"numpy", "torch", "torchvision", "pandas", "pyarrow"} <= set(json.loads(fresh)["versions"])
