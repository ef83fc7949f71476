"""The message table and the envelope: every kind decodes in its own direction only, into its own
struct; an unknown or misdirected kind is a DecodeError that names it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mmfront.errors import DecodeError
from mmfront.wire import messages
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.messages import (
    ABORT,
    ADMITTED,
    CACHE_MISS,
    ENGINE_HELLO,
    ENGINE_OUTPUTS,
    MESSAGE_KINDS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    RESET_CACHE,
    UTILITY,
    Admitted,
    CacheMiss,
    Direction,
    EngineHello,
    MirrorOnly,
    MirrorOp,
    MirrorReset,
    MirrorStamp,
    UtilityCall,
    decode_message,
    encode_envelope,
    message_kind,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType

ENC = MsgpackEncoder()
STAMP = MirrorStamp(7, 3, b"\x01" * 16, ("gone",))


def request(request_id: str) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], None, None, None, 0.0, None, None, None)


SAMPLES: dict[bytes, Any] = {
    REQUEST: request("r"),
    MIRROR_ONLY: MirrorOnly([MirrorOp("N", "h", 4)]),
    RESET_CACHE: None,
    ABORT: ["r1", "r2"],
    UTILITY: UtilityCall(3, "sleep", (1, "abort")),
    ADMITTED: Admitted("r"),
    CACHE_MISS: CacheMiss("r", ["h1", "h2"], 4),
    MIRROR_RESET: MirrorReset(5),
    ENGINE_OUTPUTS: EngineCoreOutputs(engine_index=1, outputs=[EngineCoreOutput("r", [9])], timestamp=2.0),
    ENGINE_HELLO: EngineHello(0, 12345),
}
"""One body of every kind: a new row of the table must add one here."""


def envelope(kind: bytes) -> list[Any]:
    return encode_envelope(kind, ENC.encode(SAMPLES[kind]), STAMP)


def other(direction: Direction) -> Direction:
    return Direction.TO_FRONTEND if direction is Direction.TO_ENGINE else Direction.TO_ENGINE


def test_every_kind_has_a_sample() -> None:
    assert set(SAMPLES) == set(MESSAGE_KINDS)


@pytest.mark.parametrize("kind", list(MESSAGE_KINDS.values()), ids=lambda k: k.name)
def test_every_kind_decodes_in_its_direction_only(kind: Any) -> None:
    message = decode_message(envelope(kind.code), kind.direction)
    assert (message.kind, message.stamp, message.body) == (kind.code, STAMP, SAMPLES[kind.code])
    assert message_kind(kind.code, kind.direction) is kind
    wrong = other(kind.direction)
    match = "^" + re.escape(f"{kind.name} ({kind.code!r}) messages go {kind.direction.value}, never {wrong.value}.") + "$"
    with pytest.raises(DecodeError, match=match):
        decode_message(envelope(kind.code), wrong)
    with pytest.raises(DecodeError, match=match):
        message_kind(kind.code, wrong)


@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.name)
@pytest.mark.parametrize("code", [b"Q", b"", b"RR", b"\x00"])
def test_an_unknown_kind_is_refused_by_name(direction: Direction, code: bytes) -> None:
    with pytest.raises(DecodeError, match="^Unknown message type " + re.escape(repr(code)) + "; expected one of "):
        decode_message([code, b"", b"\xc0"], direction)


def test_each_row_is_consistent() -> None:
    for code, kind in MESSAGE_KINDS.items():
        assert kind.code == code and len(code) == 1, kind
        assert getattr(messages, kind.name) == code, kind  # the row's name is its constant's
        if kind.direction is Direction.TO_FRONTEND:
            assert (kind.vllm, kind.utility) == (None, None), kind  # replies ride behind EngineCoreOutputs
        else:
            assert kind.vllm is not None, kind
            assert (kind.utility is not None) == (kind.vllm is EngineCoreRequestType.UTILITY), kind
    requests = [k for k in MESSAGE_KINDS.values() if k.direction is Direction.TO_ENGINE]
    layouts = [k.utility or k.vllm for k in requests]
    assert len(set(layouts)) == len(layouts)  # each travels as something of its own on vLLM's sockets
    assert [k.name for k in MESSAGE_KINDS.values() if k.needs_stamp] == ["MIRROR_ONLY"]


def test_envelope_round_trip_and_refusals() -> None:
    frames = encode_envelope(REQUEST, ENC.encode(request("r")), STAMP)
    assert frames[0] == b"R" and len(frames) == 3
    message = decode_message(frames, Direction.TO_ENGINE)
    assert (message.kind, message.stamp) == (REQUEST, STAMP)
    assert message.body.request_id == "r"
    assert decode_message(encode_envelope(ADMITTED, ENC.encode(Admitted("r"))), Direction.TO_FRONTEND).stamp is None
    with pytest.raises(DecodeError, match="at least 3 frames"):
        decode_message([REQUEST, b""], Direction.TO_ENGINE)
    with pytest.raises(DecodeError, match="Unknown message type"):
        decode_message([b"Q", b"", b"\xc0"], Direction.TO_ENGINE)
    with pytest.raises(DecodeError, match="Malformed mirror stamp"):
        decode_message([REQUEST, b"\x93\x01", b"\xc0"], Direction.TO_ENGINE)


def test_a_body_is_checked_against_its_kind() -> None:
    with pytest.raises(DecodeError, match="Malformed message"):
        decode_message(encode_envelope(ABORT, ENC.encode([1, 2])), Direction.TO_ENGINE)
    with pytest.raises(DecodeError, match="Malformed message"):
        decode_message(encode_envelope(RESET_CACHE, ENC.encode("not nil")), Direction.TO_ENGINE)
    with pytest.raises(DecodeError, match="Malformed message"):
        decode_message(encode_envelope(ADMITTED, ENC.encode(MirrorReset(1))), Direction.TO_FRONTEND)


def test_a_mirror_only_message_needs_its_stamp() -> None:
    unstamped = encode_envelope(MIRROR_ONLY, ENC.encode(MirrorOnly([])))
    with pytest.raises(DecodeError, match=r"^A MIRROR_ONLY message must carry the stamp"):
        decode_message(unstamped, Direction.TO_ENGINE)
