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

Which type byte (or utility call) a kind travels as is a column of the message table
(:data:`~mmfront.wire.messages.MESSAGE_KINDS`), so a new kind needs no change here. A
``UTILITY`` call gets the transport's ``client_index``; on the engine side every call of a vLLM
method arrives as ``UTILITY``, with its ``call_id``, so the engine can answer it. Over
``ipc://`` large aux frames may travel on a side channel instead
(:mod:`mmfront.engine.transports.fd_channel`). docs/wire.md ("ZMQ frames") gives the bytes.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Final

import msgspec

from mmfront.errors import DecodeError, UnknownUtilityError
from mmfront.wire import Frame, frame_view
from mmfront.wire.codec import decode_untrusted, msgpack_array_length
from mmfront.wire.messages import (
    CACHE_MISS,
    ENGINE_OUTPUTS,
    MESSAGE_KINDS,
    UTILITY,
    UTILITY_METHODS,
    Direction,
    message_kind,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequestType, FinishReason

TAIL_MAGIC: Final = b"\xc1mmf"
"""0xc1 never starts a msgpack value, and aux frames hold at least ``size_threshold`` bytes."""
_TAIL = struct.Struct("<4scI")
TAIL_SIZE: Final = _TAIL.size
_UTILITY: Final = EngineCoreRequestType.UTILITY.value
_NIL: Final = type(None)
_BY_REQUEST_TYPE: Final = {k.vllm.value: k for k in MESSAGE_KINDS.values() if k.vllm is not None and k.utility is None}
_BY_UTILITY: Final = {k.utility: k for k in MESSAGE_KINDS.values() if k.utility is not None and k.body is not _NIL
                       and k.code != UTILITY}
"""mmfront's own calls, each arriving as its kind; a call of a vLLM method arrives as ``UTILITY``
with its ``call_id``, so that the engine can answer it (a stock frontend waits for the answer)."""

_encode = msgspec.msgpack.Encoder().encode
_decode_utility = msgspec.msgpack.Decoder(tuple[int, int, str, msgspec.Raw]).decode
"""A utility call from a peer, its arguments left undecoded (counted from their array header)."""
_decode_one_argument = msgspec.msgpack.Decoder(tuple[msgspec.Raw]).decode
_decode_call = msgspec.msgpack.Decoder(tuple[int, str, msgspec.Raw]).decode


def _check_length(frames: Sequence[Frame], what: str, minimum: int) -> None:
    if len(frames) < minimum:
        raise DecodeError(f"{what} has at least {minimum} frames, got {len(frames)}.")


def request_frames(envelope: Sequence[Frame], *, call_ids: itertools.count[int], client_index: int = 0) -> list[Frame]:
    """A P0 -> P1 envelope as the frames vLLM's engine core reads after its DEALER strips the
    routing identity. ``call_ids`` numbers the utility calls (vLLM's ``call_id``)."""
    _check_length(envelope, "A P0 -> P1 envelope", 3)
    kind = message_kind(envelope[0], Direction.TO_ENGINE)
    stamp, body, aux = envelope[1], envelope[2], list(envelope[3:])
    if kind.utility is None:
        assert kind.vllm is not None  # every P0 -> P1 row has a layout (tests/wire/test_messages.py)
        return [kind.vllm.value, body, *aux, stamp]
    if kind.code == UTILITY:
        call_id, method, args = _decode_call(frame_view(body, 2))
        return [_UTILITY, _encode((client_index, call_id, method, args)), *aux, stamp]
    if kind.body is _NIL:
        return [_UTILITY, _encode((client_index, next(call_ids), kind.utility, ())), stamp]
    raw = msgspec.Raw(frame_view(body, 2))
    return [_UTILITY, _encode((client_index, next(call_ids), kind.utility, (raw,))), *aux, stamp]


def envelope_from_request_frames(frames: Sequence[Frame]) -> list[Frame]:
    """What an mmfront engine received (``[type, body, *aux, stamp]``) -> the envelope."""
    _check_length(frames, "A request from mmfront's P0", 3)
    request_type = bytes(frame_view(frames[0], 0))
    body, aux, stamp = frames[1], list(frames[2:-1]), frames[-1]
    if request_type != _UTILITY:
        kind = _BY_REQUEST_TYPE.get(request_type)
        if kind is None:
            raise DecodeError(f"Unknown request type {request_type!r}; mmfront sends "
                              f"{', '.join(t.name for t in EngineCoreRequestType)}.")
        return [kind.code, stamp, body, *aux]
    _, call_id, method, args = decode_untrusted(_decode_utility, frame_view(body, 1), "utility call")
    count = msgpack_array_length(args)
    if count is None:
        raise DecodeError("Malformed utility call: its arguments are not an array.")
    kind = _BY_UTILITY.get(method)
    if kind is not None and count == 1:
        (argument,) = decode_untrusted(_decode_one_argument, args, "utility call")
        return [kind.code, stamp, bytes(argument), *aux]
    if kind is None and method in UTILITY_METHODS and call_id >= 0:
        return [UTILITY, stamp, _encode((call_id, method, args)), *aux]
    raise UnknownUtilityError(f"Unknown utility call {method!r} with {count} arguments; an mmfront engine "
                              f"answers {sorted(UTILITY_METHODS)}.", call_id=call_id)


def _tail(kind: bytes, count: int) -> bytes:
    return _TAIL.pack(TAIL_MAGIC, kind, count)


def output_frames(envelope: Sequence[Frame], *, engine_index: int) -> list[Frame]:
    """A P1 -> P0 envelope as the frames a vLLM frontend's PULL socket reads.

    Engine outputs go as they are. A reply goes behind an ``EngineCoreOutputs`` a stock frontend
    understands: a cache miss as vLLM's own miss reply (the request finished with ``ERROR`` and
    ``mm_cache_miss_hashes``), the others behind an empty one."""
    _check_length(envelope, "A P1 -> P0 envelope", 3)
    kind = message_kind(envelope[0], Direction.TO_FRONTEND)
    message = list(envelope[2:])
    if kind.code == ENGINE_OUTPUTS:
        return message
    outputs = EngineCoreOutputs(engine_index=engine_index)
    if kind.code == CACHE_MISS:
        miss = kind.decoder.decode(message)
        outputs.outputs = [EngineCoreOutput(miss.request_id, [], finish_reason=FinishReason.ERROR,
                                            mm_cache_miss_hashes=miss.mm_hashes)]
        outputs.finished_requests = {miss.request_id}
    return [_encode(outputs), *message, _tail(kind.code, len(message))]


def envelope_from_output_frames(frames: Sequence[Frame]) -> list[Frame]:
    """What P0's PULL socket received -> the envelope: an mmfront reply when the message ends in
    a tail, the engine's outputs (``ENGINE_OUTPUTS``) otherwise, from mmfront's engine or vLLM's."""
    if not frames:
        raise DecodeError("An engine output has at least 1 frame, got 0.")
    last = frame_view(frames[-1], len(frames) - 1)
    if last.nbytes != TAIL_SIZE or bytes(last[:4]) != TAIL_MAGIC:
        return [ENGINE_OUTPUTS, b"", *frames]
    _, code, count = _TAIL.unpack(last)
    kind = MESSAGE_KINDS.get(code)
    if (kind is None or kind.direction is not Direction.TO_FRONTEND or code == ENGINE_OUTPUTS
            or not 1 <= count <= len(frames) - 2):
        raise DecodeError(f"Malformed reply tail: kind {code!r}, {count} frames in a {len(frames)}-frame message.")
    return [code, b"", *frames[-1 - count:-1]]


__all__ = [
    "TAIL_MAGIC",
    "TAIL_SIZE",
    "envelope_from_output_frames",
    "envelope_from_request_frames",
    "output_frames",
    "request_frames",
]
