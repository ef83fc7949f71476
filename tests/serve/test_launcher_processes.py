"""The launcher's hold on its engine processes, without a model: a stop is SIGTERM then SIGKILL
after the grace period, an engine outlives neither a SIGKILLed server nor an exit without stop
(atexit), an engine that exits on its own is reported, and one that fails before it is ready
fails the start at once, naming its rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import HandshakeError
from mmfront.serve.launcher import EngineProcesses, start_frontend
from mmfront.serve.settings import ServePlan, ServeSettings

IGNORES_SIGTERM = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                         "print('ready', flush=True); time.sleep(120)"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; only its parent's wait is missing
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_stop_terminates_then_kills_after_the_grace_period() -> None:
    engines = EngineProcesses([["sleep", "120"], IGNORES_SIGTERM])
    time.sleep(0.5)  # let the second one install its handler
    engines.stop(grace_s=0.5)
    assert [p.returncode for p in engines.processes] == [-signal.SIGTERM, -signal.SIGKILL]


def test_each_engine_runs_in_its_own_session() -> None:
    engines = EngineProcesses([["sleep", "120"]])
    try:
        [process] = engines.processes
        assert os.getsid(process.pid) == process.pid != os.getsid(0)
    finally:
        engines.stop()


def test_an_engine_that_exits_is_reported_with_its_rank_and_status() -> None:
    seen: list[tuple[int, int]] = []
    reported = threading.Event()
    engines = EngineProcesses([["sleep", "120"], [sys.executable, "-c", "raise SystemExit(3)"]])
    try:
        engines.watch(lambda rank, status: (seen.append((rank, status)), reported.set()))
        assert reported.wait(20)
        assert seen == [(1, 3)]
    finally:
        engines.stop()
    time.sleep(0.5)
    assert seen == [(1, 3)]  # a stop is not an exit to report


def test_an_exit_is_reported_when_another_thread_was_reaping_the_engine() -> None:
    """``Popen.poll`` answers ``None`` while another thread's ``Popen.wait`` holds the process's
    reaping lock (subprocess's ``_waitpid_lock``, held here by hand): the watcher, woken by the
    engine's ``pidfd``, looks again until the status comes instead of forgetting the engine."""
    seen: list[tuple[int, int]] = []
    reported = threading.Event()
    engines = EngineProcesses([["sleep", "120"], ["sleep", "120"]])
    victim = engines.processes[1]
    try:
        engines.watch(lambda rank, status: (seen.append((rank, status)), reported.set()))
        with victim._waitpid_lock:
            victim.kill()
            assert victim.poll() is None  # the lock is held: poll cannot tell
            time.sleep(0.5)  # the watcher wakes meanwhile
        assert reported.wait(10)
        assert seen == [(1, -signal.SIGKILL)]
    finally:
        engines.stop()


_SERVER = textwrap.dedent("""
    import json, sys, time
    from mmfront.serve.launcher import EngineProcesses
    engines = EngineProcesses([["sleep", "120"], ["sleep", "120"]])
    print(json.dumps(engines.pids), flush=True)
    if sys.argv[1] == "hang":
        time.sleep(120)
""")


@pytest.mark.parametrize("how", ["SIGKILL", "exit"])
def test_no_engine_outlives_the_server(how: str) -> None:
    """SIGKILL leaves the server no chance to clean up: the kernel's parent-death signal stops the
    engines; a plain exit without stop goes through atexit."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER, "hang" if how == "SIGKILL" else "exit"],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    pids = json.loads(server.stdout.readline())
    if how == "SIGKILL":
        assert [p for p in pids if alive(p)] == pids
        server.kill()
    server.wait(60)
    assert wait_gone(pids) == []


@pytest.mark.slow
def test_an_engine_that_fails_to_start_fails_the_start_at_once(gemma3_dir: Path) -> None:
    """A folder without weights: ``mmfront worker`` exits at once, and the wait ends on that exit
    (its message), not at the ready timeout (the handshake's "never said HELLO")."""
    plan = ServePlan(ServeSettings(gemma3_dir), MultiModalConfig(mm_processor_cache_gb=0.02, mm_processing_lanes=0),
                     engine_ready_timeout_s=300)
    with pytest.raises(HandshakeError, match=r"Engine rank 0 \(mmfront worker\) exited with status 1 before it was ready"):
        start_frontend(plan, env={**os.environ, "OMP_NUM_THREADS": "1"})
