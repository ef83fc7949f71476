"""Servers for tests: an ASGI app under a given uvicorn configuration in a thread
(:func:`run_uvicorn`), and ``mmfront serve`` as a user runs it, a subprocess on a free loopback
port (:func:`serve_process`). Both stop by themselves when their ``with`` block ends."""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmfront.network import get_open_port


def start_in_thread(server: Any) -> threading.Thread:
    """Run ``server`` (a ``uvicorn.Server``) on a daemon thread; the thread, once it serves."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    return thread


@contextmanager
def run_uvicorn(config: Any) -> Iterator[int]:
    """Serve ``config`` (a ``uvicorn.Config`` binding port 0 on loopback) in a thread; its port."""
    from mmfront.serve.quiet_server import QuietServer

    server = QuietServer(config)
    thread = start_in_thread(server)
    try:
        yield int(server.servers[0].sockets[0].getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def serve_process(model_dir: Path, log: Path, *flags: str, env: dict[str, str] | None = None,
                  ready_timeout_s: float = 240) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``mmfront serve model_dir`` (served as ``tiny``, one thread, no processing lanes, a small
    cache, with ``flags``) writing to ``log``, once ``/health`` answers 200; the process and its URL.
    It is killed when the block ends."""
    port = get_open_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mmfront.cli", "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
             "--served-model-name", "tiny", "--mm-processor-cache-gb", "0.05", "--processing-lanes", "0",
             "--uvicorn-log-level", "warning", *flags],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not _healthy(port):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield process, f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def _healthy(port: int) -> bool:
    with contextlib.suppress(OSError):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    return False


__all__ = ["run_uvicorn", "serve_process", "start_in_thread"]
