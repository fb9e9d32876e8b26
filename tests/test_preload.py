"""noisymlt.pipeline.preload: commands run in children of a preloaded server behave as fresh processes do."""

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
from helpers import tiny_params

from noisymlt.pipeline import preload

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
    """The server's running children (one that has exited stays a zombie until the server reaps it)."""
    children = psutil.Process(proc.pid).children()
    return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def reaped(proc, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while psutil.Process(proc.pid).children():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def served_client(path: str, args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "noisymlt", *args], env={**os.environ, preload.ENV: path},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_for_child(proc, client) -> psutil.Process:
    deadline = time.monotonic() + 60
    while not (children := served_children(proc)):
        assert time.monotonic() < deadline and client.poll() is None, client.communicate()
        time.sleep(0.05)
    return children[0]


def child_on_fifo(proc, client, timeout: float = 60.0) -> psutil.Process:
    """The server's child that is blocked opening a fifo (the kernel's wait channel says so): the client's command.
    Every child is looked at each time, as one a previous test started may still be exiting."""
    deadline = time.monotonic() + timeout
    while True:
        for child in served_children(proc):
            wchan = Path(f"/proc/{child.pid}/wchan")
            try:
                if "partner" in wchan.read_text():
                    return child
            except OSError:  # it exited meanwhile
                pass
        assert time.monotonic() < deadline and client.poll() is None, "no child of the server waited on its fifo"
        time.sleep(0.02)


def code_deps_on_fifo(tmp_path) -> tuple[list[str], Path]:
    """A served command that waits until the test writes its params (as JSON) into a fifo, then succeeds."""
    fifo = tmp_path / "params.json"
    os.mkfifo(fifo)
    return ["code-deps", "--params", str(fifo), "--method", "erm"], fifo


def feed(fifo: Path, timeout: float = 30.0) -> None:
    """Write the params into the fifo; fails, rather than waits for ever, when no job is there to read them."""
    from noisymlt.config import load_params

    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader
            assert time.monotonic() < deadline, f"no job reads {fifo}"
            time.sleep(0.05)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "w") as stream:
        stream.write(json.dumps(load_params(REPO / "params.yaml")))


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
    assert reaped(proc)  # both children


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
    child = child_on_fifo(proc, client)
    client.send_signal(signal.SIGKILL)
    client.wait()
    child.wait(timeout=15)  # raises if the child outlives its command
    assert not child.is_running()


def test_an_edited_source_lets_running_jobs_finish_and_refuses_new_ones(tmp_path):
    # a server whose view of the source tree the test edits: the marker file's existence is part of it
    sock, edited, starter = tmp_path / "s", tmp_path / "edited", tmp_path / "starter.py"
    starter.write_text(
        "import argparse, pathlib, sys\n"
        "from noisymlt.pipeline import preload\n"
        "real = preload.source_fingerprint\n"
        "preload.source_fingerprint = lambda: {**real(), 'edit': [pathlib.Path(sys.argv[2]).exists(), 0]}\n"
        "raise SystemExit(preload._cmd_preload(argparse.Namespace(socket=sys.argv[1], idle_timeout=300.0,\n"
        "                                                         parent=None)))\n")
    log = tmp_path / "server.log"
    with open(log, "w") as stream:
        proc = subprocess.Popen([sys.executable, str(starter), str(sock), str(edited)], stdout=stream, stderr=stream)
    try:
        deadline = time.monotonic() + 120
        while not sock.exists():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)
        args, fifo = code_deps_on_fifo(tmp_path)
        running = served_client(str(sock), args)
        child = child_on_fifo(proc, running)  # its code loaded and checked, it waits for its params
        edited.touch()  # the source changes while a job runs
        later = cli(["--version"], {preload.ENV: str(sock)})
        assert later.returncode == 0 and later.stdout.startswith("noisymlt ")  # refused: ran in its own process
        assert child.is_running() and proc.poll() is None  # the running job goes on
        feed(fifo)
        out, err = running.communicate(timeout=60)
        assert running.returncode == 0, err
        assert "noisymlt.training.trainer\n" in out  # the job finished with its result
        assert proc.wait(timeout=30) == 0 and not sock.exists()  # then the stale server exits by itself
        assert "source changed: refusing new commands, finishing 1 running" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def own_server():
    """A server that a test may kill."""
    path, proc = preload.start_server(idle_timeout=300)
    yield path, proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
    preload.stop_server(path, proc)


def test_the_servers_death_ends_its_children_and_their_commands_run_again_by_themselves(own_server, tmp_path):
    """issue 70: a job whose server dies runs in its own process instead of failing, once, saying so; its output is
    a plain run's, byte for byte."""
    path, proc = own_server
    args, fifo = code_deps_on_fifo(tmp_path)
    client = served_client(path, args)
    child = child_on_fifo(proc, client)  # the child is inside the command
    proc.kill()
    child.wait(timeout=15)  # raises if the child outlives the server (an orphan whose result nobody awaits)
    feed(fifo)  # read by the command's own process now
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert err.count("preload server") == 1 and "running the command again in this process" in err, err
    assert "Traceback" not in err, err
    alone = subprocess.Popen([sys.executable, "-m", "noisymlt", *args], stdout=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items() if k != preload.ENV})
    feed(fifo)
    assert alone.communicate(timeout=120)[0] == out


def test_a_message_is_read_alone_when_the_next_one_arrived_with_it():
    """issue 70: a fast command's exit status that reached a busy client's buffer together with "started" was
    discarded with the rest of that read, and the job failed as if the server had died."""
    import socket

    ours, theirs = socket.socketpair()
    with ours, theirs:
        preload._send(theirs, {"started": True})
        preload._send(theirs, {"exit": 3})
        theirs.close()
        time.sleep(0.05)  # both in the buffer before the first read
        assert [preload._recv(ours)[0] for _ in range(3)] == [{"started": True}, {"exit": 3}, None]


def test_a_client_that_reads_late_still_gets_its_exit_status(server):
    """The same through a real server: the child has reported before the client reads anything."""
    import socket

    path, _ = server
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            preload._send(sock, {"argv": ["--version"], "cwd": os.getcwd(), "env": dict(os.environ),
                                 **preload._identity()}, fds=[devnull, devnull, devnull])
        finally:
            os.close(devnull)
        both = sum(4 + len(json.dumps(m)) for m in ({"started": True}, {"exit": 0}))
        deadline = time.monotonic() + 60
        while len(sock.recv(1 << 16, socket.MSG_PEEK)) < both:  # the child's status waits behind "started"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert preload._recv(sock)[0] == {"started": True}
        assert preload._recv(sock)[0] == {"exit": 0}


def test_a_job_that_finished_is_not_reported_failed_when_the_server_dies(own_server, tmp_path):
    path, proc = own_server
    args, fifo = code_deps_on_fifo(tmp_path)
    client = served_client(path, args)
    child = wait_for_child(proc, client)
    os.kill(proc.pid, signal.SIGSTOP)  # the server cannot report: the job finishes while it is stopped
    feed(fifo)
    deadline = time.monotonic() + 60
    while child.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.kill()  # and the server dies before it reaped the child
    out, err = client.communicate(timeout=30)
    assert client.returncode == 0, err  # the child reported its own status
    assert "noisymlt.training.trainer\n" in out


def test_ctrl_c_gives_a_message_not_a_traceback(server, tmp_path):
    path, proc = server
    fifo = tmp_path / "never.json"
    os.mkfifo(fifo)
    args = ["code-deps", "--params", str(fifo), "--method", "erm"]
    served = served_client(path, args)
    # the command is under way (on a loaded machine a bare fork left the client mid-handshake)
    child = child_on_fifo(proc, served)
    served.send_signal(signal.SIGINT)
    _, err = served.communicate(timeout=30)  # until the child, which writes to the same stream, is gone too
    child.wait(timeout=15)
    assert served.returncode == 130
    # the command's process and the server's child (interrupted in turn) each say so, neither with a traceback
    assert err.count("noisymlt code-deps: interrupted") == 2 and "Traceback" not in err, err
    plain = subprocess.Popen([sys.executable, "-m", "noisymlt", *args], stderr=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items() if k != preload.ENV})
    time.sleep(2)  # importing or waiting on the fifo: either way a message, no traceback
    plain.send_signal(signal.SIGINT)
    _, err = plain.communicate(timeout=30)
    assert plain.returncode == 130 and err.strip() == "noisymlt code-deps: interrupted", err


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
        server.fingerprint = {**server.fingerprint, "training/trainer.py": [0, 0]}
        assert "source changed" in server._refusal(good, fds)
        assert server.draining  # stale for good: it stops taking work
        assert "source changed" in server._exit_reason()  # and, with no child running, exits saying why
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


def test_a_killed_workflow_leaves_no_preload_folder_behind(tmp_path):
    """issue 40: Snakemake killed with SIGKILL left its empty noisymlt-preload-* folder in the temporary directory;
    the server, orphaned, removes its socket and the folder start_server made for it."""
    starter = tmp_path / "starter.py"
    starter.write_text(
        "import os, signal, sys\n"
        "from noisymlt.pipeline import preload\n"
        "path, _ = preload.start_server(idle_timeout=60)\n"
        "print(path, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.run([sys.executable, str(starter)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == -9
    folder = Path(run.stdout.split()[0]).parent
    assert folder.parent == tmp_path and folder.name.startswith("noisymlt-preload-")
    deadline = time.monotonic() + 15
    while folder.exists():
        assert time.monotonic() < deadline, f"{folder} outlived the killed workflow: {list(folder.iterdir())}"
        time.sleep(0.1)


def test_manifests_record_the_same_environment_in_a_preloaded_process():
    """A step's manifest lists the installed library versions, not what its process happened to import:
    a light step run in the server (torch already imported) records what a fresh process records."""
    code = "import json; from noisymlt.core.manifest import environment; print(json.dumps(environment()))"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = subprocess.run([sys.executable, "-c", "import torch, torchvision, sklearn; " + code],
                            capture_output=True, text=True, check=True).stdout
    assert json.loads(fresh) == json.loads(loaded)
    assert {"numpy", "torch", "torchvision", "pandas", "pyarrow"} <= set(json.loads(fresh)["versions"])

