"""`--workers N`: N worker processes serve one listening port, and this process watches them.

The supervisor binds the port itself (so a port in use is one clear error) and hands the
listening sockets to every worker, which all accept on them: the kernel gives each new
connection to one worker. Each worker is a whole server (its own event loop, agent, ticker
and plugin instance) that also listens on a private unix socket in the worker folder, where
the other workers forward the requests it owns (routing.py).

The supervisor makes a secret at each start and hands it to the workers in their
environment: it signs what one worker forwards to another (channel.py). The worker
folder holds the workers' sockets and shared counts, each private to this user (mode 0600);
a folder the supervisor made is removed when it stops, and in a folder it was given
(`--worker-dir`, which may already exist and keeps its mode) only what the workers made is.

Worker 0 starts first, so a start-up mistake (a bad flag value, a bad model folder) is printed
once and ends the supervisor with its exit status. SIGTERM and SIGINT are passed on to every
worker (each drains; a second SIGTERM ends them at once); the supervisor exits when all have,
with the worst status. A worker that dies on its own (killed, crashed) is started again; its
calls are gone with it. Workers are killed if the supervisor itself is (Linux death signal).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from agent.cli_errors import exit_with_error

log = logging.getLogger("signaling.workers.supervisor")

READY_TIMEOUT = 300.0  # a worker loads its plugin before it listens
CHANNEL_SECRET_ENV = "AGENT_WORKER_CHANNEL_SECRET"  # read (and removed) by each worker
# What the workers make in the folder: removed at stop even from a folder given to us.
WORKER_FILES = ("worker-*.sock", "handoff-*.sock", "loads", "*.tally")
RESTART_DELAY = 0.5
PR_SET_PDEATHSIG = 1


def worker_socket_path(folder: str | Path, index: int) -> Path:
    return Path(folder) / f"worker-{index}.sock"


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address `host` names (as aiohttp's own server binds)."""
    listeners = []
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            listener = socket.socket(family, kind, proto)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(address)
            listener.listen(128)
            listener.set_inheritable(True)
            listeners.append(listener)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    return listeners


def _die_with_parent() -> None:
    """In the child before exec: be killed when the supervisor dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, argv: Sequence[str], count: int, folder: Path,
                 listeners: list[socket.socket]) -> None:
        self.argv = list(argv)
        self.count = count
        self.folder = folder
        self.listeners = listeners
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.stop_signal = signal.SIGTERM
        self.status = 0
        self.channel_secret = secrets.token_hex(32)  # this start's, for the workers only

    def command(self, index: int) -> list[str]:
        fds = [listener.fileno() for listener in self.listeners]
        return [sys.executable, "-m", "signaling", *self.argv,
                "--worker-index", str(index), "--worker-dir", str(self.folder),
                "--worker-fds", ",".join(map(str, fds))]

    def spawn(self, index: int) -> subprocess.Popen[bytes]:
        # Own session: a signal to the supervisor's process group (Ctrl-C, `timeout`) reaches
        # a worker once, through the supervisor, not twice (a second SIGTERM ends calls).
        environment = {**os.environ, CHANNEL_SECRET_ENV: self.channel_secret}
        worker = subprocess.Popen(self.command(index), env=environment,
                                  pass_fds=[listener.fileno() for listener in self.listeners],
                                  preexec_fn=_die_with_parent, start_new_session=True)
        self.workers[index] = worker
        if self.stopping:
            # The signal came while this one was being started, before it was in `workers`:
            # it was passed on to the others only.
            worker.send_signal(self.stop_signal)
        return worker

    def wait_ready(self, index: int) -> int | None:
        """None once worker `index` takes connections on its socket; its status if it ended."""
        path = worker_socket_path(self.folder, index)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            status = self.workers[index].poll()
            if status is not None:
                return status
            if path.exists():
                with socket.socket(socket.AF_UNIX) as probe:
                    try:
                        probe.connect(str(path))
                        return None
                    except OSError:
                        pass
            time.sleep(0.05)
        return None

    def signal_all(self, signum: int) -> None:
        for worker in self.workers.values():
            if worker.poll() is None:
                worker.send_signal(signum)

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True
        self.stop_signal = signal.Signals(signum)
        self.signal_all(signum)

    def exit_status(self, worker_status: int) -> int:
        if self.stopping and worker_status == -signal.SIGTERM:
            # Ended by the SIGTERM passed on before it had installed its drain handler, that is
            # while still starting: it had no calls, so nothing was cut short.
            return 0
        return abs(worker_status)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.spawn(0)
        status = self.wait_ready(0)
        if status is not None:
            return self.exit_status(status)  # the worker said why, once
        for index in range(1, self.count):
            if not self.stopping:
                self.spawn(index)
        for index in range(1, self.count):  # (worker 0 serves its public sockets after this)
            if index in self.workers and not self.stopping:
                self.wait_ready(index)  # one that ended is restarted below
        log.info("%d workers serving (pids %s)", self.count,
                 ", ".join(str(w.pid) for w in self.workers.values()))
        while self.workers:
            time.sleep(0.1)
            for index, worker in list(self.workers.items()):
                status = worker.poll()
                if status is None:
                    continue
                del self.workers[index]
                if status != 0 and not self.stopping:
                    log.warning("worker %d (pid %d) ended with status %d: starting it again; "
                                "its calls are gone", index, worker.pid, status)
                    time.sleep(RESTART_DELAY)
                    self.spawn(index)
                    continue
                self.status = max(self.status, self.exit_status(status))
        return self.status


def exit_for_listen_error(exc: OSError, host: str, port: int) -> NoReturn:
    """The one coded line for a port that cannot be listened on, and exit 2."""
    if exc.errno == errno.EADDRINUSE:
        exit_with_error("port_in_use", f"{host}:{port} is already in use (another server?); "
                        "pick another --port", cause=exc)
    exit_with_error("listen_failed", f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                    cause=exc)


def run_supervisor(argv: Sequence[str], count: int, host: str, port: int,
                   folder: str | None) -> int:
    """Serve `host:port` with `count` workers until they all end; the exit status."""
    try:
        listeners = bind_listeners(host, port)
    except OSError as exc:
        exit_for_listen_error(exc, host, port)
    work_folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="agent-workers-"))
    own_folder = folder is None or not work_folder.exists()
    if own_folder:
        # The worker sockets are a second way in, past the per-address limits: this user only.
        work_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(work_folder, 0o700)
    try:
        return Supervisor(argv, count, work_folder, listeners).run()
    finally:
        for listener in listeners:
            listener.close()
        if own_folder:
            shutil.rmtree(work_folder, ignore_errors=True)
        else:
            remove_worker_files(work_folder)


def remove_worker_files(folder: Path) -> None:
    """What the workers made in a folder the supervisor was given (and only that)."""
    for pattern in WORKER_FILES:
        for path in folder.glob(pattern):
            path.unlink(missing_ok=True)
