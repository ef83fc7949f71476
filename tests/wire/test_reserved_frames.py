"""Frames a lane makes where they are sent from (``OutBuffer.reserve``, ``reply_memory``): they go
out without a copy, arrive with the right bytes whatever else the message holds, and nothing the
buffer hands out is overwritten by the frames laid out beside it."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from multiprocessing.connection import Connection

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfront import pixels
from mmfront.errors import DecodeError
from mmfront.wire.memfd import ALIGN
from mmfront.wire.pipe import recv_frames, send_frames
from mmfront.wire.shared_buffer import InBuffer, OutBuffer, reply_memory, send_replies_through

SHARED = 1 << 63


@pytest.fixture
def warm() -> Iterator[OutBuffer]:
    """A sender whose buffer a first message made: 1 MiB (reservations come from the buffer the
    last message left)."""
    out = OutBuffer()
    out.place([memoryview(bytes(1000))])
    yield out
    out.close()


@pytest.fixture
def linked(ends: tuple[Connection, Connection]) -> Iterator[tuple[Connection, Connection, OutBuffer, InBuffer]]:
    """Both ends, and their buffers after a first message: the receiver holds the sender's 1 MiB buffer."""
    left, right = ends
    out, into = OutBuffer(), InBuffer()
    send_frames(left, [b"first"], out=out)
    assert recv_frames(right, into=into) == [memoryview(b"first")]
    yield left, right, out, into
    out.close()
    into.close()


def test_a_sender_without_a_buffer_reserves_nothing() -> None:
    assert OutBuffer().reserve(100) is None


def test_reserved_frames_stay_where_they_lie_and_the_others_go_after_them(warm: OutBuffer) -> None:
    rows = warm.reserve(1000)
    other = warm.reserve(10)
    assert rows is not None and other is not None
    assert other.ctypes.data - rows.ctypes.data == -(-1000 // ALIGN) * ALIGN  # laid out in turn, aligned
    rows[:] = 7
    offsets, fd = warm.place([memoryview(b"head"), rows.data, memoryview(b"tail" * 100)])
    assert fd is None  # the buffer was announced with the first message
    assert offsets == [1024 + 64, 0, 1024 + 128]  # after the reserved 1,024 + 64 bytes, aligned
    assert warm.reserve(1 << 20) is not None  # the message is placed: the whole buffer is free again
    assert warm.reserve(1) is None  # and now taken


def test_a_reserved_frame_arrives_with_its_bytes_and_the_receivers_copy_is_its_own(
        linked: tuple[Connection, Connection, OutBuffer, InBuffer]) -> None:
    left, right, warm, into = linked
    rows = warm.reserve(300_000)
    assert rows is not None
    rows[:] = np.arange(300_000) % 251
    send_frames(left, [b"header", rows.data, b"x" * 5000], out=warm)
    got = recv_frames(right, into=into)
    assert got is not None and bytes(got[0]) == b"header" and bytes(got[2]) == b"x" * 5000
    want = (np.arange(300_000) % 251).astype(np.uint8).tobytes()
    assert bytes(got[1]) == want
    rows[:] = 0  # the lane reuses the memory for its next reply: the caller's frame is unchanged
    assert bytes(got[1]) == want


def test_a_message_that_outgrows_the_buffer_copies_its_reserved_frames_into_a_new_one(
        linked: tuple[Connection, Connection, OutBuffer, InBuffer]) -> None:
    left, right, warm, into = linked
    rows = warm.reserve(1 << 19)
    assert rows is not None
    rows[:] = 3
    big = bytes([9]) * (3 << 20)  # with it the message needs more than the 1 MiB buffer
    send_frames(left, [rows.data, big], out=warm)
    got = recv_frames(right, into=into)
    assert got is not None and bytes(got[0]) == bytes([3]) * (1 << 19) and bytes(got[1]) == big
    assert bytes(rows[:4]) == bytes([3]) * 4  # the old buffer stays mapped while the lane holds its memory
    del rows
    again = warm.reserve(4 << 20)
    assert again is not None  # reservations now come from the new, larger buffer


def test_memory_of_an_earlier_message_sent_again_arrives_intact(
        linked: tuple[Connection, Connection, OutBuffer, InBuffer]) -> None:
    """A frame viewing memory an earlier message reserved is copied like any other frame, not
    overwritten by the frames laid out before it."""
    left, right, warm, into = linked
    stale = warm.reserve(4096)
    assert stale is not None
    stale[:] = 5
    send_frames(left, [b"one"], out=warm)
    assert recv_frames(right, into=into) == [memoryview(b"one")]
    send_frames(left, [b"y" * 2000, stale.data], out=warm)  # the first frame is laid out over stale's memory
    got = recv_frames(right, into=into)
    assert got is not None and bytes(got[0]) == b"y" * 2000 and bytes(got[1]) == bytes([5]) * 4096


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.tuples(st.booleans(), st.integers(1, 200_000), st.booleans()), min_size=1, max_size=8))
def test_any_mix_of_reserved_and_other_frames_arrives_as_sent(ends: tuple[Connection, Connection],
                                                              parts: list[tuple[bool, int, bool]]) -> None:
    """Each part: reserved or not, its size, and whether it is sent (a reservation may be scratch)."""
    left, right = ends
    out, into = OutBuffer(), InBuffer()
    try:
        send_frames(left, [b"first"], out=out)
        assert recv_frames(right, into=into) == [memoryview(b"first")]
        frames, want = [], []
        for n, (reserved, size, sent) in enumerate(parts):
            memory = out.reserve(size) if reserved else None
            memory = np.empty(size, np.uint8) if memory is None else memory
            memory[:] = n + 1
            if sent:
                frames.append(memory.data)
                want.append(bytes([n + 1]) * size)
        send_frames(left, [b"h", *frames], out=out)
        got = recv_frames(right, into=into)
        assert got is not None and [bytes(f) for f in got] == [b"h", *want]
    finally:
        out.close()
        into.close()


def test_a_header_naming_frames_past_the_buffer_is_refused(ends: tuple[Connection, Connection]) -> None:
    left, right = ends
    out, into = OutBuffer(), InBuffer()
    send_frames(left, [b"z" * 100], out=out)  # a 1 MiB buffer, adopted
    assert recv_frames(right, into=into) == [memoryview(b"z" * 100)]
    left.send_bytes(struct.pack("<IQQ", 1, 100 | SHARED, (1 << 20) - 50))
    with pytest.raises(DecodeError, match=f"shared frames up to byte {(1 << 20) + 50}; its shared buffer holds {1 << 20}"):
        recv_frames(right, into=into)
    left.send_bytes(struct.pack("<IQ", 1, 100 | SHARED))  # its offset left out
    with pytest.raises(DecodeError, match="Malformed message header \\(12 bytes for 1 frames, 1 shared\\)"):
        recv_frames(right, into=into)
    out.close()
    into.close()


def test_reply_memory_is_the_reply_buffers_in_a_lane_and_warm_memory_elsewhere(warm: OutBuffer) -> None:
    fresh = reply_memory(1000)
    send_replies_through(warm)
    try:
        inside = reply_memory(1000)
        rows = pixels.patch_rows(torch.zeros((1, 3, 28, 28), dtype=torch.uint8), 14, 2, 2)  # 4,704 bytes
        beyond = reply_memory(1 << 20)  # more than the 1 MiB buffer has left
    finally:
        send_replies_through(None)
    assert rows is not None and rows.shape == (1, 4, 1176) and not rows.any()
    offsets, _ = warm.place([inside.data, memoryview(rows.numpy()).cast("B"), memoryview(b"loose")])
    assert offsets == [0, 1024, 1024 + 4736]
    whole = warm.reserve(1 << 20)
    assert whole is not None
    assert np.shares_memory(inside, whole) and np.shares_memory(rows.numpy(), whole)
    assert not np.shares_memory(beyond, whole) and not np.shares_memory(fresh, whole)
    assert fresh.flags.writeable and fresh.nbytes == 1000 and beyond.nbytes == 1 << 20
    assert isinstance(beyond.base, memoryview)  # a view of a warm block (mmfront.wire.warm), not fresh memory
