"""Large buffers go back to the operating system once freed: the one home of the process-wide
malloc setting that both sides of the link make at start (here, beside the frames, because the
receivers' warm frame memory is sized by it too).

glibc serves a large buffer with ``mmap`` and unmaps it when freed, until the first such free:
it then raises its mmap threshold to that size (up to 32 MiB), later buffers come from per-thread
heaps, and one small object still alive above them keeps every freed one resident. An engine
takes messages as large as its frontends send (ZMQ's queues have no bound by default, as in
vLLM), so a rogue frontend's flood of 4 MiB bodies made an engine's memory creep up flood after
flood (the soak, docs/reliability.md); ``mmfront serve``'s request bodies left the server ~50 MiB
above its resting size after a burst of big bodies (the HTTP soak: +49 MiB in 90 s of attacks;
+4.5 MiB fixed). A fixed threshold keeps each large buffer mapped on its own, given back when freed.

Memory that a process reuses message after message on purpose is kept warm instead
(:class:`mmfront.wire.warm.WarmBlocks`): a fresh mapping costs a page fault per page.
"""

from __future__ import annotations

import ctypes
import functools

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter; setting it also turns the dynamic threshold off."""

LARGE_BUFFER_BYTES = 1 << 20
"""Allocations from this size up get pages of their own, given back to the OS when freed."""


@functools.cache
def unmap_large_buffers() -> bool:
    """Fix this process's malloc mmap threshold at :data:`LARGE_BUFFER_BYTES` (once); whether it
    took effect (``False`` off glibc, where nothing is changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES))
