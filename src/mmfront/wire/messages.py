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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Annotated, Any, Final

import msgspec

from mmfront.errors import DecodeError
from mmfront.wire._tensors import Frame, as_frames, frame_view
from mmfront.wire.codec import MsgpackDecoder, decode_untrusted, msgpack_array_length
from mmfront.wire.structs import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType


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


class UtilityCall(msgspec.Struct, array_like=True, frozen=True):
    """A call of the engine's method ``method_name`` (vLLM's UTILITY request, less the
    ``client_index`` the transport adds). The answer is a
    :class:`~mmfront.wire.structs.UtilityOutput` with the same ``call_id``, in an
    ``EngineCoreOutputs``; its ``result`` travels as vLLM's ``[type info, value]`` (see
    :func:`utility_result`)."""

    call_id: Annotated[int, msgspec.Meta(ge=0)]
    method_name: Key
    args: tuple[Any, ...] = ()


UTILITY_METHODS: Final = frozenset({
    "get_supported_tasks", "is_sleeping", "sleep", "wake_up", "reset_mm_cache", "reset_prefix_cache",
    "reset_encoder_cache"})
"""The vLLM ``EngineCore`` methods an mmfront engine answers; a call of another method is refused
with a failed ``UtilityOutput`` for that call."""


def utility_result(value: Any) -> list[Any]:
    """A utility call's return value as vLLM 0.33 carries it in ``UtilityOutput.result``:
    ``[type info, value]``, the type info nil for plain msgpack values."""
    return [None, value]


def utility_value(result: Any) -> Any:
    """The return value in a ``UtilityOutput.result`` (:func:`utility_result`'s inverse).
    :class:`~mmfront.errors.DecodeError` for a typed result (an engine with
    ``VLLM_ALLOW_INSECURE_SERIALIZATION`` returning a class mmfront does not import)."""
    if not isinstance(result, (list, tuple)) or len(result) != 2:
        raise DecodeError(f"A utility result is [type info, value], got {result!r}.")
    if result[0] is not None:
        raise DecodeError(f"The engine returned a typed utility result ({result[0]!r}); mmfront reads plain "
                          "msgpack values only.")
    return result[1]


class EngineHello(msgspec.Struct, array_like=True, frozen=True):
    """An engine's greeting and heartbeat: ``epoch`` is random per engine process."""

    engine_index: Annotated[int, msgspec.Meta(ge=0)]
    epoch: Epoch


# --- the message table ----------------------------------------------------------------------------
# Every kind of envelope is one ``_kind`` row below: its type byte, what its body decodes into,
# which way it travels, and how it rides on vLLM's sockets. ``decode_message`` and the ZMQ
# framing (``mmfront.engine.transports.zmq_frames``) read only this table.


class Direction(Enum):
    """Which way a message travels: from the frontend (P0) to the engine (P1), or back."""

    TO_ENGINE = "P0 -> P1"
    TO_FRONTEND = "P1 -> P0"


@dataclass(frozen=True)
class MessageKind:
    """One row of the message table."""

    code: bytes
    """The envelope's type byte."""
    name: str
    body: Any
    """The type the body decodes into (``NoneType``: the body is nil)."""
    direction: Direction
    needs_stamp: bool = False
    """Refused without a mirror stamp."""
    vllm: EngineCoreRequestType | None = None
    """P0 -> P1 only: the request type it travels as on vLLM's sockets. Its body is vLLM's body
    (ADD, ABORT), or the one argument of a call of ``utility`` (none when the body is nil). Every
    P1 -> P0 kind rides behind an ``EngineCoreOutputs``; ``ENGINE_OUTPUTS`` is one."""
    utility: str | None = None
    decoder: MsgpackDecoder = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # What travels to the engine comes from peers it cannot trust: each tensor its own frame.
        references = 1 if self.direction is Direction.TO_ENGINE else None
        object.__setattr__(self, "decoder", MsgpackDecoder(self.body, max_frame_references=references))


_TABLE: dict[bytes, MessageKind] = {}
MESSAGE_KINDS: Final[Mapping[bytes, MessageKind]] = MappingProxyType(_TABLE)
"""The message table: each kind by its type byte."""


def _kind(
    code: bytes, name: str, body: Any, direction: Direction, *, needs_stamp: bool = False,
    vllm: EngineCoreRequestType | None = None, utility: str | None = None,
) -> bytes:
    assert code not in _TABLE, f"{name} reuses the type byte of {_TABLE[code].name}"
    _TABLE[code] = MessageKind(code, name, body, direction, needs_stamp, vllm, utility)
    return code


# P0 -> P1
REQUEST: Final = _kind(b"R", "REQUEST", EngineCoreRequest, Direction.TO_ENGINE, vllm=EngineCoreRequestType.ADD)
"""Body: an ``EngineCoreRequest``; stamped when it changed the mirror."""
MIRROR_ONLY: Final = _kind(b"M", "MIRROR_ONLY", MirrorOnly, Direction.TO_ENGINE, needs_stamp=True,
                           vllm=EngineCoreRequestType.UTILITY, utility="mmfront_mirror_only")
"""Body: a ``MirrorOnly``; always stamped. A request committed on P0 but never sent. A stock
engine answers the utility call with a failed ``UtilityOutput``."""
RESET_CACHE: Final = _kind(b"X", "RESET_CACHE", type(None), Direction.TO_ENGINE,
                           vllm=EngineCoreRequestType.UTILITY, utility="reset_mm_cache")
"""Body: nil. Clear P1's cache (vLLM's ``reset_mm_cache``, which a stock engine runs too); P1
answers with a ``MirrorReset``."""
ABORT: Final = _kind(b"A", "ABORT", list[str], Direction.TO_ENGINE, vllm=EngineCoreRequestType.ABORT)
"""Body: a list of request ids. Abort them (vLLM's ABORT)."""
UTILITY: Final = _kind(b"U", "UTILITY", UtilityCall, Direction.TO_ENGINE, vllm=EngineCoreRequestType.UTILITY,
                       utility="*")
"""Body: a ``UtilityCall``. Run the engine method it names (``*``: any; vLLM's UTILITY, whose
body on vLLM's sockets is ``[client_index, call_id, method_name, args]``); the answer is a
``UtilityOutput`` with its ``call_id``. Over ZMQ an engine receives every call of a vLLM method
as this kind (a ``RESET_CACHE`` too, as a call of ``reset_mm_cache``), so it can answer it."""

# P1 -> P0
ADMITTED: Final = _kind(b"a", "ADMITTED", Admitted, Direction.TO_FRONTEND)
"""Body: an ``Admitted``. P1 filled every feature and handed the request to the engine."""
CACHE_MISS: Final = _kind(b"m", "CACHE_MISS", CacheMiss, Direction.TO_FRONTEND)
"""Body: a ``CacheMiss``. P1 did not admit the request: resend it with these items' data."""
MIRROR_RESET: Final = _kind(b"r", "MIRROR_RESET", MirrorReset, Direction.TO_FRONTEND)
"""Body: a ``MirrorReset``. P1 cleared its cache: P0 clears its shadow if still in that epoch."""
ENGINE_OUTPUTS: Final = _kind(b"o", "ENGINE_OUTPUTS", EngineCoreOutputs, Direction.TO_FRONTEND)
"""Body: an ``EngineCoreOutputs``, the engine's own step outputs as vLLM sends them."""
ENGINE_HELLO: Final = _kind(b"h", "ENGINE_HELLO", EngineHello, Direction.TO_FRONTEND)
"""Body: an ``EngineHello``. Sent when an engine starts serving a frontend and as its heartbeat; a
new ``epoch`` tells P0 the engine restarted and lost what was in flight."""

_encode_stamp = msgspec.msgpack.Encoder().encode
_decode_stamp = msgspec.msgpack.Decoder(MirrorStamp).decode


@dataclass(frozen=True)
class Message:
    """One envelope, decoded: ``body`` is an instance of its kind's ``body`` type."""

    kind: bytes
    stamp: MirrorStamp | None
    body: Any


def message_kind(code: Frame, direction: Direction) -> MessageKind:
    """The row of type byte ``code``; :class:`~mmfront.errors.DecodeError` naming it when it is
    unknown or travels the other way."""
    key = bytes(frame_view(code, 0))
    kind = MESSAGE_KINDS.get(key)
    if kind is None:
        raise DecodeError(f"Unknown message type {key!r}; expected one of {sorted(MESSAGE_KINDS)}.")
    if kind.direction is not direction:
        raise DecodeError(f"{kind.name} ({kind.code!r}) messages go {kind.direction.value}, never "
                          f"{direction.value}.")
    return kind


def encode_envelope(kind: bytes, message: Sequence[Frame], stamp: MirrorStamp | None = None) -> list[Frame]:
    """Wrap one codec message (``MsgpackEncoder.encode``'s frames)."""
    return [kind, b"" if stamp is None else _encode_stamp(stamp), *message]


class _RequestOutline(msgspec.Struct, array_like=True):
    """An ``EngineCoreRequest`` with its features left undecoded: counting them costs a scan of
    the bytes and the read of one array header, not an object per feature (a million empty
    features would otherwise cost far more memory than their bytes)."""

    request_id: msgspec.Raw
    prompt_token_ids: msgspec.Raw
    mm_features: msgspec.Raw


_decode_outline = msgspec.msgpack.Decoder(_RequestOutline).decode


def _check_feature_count(body: Frame, max_mm_features: int) -> None:
    try:
        count = msgpack_array_length(_decode_outline(frame_view(body, 2)).mm_features)
    except (msgspec.DecodeError, RecursionError):
        return  # malformed, or nested too deeply: the full decode says how
    if count is not None and count > max_mm_features:
        raise DecodeError(
            f"A request carries {count} multimodal features; this engine takes at most {max_mm_features} "
            "per request (its limit_mm_per_prompt). Send fewer items per request."
        )


def decode_message(frames: Iterable[Frame], direction: Direction, *, max_mm_features: int | None = None) -> Message:
    """Decode one envelope (its frames as a list, tuple or any other iterable) that travelled
    ``direction``: its kind, stamp and body, each checked. With ``max_mm_features``, a request
    with more features is refused before any of them is decoded."""
    frames = as_frames(frames)
    if len(frames) < 3:
        raise DecodeError(f"An envelope has at least 3 frames (type, stamp, body), got {len(frames)}.")
    kind = message_kind(frames[0], direction)
    raw_stamp = frame_view(frames[1], 1)
    stamp = decode_untrusted(_decode_stamp, raw_stamp, "mirror stamp") if raw_stamp.nbytes else None
    if stamp is None and kind.needs_stamp:
        raise DecodeError(f"A {kind.name} message must carry the stamp of the request it stands for.")
    if max_mm_features is not None and kind.code == REQUEST:
        _check_feature_count(frames[2], max_mm_features)
    return Message(kind.code, stamp, kind.decoder.decode(frames[2:]))


__all__ = [
    "ABORT",
    "ADMITTED",
    "CACHE_MISS",
    "DIGEST_SIZE",
    "ENGINE_HELLO",
    "ENGINE_OUTPUTS",
    "MESSAGE_KINDS",
    "MIRROR_ONLY",
    "MIRROR_RESET",
    "REQUEST",
    "RESET_CACHE",
    "UTILITY",
    "UTILITY_METHODS",
    "Admitted",
    "CacheMiss",
    "Direction",
    "EngineHello",
    "Message",
    "MessageKind",
    "MirrorOnly",
    "MirrorOp",
    "MirrorOpKind",
    "MirrorReset",
    "MirrorStamp",
    "UtilityCall",
    "decode_message",
    "encode_envelope",
    "message_kind",
    "utility_result",
    "utility_value",
]
