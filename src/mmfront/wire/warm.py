"""Memory kept resident between uses: blocks handed out for large buffers that a process makes
again and again (a lane's caller's copies of its replies, a miss's decoded pixels, resized
planes and patch rows), taken back once nothing views them; one pool per process, so what a
burst leaves idle is bounded once (:data:`WARM_KEEP_BYTES`).

Why: ``mmfront serve`` fixes glibc's mmap threshold at 1 MiB (:mod:`mmfront.wire.allocator`:
freed request bodies go back to the OS), so every large buffer is a fresh mapping and its first
write page-faults each page in. On the project's 2-core VM that cost a Qwen2.5-VL 1024x768 miss
~650 faults and 2.9-3.6 ms in a lane's caller (its reply's 4.7 MB copied out, where the same copy
into resident memory takes 0.3-0.8 ms), and processed in the server's own threads ~5 ms more CPU
than on a lane (the decoded pixels, the resized planes and the patch rows, 9.4 MB of fresh pages
a miss: docs/benchmarks.md, "In place where the kernels run").
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from mmfront.wire.allocator import LARGE_BUFFER_BYTES

WARM_MIN_BYTES = LARGE_BUFFER_BYTES
"""Buffers from this size up come from :class:`WarmBlocks`' blocks: the size from which ``mmfront
serve`` has glibc map each allocation on its own; its heap keeps smaller allocations resident by
itself."""
WARM_KEEP_BYTES = 64 << 20
"""The most idle memory one pool keeps (what a burst leaves resident)."""
_GRAIN = 1 << 20


class WarmBlocks:
    """A pool of resident blocks, each handed out as one buffer at a time.

    A buffer of :data:`WARM_MIN_BYTES` or more is a view of a block of this pool; the block comes
    back when the buffer's array is gone. Every view of a buffer holds that array: numpy stops a
    view's chain of bases at an array whose base is not an array (here a memoryview of the block),
    a memoryview holds the array it exports, and torch holds the buffer it views, so a block is
    never handed out again while any of them lives. At most :data:`WARM_KEEP_BYTES` of idle
    blocks are kept; the rest are freed. Thread-safe: a block comes back in whichever thread
    drops a buffer's last reference (the engine send's, the event loop's)."""

    def __init__(self, keep_bytes: int = WARM_KEEP_BYTES) -> None:
        self._keep = keep_bytes
        self._idle: list[np.ndarray] = []
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> np.ndarray:
        """A writable uint8 array of ``size`` bytes, from an idle block where one fits: at most a
        quarter larger than ``size`` rounded up to whole MiB, so a buffer a cache keeps holds
        little more memory than it counts."""
        if size < WARM_MIN_BYTES:
            return np.empty(size, np.uint8)
        need = -(-size // _GRAIN) * _GRAIN
        block = None
        with self._lock:
            fits = [n for n, idle in enumerate(self._idle) if need <= idle.nbytes <= need + need // 4]
            if fits:
                block = self._idle.pop(min(fits, key=lambda n: self._idle[n].nbytes))
                self._idle_bytes -= block.nbytes
        if block is None:
            block = np.empty(need, np.uint8)
        buffer = np.frombuffer(block.data[:size], np.uint8)
        weakref.finalize(buffer, self._give_back, block)
        return buffer

    def _give_back(self, block: np.ndarray) -> None:
        with self._lock:
            if self._idle_bytes + block.nbytes <= self._keep:
                self._idle.append(block)
                self._idle_bytes += block.nbytes

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes


_PROCESS_BLOCKS = WarmBlocks()
"""This process's pool (:func:`warm_memory`)."""


def warm_memory(nbytes: int) -> np.ndarray:
    """``nbytes`` of writable uint8 memory, resident where it is large (this process's
    :class:`WarmBlocks`): for a buffer made and dropped message after message, miss after miss."""
    return _PROCESS_BLOCKS.take(nbytes)


__all__ = ["WARM_KEEP_BYTES", "WARM_MIN_BYTES", "WarmBlocks", "warm_memory"]
