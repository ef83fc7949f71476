"""One ``EngineCoreReceiver`` serving two frontends over vLLM's ZMQ sockets: frontend A sends real
chat requests through the async client while frontend B floods the same engine with 10,000
mutated messages. A is served exactly as without B; every message of B's that the receiver
cannot read costs B a ``DecodeError`` failure and nothing else."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from echo_engine import request_checksum
from test_engine_link import Expected, plans, run_requests
from tests.wire.test_codec_fuzz import _max_rss_mb, mutate

from mmfront import MultiModalConfig
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports.zmq import ZmqEngineTransport, ZmqFrontendTransport, engine_identity
from mmfront.engine.transports.zmq_frames import request_frames
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.wire import EngineCoreRequest, MsgpackDecoder, MsgpackEncoder, SamplingParams, frame_view
from mmfront.wire.messages import (
    ABORT,
    DIGEST_SIZE,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    REQUEST,
    RESET_CACHE,
    MirrorOnly,
    MirrorOp,
    MirrorStamp,
    encode_envelope,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, FinishReason

SEED = 2024
CASES = 10_000
MAX_GROWTH_MB = 128
TIMEOUT = 30.0
ENCODER = MsgpackEncoder()
HUGE_HEADERS = [
    b"\xc6\xff\xff\xff\xff",  # bin 32 declaring 4 GiB
    b"\xdd\xff\xff\xff\xff",  # array 32 declaring 4 G elements
    b"\xdf\xff\xff\xff\xff",  # map 32 declaring 4 G pairs
    b"\xdb\x7f\xff\xff\xff",  # str 32 declaring 2 GiB
    b"\xc9\xff\xff\xff\xff\x03",  # ext 32 (raw tensor bytes) declaring 4 GiB
]


def _b_request(request_id: str) -> EngineCoreRequest:
    pixels = torch.arange(3 * 16 * 16, dtype=torch.float32).reshape(1, 3, 16, 16)  # 3 KiB: an aux frame
    item = MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(pixels, MultiModalBatchedField())})
    feature = MultiModalFeatureSpec(item, "image", "h-fuzz", PlaceholderRange(1, 4), "h-fuzz")
    return EngineCoreRequest(request_id, [7, 1, 1, 1, 1, 8], [feature], SamplingParams(max_tokens=1), None, 0.0,
                             None, None, None)


def base_messages(a_ids: list[str]) -> list[list[bytes]]:
    """B's messages as its engine's DEALER receives them, before mutation. The abort names A's
    requests: it must not touch them, since they are not B's."""
    stamp = MirrorStamp(7, 1, b"\x01" * DIGEST_SIZE)
    envelopes = [
        encode_envelope(REQUEST, ENCODER.encode(_b_request("fuzz-request")), stamp),
        encode_envelope(ABORT, ENCODER.encode([*a_ids[:4], "fuzz-request"])),
        encode_envelope(RESET_CACHE, ENCODER.encode(None)),
        encode_envelope(MIRROR_ONLY, ENCODER.encode(MirrorOnly([MirrorOp("N", "h-fuzz", 3072)])), stamp),
    ]
    call_ids = itertools.count()
    return [[bytes(frame_view(f, i)) for i, f in enumerate(request_frames(e, call_ids=call_ids))] for e in envelopes]


def wire_mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """The codec fuzzer's mutations of the body, plus what only the wire has: type bytes, frame
    counts and length headers that promise far more bytes than arrived."""
    op = rng.randrange(10)
    frames = list(frames)
    if op == 0:
        frames[0] = rng.choice([b"\x02", b"\x04", b"\x05", b"\xff", b"", b"\x00\x00", rng.randbytes(3)])
    elif op == 1:
        frames[rng.randrange(1, len(frames))] = rng.choice(HUGE_HEADERS) + rng.randbytes(rng.randrange(16))
    elif op == 2:
        frames = frames[: rng.randrange(1, 3)]  # too few frames
    elif op == 3:
        frames += [rng.randbytes(rng.randrange(32)) for _ in range(rng.randint(1, 40))]  # many extra frames
    else:
        frames = [frames[0], *mutate(rng, frames[1:])]
    return frames


def engine_loop(receiver: EngineCoreReceiver, stop: threading.Event, crashed: list[BaseException]) -> None:
    """Answer each request in one step: A's with the checksum of its tensors, B's with 0."""
    try:
        while not stop.is_set():
            ready = receiver.poll(0.01)
            aborted = set(receiver.take_aborted())
            outputs = [EngineCoreOutput(r.request_id, [request_checksum(r) if r.client_index == 0 else 0],
                                        finish_reason=FinishReason.LENGTH)
                       for r in ready if r.request_id not in aborted]
            if outputs:
                receiver.send(outputs)
    except BaseException as e:
        crashed.append(e)
        raise


class Replies:
    """What B's PULL got back: the failure texts, and the requests that got outputs."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.finished: set[str] = set()
        self._outputs = MsgpackDecoder(EngineCoreOutputs)

    def drain_until(self, transport: ZmqFrontendTransport, request_id: str) -> None:
        """Read until ``request_id`` finishes: everything B sent before it has been answered."""
        while request_id not in self.finished:
            frames = transport.recv(TIMEOUT)
            assert frames is not None, f"no answer for {request_id} within {TIMEOUT} s"
            if bytes(frame_view(frames[0], 0)) != ENGINE_OUTPUTS:
                continue
            outputs = self._outputs.decode(frames[2:])
            if outputs.utility_output is not None and outputs.utility_output.failure_message:
                self.failures.append(outputs.utility_output.failure_message)
            self.finished.update(o.request_id for o in outputs.outputs if o.finish_reason is not None)


@pytest.fixture
def served(gemma3_dir: Path) -> Iterator[tuple[AsyncEngineClient, ZmqFrontendTransport, EngineCoreReceiver]]:
    config = MultiModalConfig(mm_processor_cache_gb=0.02)
    a, b = ZmqFrontendTransport("ipc"), ZmqFrontendTransport("ipc")
    receiver = EngineCoreReceiver(ZmqEngineTransport(a.addresses, 0),
                                  MirroredReceiverCache(config.mm_processor_cache_bytes), heartbeat_s=0.2)
    assert receiver.add_frontend(ZmqEngineTransport(b.addresses, 0)) == 1
    a.wait_for_engines([0], TIMEOUT)
    b.wait_for_engines([0], TIMEOUT)
    stop = threading.Event()
    crashed: list[BaseException] = []
    engine = threading.Thread(target=engine_loop, args=(receiver, stop, crashed), daemon=True)
    engine.start()
    client = AsyncEngineClient(InputProcessor(InputPreprocessor(gemma3_dir, config)), a, engine_timeout_s=TIMEOUT)
    yield client, b, receiver
    assert engine.is_alive() and crashed == [], f"the engine loop died: {crashed!r}"
    stop.set()
    engine.join(TIMEOUT)
    client.close_blocking()
    b.close()
    receiver.close()


@pytest.mark.slow
def test_ten_thousand_mutated_messages_from_b_never_disturb_a(
    gemma3_dir: Path, served: tuple[AsyncEngineClient, ZmqFrontendTransport, EngineCoreReceiver],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, b, receiver = served
    caplog.set_level(logging.ERROR, logger="mmfront.engine.receiver")  # one warning per refusal: 9,000 lines
    expected = Expected(gemma3_dir)
    todo = plans(80, seed=SEED)
    warm_up = dict(list(todo.items())[:5])
    assert all(isinstance(r, list) for r in asyncio.run(run_requests(client, warm_up)).values())
    bases = base_messages(list(todo))
    rng = random.Random(SEED)
    cases = [wire_mutate(rng, bases[case % len(bases)]) for case in range(CASES)]
    before = _max_rss_mb()

    def flood() -> None:
        for frames in cases:
            b._router.send_multipart([engine_identity(0), *frames])  # a forged P0: raw frames, B's ROUTER

    fuzzer = threading.Thread(target=flood)
    fuzzer.start()
    results = asyncio.run(run_requests(client, todo, concurrency=8))
    fuzzer.join(TIMEOUT)
    assert not fuzzer.is_alive()
    b.send(encode_envelope(REQUEST, ENCODER.encode(EngineCoreRequest(
        "fuzz-final", [1, 2, 3], None, SamplingParams(max_tokens=1), None, 0.0, None, None, None))))
    replies = Replies()
    replies.drain_until(b, "fuzz-final")
    growth = _max_rss_mb() - before

    for request_id, images in todo.items():
        outputs = results[request_id]
        assert isinstance(outputs, list), f"{request_id}: {outputs!r}"
        assert [o.new_token_ids for o in outputs] == [[expected(images)]], request_id
    assert client.stats.failures == 0 and client.stats.engine_restarts == 0
    # Every refusal went to B, as a DecodeError failure; A never saw one.
    assert len(replies.failures) == receiver.decode_errors
    assert all(text.startswith("DecodeError: ") for text in replies.failures)
    kinds = Counter(re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`|\d+", "_", text)[:72] for text in replies.failures)
    assert receiver.decode_errors > CASES // 2 and len(kinds) > 20, kinds.most_common(30)
    assert growth < MAX_GROWTH_MB, f"peak RSS grew by {growth:.1f} MB"
