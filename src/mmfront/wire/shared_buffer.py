"""A lane connection's shared buffers: each end writes the frames of its messages into one memfd
it keeps and reuses, and the other end copies them out of its mapping of it.

Why not hand the receiver fresh shared memory per message (a sealed memfd it maps and keeps, no
copy)? Because on a VM the cost of a message's memory is its pages, not the copy: measured on the
project's 2-core VM (docs/benchmarks.md), 4.7 MB of Qwen2.5-VL patch rows cost 2.3 ms to write
into a fresh memfd (``pwrite``; 4.1 ms processed straight into a fresh mapping, one page fault
per page), and 0.45 ms more for the receiver's first touch of its pages; written into memory that
is already mapped, they cost 0.13 ms, and 0.2-0.8 ms to copy out into the receiver's own heap.
Memory a lane can still write must not be kept by the caller (a broken or hostile lane would
change inputs after they were hashed and cached), so the caller's copy is what makes a reused
buffer safe: a lane that writes during it spoils only the reply it is sending.

Only for strict request/reply between two processes: the sender overwrites its buffer with its
next message, which it sends only after the receiver answered, so the receiver copies the frames
out before it answers (:func:`mmfront.wire.pipe.recv_frames` does).

A sender may also make a large frame where it will be sent from: :meth:`OutBuffer.reserve` hands
out memory of the buffer for the next message (a processing lane's patch rows are laid out
straight into it, :func:`reply_memory`), and :meth:`OutBuffer.place` leaves a frame that lies
there where it is, so the lane's copy of its reply is saved (a Qwen2.5-VL 1024x768 miss: 4.7 MB,
~0.5-0.65 ms). Each frame's offset travels in the message's header.

The memfd is sealed against shrinking and growing, so the receiver's mapping stays backed (a
shrunk memfd would SIGBUS the receiver's copy); a sender that needs more room sends a new one
with its next message. The memfd has no name: nothing outlives the two processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
from collections.abc import Sequence
from typing import NoReturn

import numpy as np

from mmfront.errors import DecodeError, resource_error
from mmfront.wire.memfd import ALIGN, layout
from mmfront.wire.warm import warm_memory

KEEP_BYTES = 64 << 20
"""The largest buffer kept between messages; one a larger message needed is replaced with one of
the size the next message needs."""
MAX_BYTES = 1 << 32
"""The largest buffer a receiver maps: what one message's frames may hold in all."""
_GRAIN = 1 << 20
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _raise_typed(exc: OSError, doing: str) -> NoReturn:
    found = resource_error(exc, doing=doing)
    if found is None:
        raise exc
    raise found from exc


class OutBuffer:
    """The memfd one end writes its messages' frames into, reused message after message.

    :meth:`reserve` may be called from any thread (a processor's row workers); :meth:`place` and
    :meth:`close` from the one thread that sends."""

    def __init__(self) -> None:
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._bytes: np.ndarray | None = None
        """The mapping as an array: reservations are views of it, and frames are found in it by address."""
        self._announced = False
        self._reserved = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of writable memory in this buffer for a frame of the next message, which then
        goes out without a copy; ``None`` where the buffer (as the last message left it) has no
        room left, and the caller takes memory of its own. The memory is the next message's: it
        must not be read or written once that message is placed."""
        with self._lock:
            if self._bytes is None:
                return None
            start, end = self._reserved, self._reserved + -(-nbytes // ALIGN) * ALIGN
            if end > self._bytes.nbytes:
                return None
            self._reserved = end
            return self._bytes[start:start + nbytes]

    def place(self, views: Sequence[memoryview]) -> tuple[list[int], int | None]:
        """Writes ``views`` into the buffer, each frame :meth:`reserve` gave left where it lies and
        the others laid out (:func:`~mmfront.wire.memfd.layout`) after the reserved memory: their
        offsets, and the descriptor to send with this message where the peer does not have this
        buffer yet (it stays this buffer's), else ``None``. A message that does not fit makes a new
        buffer, every frame copied into it. :class:`~mmfront.errors.ResourceError` when a new
        buffer cannot be made (memory, descriptors)."""
        with self._lock:
            reserved, self._reserved = self._reserved, 0
        found = [self._offset_of(view, reserved) for view in views]
        loose_offsets, loose_bytes = layout([v.nbytes for v, at in zip(views, found) if at is None])
        total = reserved + loose_bytes
        size = len(self._map) if self._map is not None else 0
        if size < total or size > max(KEEP_BYTES, total):
            # reserved memory that is sent stays mapped while it is referenced: copied from there
            found, (loose_offsets, total), reserved = [None] * len(views), layout([v.nbytes for v in views]), 0
            self._replace(max(-(-total // _GRAIN), 1) * _GRAIN)
        assert self._map is not None
        # a frame in memory an earlier message reserved is copied aside before any frame is written over it
        sources = [bytes(v) if at is None and self._overlaps(v) else v for v, at in zip(views, found)]
        loose = iter(loose_offsets)
        offsets = []
        for source, at in zip(sources, found):
            if at is None:
                at = reserved + next(loose)
                self._map[at:at + len(source)] = source
            offsets.append(at)
        if self._announced:
            return offsets, None
        self._announced = True
        return offsets, self._fd

    def _offset_of(self, view: memoryview, reserved: int) -> int | None:
        """Where ``view`` lies in the reserved memory, or ``None`` if it lies elsewhere."""
        if self._bytes is None or not reserved:
            return None
        offset = _address(view) - self._bytes.ctypes.data
        return offset if offset >= 0 and offset + view.nbytes <= reserved else None

    def _overlaps(self, view: memoryview) -> bool:
        """Whether ``view`` lies anywhere in the buffer (memory of an earlier message's reservation:
        copied out first, so laying frames out cannot overwrite it mid-copy)."""
        if self._bytes is None:
            return False
        start, begin = _address(view), self._bytes.ctypes.data
        return start < begin + self._bytes.nbytes and begin < start + view.nbytes

    def _replace(self, size: int) -> None:
        self.close()
        try:
            fd = os.memfd_create("mmfront-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            _raise_typed(exc, "Creating a memfd for a message's frames")
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            _raise_typed(exc, f"Making a {size}-byte memfd for a message's frames")
        self._bytes = np.frombuffer(self._map, np.uint8)
        self._fd, self._announced = fd, False

    def close(self) -> None:
        """Releases the buffer (idempotent); a later message makes a new one. Memory a reservation
        gave that is still referenced stays mapped until its last reference goes."""
        self._bytes = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # reserved memory still referenced: unmapped with it
                self._map.close()
            self._map = None
        if self._fd != -1:
            os.close(self._fd)
            self._fd = -1


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)


_reply_buffer: OutBuffer | None = None
"""The buffer this process sends its replies through (a processing lane's), set by :func:`send_replies_through`."""


def send_replies_through(out: OutBuffer | None) -> None:
    """Makes ``out`` the buffer :func:`reply_memory` reserves from (``None``: none); a processing
    lane sets it once, before its first job."""
    global _reply_buffer
    _reply_buffer = out


def reply_memory(nbytes: int) -> np.ndarray:
    """``nbytes`` of writable uint8 memory for a large part of this process's next reply: in the
    buffer it sends replies through where it has one and room is left (no copy at the send),
    else warm memory of this process (:func:`~mmfront.wire.warm.warm_memory`). Only for what goes
    into the reply, written before it is sent."""
    out = _reply_buffer
    found = out.reserve(nbytes) if out is not None else None
    return found if found is not None else warm_memory(nbytes)


class InBuffer:
    """A receiver's read-only mapping of the peer's :class:`OutBuffer`, and the warm memory
    of this process (:func:`~mmfront.wire.warm.warm_memory`) its frames are copied into."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def adopt(self, fd: int) -> None:
        """Maps the buffer ``fd`` (which stays the caller's to close) in place of the previous one;
        :class:`~mmfront.errors.DecodeError` when it is not a memfd sealed against shrinking of at
        most :data:`MAX_BYTES`."""
        try:
            sealed = fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS == _SEALS
        except OSError:
            sealed = False
        size = os.fstat(fd).st_size
        if not sealed or not 0 < size <= MAX_BYTES:
            raise DecodeError(f"A message's shared buffer is not a sealed memfd of 1 to {MAX_BYTES} bytes.")
        try:
            mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except OSError as exc:
            _raise_typed(exc, f"Mapping a message's {size}-byte shared buffer")
        self.close()
        self._map = mapped

    def copy_out(self, sizes: Sequence[int], offsets: Sequence[int]) -> list[memoryview]:
        """The frames of sizes ``sizes`` at ``offsets`` in the buffer, each copied into memory of
        its own (writable, so tensors can view it)."""
        held = 0 if self._map is None else len(self._map)
        past = max((offset + size for size, offset in zip(sizes, offsets)), default=0)
        if self._map is None or past > held:
            raise DecodeError(f"A message announced shared frames up to byte {past}; its shared buffer holds {held}.")
        frames = []
        for size, offset in zip(sizes, offsets):
            frame = warm_memory(size)
            frame[:] = np.frombuffer(self._map, np.uint8, size, offset)
            frames.append(frame.data)
        return frames

    def close(self) -> None:
        """Unmaps the buffer (idempotent)."""
        if self._map is not None:
            self._map.close()
            self._map = None


__all__ = ["KEEP_BYTES", "MAX_BYTES", "InBuffer", "OutBuffer", "reply_memory", "send_replies_through"]
