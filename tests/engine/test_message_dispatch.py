"""The client, the receivers and the ZMQ transports over the message table: each envelope is
decoded once (one ``decode_message``, one body decode), every kind is handled on its side, and a
kind sent the wrong way is refused by name."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import mmfront.engine.client as client_module
import mmfront.engine.receiver as receiver_module
from local_services import Inbox
from mmfront import MultiModalConfig
from mmfront.engine.client import EngineClient
from mmfront.engine.receiver import EngineCoreReceiver, EngineReceiver
from mmfront.engine.transports import ZmqEngineTransport, ZmqFrontendTransport
from mmfront.errors import DecodeError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
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
    encode_envelope,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from toy_models import toy

ENC = MsgpackEncoder()
STAMP = MirrorStamp(1, 1, b"\x01" * 16)
TIMEOUT = 10.0


def request(request_id: str) -> EngineCoreRequest:
    feature = MultiModalFeatureSpec(MultiModalKwargsItem.dummy(3), "image", "h", PlaceholderRange(0, 2), "h")
    return EngineCoreRequest(request_id, [1, 2, 3], [feature], None, None, 0.0, None, None, None)


TO_ENGINE = [
    encode_envelope(REQUEST, ENC.encode(request("r")), STAMP),
    encode_envelope(MIRROR_ONLY, ENC.encode(MirrorOnly([MirrorOp("N", "h", 4)])), STAMP),
    encode_envelope(RESET_CACHE, ENC.encode(None)),
    encode_envelope(ABORT, ENC.encode(["r"])),
    encode_envelope(UTILITY, ENC.encode(UtilityCall(1, "is_sleeping"))),
]
TO_FRONTEND = [
    encode_envelope(ENGINE_HELLO, ENC.encode(EngineHello(0, 1))),
    encode_envelope(ADMITTED, ENC.encode(Admitted("r"))),
    encode_envelope(CACHE_MISS, ENC.encode(CacheMiss("r", ["h"]))),
    encode_envelope(MIRROR_RESET, ENC.encode(MirrorReset(5))),
    encode_envelope(ENGINE_OUTPUTS, ENC.encode(EngineCoreOutputs(engine_index=0, outputs=[EngineCoreOutput("r", [1])]))),
]


def test_the_samples_cover_every_kind() -> None:
    assert sorted(bytes(e[0]) for e in TO_ENGINE + TO_FRONTEND) == sorted(MESSAGE_KINDS)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts ``decode_message`` calls in the client and the receiver, and body decodes anywhere."""
    calls: Counter[str] = Counter()
    body_decode = MsgpackDecoder.decode

    def counted_body(self: MsgpackDecoder, frames: Any) -> Any:
        calls["body"] += 1
        return body_decode(self, frames)

    monkeypatch.setattr(MsgpackDecoder, "decode", counted_body)
    for module in (client_module, receiver_module):
        real = module.decode_message

        def counted(frames: Any, direction: Direction, real: Any = real, **limits: Any) -> Any:
            calls["envelope"] += 1
            return real(frames, direction, **limits)

        monkeypatch.setattr(module, "decode_message", counted)
    yield calls


def test_the_engine_receiver_decodes_each_envelope_once(decodes: Counter[str]) -> None:
    transport = Inbox(*TO_ENGINE)
    receiver = EngineCoreReceiver(transport, None)
    assert [r.request_id for r in receiver.poll()] == ["r"]
    assert receiver.decode_errors == 0 and receiver.take_aborted() == ["r"]
    assert decodes == Counter(envelope=len(TO_ENGINE), body=len(TO_ENGINE))
    decodes.clear()
    for frames in TO_ENGINE:
        EngineReceiver(None).handle(frames)
    assert decodes == Counter(envelope=len(TO_ENGINE), body=len(TO_ENGINE))


def test_the_engine_refuses_every_reply_kind_by_name() -> None:
    transport = Inbox(*TO_FRONTEND)
    receiver = EngineCoreReceiver(transport, None)
    assert receiver.poll() == [] and receiver.decode_errors == len(TO_FRONTEND)
    refusals = [MsgpackDecoder(EngineCoreOutputs).decode(frames[2:]).utility_output for frames in transport.sent[1:]]
    names = [MESSAGE_KINDS[bytes(e[0])].name for e in TO_FRONTEND]
    assert [r.failure_message if r else None for r in refusals] == [
        f"DecodeError: {name} ({MESSAGE_KINDS[bytes(e[0])].code!r}) messages go P1 -> P0, never P0 -> P1."
        for name, e in zip(names, TO_FRONTEND)]


def test_the_client_decodes_each_reply_once_and_handles_every_kind(decodes: Counter[str]) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=64 / 2**30)
    client = EngineClient(InputProcessor(InputPreprocessor("toy", config, processor=toy(config))), Inbox())
    for frames in TO_FRONTEND:
        assert client.handle_reply(frames) == []  # nothing in flight: every reply is for no one
    assert client.ranks[0].epoch == 1
    assert decodes == Counter(envelope=len(TO_FRONTEND), body=len(TO_FRONTEND))
    for frames in TO_ENGINE:
        kind = MESSAGE_KINDS[bytes(frames[0])]
        with pytest.raises(DecodeError, match=rf"^{kind.name} .* go P0 -> P1, never P1 -> P0\.$"):
            client.handle_reply(frames)


def test_over_zmq_the_framing_adds_no_decode(decodes: Counter[str]) -> None:
    with ZmqFrontendTransport() as p0:
        receiver = EngineCoreReceiver(ZmqEngineTransport(p0.addresses, 0), None)
        with receiver:
            p0.wait_for_engines([0], TIMEOUT)
            for frames in TO_ENGINE:
                p0.send(frames)
            assert [r.request_id for r in receiver.poll(TIMEOUT)] == ["r"]
            deadline = time.monotonic() + TIMEOUT
            while decodes["envelope"] < len(TO_ENGINE) and time.monotonic() < deadline:
                receiver.poll(0.05)
            assert receiver.decode_errors == 0 and receiver.take_aborted() == ["r"]
    assert decodes == Counter(envelope=len(TO_ENGINE), body=len(TO_ENGINE))
