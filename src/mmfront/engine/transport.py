"""How frames move between P0 and P1: one interface, one implementation per medium.

A transport moves lists of frames (``bytes``-like buffers) in order between two peers and knows
nothing about what they mean: the envelope and its messages live in :mod:`mmfront.wire.messages`.
:class:`BaseTransport` is the interface the client and the receiver take (httpx's
``BaseTransport`` is the model); :class:`PipeTransport` runs over a ``multiprocessing.Pipe``
(tests, a P1 in a child process) and the ZMQ transport over vLLM's sockets.

Thread-safety: one sender thread and one receiver thread per end; the frames of two messages
must not interleave, so concurrent senders serialise through the caller's commit lane.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from multiprocessing import BufferTooShort
from multiprocessing.connection import Connection
from types import TracebackType

from mmfront.errors import DecodeError, TransportError
from mmfront.wire import Frame, frame_view

_MAX_FRAMES = 1 << 16


class BaseTransport(ABC):
    """One end of an ordered, message-framed link."""

    @abstractmethod
    def send(self, frames: Sequence[Frame]) -> None:
        """Send one message; raises :class:`~mmfront.errors.TransportError` when the peer is gone."""

    @abstractmethod
    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        """The next message's frames, or ``None`` if none arrived within ``timeout`` seconds
        (``None`` waits for ever). Raises ``EOFError`` when the peer closed its end."""

    @abstractmethod
    def close(self) -> None:
        """Release the link; idempotent."""

    def __enter__(self) -> BaseTransport:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self.close()


class PipeTransport(BaseTransport):
    """Moves frame lists over one end of a ``multiprocessing.Pipe``.

    A message is a header (frame count and lengths) followed by one pipe message per non-empty
    frame; frames arrive in writable buffers, so decoded tensors can view them without a copy.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, frames: Sequence[Frame]) -> None:
        views = [frame_view(f, i) for i, f in enumerate(frames)]
        try:
            self.conn.send_bytes(struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views)))
            for view in views:
                if view.nbytes:
                    self.conn.send_bytes(view)
        except (OSError, ValueError) as e:
            raise TransportError(f"The peer is gone ({e}); reconnect and resend what was in flight.") from e

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        try:
            if timeout is not None and not self.conn.poll(timeout):
                return None
            header = self.conn.recv_bytes()
            if len(header) < 4:
                raise DecodeError(f"A message header has at least 4 bytes, got {len(header)}.")
            (count,) = struct.unpack_from("<I", header)
            if count > _MAX_FRAMES or len(header) != 4 + 8 * count:
                raise DecodeError(f"Malformed message header ({len(header)} bytes for {count} frames).")
            frames: list[Frame] = []
            for size in struct.unpack_from(f"<{count}Q", header, 4):
                buf = bytearray(size)
                if size and self.conn.recv_bytes_into(buf) != size:
                    raise DecodeError(f"A frame announced as {size} bytes arrived shorter.")
                frames.append(buf)
            return frames
        except BufferTooShort as e:
            raise DecodeError("A frame arrived longer than its header announced.") from e
        except OSError as e:
            raise TransportError(f"The peer is gone ({e}).") from e

    def close(self) -> None:
        self.conn.close()


__all__ = ["BaseTransport", "PipeTransport"]
