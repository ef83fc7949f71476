"""mmfront's envelopes laid out as vLLM 0.33's ZMQ frames, and back.

mmfront's envelope (``[kind, stamp, body, *aux]``, :mod:`mmfront.wire.messages`) is what the
client and the receiver exchange over any transport. On vLLM's sockets the same content is laid
out so that a stock vLLM 0.33 peer reads what it knows and ignores mmfront's extras:

* P0 -> engine (ROUTER -> DEALER; the identity frame is the socket's business):
  ``[type, vllm body, *aux, stamp]``. ``type`` is vLLM's request type byte (ADD ``\\x00``,
  ABORT ``\\x01``, UTILITY ``\\x03``); the stamp is always the last frame (empty when there is
  none) and no aux index refers to it, so vLLM's decoder never looks at it.
* Engine -> P0 (PUSH -> PULL): ``[EngineCoreOutputs body, *aux]`` exactly as vLLM sends it; an
  mmfront reply rides after it as ``[*reply frames, tail]`` where the 9-byte tail says which
  reply and how many frames it has. vLLM's output decoder ignores both.

Over ``ipc://`` an mmfront engine may open a side channel (:mod:`mmfront.engine._fd_channel`):
large aux frames then travel in a sealed memfd passed on it, each left empty in the ZMQ message,
and a marker frame after the stamp names the side message that holds them. Only engines that
opened the channel get such messages; a stock vLLM engine never does.

docs/wire.md ("ZMQ frames") gives the bytes.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Final

import msgspec

from mmfront.errors import DecodeError
from mmfront.wire._tensors import Frame, frame_view
from mmfront.wire.messages import (
    ABORT,
    ADMITTED,
    CACHE_MISS,
    ENGINE_HELLO,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    RESET_CACHE,
    CacheMiss,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, FinishReason

# vLLM's EngineCoreRequestType bytes.
ADD: Final = b"\x00"
ABORT_TYPE: Final = b"\x01"
UTILITY: Final = b"\x03"

MIRROR_ONLY_METHOD: Final = "mmfront_mirror_only"
"""The utility a mirror-only message calls; a stock engine answers it with a failed UtilityOutput."""
RESET_METHOD: Final = "reset_mm_cache"
"""vLLM's own utility: a stock engine clears its processor cache, as mmfront's does."""

TAIL_MAGIC: Final = b"\xc1mmf"
"""0xc1 never starts a msgpack value, and aux frames hold at least ``size_threshold`` bytes."""
_TAIL = struct.Struct("<4scI")
TAIL_SIZE: Final = _TAIL.size
_REPLIES: Final = frozenset({ADMITTED, CACHE_MISS, MIRROR_RESET, ENGINE_HELLO})

SIDE_MAGIC: Final = b"\xc1mfd"
"""Starts the marker frame of a message whose large frames are in the side channel."""
_MARKER = struct.Struct("<4sQ")
_SIDE_HEADER = struct.Struct("<QI")
_SIDE_ENTRY = struct.Struct("<IQ")
MAX_SIDE_FRAMES: Final = 4096
"""Most frames one side message may carry (it is one datagram)."""
SIDE_MESSAGE_MAX: Final = _SIDE_HEADER.size + MAX_SIDE_FRAMES * _SIDE_ENTRY.size

_encode = msgspec.msgpack.Encoder().encode
_decode_utility = msgspec.msgpack.Decoder(tuple[int, int, str, list[msgspec.Raw]]).decode
_decode_miss = msgspec.msgpack.Decoder(CacheMiss).decode


def _kind(frames: Sequence[Frame], what: str, minimum: int) -> bytes:
    if len(frames) < minimum:
        raise DecodeError(f"{what} has at least {minimum} frames, got {len(frames)}.")
    return bytes(frame_view(frames[0], 0))


def request_frames(envelope: Sequence[Frame], *, call_ids: itertools.count[int], client_index: int = 0) -> list[Frame]:
    """A P0 -> P1 envelope as the frames vLLM's engine core reads after its DEALER strips the
    routing identity. ``call_ids`` numbers the utility calls (vLLM's ``call_id``)."""
    kind = _kind(envelope, "A P0 -> P1 envelope", 3)
    stamp, body, aux = envelope[1], envelope[2], list(envelope[3:])
    if kind == REQUEST:
        return [ADD, body, *aux, stamp]
    if kind == ABORT:
        return [ABORT_TYPE, body, *aux, stamp]
    if kind == RESET_CACHE:
        return [UTILITY, _encode((client_index, next(call_ids), RESET_METHOD, ())), stamp]
    if kind == MIRROR_ONLY:
        raw = msgspec.Raw(frame_view(body, 2))
        return [UTILITY, _encode((client_index, next(call_ids), MIRROR_ONLY_METHOD, (raw,))), *aux, stamp]
    raise DecodeError(f"P0 does not send {kind!r} messages; they are P1's replies.")


def envelope_from_request_frames(frames: Sequence[Frame]) -> list[Frame]:
    """What an mmfront engine received (``[type, body, *aux, stamp]``) -> the envelope."""
    kind = _kind(frames, "A request from mmfront's P0", 3)
    body, aux, stamp = frames[1], list(frames[2:-1]), frames[-1]
    if kind == ADD:
        return [REQUEST, stamp, body, *aux]
    if kind == ABORT_TYPE:
        return [ABORT, stamp, body, *aux]
    if kind != UTILITY:
        raise DecodeError(f"Unknown request type {kind!r}; mmfront sends ADD, ABORT and UTILITY.")
    try:
        _, _, method, args = _decode_utility(frame_view(body, 1))
    except msgspec.DecodeError as e:
        raise DecodeError(f"Malformed utility call: {e}") from e
    if method == RESET_METHOD and not args:
        return [RESET_CACHE, stamp, _encode(None)]
    if method == MIRROR_ONLY_METHOD and len(args) == 1:
        return [MIRROR_ONLY, stamp, bytes(args[0]), *aux]
    raise DecodeError(f"Unknown utility call {method!r} with {len(args)} arguments.")


def side_marker(token: int) -> bytes:
    """The frame appended (after the stamp) to a request whose large frames went to the side channel."""
    return _MARKER.pack(SIDE_MAGIC, token)


def split_side_marker(frames: Sequence[Frame]) -> tuple[list[Frame], int | None]:
    """``frames`` without a trailing side marker, and the marker's token (``None``: none)."""
    last = frame_view(frames[-1], len(frames) - 1) if frames else memoryview(b"")
    if last.nbytes != _MARKER.size or bytes(last[:4]) != SIDE_MAGIC:
        return list(frames), None
    return list(frames[:-1]), _MARKER.unpack(last)[1]


def side_message(token: int, placed: Sequence[tuple[int, int]]) -> bytes:
    """The side channel's datagram: the token, then (frame index, size) of each frame in its memfd."""
    if len(placed) > MAX_SIDE_FRAMES:
        raise DecodeError(f"A side message carries at most {MAX_SIDE_FRAMES} frames, not {len(placed)}.")
    return _SIDE_HEADER.pack(token, len(placed)) + b"".join(_SIDE_ENTRY.pack(i, n) for i, n in placed)


def parse_side_message(data: bytes) -> tuple[int, list[tuple[int, int]]]:
    """:func:`side_message` read back; :class:`~mmfront.errors.DecodeError` if malformed."""
    if len(data) < _SIDE_HEADER.size:
        raise DecodeError(f"A side message has at least {_SIDE_HEADER.size} bytes, got {len(data)}.")
    token, count = _SIDE_HEADER.unpack_from(data)
    if count > MAX_SIDE_FRAMES or len(data) != _SIDE_HEADER.size + count * _SIDE_ENTRY.size:
        raise DecodeError(f"Malformed side message ({len(data)} bytes for {count} frames).")
    return token, [_SIDE_ENTRY.unpack_from(data, _SIDE_HEADER.size + k * _SIDE_ENTRY.size) for k in range(count)]


def _tail(kind: bytes, count: int) -> bytes:
    return _TAIL.pack(TAIL_MAGIC, kind, count)


def output_frames(envelope: Sequence[Frame], *, engine_index: int) -> list[Frame]:
    """A P1 -> P0 envelope as the frames a vLLM frontend's PULL socket reads.

    Engine outputs go as they are. A reply goes behind an ``EngineCoreOutputs`` a stock frontend
    understands: a cache miss as vLLM's own miss reply (the request finished with ``ERROR`` and
    ``mm_cache_miss_hashes``), the others behind an empty one."""
    kind = _kind(envelope, "A P1 -> P0 envelope", 3)
    message = list(envelope[2:])
    if kind == ENGINE_OUTPUTS:
        return message
    if kind not in _REPLIES:
        raise DecodeError(f"P1 does not send {kind!r} messages; they are P0's requests.")
    outputs = EngineCoreOutputs(engine_index=engine_index)
    if kind == CACHE_MISS:
        try:
            miss = _decode_miss(frame_view(message[0], 2))
        except msgspec.DecodeError as e:
            raise DecodeError(f"Malformed cache-miss reply: {e}") from e
        outputs.outputs = [EngineCoreOutput(miss.request_id, [], finish_reason=FinishReason.ERROR,
                                            mm_cache_miss_hashes=miss.mm_hashes)]
        outputs.finished_requests = {miss.request_id}
    return [_encode(outputs), *message, _tail(kind, len(message))]


def envelope_from_output_frames(frames: Sequence[Frame]) -> list[Frame]:
    """What P0's PULL socket received -> the envelope: an mmfront reply when the message ends in
    a tail, the engine's outputs (``ENGINE_OUTPUTS``) otherwise, from mmfront's engine or vLLM's."""
    if not frames:
        raise DecodeError("An engine output has at least 1 frame, got 0.")
    last = frame_view(frames[-1], len(frames) - 1)
    if last.nbytes != TAIL_SIZE or bytes(last[:4]) != TAIL_MAGIC:
        return [ENGINE_OUTPUTS, b"", *frames]
    _, kind, count = _TAIL.unpack(last)
    if kind not in _REPLIES or not 1 <= count <= len(frames) - 2:
        raise DecodeError(f"Malformed reply tail: kind {kind!r}, {count} frames in a {len(frames)}-frame message.")
    return [kind, b"", *frames[-1 - count:-1]]


__all__ = [
    "ABORT_TYPE",
    "ADD",
    "MAX_SIDE_FRAMES",
    "MIRROR_ONLY_METHOD",
    "RESET_METHOD",
    "SIDE_MAGIC",
    "SIDE_MESSAGE_MAX",
    "TAIL_MAGIC",
    "TAIL_SIZE",
    "UTILITY",
    "envelope_from_output_frames",
    "envelope_from_request_frames",
    "output_frames",
    "parse_side_message",
    "request_frames",
    "side_marker",
    "side_message",
    "split_side_marker",
]
