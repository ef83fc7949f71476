"""A ``mmfront worker`` never outlives the server it serves, whatever the stage its server dies in.

The orphan these guard against (found idle half an hour after its test): the worker's SIGTERM
handler ran ``stop.set()`` again inside the first signal's ``stop.set()`` and waited forever on the
lock that call held. And a worker told to stop while it waited in the handshake for a frontend
that had gone waited out the handshake's five minutes first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from mmfront.engine.worker import StopSignals
from mmfront.serve.launcher import EngineProcesses, group_running
from mmfront.testing.servers import serve_process

pytestmark = pytest.mark.slow

EXIT_S = 30.0
"""Far below the handshake's 300 s wait: a worker that waits it out fails."""


class SignalledDuringSet(threading.Event):
    """A stop event whose ``set`` is interrupted by a second signal, as a real one may be."""

    def __init__(self) -> None:
        super().__init__()
        self.handler: StopSignals | None = None
        self.calls = 0

    def set(self) -> None:
        self.calls += 1
        assert self.handler is not None
        self.handler(signal.SIGTERM, None)
        super().set()


def test_a_signal_during_the_first_signals_handling_returns_at_once() -> None:
    stop = SignalledDuringSet()
    signals = StopSignals(stop)
    stop.handler = signals
    signals.serving = True
    signals(signal.SIGTERM, None)
    assert stop.is_set() and stop.calls == 1
    signals(signal.SIGINT, None)
    assert stop.calls == 1


def test_a_signal_before_the_engine_serves_ends_the_start_up() -> None:
    stop = threading.Event()
    signals = StopSignals(stop)
    with pytest.raises(SystemExit):
        signals(signal.SIGTERM, None)
    signals(signal.SIGTERM, None)  # the second one while the first unwinds: nothing
    assert not stop.is_set()


@pytest.fixture
def silent_frontend(tmp_path: Path) -> Iterator[tuple[str, zmq.Socket[bytes]]]:
    """A handshake socket that takes a worker's HELLO and never answers it."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    address = f"ipc://{tmp_path}/handshake"
    router.bind(address)
    try:
        yield address, router
    finally:
        ctx.destroy(linger=0)


def _worker_command(model: Path, handshake: str) -> list[str]:
    return [sys.executable, "-m", "mmfront.cli", "worker", str(model), "--handshake", handshake, "--local",
            "--cache-gb", "0"]


def _await_hello(router: zmq.Socket[bytes], process_alive: object) -> None:
    deadline = time.monotonic() + 240
    while not router.poll(200):
        assert callable(process_alive) and process_alive(), "the worker exited before its HELLO"
        assert time.monotonic() < deadline, "the worker never said HELLO"
    router.recv_multipart()


def _await_gone(pid: int) -> None:
    deadline = time.monotonic() + EXIT_S
    while group_running(pid):
        assert time.monotonic() < deadline, f"worker {pid} still runs {EXIT_S} s after its server went"
        time.sleep(0.1)


def test_sigterm_in_the_handshake_ends_the_worker(
        gemma3_weights_dir: Path, silent_frontend: tuple[str, zmq.Socket[bytes]], tmp_path: Path) -> None:
    address, router = silent_frontend
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(_worker_command(gemma3_weights_dir, address), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        _await_hello(router, lambda: worker.poll() is None)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(EXIT_S) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


SPAWNER = """
import subprocess, sys, time
worker = subprocess.Popen(sys.argv[1:], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(worker.pid, flush=True)
time.sleep(600)
"""
"""A server stand-in that starts the worker without the kernel's parent-death signal."""


def test_a_local_worker_ends_when_its_server_is_killed_in_the_handshake(
        gemma3_weights_dir: Path, silent_frontend: tuple[str, zmq.Socket[bytes]]) -> None:
    address, router = silent_frontend
    server = subprocess.Popen([sys.executable, "-c", SPAWNER, *_worker_command(gemma3_weights_dir, address)],
                              stdout=subprocess.PIPE)
    assert server.stdout is not None
    worker_pid = int(server.stdout.readline())
    try:
        _await_hello(router, lambda: group_running(worker_pid))
        server.kill()
        server.wait()
        _await_gone(worker_pid)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if group_running(worker_pid):
            os.killpg(worker_pid, signal.SIGKILL)


def _workers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children
            if b"worker" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's children from /proc")
def test_a_worker_ends_when_its_serving_server_is_killed(gemma3_weights_dir: Path, tmp_path: Path) -> None:
    with serve_process(gemma3_weights_dir, tmp_path / "serve.log") as (server, _):
        workers = _workers_of(server.pid)
        assert len(workers) == 1
        server.kill()
        server.wait()
    _await_gone(workers[0])


def test_an_engine_started_from_a_thread_that_ends_lives_on() -> None:
    """Linux's parent-death signal fires as the thread that forked the engine ends: the launcher
    starts engines from a thread that lasts as long as the server."""
    started: list[EngineProcesses] = []
    thread = threading.Thread(target=lambda: started.append(
        EngineProcesses([[sys.executable, "-c", "import time; time.sleep(60)"]])))
    thread.start()
    thread.join()
    [engines] = started
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert engines.exited() == []
            time.sleep(0.05)
    finally:
        engines.stop()
    assert engines.processes[0].returncode == -signal.SIGTERM
