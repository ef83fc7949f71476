"""Message framing over one end of a ``multiprocessing`` pipe: the one home of the byte layout
that :class:`~mmfront.engine.transport.PipeTransport` and the processing lanes' worker pipes share.

A message is a header (frame count and lengths) followed by one pipe message per non-empty
frame; frames arrive in writable buffers, so decoded tensors can view them without a copy.
Nothing is pickled: the pipe carries only the codec's frames.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from multiprocessing import BufferTooShort
from multiprocessing.connection import Connection

from mmfront.errors import DecodeError, TransportError
from mmfront.wire._tensors import Frame, frame_view

MAX_FRAMES = 1 << 16
"""Most frames one message may announce."""


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
            if size and conn.recv_bytes_into(buf) != size:
                raise DecodeError(f"A frame announced as {size} bytes arrived shorter.")
            frames.append(buf)
        return frames
    except BufferTooShort as e:
        raise DecodeError("A frame arrived longer than its header announced.") from e
    except OSError as e:
        raise TransportError(f"The peer is gone ({e}).") from e


__all__ = ["MAX_FRAMES", "recv_frames", "send_frames"]
