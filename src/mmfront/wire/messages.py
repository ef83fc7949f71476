"""Every message of mmfront's P0 <-> P1 protocol, and the envelope that carries them.

An envelope is ``[type byte, stamp, body, *aux]``: the type says what the body is, the stamp is
the msgpack-encoded :class:`MirrorStamp` of a request (empty when the request changed nothing in
the mirror, and for every reply), and ``[body, *aux]`` is one message of mmfront's codec (tensors
travel in aux frames, nothing is pickled). Any transport that moves lists of frames in order
carries it. This module holds the formats only; what each side does with them lives in
``mmfront.cache.mirror`` (the mirror's bookkeeping) and ``mmfront.engine`` (client, receiver).

Every field is checked on decode (msgspec constraints, ``__post_init__``), so a forged or corrupt
message is a :class:`~mmfront.errors.DecodeError` at the door and the mirror's bookkeeping only
ever sees values P0 could have sent: epochs are unsigned 64-bit, ``seq`` starts at 1, digests
have their one size, sizes are never negative.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Final

import msgspec

from mmfront.errors import DecodeError
from mmfront.wire._tensors import Frame, as_frames, frame_view
from mmfront.wire.structs import EngineCoreRequest


class MirrorOpKind(str, Enum):
    """What happened to an item in the mirror, as it enters a stamp's digest and a
    :class:`MirrorOp`. The one definition of the kinds that travel; the op log of
    :mod:`mmfront.cache.mirror.oplog` adds only the evictions an insert caused, which each side
    derives from its own LRU."""

    HIT = "H"
    INSERT = "N"
    OVERSIZE = "O"

DIGEST_SIZE: Final = 16
"""Bytes of a stamp's digest (blake2b-128)."""

Epoch = Annotated[int, msgspec.Meta(ge=0)]
"""An epoch, of P0's shadow or of an engine: unsigned 64-bit (msgpack carries nothing larger)."""
Seq = Annotated[int, msgspec.Meta(ge=1)]
Digest = Annotated[bytes, msgspec.Meta(min_length=DIGEST_SIZE, max_length=DIGEST_SIZE)]
Key = Annotated[str, msgspec.Meta(min_length=1)]
"""An item's ``mm_hash`` (or identifier): never empty."""
ByteCount = Annotated[int, msgspec.Meta(ge=0)]


class MirrorStamp(msgspec.Struct, array_like=True, frozen=True):
    """Where a request stands in P0's mirror history; travels with the request.

    ``invalidated`` lists the keys P0 dropped from its shadow since the previous stamped request
    (P1 reported them missing, or their request was aborted after its commit); P1 drops them too
    before it applies the request."""

    epoch: Epoch
    seq: Seq
    digest: Digest
    invalidated: tuple[Key, ...] = ()


class MirrorOp(msgspec.Struct, array_like=True, frozen=True):
    """One item's operation in a mirror-only message (``nbytes`` is the size an insert charged)."""

    kind: MirrorOpKind
    mm_hash: Key
    nbytes: ByteCount = 0

    def __post_init__(self) -> None:
        if self.nbytes and self.kind != MirrorOpKind.INSERT:
            raise ValueError(f"only an insert ({MirrorOpKind.INSERT.value!r}) has a size, got a "
                             f"{MirrorOpKind(self.kind).value!r} of {self.nbytes} bytes")


class MirrorOnly(msgspec.Struct, array_like=True, frozen=True):
    """The mirror operations of a request that was committed on P0 but will never be sent.

    P1 replays them without the data: an insert stores a data-less placeholder of the same size,
    so both LRUs evict the same keys; P0 invalidates the inserted keys, and the next stamp tells
    P1 to drop the placeholders."""

    ops: list[MirrorOp]


class MirrorReset(msgspec.Struct, array_like=True, frozen=True):
    """P1 reset its cache and retired ``epoch``: a P0 still in that epoch must clear its shadow."""

    epoch: Epoch


# P0 -> P1
REQUEST: Final = b"R"
"""Body: an ``EngineCoreRequest``; stamped when it changed the mirror."""
MIRROR_ONLY: Final = b"M"
"""Body: a ``MirrorOnly``; always stamped. A request committed on P0 but never sent."""
RESET_CACHE: Final = b"X"
"""Body: nil. Clear P1's cache (vLLM's ``reset_mm_cache``); P1 answers with a ``MirrorReset``."""
ABORT: Final = b"A"
"""Body: a list of request ids. Abort them (vLLM's ABORT)."""

# P1 -> P0
ADMITTED: Final = b"a"
"""Body: an ``Admitted``. P1 filled every feature and handed the request to the engine."""
CACHE_MISS: Final = b"m"
"""Body: a ``CacheMiss``. P1 did not admit the request: resend it with these items' data."""
MIRROR_RESET: Final = b"r"
"""Body: a ``MirrorReset``. P1 cleared its cache: P0 clears its shadow if still in that epoch."""
ENGINE_OUTPUTS: Final = b"o"
"""Body: an ``EngineCoreOutputs``, the engine's own step outputs as vLLM sends them."""
ENGINE_HELLO: Final = b"h"
"""Body: an ``EngineHello``. Sent when an engine starts serving a frontend and as its heartbeat; a
new ``epoch`` tells P0 the engine restarted and lost what was in flight."""

MESSAGE_TYPES: Final = frozenset(
    {REQUEST, MIRROR_ONLY, RESET_CACHE, ABORT, ADMITTED, CACHE_MISS, MIRROR_RESET, ENGINE_OUTPUTS, ENGINE_HELLO})

_encode_stamp = msgspec.msgpack.Encoder().encode
_decode_stamp = msgspec.msgpack.Decoder(MirrorStamp).decode


class CacheMiss(msgspec.Struct, array_like=True, frozen=True):
    """P1 lacks ``mm_hashes``, which the request sent without data. ``stale_epoch`` is set when
    P1 had retired the request's epoch, i.e. P0's whole shadow is stale, not just these keys."""

    request_id: str
    mm_hashes: list[Key]
    stale_epoch: Epoch | None = None


class Admitted(msgspec.Struct, array_like=True, omit_defaults=True):
    """P1 admitted ``request_id``. An echoing receiver (tests, debugging) returns the request as
    the engine got it, with every feature's data filled in."""

    request_id: str
    request: EngineCoreRequest | None = None


class EngineHello(msgspec.Struct, array_like=True, frozen=True):
    """An engine's greeting and heartbeat: ``epoch`` is random per engine process."""

    engine_index: Annotated[int, msgspec.Meta(ge=0)]
    epoch: Epoch


@dataclass(frozen=True)
class Envelope:
    kind: bytes
    stamp: MirrorStamp | None
    message: Sequence[Frame]
    """``[body, *aux]``, for ``MsgpackDecoder.decode``."""


def encode_envelope(kind: bytes, message: Sequence[Frame], stamp: MirrorStamp | None = None) -> list[Frame]:
    """Wrap one codec message (``MsgpackEncoder.encode``'s frames)."""
    return [kind, b"" if stamp is None else _encode_stamp(stamp), *message]


def decode_envelope(frames: Iterable[Frame]) -> Envelope:
    """Split an envelope (its frames as a list, tuple or any other iterable) and decode its stamp."""
    frames = as_frames(frames)
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


__all__ = [
    "ABORT",
    "ADMITTED",
    "CACHE_MISS",
    "DIGEST_SIZE",
    "ENGINE_HELLO",
    "ENGINE_OUTPUTS",
    "MESSAGE_TYPES",
    "MIRROR_ONLY",
    "MIRROR_RESET",
    "REQUEST",
    "RESET_CACHE",
    "Admitted",
    "CacheMiss",
    "EngineHello",
    "Envelope",
    "MirrorOnly",
    "MirrorOp",
    "MirrorOpKind",
    "MirrorReset",
    "MirrorStamp",
    "decode_envelope",
    "encode_envelope",
]
