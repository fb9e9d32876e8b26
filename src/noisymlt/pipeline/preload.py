"""A preloaded process that runs `noisymlt` commands in forked children: local workflow runs only.

Every training job pays about 3.5 s importing torch and torchvision (which imports torch._dynamo)
before its first step, and the demo runs about 160 of them on 2 cores. With ``workflow.preload: true``
the Snakefile starts one server per Snakemake run, which imports those modules once. A `noisymlt`
command whose environment names the server (``NOISYMLT_PRELOAD``) hands it its arguments, working
directory, environment and standard streams; the server forks a child that runs the command with
them, as a fresh process would; the child reports its own exit status, which the command exits with.

What ends what, so that no job is lost and none is reported wrongly:
- the command's process is interrupted or killed (Ctrl-C, a cancelled job): the server interrupts the
  child (SIGINT, as Ctrl-C reaches a plain process), then kills it after KILL_GRACE_S;
- the server dies: its children die with it (the kernel's parent-death signal), and a command whose child
  had not reported runs again in its own process, once, saying so (its checkpoints and atomic writes make that
  the result a plain run gives); one whose child had finished has its status already, sent by the child;
- the package's source changes while the server runs: it refuses new commands (which then run in their own
  processes, with the new code), lets the running children finish, and exits.

Nothing depends on the server: without one (a SLURM node, a stale socket, a source tree edited since
the server started) the command runs in its own process as always. The server saves start-up time
and never changes a result: tests compare its runs' outputs with plain runs byte for byte.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "NOISYMLT_PRELOAD"
# What a training or evaluation job imports; the server does it once. numpy and pyarrow start
# threads of their own, which fork handles as it does for PyTorch's DataLoader workers. DivideMix's
# co-divide imports sklearn.mixture when it first runs (~1 CPU second a DivideMix job).
PRELOAD_MODULES = ("numpy", "pandas", "pyarrow.parquet", "torch", "torchvision", "noisymlt.cli", "noisymlt.training.trainer",
                   "noisymlt.methods.single", "noisymlt.methods.colearning", "noisymlt.methods.dividemix",
                   "noisymlt.methods.bbn", "noisymlt.methods.mlgcn", "noisymlt.evaluation.evaluate", "sklearn.mixture")
# A caller also leaves when it has its exit status, sent by the child just before it exits: a child still
# there after LEAVE_GRACE_S was left by an interrupted or killed caller, and is interrupted in turn.
LEAVE_GRACE_S = 0.5
KILL_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


# ---------------------------------------------------------------------------------------------- wire
def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    header = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(sock, [header + data], fds)
    else:
        sock.sendall(header + data)


def _reply(conn: socket.socket, message: dict) -> None:
    """Send to a client that may have gone already (then there is no one left to tell)."""
    try:
        _send(conn, message)
    except OSError:
        pass


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


MAX_MESSAGE = 64 << 20  # a request carries an environment: large, but never this large


def _exactly(sock: socket.socket, size: int, start: bytes = b"") -> bytes | None:
    """``size`` bytes (``start`` first), or None at end of stream. Never more: a second message that arrived in
    the same buffer (a child's exit status right behind "started", read by a client the machine had not scheduled
    for a while) stays in the socket for the next read."""
    data = start
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None
        data += more
    return data


def _recv(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None at end of stream) and the file descriptors that came with it."""
    fds: list[int] = []
    if with_fds:  # the descriptors ride on the message's first bytes
        head, fds, _, _ = socket.recv_fds(sock, 4, with_fds)
    else:
        head = sock.recv(4)
    head = _exactly(sock, 4, head) if head else None
    if head is None:
        return None, fds
    (size,) = struct.unpack("!I", head)
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes")
    data = _exactly(sock, size)
    if data is None:
        return None, fds
    return json.loads(data), fds


def source_fingerprint() -> dict[str, list[int]]:
    """(mtime, size) of every module of the package: a server whose code was edited since it
    imported it must not run jobs with the old code."""
    root = Path(__file__).resolve().parents[1]  # the package
    return {str(p.relative_to(root)): _stamp(p) for p in sorted(root.rglob("*.py"))}


def _stamp(path: Path) -> list[int]:
    try:
        stat = path.stat()
    except OSError:  # removed since the listing (an editor's save): a change like any other
        return [-1, -1]
    return [stat.st_mtime_ns, stat.st_size]


def _identity() -> dict:
    """What client and server must share: the interpreter and the package location."""
    return {"executable": os.path.realpath(sys.executable), "package": str(Path(__file__).resolve().parents[1])}


def _out_arg(argv: list[str]) -> list[str]:
    """The --out of a command line, which names the run a training job is for."""
    return [f"--out {argv[i + 1]}" for i, a in enumerate(argv[:-1]) if a == "--out"][:1]


def _log(line: str) -> None:
    print(time.strftime("%Y-%m-%d %H:%M:%S"), line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- client
def run_via_server(argv: list[str]) -> int | None:
    """Run ``noisymlt ARGV`` in a child of the preload server named by $NOISYMLT_PRELOAD (a socket path), and return
    its exit status; None when there is no usable server (the caller then runs the command itself)."""
    path = os.environ.get(ENV)
    if not path or not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        _send(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), **_identity()}, fds=[0, 1, 2])
        reply, _ = _recv(sock)
    except (OSError, ValueError):
        sock.close()
        return None
    if reply is None or "refused" in reply:
        sock.close()
        return None
    # Started: from here on the command's fate is the child's. A signal that ends this process closes
    # the socket, and the server then interrupts the child. The exit status comes from the child itself
    # (or from the server when a signal ended the child), so it arrives even if the server has died since.
    try:
        result, _ = _recv(sock)
    except (OSError, ValueError):
        result = None
    sock.close()
    if result is None:
        # The stream ends once every holder of the child's end has closed it: the child and whatever it forked
        # are gone, so nothing of that attempt writes any more. This process runs the command itself, once.
        print(f"noisymlt {argv[0] if argv else ''}: the preload server ({path}) ended before the command "
              "reported its exit status (its log says why); running the command again in this process",
              file=sys.stderr)
        os.environ.pop(ENV, None)  # and what it starts does not try that server again
        return None
    return int(result["exit"])


# ---------------------------------------------------------------------------------------------- server
@dataclass
class _Job:
    conn: socket.socket  # the client waiting for the child's exit status
    started: float
    command: str  # for the log


class Server:
    """Single-threaded: a fork from a process with several Python threads could copy a held lock."""

    def __init__(self, path: Path, *, idle_timeout: float, parent: int | None):
        self.path = path
        self.idle_timeout = idle_timeout
        self.parent = parent
        self.fingerprint = source_fingerprint()
        self.identity = _identity()
        self.children: dict[int, _Job] = {}  # pid -> its job
        self.left: dict[int, float] = {}  # pid -> when its caller left
        self.interrupted: set[int] = set()  # children sent SIGINT because their caller left
        self.draining = False  # the source changed: finish the running children, take no new ones, exit
        self.stopping = False  # told to stop (SIGTERM): end now, children included
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        os.chmod(path, 0o600)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.last_active = time.monotonic()

    def serve(self) -> None:
        why = None
        try:
            while not (why := self._exit_reason()):
                for key, _ in self.selector.select(timeout=0.05):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:  # a client closed its end before its child finished: it was killed
                        self._client_gone(key.data)
                self._reap()
        except BaseException as exc:
            import traceback

            traceback.print_exc()  # into the log: a server that ends must say why
            why = f"{type(exc).__name__} in the server (the traceback above)"
            raise
        finally:
            _log(f"exiting: {why}" + (f"; killing {len(self.children)} running command(s), whose callers run them "
                                      "again themselves" if self.children else ""))
            for pid in list(self.children):
                self._kill(pid, signal.SIGKILL)
            self.listener.close()
            self.path.unlink(missing_ok=True)
            if self.parent is not None:  # a workflow's own folder (start_server): gone with it, even after kill -9
                try:
                    self.path.parent.rmdir()
                except OSError:
                    pass

    def stop(self) -> None:
        self.stopping = True

    def _exit_reason(self) -> str | None:
        """Why the server ends now, or None while it serves."""
        if self.stopping:
            return "told to stop (SIGTERM)"
        if self.parent is not None and os.getppid() != self.parent:
            return f"the workflow that started it (pid {self.parent}) has ended"
        if self.children:
            self.last_active = time.monotonic()
            return None
        if self.draining:
            return "the package's source changed and its last command has finished"
        idle = time.monotonic() - self.last_active
        return f"idle for {idle:.0f} s" if idle >= self.idle_timeout else None

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        self.last_active = time.monotonic()
        conn.settimeout(5.0)  # a client sends its request at once; never let one stall the server
        try:
            request, fds = _recv(conn, with_fds=3)
        except (OSError, ValueError):
            conn.close()
            return
        conn.settimeout(None)
        reason = self._refusal(request, fds)
        if reason:
            _close_all(fds)
            _reply(conn, {"refused": reason})
            conn.close()
            return
        # Told before the fork: from then on only the child writes to the client (its exit status), or the
        # server when a signal ended the child, so two processes never write to one socket at once.
        _reply(conn, {"started": True})
        server_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:  # no memory or no process slot for a child: its caller runs the command itself
            _log(f"cannot fork for noisymlt {' '.join(request['argv'][:1])}: {exc}")
            _close_all(fds)
            conn.close()
            return
        if pid == 0:
            self._child(request, fds, conn, server_pid)  # never returns
        try:
            os.setpgid(pid, pid)  # as the child does: whichever runs first, the group exists before a kill
        except OSError:
            pass
        _close_all(fds)
        job = _Job(conn, time.monotonic(), " ".join(request["argv"][:1] + _out_arg(request["argv"])))
        self.children[pid] = job
        self.selector.register(conn, selectors.EVENT_READ, pid)
        _log(f"pid {pid}: noisymlt {job.command}")

    def _refusal(self, request: dict | None, fds: list[int]) -> str | None:
        if not isinstance(request, dict) or len(fds) != 3 or not isinstance(request.get("argv"), list):
            return "malformed request"
        if {k: request.get(k) for k in self.identity} != self.identity:
            return "another interpreter or package location"
        if source_fingerprint() != self.fingerprint:
            if not self.draining:
                _log(f"the package's source changed: refusing new commands, finishing {len(self.children)} running")
            self.draining = True  # stale for good: finish the running children, then exit
            return "the package's source changed since the server started"
        return None

    def _check_source(self) -> None:
        """In a child, once its command has read its code digest: the source must still be what this server
        imported (it was when the request came; an edit since would make the digest name other code)."""
        if source_fingerprint() != self.fingerprint:
            from noisymlt.errors import NoisyMLTError

            raise NoisyMLTError("the package's source changed since the preload server imported it; run the "
                                "command again (it then runs in its own process, with the code on disk)")

    def _child(self, request: dict, fds: list[int], conn: socket.socket, server_pid: int) -> None:
        code = 1
        try:
            self.selector.close()
            self.listener.close()
            for job in self.children.values():
                job.conn.close()
            os.setpgid(0, 0)  # its own group: the server interrupts or kills it with everything it started
            # die with the server (SIGTERM when it ends), unless it already ended before this line
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != server_pid:
                os._exit(128 + signal.SIGTERM)
            for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a fresh interpreter
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = [sys.argv[0], *request["argv"]]
            from noisymlt.cli import main
            from noisymlt.core import codedeps

            codedeps.loaded_check = self._check_source  # the digest a job takes must name the code imported here
            code = main(request["argv"])
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except KeyboardInterrupt:  # before the command's own handler was reached (cli.main has one)
            print(f"noisymlt {request['argv'][0] if request['argv'] else ''}: interrupted", file=sys.stderr)
            code = 130
        except BaseException:  # noqa: BLE001 (report anything, as the interpreter would)
            import traceback

            traceback.print_exc()
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing may stop the report and the exit below
            import logging

            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            code = code if isinstance(code, int) else 1
            _reply(conn, {"exit": code})  # the child's own report: it arrives even if the server has died
            os._exit(code)

    def _client_gone(self, pid: int) -> None:
        job = self.children.get(pid)
        if job is not None and pid not in self.left:
            self.selector.unregister(job.conn)
            self.left[pid] = time.monotonic()  # _reap interrupts it unless it is exiting

    def _kill(self, pid: int, sig: int) -> None:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, sig)
                return
            except ProcessLookupError:
                continue

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
            job = self.children.pop(pid, None)
            if job is None:
                continue
            code = os.waitstatus_to_exitcode(status)  # -N for signal N
            _log(f"pid {pid}: exit status {code} after {time.monotonic() - job.started:.1f} s"
                 + (" (interrupted: its caller left)" if pid in self.interrupted else ""))
            if pid not in self.left:
                self.selector.unregister(job.conn)
                if code < 0:  # a signal ended the child before it could report: report as a shell would
                    _reply(job.conn, {"exit": 128 - code})
            self.left.pop(pid, None)
            self.interrupted.discard(pid)
            job.conn.close()
        now = time.monotonic()
        for pid, since in list(self.left.items()):
            if now - since > LEAVE_GRACE_S and pid not in self.interrupted:
                self._kill(pid, signal.SIGINT)  # what Ctrl-C sends a plain process: it ends with a message
                self.interrupted.add(pid)
            elif now - since > LEAVE_GRACE_S + KILL_GRACE_S:
                self._kill(pid, signal.SIGKILL)


def start_server(*, idle_timeout: float = 600.0, log: Path | None = None):
    """Start a server in the background for the calling process (it exits when this process does, or
    after ``idle_timeout`` seconds without work) and wait until it accepts; returns (socket path, its
    Popen). The socket lives in a private temporary folder: a Unix socket path must stay short.
    ``log``: the file the server appends one line per command started and ended to."""
    import subprocess

    folder = Path(tempfile.mkdtemp(prefix="noisymlt-preload-"))
    path = folder / "socket"
    stream = None
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        stream = open(log, "a")
    proc = subprocess.Popen([sys.executable, "-m", "noisymlt", "preload", "--socket", str(path),
                             "--idle-timeout", str(idle_timeout), "--parent", str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=stream, stderr=stream, start_new_session=True)
    if stream is not None:
        stream.close()
    deadline = time.monotonic() + 120
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the preload server did not start (exit status {proc.poll()})")
        time.sleep(0.05)
    return str(path), proc


def stop_server(path: str, proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except Exception:  # noqa: BLE001
        proc.kill()
    Path(path).unlink(missing_ok=True)
    try:
        Path(path).parent.rmdir()
    except OSError:
        pass


def _cmd_preload(args: argparse.Namespace) -> int:
    import importlib

    path = Path(args.socket)
    if path.exists():
        raise SystemExit(f"noisymlt preload: {path} exists (another server?); remove it or choose another path")
    for name in PRELOAD_MODULES:
        importlib.import_module(name)
    # the import graph that every job's manifest records (valid while the source is unchanged, which is
    # as long as this server serves)
    importlib.import_module("noisymlt.pipeline.step_code").warm()
    sys.stdout.flush()
    sys.stderr.flush()
    server = Server(path, idle_timeout=args.idle_timeout, parent=args.parent)
    _log(f"serving on {path}: {', '.join(PRELOAD_MODULES)} imported")
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    server.serve()
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "preload", help="serve noisymlt commands from a process with torch already imported (local runs)",
        description="Import torch, torchvision and the trainer once, then run each noisymlt command that "
                    f"connects (its environment has {ENV}=SOCKET) in a forked child with the command's "
                    "arguments, working directory, environment and standard streams. Saves the ~3.5 s "
                    "import per job; results are those of a fresh process. The workflow starts and stops it "
                    "(workflow.preload: true); it exits on SIGTERM, when --parent exits, or when idle.",
    )
    p.add_argument("--socket", required=True, help="Unix socket path to listen on (short: ~100 characters at most)")
    p.add_argument("--idle-timeout", type=float, default=600.0, help="exit after this many seconds without work")
    p.add_argument("--parent", type=int, help="exit when this process (the workflow) is no longer our parent")
    p.set_defaults(func=_cmd_preload)
