"""The ZMQ transport with real sockets: vLLM's layout, ipc and tcp, zero-copy tensors, several
engines, cleanup, and typed errors for bad frames and bad settings."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from mmfront.engine.transports import ENGINE_TRANSPORTS
from mmfront.engine.transports.zmq import ZmqEngineTransport, ZmqFrontendTransport, engine_identity, zmq_engine_factory
from mmfront.engine.transports.zmq_frames import TAIL_MAGIC
from mmfront.errors import ConfigError, DecodeError, TransportError
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.messages import (
    ABORT,
    ADMITTED,
    CACHE_MISS,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    RESET_CACHE,
    UTILITY,
    Admitted,
    CacheMiss,
    Direction,
    MirrorOnly,
    MirrorOp,
    MirrorReset,
    MirrorStamp,
    UtilityCall,
    decode_message,
    encode_envelope,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason

ENCODER = MsgpackEncoder()
TIMEOUT = 10.0


def image_request(request_id: str, pixels: torch.Tensor) -> EngineCoreRequest:
    item = MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(pixels, MultiModalBatchedField())})
    spec = MultiModalFeatureSpec(item, "image", "h1", PlaceholderRange(1, 4), "h1")
    return EngineCoreRequest(request_id, [7, 1, 1, 1, 1, 8], [spec], None, None, 0.0, None, None, None)


@pytest.fixture(params=["ipc", "tcp"])
def link(request: pytest.FixtureRequest) -> tuple[ZmqFrontendTransport, ZmqEngineTransport]:
    p0 = ZmqFrontendTransport(request.param)
    p1 = ZmqEngineTransport(p0.addresses, 0)
    p0.wait_for_engines([0], TIMEOUT)
    yield p0, p1
    p1.close()
    p0.close()


def test_addresses_follow_the_scheme() -> None:
    with ZmqFrontendTransport("tcp") as p0:
        assert p0.addresses.input.startswith("tcp://127.0.0.1:")
        assert p0.addresses.output.startswith("tcp://127.0.0.1:")
        assert p0.addresses.input != p0.addresses.output
    with ZmqFrontendTransport() as p0:
        assert p0.addresses.input.startswith("ipc://")


def test_request_with_a_large_tensor_round_trips_zero_copy(link: tuple[ZmqFrontendTransport, ZmqEngineTransport]) -> None:
    p0, p1 = link
    pixels = torch.randn(5, 3, 64, 64)
    stamp = MirrorStamp(2, 7, b"\xaa" * 16, ("old",))
    p0.send(encode_envelope(REQUEST, ENCODER.encode(image_request("r1", pixels)), stamp))
    frames = p1.recv(TIMEOUT)
    assert frames is not None
    message = decode_message(frames, Direction.TO_ENGINE)
    assert (message.kind, message.stamp) == (REQUEST, stamp)
    [body, aux] = frames[2:]
    got = message.body
    tensor = got.mm_features[0].data["pixel_values"].data
    assert torch.equal(tensor, pixels)
    assert tensor.data_ptr() == np.frombuffer(aux, np.uint8).ctypes.data  # a view of the received frame
    assert memoryview(aux).nbytes == pixels.nbytes
    assert len(bytes(body)) < 1000


def test_every_p0_message_kind_arrives_as_sent(link: tuple[ZmqFrontendTransport, ZmqEngineTransport]) -> None:
    p0, p1 = link
    mirror_only = MirrorOnly([MirrorOp("N", "h1", 10), MirrorOp("H", "h2")])
    stamp = MirrorStamp(1, 3, b"\x01" * 16)
    p0.send(encode_envelope(MIRROR_ONLY, ENCODER.encode(mirror_only), stamp))
    p0.send(encode_envelope(RESET_CACHE, ENCODER.encode(None)))
    p0.send(encode_envelope(ABORT, ENCODER.encode(["r1", "r2"])))
    got = [decode_message(p1.recv(TIMEOUT) or [], Direction.TO_ENGINE) for _ in range(3)]
    # a reset arrives as the call of vLLM's reset_mm_cache it travels as, with its call id, so it can be answered
    assert [(e.kind, e.stamp) for e in got] == [(MIRROR_ONLY, stamp), (UTILITY, None), (ABORT, None)]
    assert [e.body for e in got] == [mirror_only, UtilityCall(1, "reset_mm_cache"), ["r1", "r2"]]


def test_every_p1_reply_arrives_as_sent(link: tuple[ZmqFrontendTransport, ZmqEngineTransport]) -> None:
    p0, p1 = link
    pixels = torch.randn(5, 3, 64, 64)
    echoed = Admitted("r1", image_request("r1", pixels))
    outputs = EngineCoreOutputs(engine_index=0, outputs=[EngineCoreOutput("r2", [5, 6], finish_reason=FinishReason.STOP)])
    p1.send(encode_envelope(ADMITTED, ENCODER.encode(echoed)))
    p1.send(encode_envelope(CACHE_MISS, ENCODER.encode(CacheMiss("r3", ["h1", "h2"], 4))))
    p1.send(encode_envelope(MIRROR_RESET, ENCODER.encode(MirrorReset(5))))
    p1.send(encode_envelope(ENGINE_OUTPUTS, ENCODER.encode(outputs)))
    got = [decode_message(p0.recv(TIMEOUT) or [], Direction.TO_FRONTEND) for _ in range(4)]
    assert [e.kind for e in got] == [ADMITTED, CACHE_MISS, MIRROR_RESET, ENGINE_OUTPUTS]
    admitted = got[0].body
    assert admitted.request is not None
    assert torch.equal(admitted.request.mm_features[0].data["pixel_values"].data, pixels)
    assert got[1].body == CacheMiss("r3", ["h1", "h2"], 4)
    assert got[2].body == MirrorReset(5)
    [output] = got[3].body.outputs
    assert (output.request_id, output.new_token_ids, output.finish_reason) == ("r2", [5, 6], FinishReason.STOP)


def test_cache_miss_rides_behind_vllms_own_miss_output() -> None:
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 3) as p1:
        raw = zmq.Context.instance().socket(zmq.PULL)
        try:
            p1.close()  # reconnect engine 3's PUSH to a raw PULL to see the frames vLLM's frontend sees
            raw.bind("tcp://127.0.0.1:*")
            endpoint = raw.getsockopt_string(zmq.LAST_ENDPOINT)
            engine = ZmqEngineTransport(type(p0.addresses)(p0.addresses.input, endpoint), 3)
            engine.send(encode_envelope(CACHE_MISS, ENCODER.encode(CacheMiss("r", ["h"]))))
            assert raw.poll(int(TIMEOUT * 1000))
            frames = raw.recv_multipart()
            engine.close()
        finally:
            raw.close(linger=0)
    outputs = MsgpackDecoder(EngineCoreOutputs).decode(frames)
    assert (outputs.engine_index, outputs.finished_requests) == (3, {"r"})
    [output] = outputs.outputs
    assert (output.request_id, output.new_token_ids, output.finish_reason, output.mm_cache_miss_hashes) == (
        "r", [], FinishReason.ERROR, ["h"])
    assert len(frames) == 3 and frames[-1][:4] == TAIL_MAGIC and len(frames[-1]) == 9


def test_two_engines_get_their_own_requests() -> None:
    with ZmqFrontendTransport("tcp") as p0, ZmqEngineTransport(p0.addresses, 0) as e0, \
            ZmqEngineTransport(p0.addresses, 1) as e1:
        p0.wait_for_engines([0, 1], TIMEOUT)
        assert p0.engines == {0, 1}
        for engine_index in (1, 0, 1):
            request = EngineCoreRequest(f"to-{engine_index}", [1], None, None, None, 0.0, None, None, None)
            p0.send_to(engine_index, encode_envelope(REQUEST, ENCODER.encode(request)))
        got0 = [decode_message(e0.recv(TIMEOUT) or [], Direction.TO_ENGINE).body.request_id]
        got1 = [decode_message(e1.recv(TIMEOUT) or [], Direction.TO_ENGINE).body.request_id for _ in range(2)]
        assert (got0, got1) == (["to-0"], ["to-1", "to-1"])
        assert e0.recv(0.05) is None
        e1.send(encode_envelope(MIRROR_RESET, ENCODER.encode(MirrorReset(1))))
        assert decode_message(p0.recv(TIMEOUT) or [], Direction.TO_FRONTEND).kind == MIRROR_RESET


def test_ipc_directory_is_private_and_removed_on_close() -> None:
    p0 = ZmqFrontendTransport()
    directory = Path(p0.addresses.input.removeprefix("ipc://")).parent
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert {p.name for p in directory.iterdir()} == {"input", "output", "input.fds"}
    p0.close()
    p0.close()  # idempotent
    assert not directory.exists()


def test_recv_times_out_with_none() -> None:
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0) as p1:
        assert p0.recv(0.01) is None
        assert p1.recv(0.01) is None


def test_malformed_messages_raise_decode_error_and_the_next_one_still_arrives() -> None:
    with ZmqFrontendTransport() as p0:
        ctx = zmq.Context()
        dealer, push = ctx.socket(zmq.DEALER), ctx.socket(zmq.PUSH)
        dealer.setsockopt(zmq.IDENTITY, engine_identity(0))
        dealer.connect(p0.addresses.input)
        push.connect(p0.addresses.output)
        try:
            engine = ZmqEngineTransport(p0.addresses, 1)
            p0.wait_for_engines([1], TIMEOUT)
            bad_tail = TAIL_MAGIC + b"Z\x01\x00\x00\x00"
            push.send_multipart([b"\x90", b"x", bad_tail])
            with pytest.raises(DecodeError, match="Malformed reply tail"):
                p0.recv(TIMEOUT)
            engine.send(encode_envelope(MIRROR_RESET, ENCODER.encode(MirrorReset(2))))
            assert decode_message(p0.recv(TIMEOUT) or [], Direction.TO_FRONTEND).kind == MIRROR_RESET
            engine.close()
        finally:
            ctx.destroy(linger=0)
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0) as p1:
        p0.wait_for_engines([0], TIMEOUT)
        router_send = p0._router.send_multipart  # a forged P0: raw frames through the same ROUTER
        for frames, match in [
            ([b"\x07", b"\xc0", b""], "Unknown request type"),
            ([b"\x03", b"\xc1", b""], "Malformed utility call"),
            ([b"\x03", b"\x94\x00\x00\xa3foo\x90", b""], "Unknown utility call 'foo'"),
            ([b"\x00", b""], "at least 3 frames"),
        ]:
            router_send([engine_identity(0), *frames])
            with pytest.raises(DecodeError, match=match):
                p1.recv(TIMEOUT)
        p0.send(encode_envelope(RESET_CACHE, ENCODER.encode(None)))
        assert decode_message(p1.recv(TIMEOUT) or [], Direction.TO_ENGINE).kind == UTILITY


def test_sending_to_an_engine_that_is_not_connected_raises() -> None:
    with ZmqFrontendTransport() as p0:
        request = EngineCoreRequest("r", [1], None, None, None, 0.0, None, None, None)
        with pytest.raises(TransportError, match="Engine 4 is not connected"):
            p0.send_to(4, encode_envelope(REQUEST, ENCODER.encode(request)))
        with pytest.raises(TransportError, match=r"Engines \[4\] did not connect"):
            p0.wait_for_engines([4], 0.05)


def test_wrong_direction_kinds_raise_decode_error() -> None:
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0) as p1:
        with pytest.raises(DecodeError, match=r"^ADMITTED \(b'a'\) messages go P1 -> P0, never P0 -> P1"):
            p0.send(encode_envelope(ADMITTED, ENCODER.encode(Admitted("r"))))
        with pytest.raises(DecodeError, match=r"^REQUEST \(b'R'\) messages go P0 -> P1, never P1 -> P0"):
            p1.send(encode_envelope(REQUEST, [b"\xc0"]))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"scheme": "udp"}, "scheme must be 'ipc' or 'tcp'"),
    ({"hwm": -1}, "hwm must be 0"),
    ({"max_frame_bytes": 0}, "max_frame_bytes must be -1"),
    ({"send_timeout_s": -1.0}, "send_timeout_s must be None"),
    ({"engine_index": 1 << 16}, "engine_index must be in"),
])
def test_bad_settings_raise_config_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ZmqFrontendTransport(**kwargs)


def test_taken_port_raises_transport_error() -> None:
    with ZmqFrontendTransport("tcp") as first:
        port = int(first.addresses.input.rsplit(":", 1)[1])
        with pytest.raises(TransportError, match="Cannot bind the tcp sockets"):
            ZmqFrontendTransport("tcp", ports=(port, 0))


def test_full_queue_with_send_timeout_raises() -> None:
    with ZmqFrontendTransport(hwm=1, send_timeout_s=0.05) as p0, ZmqEngineTransport(p0.addresses, 0, hwm=1):
        p0.wait_for_engines([0], TIMEOUT)
        big = ENCODER.encode(image_request("r", torch.zeros(256, 1024)))
        with pytest.raises(TransportError, match="did not take the message within send_timeout_s"):
            for _ in range(10_000):
                p0.send(encode_envelope(REQUEST, big))


def test_oversized_frames_are_dropped_by_max_frame_bytes() -> None:
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0, max_frame_bytes=1024) as p1:
        p0.wait_for_engines([0], TIMEOUT)
        p0.send(encode_envelope(REQUEST, ENCODER.encode(image_request("big", torch.zeros(64, 64)))))
        assert p1.recv(0.3) is None


def test_an_engine_connects_through_the_zmq_factory() -> None:
    assert ENGINE_TRANSPORTS["zmq"] is zmq_engine_factory
    with ZmqFrontendTransport() as p0:
        connect = zmq_engine_factory(p0.addresses.input, p0.addresses.output)
        with connect(3) as engine:
            assert isinstance(engine, ZmqEngineTransport) and engine.engine_index == 3
            p0.wait_for_engines([3], TIMEOUT)
            p0.send_to(3, encode_envelope(RESET_CACHE, ENCODER.encode(None)))
            assert decode_message(engine.recv(TIMEOUT) or [], Direction.TO_ENGINE).kind == UTILITY
