"""Freed request bodies go back to the OS (``mmfront.wire.allocator.unmap_large_buffers``,
called as ``mmfront serve`` starts): without it, glibc raises its mmap threshold after the first
large free and keeps later bodies in per-thread heaps that small survivors pin (this script: +124
MiB kept after 480 MiB of 3 MiB bodies on four threads; the HTTP soak's server +49 MiB after 90 s of
big-body attacks)."""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.types import Message

from mmfront.serve.bodies import BodyBudget, HeldBody, read_body
from mmfront.wire.allocator import unmap_large_buffers

BODIES_ON_THREADS = textwrap.dedent("""
    import threading
    from mmfront.wire.allocator import unmap_large_buffers

    def rss_mib():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 >> 20

    assert unmap_large_buffers()
    survivors = []
    before = rss_mib()

    def serve_bodies():
        for _ in range(3):
            bodies = [bytearray(3 << 20) for _ in range(40)]
            small = [bytes(200) for _ in range(2000)]
            survivors.append(small[::500])  # a few small objects outlive each burst
            del bodies, small

    threads = [threading.Thread(target=serve_bodies) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(rss_mib() - before)
""")


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_bodies_leave_the_process() -> None:
    assert unmap_large_buffers()
    done = subprocess.run([sys.executable, "-c", BODIES_ON_THREADS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=True)
    kept_mib = int(done.stdout.strip())
    assert kept_mib < 16, f"{kept_mib} MiB of 480 MiB of freed bodies stayed in the process"


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the RSS from /proc")
def test_a_declared_body_takes_memory_as_its_bytes_arrive() -> None:
    """Issue 36's soak: ``bytearray(size)`` zeroed a declared 64 MiB at once, on the event loop,
    before a byte of the body arrived (~15-25 ms per 60 MB, four bodies arriving together four
    times that, every other request waiting). A large body now grows as its bytes arrive; it is
    read whole, in one buffer, as before."""
    size, first = 64 << 20, 1 << 20
    grown: list[int] = []
    sent = 0
    before = _rss_bytes()

    async def receive() -> Message:
        nonlocal sent
        if sent:
            grown.append(_rss_bytes() - before)
        part = b"b" * (size - first) if sent else b"a" * first
        sent += len(part)
        return {"type": "http.request", "body": part, "more_body": sent < size}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-length", str(size).encode())]}
    budget = BodyBudget(size)
    body = asyncio.run(read_body(Request(scope, receive), size, HeldBody(budget)))
    assert len(body) == size and body[:first] == b"a" * first and body[first:] == b"b" * (size - first)
    assert budget.held == size
    assert grown[0] < 16 << 20, grown  # before: the whole 64 MiB, zeroed before the second read
