"""Issue 13, class 9: the P0/P1 messages, the codec and P1's mirror state against forged input.

Every field of a protocol message is checked on decode (a negative epoch used to crash P1 with
an OverflowError; a negative insert size disabled its capacity bound); P1 buffers a bounded
number of early arrivals over all epochs together; a decode without ``share_mem`` copies a
bounded multiple of its input; frames may come as any iterable.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from multiprocessing import Pipe
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from local_services import Inbox
from mmfront import MultiModalConfig
from mmfront.cache.mirror import MirrorDelivery, MirroredReceiverCache, chain_digest, initial_digest
from mmfront.engine.client import EngineClient
from mmfront.engine.receiver import EngineCoreReceiver, EngineReceiver, serve_pipe
from mmfront.engine.transports import PipeTransport
from mmfront.errors import DecodeError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.wire.codec import MAX_COPY_FACTOR, MsgpackDecoder, MsgpackEncoder
from mmfront.wire.messages import (
    ADMITTED,
    CACHE_MISS,
    ENGINE_HELLO,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    CacheMiss,
    Direction,
    EngineHello,
    MirrorOnly,
    MirrorOp,
    MirrorOpKind,
    MirrorReset,
    MirrorStamp,
    decode_message,
    encode_envelope,
)
from mmfront.wire.structs import EngineCoreRequest
from toy_models import toy

ENC = MsgpackEncoder()
DIGEST = bytes(16)
CAPACITY = 64


def stamp_bytes(*fields: Any) -> bytes:
    """A stamp as raw msgpack, so a test can write what no MirrorStamp constructor would."""
    return msgspec.msgpack.encode(list(fields))


def text_request(request_id: str, *features: MultiModalFeatureSpec) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], list(features) or None, None, None, 0.0, None, None, None)


def forged(kind: bytes, raw_stamp: bytes, body: Any) -> list[Any]:
    return [kind, raw_stamp, *ENC.encode(body)]


# --- every field checked ------------------------------------------------------------------------


def test_a_negative_epoch_is_refused_and_the_engine_keeps_serving() -> None:
    bad = forged(REQUEST, stamp_bytes(-1, 1, DIGEST, []), text_request("evil"))
    receiver = EngineReceiver(MirroredReceiverCache(CAPACITY))
    with pytest.raises(DecodeError, match=r"^Malformed mirror stamp: Expected `int` >= 0 - at `\$\[0\]`"):
        receiver.handle(bad)

    transport = Inbox(bad, encode_envelope(REQUEST, ENC.encode(text_request("good"))))
    engine = EngineCoreReceiver(transport, MirroredReceiverCache(CAPACITY))
    assert [r.request_id for r in engine.poll()] == ["good"]
    assert engine.decode_errors == 1
    kinds = [decode_message(frames, Direction.TO_FRONTEND).kind for frames in transport.sent]
    assert kinds == [ENGINE_HELLO, ENGINE_OUTPUTS, ADMITTED]  # greeting, the refusal, the admission
    refusal = decode_message(transport.sent[1], Direction.TO_FRONTEND).body
    assert refusal.utility_output is not None and "Expected `int` >= 0" in (refusal.utility_output.failure_message or "")


@pytest.mark.parametrize(("fields", "match"), [
    ((-1, 1, DIGEST, []), r"Expected `int` >= 0 - at `\$\[0\]`"),
    ((-(2**63), 1, DIGEST, []), r"Expected `int` >= 0 - at `\$\[0\]`"),
    ((1.5, 1, DIGEST, []), r"Expected `int`, got `float` - at `\$\[0\]`"),
    ((1, 0, DIGEST, []), r"Expected `int` >= 1 - at `\$\[1\]`"),
    ((1, -7, DIGEST, []), r"Expected `int` >= 1 - at `\$\[1\]`"),
    ((1, 1, bytes(15), []), r"Expected `bytes` of length >= 16 - at `\$\[2\]`"),
    ((1, 1, bytes(17), []), r"Expected `bytes` of length <= 16 - at `\$\[2\]`"),
    ((1, 1, DIGEST, [""]), r"Expected `str` of length >= 1 - at `\$\[3\]\[0\]`"),
    ((1, 1, DIGEST, [7]), r"Expected `str`, got `int` - at `\$\[3\]\[0\]`"),
])
def test_every_stamp_field_is_checked(fields: tuple[Any, ...], match: str) -> None:
    with pytest.raises(DecodeError, match=r"^Malformed mirror stamp: " + match):
        decode_message(forged(REQUEST, stamp_bytes(*fields), text_request("r")), Direction.TO_ENGINE)


def test_the_largest_epoch_is_mirrored_without_overflow() -> None:
    epoch = 2**64 - 1
    digest = chain_digest(initial_digest(epoch, CAPACITY), (), [])
    message = forged(MIRROR_ONLY, stamp_bytes(epoch, 1, digest, []), MirrorOnly([]))
    assert decode_message(message, Direction.TO_ENGINE).stamp == MirrorStamp(epoch, 1, digest)
    cache = MirroredReceiverCache(CAPACITY)
    assert EngineReceiver(cache).handle(message) == ([], [])
    assert cache.epoch == epoch and cache.resets == 0


def test_a_forged_negative_insert_size_cannot_disable_the_capacity_bound() -> None:
    epoch = 5
    ops = [MirrorOpKind.INSERT, "x"]
    digest = chain_digest(initial_digest(epoch, CAPACITY), (), ops)  # the digest is not keyed: forgeable
    cache = MirroredReceiverCache(CAPACITY)
    receiver = EngineReceiver(cache)
    message = forged(MIRROR_ONLY, stamp_bytes(epoch, 1, digest, []), MirrorOnly([MirrorOp("N", "x", -10**12)]))
    with pytest.raises(DecodeError, match=r"^Malformed message: Expected `int` >= 0 - at `\$\[0\]\[0\]\[2\]`"):
        receiver.handle(message)
    assert cache.epoch is None and len(cache._cache) == 0  # nothing was applied


@pytest.mark.parametrize(("op", "match"), [
    (["H", "x", 5], r"only an insert \('N'\) has a size, got a 'H' of 5 bytes"),
    (["O", "x", 1], r"only an insert \('N'\) has a size, got a 'O' of 1 bytes"),
    (["E", "x", 0], r"Invalid enum value 'E'"),
    (["N", "", 4], r"Expected `str` of length >= 1"),
    (["N", "x", 1.0], r"Expected `int`, got `float`"),
])
def test_every_mirror_op_field_is_checked(op: list[Any], match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        MsgpackDecoder(MirrorOnly).decode(msgspec.msgpack.encode([[op]]))


@pytest.mark.parametrize(("kind", "body", "match"), [
    (MIRROR_RESET, [-1], r"Expected `int` >= 0 - at `\$\[0\]`"),
    (CACHE_MISS, ["r", ["h"], -3], r"Expected `int` >= 0 - at `\$\[2\]`"),
    (CACHE_MISS, ["r", [""], None], r"Expected `str` of length >= 1 - at `\$\[1\]\[0\]`"),
    (ENGINE_HELLO, [-1, 7], r"Expected `int` >= 0 - at `\$\[0\]`"),
    (ENGINE_HELLO, [0, -7], r"Expected `int` >= 0 - at `\$\[1\]`"),
])
def test_every_reply_field_is_checked(kind: bytes, body: list[Any], match: str) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=CAPACITY / 2**30)
    client = EngineClient(InputProcessor(InputPreprocessor("toy", config, processor=toy(config))), Inbox())
    with pytest.raises(DecodeError, match=r"^Malformed message: " + match):
        client.handle_reply([kind, b"", msgspec.msgpack.encode(body)])
    assert client.stats.shadow_resets == 0 and client.ranks[0].epoch is None


def test_the_largest_epoch_decodes_in_every_reply() -> None:
    top = 2**64 - 1
    assert MsgpackDecoder(MirrorReset).decode(msgspec.msgpack.encode([top])) == MirrorReset(top)
    assert MsgpackDecoder(CacheMiss).decode(msgspec.msgpack.encode(["r", ["h"], top])).stale_epoch == top
    assert MsgpackDecoder(EngineHello).decode(msgspec.msgpack.encode([3, top])) == EngineHello(3, top)


# --- P1's buffer: bounded over all epochs together -------------------------------------------------


def test_pending_requests_are_bounded_in_total_across_epochs() -> None:
    now = [0.0]
    cache = MirroredReceiverCache(CAPACITY, max_pending=4, clock=lambda: now[0])
    synced = chain_digest(initial_digest(1, CAPACITY), (), [])
    assert cache.receive_mirror_only(MirrorStamp(1, 1, synced), MirrorOnly([])) == []  # follows epoch 1
    announced: list[int] = []
    for n, epoch in enumerate(range(100, 110)):
        now[0] = float(n)
        feature = MultiModalFeatureSpec(None, "image", f"h{epoch}", PlaceholderRange(0, 1), f"h{epoch}")
        events = cache.receive(MirrorStamp(epoch, 2, DIGEST), [feature], epoch)  # #1 of each still "in transit"
        assert cache.pending == min(n + 1, 4)
        for event in events:
            if isinstance(event, MirrorReset):
                announced.append(event.epoch)
            else:
                assert isinstance(event, MirrorDelivery)  # served outside the mirror, with what it lacks
                assert (event.payload, event.missing, event.stale_epoch) == (event.stale_epoch, [f"h{event.payload}"],
                                                                             event.payload)
    assert announced == [100, 101, 102, 103, 104, 105]  # the longest waiting gave way first
    assert cache.epoch == 1 and cache.resets == 6
    now[0] = 12.5  # the gaps of 106 and 107 opened at 6 and 7 s: timed out; 108 and 109 not yet
    assert [e.epoch for e in cache.poll() if isinstance(e, MirrorReset)] == [106, 107]
    assert cache.pending == 2


def test_progress_restarts_an_epochs_gap_clock() -> None:
    now = [0.0]
    cache = MirroredReceiverCache(CAPACITY, gap_timeout_s=5.0, clock=lambda: now[0])
    chain = initial_digest(1, CAPACITY)
    digests = []
    for _ in range(3):
        chain = chain_digest(chain, (), [])
        digests.append(chain)
    assert cache.receive_mirror_only(MirrorStamp(1, 1, digests[0]), MirrorOnly([])) == []
    feature = MultiModalFeatureSpec(None, "image", "h", PlaceholderRange(0, 1), "h")
    assert cache.receive(MirrorStamp(9, 3, DIGEST), [feature], "other") == []  # another epoch's gap, at 0 s
    assert cache.receive_mirror_only(MirrorStamp(1, 3, digests[2]), MirrorOnly([])) == []  # gap at #2, at 0 s
    now[0] = 4.0
    assert cache.receive_mirror_only(MirrorStamp(1, 2, digests[1]), MirrorOnly([])) == []  # filled
    now[0] = 5.0  # epoch 9's gap times out; epoch 1 has none left
    events = cache.poll()
    assert [e.epoch for e in events if isinstance(e, MirrorReset)] == [9] and cache.epoch == 1


# --- the codec: a bounded copy, any iterable of frames ---------------------------------------------


def repeated_reference(frame_bytes: int, references: int, dtype: str = "uint8") -> list[Any]:
    """A body that points ``references`` tensors at one aux frame of ``frame_bytes`` bytes."""
    return [msgspec.msgpack.encode([[dtype, [frame_bytes], 1]] * references), bytearray(frame_bytes)]


def test_one_aux_frame_referenced_2000_times_is_not_copied_2000_times() -> None:
    frames = repeated_reference(4 << 20, 2000)  # the case: 28 KB of body, 8 GiB of copies
    assert len(frames[0]) // 1000 == 28
    with pytest.raises(DecodeError, match=rf"would copy or scan more than {MAX_COPY_FACTOR}x the 4\d+ bytes"):
        MsgpackDecoder(list[torch.Tensor], share_mem=False).decode(frames)
    views = MsgpackDecoder(list[torch.Tensor]).decode(frames)  # views of the frame cost nothing
    assert len(views) == 2000 and len({v.data_ptr() for v in views}) == 1


@pytest.mark.parametrize("target", [list[torch.Tensor], list[np.ndarray]])
def test_copies_stop_at_a_small_multiple_of_the_input(target: Any) -> None:
    dtype = "uint8" if target == list[torch.Tensor] else "|u1"
    with pytest.raises(DecodeError, match="would copy or scan more than"):
        MsgpackDecoder(target, share_mem=False).decode(repeated_reference(1 << 20, 64, dtype))
    out = MsgpackDecoder(target, share_mem=False).decode(repeated_reference(1 << 20, MAX_COPY_FACTOR, dtype))
    assert len(out) == MAX_COPY_FACTOR  # up to the bound, copies are fine


def test_bool_checks_of_one_frame_count_as_well() -> None:
    frames = repeated_reference(1 << 20, 64, "bool")
    with pytest.raises(DecodeError, match="would copy or scan more than"):
        MsgpackDecoder(list[torch.Tensor]).decode(frames)


def test_an_honest_message_of_bools_decodes_with_copies() -> None:
    """The worst honest case: every byte is copied once and checked once."""
    tensors = [torch.ones(300, dtype=torch.bool), torch.zeros(3, dtype=torch.bool), torch.arange(70) % 2 == 0]
    arrays = [np.ones(500, dtype=bool), np.zeros(2, dtype=bool)]
    frames = ENC.encode([tensors, arrays])
    got_t, got_a = MsgpackDecoder(tuple[list[torch.Tensor], list[np.ndarray]], share_mem=False).decode(frames)
    assert all(torch.equal(g, w) for g, w in zip(got_t, tensors, strict=True))
    assert all(np.array_equal(g, w) for g, w in zip(got_a, arrays, strict=True))


def _generator(frames: list[Any]) -> Iterator[Any]:
    yield from frames


@pytest.mark.parametrize("wrap", [list, tuple, iter, _generator, deque], ids=["list", "tuple", "iter", "generator",
                                                                              "deque"])
def test_frames_as_any_iterable(wrap: Any) -> None:
    item = MultiModalKwargsItem.dummy(600)
    feature = MultiModalFeatureSpec(item, "image", "h", PlaceholderRange(0, 2), "h")
    envelope = encode_envelope(REQUEST, ENC.encode(text_request("r", feature)))
    assert len(envelope) == 4  # type, stamp, body and one aux frame
    decoded = MsgpackDecoder(EngineCoreRequest).decode(wrap(envelope[2:]))
    assert decoded.mm_features[0].data == item
    assert decode_message(wrap(envelope), Direction.TO_ENGINE).kind == REQUEST
    ready, replies = EngineReceiver(None).handle(wrap(envelope))
    assert [r.request_id for r in ready] == ["r"] and decode_message(replies[0], Direction.TO_FRONTEND).kind == ADMITTED


def test_one_buffer_is_one_frame_and_anything_else_is_refused() -> None:
    body = ENC.encode([1, 2])[0]
    assert MsgpackDecoder().decode(np.frombuffer(body, dtype=np.uint8)) == [1, 2]  # any buffer: one frame
    with pytest.raises(DecodeError, match=r"^Frames must be a bytes-like object or an iterable of them .* got a int"):
        MsgpackDecoder().decode(5)  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match=r"^Frames must be .* got a float"):
        decode_message(1.5, Direction.TO_ENGINE)  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="no frames"):
        MsgpackDecoder().decode(_generator([]))


# --- a P1 process lives on ---------------------------------------------------------------------


def test_serve_pipe_refuses_a_forged_message_and_serves_the_next() -> None:
    p0_end, p1_end = Pipe()
    config = MultiModalConfig(mm_processor_cache_gb=CAPACITY / 2**30)
    server = threading.Thread(target=serve_pipe, args=(p1_end, config), kwargs={"echo": True}, daemon=True)
    server.start()
    link = PipeTransport(p0_end)
    link.send(forged(REQUEST, stamp_bytes(-1, 1, DIGEST, []), text_request("evil")))
    link.send(encode_envelope(REQUEST, ENC.encode(text_request("good"))))
    reply = link.recv(10.0)
    assert reply is not None and decode_message(reply, Direction.TO_FRONTEND).kind == ADMITTED
    link.close()
    server.join(10.0)
    assert not server.is_alive()
