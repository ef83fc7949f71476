"""Warm memory (mmfront.wire.warm.WarmBlocks), as a lane's caller copies its frames out into it:
a block is handed out again only once nothing views its frame any more (numpy views, memoryviews,
torch tensors), idle blocks are capped, small frames are plain arrays, and a large message's
copy-out page-faults no memory in once the pool is warm."""

from __future__ import annotations

import gc
import itertools
import resource
import threading
from multiprocessing.connection import Connection

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.wire import shared_buffer
from mmfront.wire.allocator import unmap_large_buffers
from mmfront.wire.pipe import recv_frames, send_frames
from mmfront.wire.shared_buffer import InBuffer, OutBuffer
from mmfront.wire.warm import WARM_KEEP_BYTES, WARM_MIN_BYTES, WarmBlocks

MIB = 1 << 20


def _address(frame: np.ndarray) -> int:
    return int(frame.__array_interface__["data"][0])


@pytest.mark.parametrize("holder", ["numpy view", "memoryview", "torch tensor", "array of the memoryview"])
def test_a_block_comes_back_only_when_every_view_of_its_frame_is_gone(holder: str) -> None:
    pool = WarmBlocks()
    frame = pool.take(3 * MIB)
    start = _address(frame)
    frame[:] = 7
    memory = frame.data
    view: object = {
        "numpy view": frame[10:20],
        "memoryview": memory[5:],
        "torch tensor": torch.frombuffer(memory, dtype=torch.uint8)[5:],
        "array of the memoryview": np.frombuffer(memory, np.uint8)[1:],
    }[holder]
    del frame, memory
    gc.collect()
    assert pool.idle_bytes == 0
    other = pool.take(3 * MIB)  # taken while the view lives: another block
    assert _address(other) != start
    other[:] = 9
    assert int(np.asarray(view)[0]) == 7  # the view still reads its own frame
    del other
    assert pool.idle_bytes == 3 * MIB
    del view
    assert pool.idle_bytes == 6 * MIB
    assert start in {_address(pool.take(3 * MIB)), _address(pool.take(3 * MIB))}


def test_the_same_block_serves_message_after_message() -> None:
    pool = WarmBlocks()
    first = pool.take(4_700_000)
    start = _address(first)
    del first
    assert pool.idle_bytes == 5 * MIB  # rounded up to whole MiB
    again = pool.take(4_000_000)
    assert _address(again) == start and again.nbytes == 4_000_000 and again.flags.writeable
    assert pool.idle_bytes == 0


def test_a_block_more_than_a_quarter_larger_than_a_frame_is_not_taken_for_it() -> None:
    pool = WarmBlocks()
    big = pool.take(5 * MIB)
    big_start = _address(big)
    del big
    small = pool.take(3 * MIB + 1)  # needs 4 MiB: a 5 MiB block is a quarter more
    assert _address(small) == big_start and small.nbytes == 3 * MIB + 1
    del small
    smaller = pool.take(3 * MIB)
    assert _address(smaller) != big_start and pool.idle_bytes == 5 * MIB


def test_small_frames_are_plain_arrays_and_idle_blocks_are_capped() -> None:
    pool = WarmBlocks(keep_bytes=8 * MIB)
    small = pool.take(WARM_MIN_BYTES - 1)
    assert small.base is None and small.nbytes == WARM_MIN_BYTES - 1
    frames = [pool.take(3 * MIB) for _ in range(4)]
    del frames
    assert pool.idle_bytes == 6 * MIB  # two 3 MiB blocks fit under 8 MiB, the others are freed
    assert WarmBlocks().take(WARM_MIN_BYTES).base is not None
    assert WARM_KEEP_BYTES == 64 * MIB


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4), st.integers(0, 7)), min_size=1, max_size=24))
def test_no_two_live_frames_share_memory_whatever_the_order_of_takes_and_drops(
        steps: list[tuple[bool, int, int]]) -> None:
    pool = WarmBlocks(keep_bytes=12 * MIB)
    live: list[tuple[np.ndarray, int]] = []
    for serial, (take, mib, pick) in enumerate(steps):
        if take or not live:
            frame = pool.take(mib * MIB)
            frame[:] = serial % 251
            live.append((frame, serial % 251))
        else:
            live.pop(pick % len(live))
        spans = sorted((_address(f), _address(f) + f.nbytes) for f, _ in live)
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
        assert all(int(f[0]) == value and int(f[-1]) == value for f, value in live)


def test_threads_dropping_frames_while_another_takes_them_keep_every_frame_intact() -> None:
    pool = WarmBlocks(keep_bytes=16 * MIB)
    handed: list[tuple[np.ndarray, int]] = []
    lock = threading.Condition()
    failures: list[str] = []
    done = threading.Event()

    def dropper() -> None:
        while not done.is_set() or handed:
            with lock:
                while not handed and not done.is_set():
                    lock.wait(0.01)
                item = handed.pop(0) if handed else None
                lock.notify_all()
            if item is not None:
                frame, value = item
                if not (int(frame[0]) == value and int(frame[len(frame) // 2]) == value and int(frame[-1]) == value):
                    failures.append(f"frame {value} changed while held")

    threads = [threading.Thread(target=dropper) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for n in range(300):
            frame = pool.take((1 + n % 3) * MIB)
            frame[:] = n % 251
            with lock:
                while len(handed) >= 8:  # a bounded hand-off: at most 8 frames wait for a dropper
                    lock.wait(0.01)
                handed.append((frame, n % 251))
                lock.notify_all()
            del frame
    finally:
        done.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not failures
    assert pool.idle_bytes <= 16 * MIB


def test_a_warm_receiver_copies_a_large_frame_out_without_faulting_memory_in(
        ends: tuple[Connection, Connection], monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane feeder's case: 4.7 MB of patch rows per reply, each dropped before the next. The
    copies come from a pool of the test's own: the process's pool is shared with whatever else
    the test process runs, whose takes would make the count depend on them; glibc's mmap
    threshold is fixed as in ``mmfront serve`` (and its lanes), where a large copy without the pool
    is a fresh mapping whose pages fault in (elsewhere glibc's heap may reuse one by itself)."""
    if not unmap_large_buffers():
        pytest.skip("glibc's mallopt is not here: large buffers are not fresh mappings to begin with")
    monkeypatch.setattr(shared_buffer, "warm_memory", WarmBlocks().take)
    left, right = ends
    out, into = OutBuffer(), InBuffer()
    rows = np.arange(4_700_000, dtype=np.uint8)
    for _ in range(3):  # warm: the sender's buffer, the receiver's mapping and its pool
        send_frames(left, [rows.data], out=out)
        frames = recv_frames(right, into=into)
        del frames
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for n in range(10):
        rows[0] = n
        send_frames(left, [rows.data], out=out)
        frames = recv_frames(right, into=into)
        assert frames is not None and bytes(frames[0][:2]) == bytes([n, 1])
        del frames
    assert resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults < 100  # a fresh 4.7 MB copy: ~1,150 each
    out.close()
    into.close()
