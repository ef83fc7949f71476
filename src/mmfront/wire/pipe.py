"""Message framing over one end of a ``multiprocessing`` pipe: the one home of the byte layout
that :class:`~mmfront.engine.transport.PipeTransport` and the processing lanes' worker pipes share.

A message is a header (frame count and lengths) followed by one pipe message per non-empty
frame; frames arrive in writable buffers, so decoded tensors can view them without a copy.
Nothing is pickled: the pipe carries only the codec's frames.

A frame is read straight from the pipe into its buffer. ``Connection.recv_bytes_into`` would
read it in chunks, allocating a buffer of the whole remaining size for each, then copy the
chunks twice: for a 4.8 MB tensor that was ~4.5 ms of the receiver's CPU, against ~1 ms now.
The frame keeps ``Connection``'s own message layout (a ``!i`` length, or ``-1`` and a ``!Q``
length), so either end may still be a plain ``send_bytes``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from multiprocessing.connection import Connection

from mmfront.errors import DecodeError, TransportError
from mmfront.wire._tensors import Frame, frame_view

MAX_FRAMES = 1 << 16
"""Most frames one message may announce."""
_DISCARD_CHUNK = 1 << 20
"""How much of a frame that does not match its header is read (and dropped) at a time."""


def send_frames(conn: Connection, frames: Sequence[Frame]) -> None:
    """Send one message; raises :class:`~mmfront.errors.TransportError` when the peer is gone."""
    views = [frame_view(f, i) for i, f in enumerate(frames)]
    try:
        conn.send_bytes(struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views)))
        for view in views:
            if view.nbytes:
                conn.send_bytes(view)
    except (OSError, ValueError) as e:
        raise TransportError(f"The peer is gone ({e}); reconnect and resend what was in flight.") from e


def recv_frames(conn: Connection, timeout: float | None = None) -> list[Frame] | None:
    """The next message's frames, or ``None`` if none arrived within ``timeout`` seconds (``None``
    waits for ever). Raises ``EOFError`` when the peer closed its end."""
    try:
        if timeout is not None and not conn.poll(timeout):
            return None
        header = conn.recv_bytes()
        if len(header) < 4:
            raise DecodeError(f"A message header has at least 4 bytes, got {len(header)}.")
        (count,) = struct.unpack_from("<I", header)
        if count > MAX_FRAMES or len(header) != 4 + 8 * count:
            raise DecodeError(f"Malformed message header ({len(header)} bytes for {count} frames).")
        frames: list[Frame] = []
        for size in struct.unpack_from(f"<{count}Q", header, 4):
            buf = bytearray(size)
            if size:
                _recv_frame_into(conn.fileno(), buf)
            frames.append(buf)
        return frames
    except OSError as e:
        raise TransportError(f"The peer is gone ({e}).") from e


def _recv_frame_into(fd: int, buf: bytearray) -> None:
    """Read one ``Connection`` message into ``buf``, which has the size its header announced;
    a message of another size is read to its end (so the next one starts in step) and refused."""
    size = _read_length(fd)
    if size != len(buf):
        _discard(fd, size)
        which = "shorter" if size < len(buf) else "longer"
        raise DecodeError(f"A frame arrived {which} than its header announced ({size} bytes, not {len(buf)}).")
    _read_into(fd, memoryview(buf))


def _read_length(fd: int) -> int:
    prefix = bytearray(4)
    _read_into(fd, memoryview(prefix))
    (size,) = struct.unpack("!i", prefix)
    if size != -1:
        return int(size)
    long_prefix = bytearray(8)
    _read_into(fd, memoryview(long_prefix))
    return int(struct.unpack("!Q", long_prefix)[0])


def _discard(fd: int, size: int) -> None:
    scratch = memoryview(bytearray(min(size, _DISCARD_CHUNK)))
    while size:
        chunk = scratch[:min(size, len(scratch))]
        _read_into(fd, chunk)
        size -= len(chunk)


def _read_into(fd: int, view: memoryview) -> None:
    """Fill ``view`` from ``fd``; an end of file before it is full means the peer is gone."""
    while view.nbytes:
        n = os.readv(fd, [view])
        if n == 0:
            raise OSError("got end of file during message")
        view = view[n:]


__all__ = ["MAX_FRAMES", "recv_frames", "send_frames"]
