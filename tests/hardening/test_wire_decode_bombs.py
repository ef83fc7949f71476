"""Issue 36, Build 6: nesting and size bombs on every decode path of the engine's receiver (and
of vLLM's start-up handshake, both ways).

79 of 3,000 fuzzed messages used to escape ``EngineCoreReceiver.handle`` as an untyped
``RecursionError`` (the request's feature count was read with a plain msgspec decode), the
utility call of vLLM's frames did the same over ZMQ, and counting a request's features made an
object per feature (a million empty ones: ~58 MB from 1 MB). Each is now the receiver's typed
:class:`~mmfront.errors.DecodeError`, answered to the sender alone.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import tracemalloc
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_services import Inbox
from mmfront.engine.handshake import FrontendHandshake, engine_handshake_all
from mmfront.engine.receiver import EngineCoreReceiver, EngineReceiver
from mmfront.engine.transports.zmq import ZmqFrontendTransport, engine_identity
from mmfront.engine.transports.zmq_frames import envelope_from_request_frames
from mmfront.errors import DecodeError, HandshakeError
from mmfront.wire.codec import MsgpackDecoder
from mmfront.wire.handshake import EngineCoreReadyResponse
from mmfront.wire.messages import (
    ENGINE_OUTPUTS,
    MESSAGE_KINDS,
    UTILITY_METHODS,
    Direction,
    decode_message,
)
from mmfront.wire.structs import EngineCoreOutputs, EngineCoreRequestType

TO_ENGINE = sorted(code for code, kind in MESSAGE_KINDS.items() if kind.direction is Direction.TO_ENGINE)
TO_FRONTEND = sorted(code for code, kind in MESSAGE_KINDS.items() if kind.direction is Direction.TO_FRONTEND)
DEEP = 5_000
"""Far deeper than msgspec can recurse under Python's default recursion limit (1000)."""
STAMP = msgspec.msgpack.encode([1, 1, bytes(16), []])


def array_header(length: int) -> bytes:
    if length < 16:
        return bytes([0x90 | length])
    return b"\xdc" + struct.pack(">H", length) if length < 1 << 16 else b"\xdd" + struct.pack(">I", length)


def bomb(depth: int, container: str) -> bytes:
    """``depth`` nested arrays or one-key maps around an int, written without recursion."""
    level = b"\x91" if container == "array" else b"\x81\xa1k"
    return level * depth + b"\x01"


def place(path: Sequence[int], inner: bytes) -> bytes:
    """``inner`` at ``path`` in arrays whose earlier elements are small strings: the bomb sits
    behind that many valid-looking fields, so each field's decoder meets it."""
    out = inner
    for index in reversed(path):
        out = array_header(index + 1) + b"\xa1x" * index + out
    return out


paths = st.lists(st.integers(0, 4) | st.integers(0, 24), min_size=0, max_size=3)
depths = st.integers(DEEP, 4 * DEEP)
containers = st.sampled_from(["array", "map"])
fuzz = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- the envelope as any transport carries it -----------------------------------------------------


@fuzz
@given(kind=st.sampled_from(TO_ENGINE), path=paths, depth=depths, container=containers,
       in_stamp=st.booleans())
@example(kind=b"R", path=[2], depth=DEEP, container="array", in_stamp=False)  # the features, counted first
@example(kind=b"R", path=[2, 0], depth=DEEP, container="array", in_stamp=False)
@example(kind=b"R", path=[3, 24], depth=DEEP, container="map", in_stamp=False)  # sampling params' extra args
@example(kind=b"U", path=[2, 0], depth=DEEP, container="array", in_stamp=False)  # a utility call's argument
def test_a_nesting_bomb_anywhere_in_an_envelope_is_a_decode_error(
    kind: bytes, path: list[int], depth: int, container: str, in_stamp: bool,
) -> None:
    nested = place(path, bomb(depth, container))
    frames = [kind, nested, b"\x90"] if in_stamp else [kind, STAMP, nested]
    with pytest.raises(DecodeError):
        EngineReceiver(None).handle(frames)
    with pytest.raises(DecodeError):
        decode_message(frames, Direction.TO_ENGINE)


@fuzz
@given(kind=st.sampled_from(TO_FRONTEND), path=paths, depth=depths, container=containers)
def test_a_nesting_bomb_from_an_engine_is_a_decode_error_on_the_frontend(
    kind: bytes, path: list[int], depth: int, container: str,
) -> None:
    with pytest.raises(DecodeError):
        decode_message([kind, b"", place(path, bomb(depth, container))], Direction.TO_FRONTEND)


# --- vLLM's ZMQ frames ---------------------------------------------------------------------------


def utility_body(method: str, argument: bytes) -> bytes:
    """vLLM's utility call ``[client_index, call_id, method_name, args]`` with ``argument`` as
    its one argument, in raw msgpack."""
    return b"\x94\x00\x07" + msgspec.msgpack.encode(method) + b"\x91" + argument


@fuzz
@given(method=st.sampled_from(sorted(UTILITY_METHODS | {"mmfront_mirror_only"})), path=paths, depth=depths,
       container=containers)
@example(method="is_sleeping", path=[], depth=DEEP, container="array")
def test_a_nesting_bomb_in_a_utility_call_on_vllms_frames_is_a_decode_error(
    method: str, path: list[int], depth: int, container: str,
) -> None:
    frames = [EngineCoreRequestType.UTILITY.value, utility_body(method, place(path, bomb(depth, container))), STAMP]
    with pytest.raises(DecodeError):
        EngineReceiver(None).handle(envelope_from_request_frames(frames))


@fuzz
@given(request_type=st.sampled_from([t.value for t in EngineCoreRequestType if t != EngineCoreRequestType.UTILITY]),
       path=paths, depth=depths, container=containers)
def test_a_nesting_bomb_in_an_add_or_abort_on_vllms_frames_is_a_decode_error(
    request_type: bytes, path: list[int], depth: int, container: str,
) -> None:
    frames = [request_type, place(path, bomb(depth, container)), b""]
    try:
        envelope = envelope_from_request_frames(frames)
    except DecodeError:
        return  # a request type mmfront does not send
    with pytest.raises(DecodeError):
        EngineReceiver(None).handle(envelope)


# --- the engine loop answers it and goes on -------------------------------------------------------


def test_the_engine_loop_refuses_each_bomb_to_its_sender_and_serves_the_next_message() -> None:
    bombs = [[code, STAMP, place([index], bomb(DEEP, container))]
             for code in TO_ENGINE for index in range(12) for container in ("array", "map")]
    good = msgspec.msgpack.encode(["good", [1, 2, 3], None, None, None, 0.0, None, None, None])
    link = Inbox(*bombs, [b"R", b"", good])
    with EngineCoreReceiver(link, heartbeat_s=60.0, round_budget=len(bombs) + 1) as receiver:
        ready = receiver.poll(0.0)
    assert [r.request_id for r in ready] == ["good"]
    assert receiver.decode_errors == len(bombs)
    failures = [MsgpackDecoder(EngineCoreOutputs).decode(f[2:]).utility_output
                for f in link.sent if bytes(f[0]) == ENGINE_OUTPUTS]
    refusals = [u.failure_message for u in failures if u is not None]
    assert len(refusals) == len(bombs)
    assert all(m.startswith("DecodeError: ") for m in refusals)


# --- size bombs: counting never costs an object per element -----------------------------------------


def peak_bytes(call: Any) -> int:
    tracemalloc.start()
    with contextlib.suppress(DecodeError):
        call()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


MILLION = 1 << 20


def test_a_million_empty_features_are_counted_from_their_header() -> None:
    body = b"\x93\xa1x\x90" + array_header(MILLION) + b"\x90" * MILLION
    with pytest.raises(DecodeError, match=f"carries {MILLION} multimodal features; this engine takes at most 4"):
        EngineReceiver(None, max_mm_features=4).handle([b"R", b"", body])
    assert peak_bytes(lambda: EngineReceiver(None, max_mm_features=4).handle([b"R", b"", body])) < len(body)


def test_a_million_empty_utility_arguments_are_counted_from_their_header() -> None:
    body = b"\x94\x00\x07" + msgspec.msgpack.encode("mmfront_mirror_only") + array_header(MILLION) + b"\x90" * MILLION
    frames = [EngineCoreRequestType.UTILITY.value, body, b""]
    with pytest.raises(DecodeError, match=f"Unknown utility call 'mmfront_mirror_only' with {MILLION} arguments"):
        envelope_from_request_frames(frames)
    assert peak_bytes(lambda: envelope_from_request_frames(frames)) < len(body)


# --- vLLM's start-up handshake, both ways ---------------------------------------------------------------


def map_with(bombed: str, **fields: Any) -> bytes:
    """A msgpack map of ``fields`` and, under ``bombed``, a map whose one value is a nesting bomb
    (what a field typed ``Any`` or ``dict[str, Any]`` takes)."""
    head = bytes([0x80 | (len(fields) + 1)])
    pairs = b"".join(msgspec.msgpack.encode(k) + msgspec.msgpack.encode(v) for k, v in fields.items())
    return head + pairs + msgspec.msgpack.encode(bombed) + b"\x81\xa1k" + bomb(DEEP, "array")


def test_a_nesting_bomb_in_an_engines_hello_is_a_handshake_error() -> None:
    hello = map_with("parallel_config_hash", status="HELLO", local=True, headless=False)
    p0 = ZmqFrontendTransport()
    with p0, FrontendHandshake(p0) as handshake:
        ctx = zmq.Context()
        try:
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, engine_identity(0))
            dealer.connect(handshake.address)
            dealer.send(hello)
            with pytest.raises(HandshakeError, match="Engine rank 0 sent a malformed handshake message"):
                handshake.wait(10)
        finally:
            ctx.destroy(linger=0)


def test_a_nesting_bomb_in_a_frontends_handshake_metadata_is_a_handshake_error() -> None:
    metadata = map_with("parallel_config", addresses={"inputs": ["ipc://x"], "outputs": ["ipc://y"]})
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        answered = threading.Thread(target=lambda: router.send_multipart([router.recv_multipart()[0], metadata]),
                                    daemon=True)
        answered.start()
        with pytest.raises(HandshakeError, match="answered with no handshake metadata"):
            engine_handshake_all(f"tcp://127.0.0.1:{port}", 0, EngineCoreReadyResponse(16, 16, 1), timeout=10)
        answered.join(10)
    finally:
        ctx.destroy(linger=0)
