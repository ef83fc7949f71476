"""A flood of large messages leaves no memory behind in the engine once they are freed
(soak finding: glibc's dynamic mmap threshold kept freed 4 MiB buffers resident in the heap)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator, Linux only")

FLOOD = textwrap.dedent("""
    import ctypes, sys
    if sys.argv[1] == "receiver":
        from multiprocessing import Pipe
        from mmfront.engine.receiver import EngineCoreReceiver
        from mmfront.engine.transports import PipeTransport
        frontend, engine = Pipe()
        EngineCoreReceiver(PipeTransport(engine), None).close()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    size = 4 << 20
    libc.free(libc.malloc(size))  # the first large free: glibc raises its threshold to 4 MiB here
    before = resident_mib()
    buffers = [libc.malloc(size) for _ in range(32)]
    for p in buffers:
        ctypes.memset(p, 1, size)
    for p in buffers[:-1]:
        libc.free(p)  # the flood is handled; its last message is still held
    print(resident_mib() - before)
""")


def _retained_mib(setup: str) -> float:
    out = subprocess.run([sys.executable, "-c", FLOOD, setup], capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.strip())


def test_an_engine_returns_a_floods_freed_buffers_to_the_os() -> None:
    assert _retained_mib("receiver") < 16  # only the message still held (4 MiB)


def test_without_the_receiver_glibc_keeps_them() -> None:
    """What the receiver prevents: the same flood in a bare process keeps ~124 MiB resident."""
    assert _retained_mib("bare") > 64
