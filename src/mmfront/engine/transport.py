"""The P0 <-> P1 envelope, its messages, and a multiprocessing-pipe transport for it.

An envelope is ``[type byte, stamp, body, *aux]``: the type says what the body is, the stamp is
the msgpack-encoded :class:`~mmfront.cache.mirror.MirrorStamp` of a request (empty when the
request changed nothing in the mirror, and for every reply), and ``[body, *aux]`` is one message
of mmfront's codec (tensors travel in aux frames, nothing is pickled). Any transport that moves
lists of frames in order carries it; the ZMQ transport sends the frames as one multipart message.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import BufferTooShort
from multiprocessing.connection import Connection
from typing import Final

import msgspec

from mmfront.cache.mirror import MirrorStamp
from mmfront.engine.codec_tensors import Frame, frame_view
from mmfront.engine.structs import EngineCoreRequest
from mmfront.errors import DecodeError, TransportError

# P0 -> P1
REQUEST: Final = b"R"
"""Body: an ``EngineCoreRequest``; stamped when it changed the mirror."""
MIRROR_ONLY: Final = b"M"
"""Body: a ``MirrorOnly``; always stamped. A request committed on P0 but never sent."""
RESET_CACHE: Final = b"X"
"""Body: nil. Clear P1's cache (vLLM's ``reset_mm_cache``); P1 answers with a ``MirrorReset``."""

# P1 -> P0
ADMITTED: Final = b"a"
"""Body: an ``Admitted``. P1 filled every feature and handed the request to the engine."""
CACHE_MISS: Final = b"m"
"""Body: a ``CacheMiss``. P1 did not admit the request: resend it with these items' data."""
MIRROR_RESET: Final = b"r"
"""Body: a ``MirrorReset``. P1 cleared its cache: P0 clears its shadow if still in that epoch."""

MESSAGE_TYPES: Final = frozenset({REQUEST, MIRROR_ONLY, RESET_CACHE, ADMITTED, CACHE_MISS, MIRROR_RESET})

_MAX_FRAMES = 1 << 16
_encode_stamp = msgspec.msgpack.Encoder().encode
_decode_stamp = msgspec.msgpack.Decoder(MirrorStamp).decode


class CacheMiss(msgspec.Struct, array_like=True, frozen=True):
    """P1 lacks ``mm_hashes``, which the request sent without data. ``stale_epoch`` is set when
    P1 had retired the request's epoch, i.e. P0's whole shadow is stale, not just these keys."""

    request_id: str
    mm_hashes: list[str]
    stale_epoch: int | None = None


class Admitted(msgspec.Struct, array_like=True, omit_defaults=True):
    """P1 admitted ``request_id``. An echoing receiver (tests, debugging) returns the request as
    the engine got it, with every feature's data filled in."""

    request_id: str
    request: EngineCoreRequest | None = None


@dataclass(frozen=True)
class Envelope:
    kind: bytes
    stamp: MirrorStamp | None
    message: Sequence[Frame]
    """``[body, *aux]``, for ``MsgpackDecoder.decode``."""


def encode_envelope(kind: bytes, message: Sequence[Frame], stamp: MirrorStamp | None = None) -> list[Frame]:
    """Wrap one codec message (``MsgpackEncoder.encode``'s frames)."""
    return [kind, b"" if stamp is None else _encode_stamp(stamp), *message]


def decode_envelope(frames: Sequence[Frame]) -> Envelope:
    if len(frames) < 3:
        raise DecodeError(f"An envelope has at least 3 frames (type, stamp, body), got {len(frames)}.")
    kind = bytes(frame_view(frames[0], 0))
    if kind not in MESSAGE_TYPES:
        raise DecodeError(f"Unknown message type {kind!r}; expected one of {sorted(MESSAGE_TYPES)}.")
    raw_stamp = frame_view(frames[1], 1)
    try:
        stamp = _decode_stamp(raw_stamp) if raw_stamp.nbytes else None
    except msgspec.DecodeError as e:
        raise DecodeError(f"Malformed mirror stamp: {e}") from e
    return Envelope(kind, stamp, frames[2:])


class PipeTransport:
    """Moves frame lists over one end of a ``multiprocessing.Pipe``.

    A message is a header (frame count and lengths) followed by one pipe message per non-empty
    frame; frames arrive in writable buffers, so decoded tensors can view them without a copy.
    One writer and one reader per end: the frames of two messages must not interleave.
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

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message is ready (waits up to ``timeout`` seconds)."""
        try:
            return self.conn.poll(timeout)
        except (OSError, ValueError) as e:
            raise TransportError(f"The peer is gone ({e}).") from e

    def recv(self) -> list[Frame]:
        """The next message's frames; raises ``EOFError`` when the peer closed its end."""
        try:
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


__all__ = [
    "ADMITTED",
    "CACHE_MISS",
    "MESSAGE_TYPES",
    "MIRROR_ONLY",
    "MIRROR_RESET",
    "REQUEST",
    "RESET_CACHE",
    "Admitted",
    "CacheMiss",
    "Envelope",
    "PipeTransport",
    "decode_envelope",
    "encode_envelope",
]
