"""Large message buffers go back to the operating system once an engine frees them.

An engine takes messages as large as its frontends send (ZMQ's queues have no bound by default,
as in vLLM), so a rogue frontend's flood of 4 MiB bodies arrives whole. glibc serves buffers that
size with ``mmap`` and unmaps them when freed, until the first such free: it then raises its mmap
threshold to that size, later buffers come from the heap, and one buffer still alive above them
keeps every freed one resident. The soak saw an engine's memory creep up flood after flood that
way (docs/reliability.md). A fixed threshold keeps each large buffer mapped on its own for good.
"""

from __future__ import annotations

import ctypes
import functools

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter; setting it also turns the dynamic threshold off."""

MMAP_THRESHOLD_BYTES = 1 << 20


@functools.cache
def unmap_large_buffers() -> bool:
    """Fix this process's malloc mmap threshold at :data:`MMAP_THRESHOLD_BYTES` (once); whether
    it took effect (``False`` off glibc, where nothing is changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
