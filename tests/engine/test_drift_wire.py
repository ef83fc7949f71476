"""The pipe transport, P1's EngineReceiver and P0's EngineClient, in one process (the envelope
itself: tests/wire/test_messages.py)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import struct
import warnings
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from mmfront import MultiModalConfig
from mmfront.cache.lru import LruKeyReplicatedReceiverCache, LruKeyReplicatedSenderCache
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.engine.client import EngineClient, RequestAdmitted
from mmfront.engine.receiver import EngineReceiver
from mmfront.engine.transports import BaseTransport, PipeTransport
from mmfront.errors import DecodeError, TransportError, ValidationError
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import make_audio, make_image
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.messages import (
    ADMITTED,
    CACHE_MISS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    RESET_CACHE,
    CacheMiss,
    Direction,
    MirrorOnly,
    MirrorReset,
    MirrorStamp,
    decode_message,
    encode_envelope,
)
from mmfront.wire.structs import EngineCoreRequest
from toy_models import ToyProcessor, toy

GiB = 1 << 30
ENC = MsgpackEncoder()


def request(request_id: str, *features: MultiModalFeatureSpec) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], list(features) or None, None, None, 0.0, None, None, None)


def feature(mm_hash: str, data: MultiModalKwargsItem | None) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(data, "image", mm_hash, PlaceholderRange(0, 2), mm_hash)


def toy_processor(capacity: int) -> InputProcessor:
    config = MultiModalConfig(mm_processor_cache_gb=capacity / GiB)
    return InputProcessor(InputPreprocessor("toy", config, processor=toy(config)))


class QueueTransport(BaseTransport):
    """Sent envelopes queue until the test delivers them (in any order it likes)."""

    def __init__(self) -> None:
        self.queue: list[list[Any]] = []

    def send(self, frames: Sequence[Any]) -> None:
        self.queue.append(list(frames))

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        return None  # replies are fed to the client directly by Loop.deliver

    def close(self) -> None:
        self.queue.clear()


class Loop:
    """Client and receiver wired in process: sent envelopes queue until delivered."""

    def __init__(self, processor: InputProcessor, receiver: EngineReceiver) -> None:
        self.transport = QueueTransport()
        self.queue = self.transport.queue
        self.client = EngineClient(processor, self.transport)
        self.receiver = receiver
        self.events: list[Any] = []

    def deliver(self, order: list[int] | None = None) -> None:
        batch, self.queue[:] = list(self.queue), []
        for i in order if order is not None else range(len(batch)):
            _, replies = self.receiver.handle(batch[i])
            for reply in replies:
                self.events += self.client.handle_reply(reply)


# --- the pipe ---------------------------------------------------------------------------------


def test_pipe_transport_carries_frames_into_writable_buffers() -> None:
    a, b = mp.Pipe()
    left, right = PipeTransport(a), PipeTransport(b)
    tensor = torch.arange(1000, dtype=torch.float32)
    item = MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(tensor, MultiModalBatchedField())})
    sent = encode_envelope(REQUEST, ENC.encode(request("r", feature("h", item))), MirrorStamp(1, 1, b"d" * 16))
    left.send(sent)
    got = right.recv(1.0)
    assert got is not None
    assert [bytes(memoryview(f).cast("B")) for f in got] == [bytes(memoryview(f).cast("B")) for f in sent]
    assert got[1] and all(isinstance(f, bytearray) for f in got)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it views a read-only buffer
        decoded = decode_message(got, Direction.TO_ENGINE).body
    data = decoded.mm_features[0].data["pixel_values"].data
    assert torch.equal(data, tensor)
    data[0] = 5.0  # a view of the received frame, not a copy
    assert memoryview(got[3]).cast("B")[:4].tobytes() == struct.pack("<f", 5.0)
    # A header that does not match its frames is refused.
    a.send_bytes(struct.pack("<I", 2))
    with pytest.raises(DecodeError, match="Malformed message header"):
        right.recv()
    a.send_bytes(struct.pack("<IQ", 1, 2))
    a.send_bytes(b"abc")
    with pytest.raises(DecodeError, match="longer than its header"):
        right.recv()
    left.close()
    with pytest.raises(EOFError):
        right.recv()
    with pytest.raises(TransportError):
        left.send([b"x"])
    right.close()


# --- P1 ---------------------------------------------------------------------------------------


def test_receiver_without_a_cache_admits_complete_requests_only() -> None:
    receiver = EngineReceiver(None)
    full = request("full", feature("a", MultiModalKwargsItem.dummy(3)))
    ready, replies = receiver.handle(encode_envelope(REQUEST, ENC.encode(full)))
    assert [r.request_id for r in ready] == ["full"]
    assert decode_message(replies[0], Direction.TO_FRONTEND).kind == ADMITTED
    ready, replies = receiver.handle(encode_envelope(REQUEST, ENC.encode(request("gap", feature("b", None)))))
    assert ready == []
    env = decode_message(replies[0], Direction.TO_FRONTEND)
    assert env.kind == CACHE_MISS and env.body == CacheMiss("gap", ["b"])
    assert receiver.handle(encode_envelope(RESET_CACHE, ENC.encode(None))) == ([], [])
    assert receiver.poll() == ([], [])
    with pytest.raises(DecodeError, match=r"^MIRROR_RESET \(b'r'\) messages go P1 -> P0, never P0 -> P1"):
        receiver.handle(encode_envelope(MIRROR_RESET, ENC.encode(MirrorReset(1))))


def test_mirror_only_needs_a_stamp() -> None:
    receiver = EngineReceiver(LruKeyReplicatedReceiverCache(100))
    with pytest.raises(DecodeError, match="must carry the stamp"):
        receiver.handle(encode_envelope(MIRROR_ONLY, ENC.encode(MirrorOnly([]))))


def test_unstamped_mirror_drifts_on_swapped_delivery_where_the_stamped_one_does_not() -> None:
    """vLLM 0.33's design (no stamps) misses when two dependent requests swap; mmfront does not."""
    image = make_image(5, 4, seed=1)
    outcomes = {}
    for name in ("unstamped", "stamped"):
        processor = toy_processor(64)
        if name == "unstamped":
            processor.pipeline.cache = LruKeyReplicatedSenderCache(64)
            receiver = EngineReceiver(LruKeyReplicatedReceiverCache(64), echo=True)
        else:
            receiver = EngineReceiver(MirroredReceiverCache(64), echo=True)
        loop = Loop(processor, receiver)
        loop.client.add_request("warm", "c <img>", mm_data={"image": [make_image(6, 4, seed=3)]})
        loop.deliver()
        loop.client.add_request("first", "a <img>", mm_data={"image": [image]})
        loop.client.add_request("second", "b <img>", mm_data={"image": [image]})  # sent without data
        loop.deliver(order=[1, 0])
        while loop.queue:
            loop.deliver()
        assert [type(e) for e in loop.events] == [RequestAdmitted] * 3
        assert all(e.request.mm_features[0].data is not None for e in loop.events)
        outcomes[name] = loop.client.stats.resends
    assert outcomes == {"unstamped": 1, "stamped": 0}


# --- P0 ---------------------------------------------------------------------------------------


def test_client_resends_once_with_every_item_then_ignores_misses_of_earlier_copies() -> None:
    processor = toy_processor(64)
    loop = Loop(processor, EngineReceiver(MirroredReceiverCache(64), echo=True))
    image = make_image(5, 4, seed=2)
    loop.client.add_request("warm", "a <img>", mm_data={"image": [image]})
    loop.deliver()
    mm_hash = loop.events[0].request.mm_features[0].mm_hash
    loop.client.add_request("r", "a <img>", mm_data={"image": [image]})
    cache = processor.preprocessor.cache
    assert cache is not None and cache.is_cached_item(mm_hash)
    epoch = cache.epoch  # type: ignore[attr-defined]
    loop.queue.clear()  # lost in transit; P1 answers as if its cache had been reset
    miss = encode_envelope(CACHE_MISS, ENC.encode(CacheMiss("r", [mm_hash], stale_epoch=epoch)))
    assert loop.client.handle_reply(miss) == []
    assert cache.epoch != epoch and loop.client.stats.shadow_resets == 1  # type: ignore[attr-defined]
    assert len(loop.queue) == 1  # the resend, with its data
    resent = decode_message(loop.queue[0], Direction.TO_ENGINE).body
    assert resent.mm_features is not None and resent.mm_features[0].data is not None
    # The resend carries every item, so a later miss answers an earlier copy: nothing to do.
    assert loop.client.handle_reply(encode_envelope(CACHE_MISS, ENC.encode(CacheMiss("r", [mm_hash])))) == []
    assert len(loop.queue) == 1 and loop.client.in_flight == ["r"] and loop.client.stats.resends == 1
    loop.deliver()
    assert [(type(e), e.request_id) for e in loop.events[1:]] == [(RequestAdmitted, "r")]
    assert loop.client.in_flight == [] and loop.client.stats.failures == 0


def test_client_bookkeeping() -> None:
    processor = toy_processor(64)
    loop = Loop(processor, EngineReceiver(MirroredReceiverCache(64), echo=True))
    loop.client.add_request("text", "just text")
    with pytest.raises(ValidationError, match="already in flight"):
        loop.client.add_request("text", "again")
    assert decode_message(loop.queue[0], Direction.TO_ENGINE).stamp is None  # changed nothing in the mirror
    loop.client.add_request("img", "a <img>", mm_data={"image": [make_image(4, 4)]})
    assert decode_message(loop.queue[1], Direction.TO_ENGINE).stamp is not None
    loop.client.abort_request("img")
    loop.deliver()
    assert [e.request_id for e in loop.events] == ["text"]  # the aborted request's admission is ignored
    assert loop.client.handle_reply(encode_envelope(CACHE_MISS, ENC.encode(CacheMiss("img", ["x"])))) == []
    stale = encode_envelope(MIRROR_RESET, ENC.encode(MirrorReset(12345)))
    assert loop.client.handle_reply(stale) == [] and loop.client.stats.shadow_resets == 0
    with pytest.raises(DecodeError, match=r"^REQUEST \(b'R'\) messages go P0 -> P1, never P1 -> P0"):
        loop.client.handle_reply(encode_envelope(REQUEST, ENC.encode(request("x"))))


class ModalityOrderToy(ToyProcessor):
    """Commits cache updates modality by modality, as vLLM 0.33's P0 does."""

    def prepare(self, *args: Any, **kwargs: Any) -> Any:
        out = super().prepare(*args, **kwargs)
        pending = out["mm_pending"]
        out["mm_pending"] = dataclasses.replace(pending, order=sorted(pending.order, key=lambda o: (o[1], o[2])))
        return out


@pytest.mark.parametrize("commit_order", ["placeholder offset", "modality (vLLM 0.33)"])
def test_interleaved_prompt_committed_out_of_p1_order_is_caught_and_repaired(commit_order: str) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=64 / GiB)
    proc = toy(config) if commit_order == "placeholder offset" else ModalityOrderToy(toy(config).info)
    receiver_cache = MirroredReceiverCache(64)
    loop = Loop(InputProcessor(InputPreprocessor("toy", config, processor=proc)), EngineReceiver(receiver_cache, echo=True))
    images, audio = [make_image(4, 4, seed=1), make_image(5, 4, seed=2)], make_audio(0.001, seed=3)
    for n in range(3):
        loop.client.add_request(f"r{n}", "a <img> b <aud> c <img>", mm_data={"image": images, "audio": [audio]})
        loop.deliver()
    while loop.queue:
        loop.deliver()
    assert [(type(e), e.request_id) for e in loop.events] == [(RequestAdmitted, f"r{n}") for n in range(3)]
    for event in loop.events:
        assert [f.data is not None for f in event.request.mm_features] == [True] * 3
    if commit_order == "placeholder offset":
        assert receiver_cache.resets == 0 and loop.client.stats.resends == 0
    else:  # every request's order differs from P1's walk: detected at once, and nothing reaches the caller
        assert receiver_cache.resets == 3 and loop.client.stats.shadow_resets == 3
