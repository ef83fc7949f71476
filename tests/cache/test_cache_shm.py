"""The shm ring, object store and shm caches: vLLM's eviction and signing cases, reclamation of
aborted requests' handles, zero-copy reads, and /dev/shm cleanup when processes die."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mmfront.cache import _shm_ring as shm_ring
from mmfront.cache import _shm_store as shm_store
from mmfront.cache._shm_ring import SEGMENT_PREFIX, ShmSegment, _pid_alive, _segment_pid, cleanup_stale_segments
from mmfront.cache.base import CacheInfo
from mmfront.cache.factory import processor_cache_from_config, worker_receiver_cache_from_config
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache, ShmObjectStoreSenderCache
from mmfront.config import GiB_bytes, MiB_bytes, MultiModalConfig
from mmfront.errors import CacheError, MultiModalCacheMissError, ShmHandleError
from mmfront.inputs import (
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    MultiModalSharedField,
    PlaceholderRange,
)
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shared memory in /dev/shm")

FORK = multiprocessing.get_context("fork")


def _segments() -> set[str]:
    """This test run's segments: written by this process, or by a writer that is gone (a killed
    child). Other processes on the machine may hold segments of their own meanwhile."""
    own = os.getpid()
    return {
        n for n in os.listdir("/dev/shm")
        if n.startswith(SEGMENT_PREFIX) and (_segment_pid(n) == own or not _pid_alive(_segment_pid(n) or 0))
    }


@pytest.fixture(autouse=True)
def no_segment_left_behind():
    before = _segments()
    yield
    gc.collect()
    assert _segments() - before == set()


def _item(nbytes: int, fill: int = 0) -> MultiModalKwargsItem:
    data = torch.full((nbytes,), fill, dtype=torch.uint8)
    return MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(data, MultiModalSharedField(batch_size=1))})


def _pair(capacity: int, **kwargs) -> tuple[ShmObjectStoreSenderCache, ShmObjectStoreReceiverCache]:
    sender = ShmObjectStoreSenderCache(capacity, **kwargs)
    return sender, ShmObjectStoreReceiverCache(sender.shm_name)


@pytest.fixture
def pair():
    created: list = []

    def make(capacity: int, **kwargs):
        out = _pair(capacity, **kwargs)
        created.extend(out)
        return out

    yield make
    for cache in reversed(created):
        cache.close()


def _copy_handle(handle: MultiModalKwargsItem) -> MultiModalKwargsItem:
    return MultiModalKwargsItem({k: MultiModalFieldElem(e.data, e.field) for k, e in handle.items()})


# --- vLLM's shm eviction scenario ---------------------------------------------------------------


def test_cache_eviction_shm_cache():
    config = MultiModalConfig(mm_processor_cache_type="shm", mm_shm_cache_max_object_size_mb=6,
                              mm_processor_cache_gb=15.2 * MiB_bytes / GiB_bytes)
    p0 = processor_cache_from_config(config)
    p1 = worker_receiver_cache_from_config(config, shm_name=p0.shm_name)
    sizes = {"image_A": 5, "image_B": 5, "image_C": 5, "image_G": 2, "image_H": 2, "image_I": 2}
    try:
        steps = [
            # A, B and C fill the buffer.
            (["image_A", "image_B", "image_C"], [False] * 3, [True] * 3, ["image_A", "image_B", "image_C"]),
            # G cannot be stored: freeing would have to start with A, which this request touched.
            (["image_G", "image_A"], [False, True], [False, True], ["image_A", "image_B", "image_C"]),
            # A is freed; G and H fit; I would need B, which is touched; B is a hit.
            (["image_G", "image_H", "image_I", "image_B"], [False, False, False, True], [True, True, False, True],
             ["image_B", "image_C", "image_G", "image_H"]),
        ]
        for hashes, cached_before, cached_after, keys in steps:
            cached = p0.is_cached(hashes)
            assert cached == cached_before
            for h in hashes:
                p0.touch_sender_cache_item(h)
            out = [p0.get_and_update_item(None if c else (_item(sizes[h] * MiB_bytes), []), h)[0]
                   for h, c in zip(hashes, cached)]
            assert p0.is_cached(hashes) == cached_after
            for h, o in zip(hashes, out):
                p1.touch_receiver_cache_item(h, o)
            resolved = [p1.get_and_update_item(o, h) for h, o in zip(hashes, out)]
            assert [r["pixel_values"].data.numel() for r in resolved] == [sizes[h] * MiB_bytes for h in hashes]
            assert p0.store.keys() == keys
        assert p0.make_stats() == CacheInfo(hits=2, total=9)
    finally:
        p1.close()
        p0.close()


# --- reads -----------------------------------------------------------------------------------


def test_copy_read_is_independent_of_shared_memory(pair):
    sender, receiver = pair(4 * MiB_bytes)
    handle, updates = sender.get_and_update_item((_item(MiB_bytes, fill=3), ["u"]), "A")
    assert updates == ["u"] and set(handle) == {"address", "monotonic_id", "signature"}
    first = receiver.get_and_update_item(handle, "A")
    assert first == _item(MiB_bytes, fill=3)
    first["pixel_values"].data.fill_(9)
    again = receiver.get_and_update_item(sender.get_and_update_item(None, "A")[0], "A")
    assert again == _item(MiB_bytes, fill=3)


def test_zero_copy_read_views_shared_memory_and_holds_it_until_released(pair):
    sender, copier = pair(int(2.5 * MiB_bytes))
    zero_copy = ShmObjectStoreReceiverCache(sender.shm_name, zero_copy=True)
    try:
        handle, _ = sender.get_and_update_item((_item(MiB_bytes, fill=1), []), "A")
        view = zero_copy.get_and_update_item(handle, "A")["pixel_values"].data
        assert view.data_ptr() % 64 == 0
        view.fill_(7)  # only to prove aliasing; consumers must treat the tensors as read-only
        assert copier.get_and_update_item(sender.get_and_update_item(None, "A")[0], "A") == _item(MiB_bytes, fill=7)
        # One handle was read twice (once per receiver; both count as reader 0) and issued twice,
        # but the zero-copy read has not been released: B (which needs A's space) goes inline.
        sender.get_and_update_item((_item(MiB_bytes), []), "B")
        big, _ = sender.get_and_update_item((_item(MiB_bytes), []), "C")
        assert sender.store.keys() == ["A", "B"]
        assert big == _item(MiB_bytes)
        zero_copy.release_reads()
        del view
        handle, _ = sender.get_and_update_item((_item(MiB_bytes), []), "D")
        assert sender.store.keys() == ["B", "D"]
    finally:
        zero_copy.close()


def test_handle_survives_a_msgpack_round_trip(pair):
    sender, receiver = pair(2 * MiB_bytes)
    item = _item(1000, fill=5)
    handle, _ = sender.get_and_update_item((item, []), "A")
    frames = MsgpackEncoder().encode(handle)
    assert len(frames) == 1  # a handle is small: no aux frames
    decoded = MsgpackDecoder(MultiModalKwargsItem).decode(frames)
    assert decoded == handle
    assert receiver.get_and_update_item(decoded, "A") == item


def test_receiver_features_resolve_handles_pass_inline_items_and_skip_stripped(pair):
    sender, receiver = pair(2 * MiB_bytes)
    a, b = _item(1000, fill=1), _item(2000, fill=2)
    handle, _ = sender.get_and_update_item((a, []), "A")
    features = [
        MultiModalFeatureSpec(handle, "image", "A", PlaceholderRange(0, 4), "A"),
        MultiModalFeatureSpec(b, "image", "B", PlaceholderRange(4, 4), "B"),
        MultiModalFeatureSpec(None, "image", "C", PlaceholderRange(8, 4), "C"),
    ]
    out = receiver.get_and_update_features(features)
    assert [f.data for f in out] == [a, b, None]
    assert out[1].data is b
    with pytest.raises(MultiModalCacheMissError) as exc:
        receiver.get_and_update_item(None, "C")
    assert exc.value.mm_hashes == ["C"]


# --- signing ---------------------------------------------------------------------------------


def _forge(handle: MultiModalKwargsItem, change: str) -> MultiModalKwargsItem:
    out = _copy_handle(handle)
    sig = list(out["signature"].data)
    if change == "flipped":
        sig[0] ^= 1
        out["signature"] = MultiModalFieldElem(sig, out["signature"].field)
    elif change == "missing":
        del out["signature"]
    elif change == "short":
        out["signature"] = MultiModalFieldElem(sig[:31], out["signature"].field)
    elif change == "not_bytes":
        out["signature"] = MultiModalFieldElem([256, *sig[1:]], out["signature"].field)
    else:
        field, value = change.split("=")
        out[field] = MultiModalFieldElem(int(value), out[field].field)
    return out


@pytest.mark.parametrize(
    "change",
    ["flipped", "missing", "short", "not_bytes", "address=-1", f"address={2**64}", "monotonic_id=-1",
     f"monotonic_id={2**32}", "address=64", "monotonic_id=1"],
)
def test_forged_handles_are_refused(pair, change):
    sender, receiver = pair(2 * MiB_bytes)
    handle, _ = sender.get_and_update_item((_item(1000), []), "A")
    with pytest.raises(ShmHandleError, match="SHM handle signature"):
        receiver.get_and_update_item(_forge(handle, change), "A")


def test_handle_is_bound_to_its_key(pair):
    sender, receiver = pair(2 * MiB_bytes)
    handle, _ = sender.get_and_update_item((_item(1000), []), "A")
    sender.get_and_update_item((_item(1000), []), "B")
    with pytest.raises(ShmHandleError, match="SHM handle signature"):
        receiver.get_and_update_item(handle, "B")


def test_handle_from_before_clear_resolves_until_its_memory_is_reused(pair):
    sender, receiver = pair(3 * MiB_bytes)
    a = _item(MiB_bytes, fill=1)
    handle, _ = sender.get_and_update_item((a, []), "A")
    sender.clear_cache()
    assert not sender.is_cached_item("A")
    assert receiver.get_and_update_item(handle, "A") == a
    sender.get_and_update_item((_item(MiB_bytes), []), "B")  # lands after A
    assert receiver.get_and_update_item(handle, "A") == a
    sender.get_and_update_item((_item(MiB_bytes), []), "C")  # wraps onto A's memory
    assert sender.store.keys() == ["B", "C"]
    with pytest.raises(ShmHandleError, match="modified or is invalid"):
        receiver.get_and_update_item(handle, "A")


# --- reclamation -----------------------------------------------------------------------------


def _request(sender: ShmObjectStoreSenderCache, request_id: str, key: str, nbytes: int = MiB_bytes) -> bool:
    """Runs one single-item request through P0; whether the item went to shared memory."""
    sender.begin_request(request_id)
    sender.touch_sender_cache_item(key)
    out, _ = sender.get_and_update_item(None if sender.is_cached_item(key) else (_item(nbytes), []), key)
    sender.release_sender_touches()
    return set(out) == {"address", "monotonic_id", "signature"}


def test_unread_handles_of_ended_requests_are_reclaimed(pair, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(shm_store.time, "monotonic", lambda: clock[0])
    sender, _ = pair(int(2.5 * MiB_bytes), abort_grace_s=10.0)
    assert _request(sender, "r1", "A")
    assert _request(sender, "r2", "B")
    assert sender.store.pending_requests() == 2
    # Nobody read A or B: the ring is full and the next item goes inline.
    assert not _request(sender, "r3", "C")
    sender.on_request_aborted("r1")
    assert not _request(sender, "r4", "D")  # a step may still be reading r1's items
    clock[0] += 10.0
    assert _request(sender, "r5", "E")
    assert sender.store.keys() == ["B", "E"]
    sender.on_request_finished("r2")
    assert _request(sender, "r6", "F")
    assert sender.store.keys() == ["E", "F"]
    for rid in ("r3", "r4", "r5", "r6"):
        sender.on_request_finished(rid)
    assert sender.store.pending_requests() == 0
    sender.on_request_finished("unknown")


def test_without_request_tracking_an_unread_handle_pins_the_ring(pair):
    """vLLM 0.33's behaviour, kept when the frontend reports no request ends."""
    sender, receiver = pair(int(2.5 * MiB_bytes))
    handle_a, _ = sender.get_and_update_item((_item(MiB_bytes), []), "A")
    sender.get_and_update_item((_item(MiB_bytes), []), "B")
    for key in ("C", "D"):
        out, _ = sender.get_and_update_item((_item(MiB_bytes), []), key)
        assert "pixel_values" in out
    receiver.get_and_update_item(handle_a, "A")
    sender.get_and_update_item((_item(MiB_bytes), []), "E")
    assert sender.store.keys() == ["B", "E"]


def test_every_reader_must_read_before_a_chunk_is_freed():
    lock = FORK.Lock()
    sender = ShmObjectStoreSenderCache(int(1.5 * MiB_bytes), n_readers=2, lock=lock)
    readers = [ShmObjectStoreReceiverCache(sender.shm_name, reader_rank=r, lock=lock) for r in (0, 1)]
    try:
        handle, _ = sender.get_and_update_item((_item(MiB_bytes), []), "A")
        readers[0].get_and_update_item(handle, "A")
        sender.get_and_update_item((_item(MiB_bytes), []), "B")
        assert sender.store.keys() == ["A"]
        readers[1].get_and_update_item(handle, "A")
        sender.get_and_update_item((_item(MiB_bytes), []), "B")
        assert sender.store.keys() == ["B"]
        with pytest.raises(CacheError, match="reader_rank"):
            ShmObjectStoreReceiverCache(sender.shm_name, reader_rank=2)
    finally:
        for r in readers:
            r.close()
        sender.close()


# --- sender behaviour -------------------------------------------------------------------------


def test_oversize_item_goes_inline_with_one_warning(pair, caplog):
    sender, receiver = pair(4 * MiB_bytes, max_object_size=MiB_bytes)
    big = _item(MiB_bytes)  # the object layout adds a header, so it exceeds 1 MiB
    with caplog.at_level(logging.WARNING, logger="mmfront.cache.lru"):
        for _ in range(2):
            out, _ = sender.get_and_update_item((big, ["u"]), "big")
            assert out is big
            assert receiver.get_and_update_item(out, "big") is big
    assert not sender.is_cached_item("big")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "mm_shm_cache_max_object_size_mb" in messages[0]


def test_repeated_item_in_one_request_is_stored_once(pair):
    sender, receiver = pair(2 * MiB_bytes)
    item = _item(1000)
    assert sender.is_cached(["A", "A"]) == [False, False]
    first, _ = sender.get_and_update_item((item, ["u"]), "A")
    second, updates = sender.get_and_update_item((item, ["u"]), "A")
    assert first is second and updates == ["u"]
    assert sender.peek_prompt_updates("A") == ["u"]
    assert sender.peek_prompt_updates("B") is None
    assert sender.make_stats(delta=True) == CacheInfo(hits=1, total=2)
    assert sender.make_stats(delta=True) == CacheInfo(hits=0, total=0)
    with pytest.raises(CacheError, match="no item was given"):
        sender.get_and_update_item(None, "B")
    sender.invalidate("A")
    assert not sender.is_cached_item("A") and sender.peek_prompt_updates("A") is None
    fresh, _ = sender.get_and_update_item((item, ["v"]), "A")
    assert receiver.get_and_update_item(fresh, "A") == item
    assert sender.store.keys() == ["A"]


# --- segments, processes and /dev/shm ---------------------------------------------------------


def test_attach_errors():
    with pytest.raises(CacheError, match="does not exist"):
        ShmObjectStoreReceiverCache(f"{SEGMENT_PREFIX}-1-000000000000")
    from multiprocessing import shared_memory

    foreign = shared_memory.SharedMemory(create=True, size=4096)
    try:
        with pytest.raises(CacheError, match="not an mmfront shm cache"):
            ShmObjectStoreReceiverCache(foreign.name)
    finally:
        foreign.close()
        foreign.unlink()


def test_refuses_a_segment_larger_than_free_shared_memory(monkeypatch):
    class Tiny:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(shm_ring.os, "statvfs", lambda path: Tiny())
    with pytest.raises(CacheError, match="shm-size"):
        ShmObjectStoreSenderCache(MiB_bytes)


def test_readers_never_register_with_the_resource_tracker(pair, monkeypatch):
    calls = []
    monkeypatch.setattr(multiprocessing.resource_tracker, "register", lambda *a: calls.append(a))
    sender, _ = pair(MiB_bytes)
    reader = ShmObjectStoreReceiverCache(sender.shm_name)
    reader.close()
    assert calls == []


def test_close_and_garbage_collection_unlink():
    sender = ShmObjectStoreSenderCache(MiB_bytes)
    name = sender.shm_name
    assert name in _segments()
    sender.close()
    sender.close()
    assert name not in _segments()
    sender = ShmObjectStoreSenderCache(MiB_bytes)
    name = sender.shm_name
    del sender
    gc.collect()
    assert name not in _segments()


def test_interpreter_exit_unlinks():
    code = textwrap.dedent("""
        from mmfront.cache.shm_cache import ShmObjectStoreSenderCache
        from mmfront.inputs import MultiModalKwargsItem
        cache = ShmObjectStoreSenderCache(1 << 20)
        cache.get_and_update_item((MultiModalKwargsItem.dummy(1000), []), "A")
        print(cache.shm_name)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    name = out.stdout.strip()
    assert name.startswith(SEGMENT_PREFIX)
    assert name not in _segments()


def test_forked_child_never_unlinks_its_parents_segment(pair):
    sender, receiver = pair(MiB_bytes)
    pid = os.fork()
    if pid == 0:
        sender.close()
        os._exit(0)
    os.waitpid(pid, 0)
    assert sender.shm_name in _segments()
    handle, _ = sender.get_and_update_item((_item(100, fill=4), []), "A")
    assert receiver.get_and_update_item(handle, "A") == _item(100, fill=4)


def _read_then_hang(name: str, handle: MultiModalKwargsItem, conn) -> None:
    reader = ShmObjectStoreReceiverCache(name, zero_copy=True)
    item = reader.get_and_update_item(handle, "A")
    conn.send(int(item["pixel_values"].data[0]))
    signal.pause()


def test_killed_reader_leaves_the_segment_to_the_writer(pair):
    sender, _ = pair(int(1.5 * MiB_bytes))
    sender.begin_request("r1")
    handle, _ = sender.get_and_update_item((_item(MiB_bytes, fill=6), []), "A")
    sender.release_sender_touches()
    parent, child = FORK.Pipe()
    proc = FORK.Process(target=_read_then_hang, args=(sender.shm_name, handle, child))
    proc.start()
    assert parent.recv() == 6
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    assert sender.shm_name in _segments()
    # The dead reader never released its zero-copy read; the request's end frees the chunk.
    out, _ = sender.get_and_update_item((_item(MiB_bytes), []), "B")
    assert "pixel_values" in out
    sender.on_request_finished("r1")
    out, _ = sender.get_and_update_item((_item(MiB_bytes), []), "B")
    assert set(out) == {"address", "monotonic_id", "signature"}
    assert sender.store.keys() == ["B"]


def _write_then_hang(conn) -> None:
    cache = ShmObjectStoreSenderCache(MiB_bytes)
    cache.get_and_update_item((MultiModalKwargsItem.dummy(1000), []), "A")
    conn.send(cache.shm_name)
    signal.pause()


def _kill_a_writer() -> str:
    parent, child = FORK.Pipe()
    proc = FORK.Process(target=_write_then_hang, args=(child,))
    proc.start()
    name = parent.recv()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert name in _segments()
    assert Path("/dev/shm", name).stat().st_size > MiB_bytes
    return name


def test_segment_of_a_killed_writer_is_removed_by_cleanup():
    name = _kill_a_writer()
    assert cleanup_stale_segments() == [name]
    assert name not in _segments()
    assert cleanup_stale_segments() == []


def test_next_writer_start_removes_a_killed_writers_segment():
    name = _kill_a_writer()
    segment = ShmSegment.create(4096)
    try:
        assert name not in _segments()
        assert segment.name in _segments()
    finally:
        segment.close()


# --- the ring ----------------------------------------------------------------------------------


@pytest.fixture
def ring():
    r = shm_ring.SingleWriterShmRingBuffer(1000, n_readers=1)  # rounded down to 960 bytes
    yield r
    r.close()


def _free_all(ring, nbytes=10**9):
    return [c.monotonic_id for c in ring.free_oldest(lambda c: True, nbytes)]


def test_ring_allocates_in_fifo_order_and_skips_a_short_tail(ring):
    assert ring.data_size == 960
    a, b, c = (ring.allocate(300 - 16) for _ in range(3))  # 320-byte chunks
    assert [(x.address, x.monotonic_id, x.size) for x in (a, b, c)] == [(0, 0, 320), (320, 1, 320), (640, 2, 320)]
    assert ring.allocate(1) is None
    assert _free_all(ring, 1) == [0]
    d = ring.allocate(400)  # needs 448 bytes: only the 320 freed at the start are free
    assert d is None
    assert _free_all(ring, 1) == [1]
    d = ring.allocate(400)
    assert (d.address, d.monotonic_id, d.size) == (960, 3, 448)
    reader = shm_ring.ShmRingReader(ring.name)
    try:
        assert reader.chunk(960, 3).nbytes == 448
        with pytest.raises(ShmHandleError, match="modified or is invalid"):
            reader.chunk(0, 0)  # d overwrote a's header
        assert reader.chunk(640, 2).nbytes == 320
    finally:
        reader.close()


def test_empty_ring_takes_an_object_longer_than_the_tail(ring):
    ring.allocate(600)  # 640 bytes
    assert _free_all(ring) == [0]
    chunk = ring.allocate(800)  # 832 bytes: more than the 320-byte tail, less than the ring
    assert (chunk.address, chunk.size) == (960, 832)


def test_clear_keeps_ids_increasing(ring):
    ring.allocate(10)
    ring.clear()
    assert len(ring) == 0
    chunk = ring.allocate(10)
    assert (chunk.address, chunk.monotonic_id) == (64, 1)
    with pytest.raises(CacheError, match="cannot fit"):
        ring.allocate(960)


def test_put_frees_only_what_it_needs(pair):
    sender, receiver = pair(int(3.5 * MiB_bytes))
    for key in "ABC":
        handle, _ = sender.get_and_update_item((_item(MiB_bytes), []), key)
        receiver.get_and_update_item(handle, key)
    sender.get_and_update_item((_item(MiB_bytes), []), "D")
    assert sender.store.keys() == ["B", "C", "D"]


def test_object_larger_than_the_ring_goes_inline(pair, caplog):
    sender, _ = pair(MiB_bytes)  # max object size stays at its 128 MiB default
    big = _item(2 * MiB_bytes)
    with caplog.at_level(logging.WARNING, logger="mmfront.cache.lru"):
        out, _ = sender.get_and_update_item((big, []), "big")
    assert out is big
    assert sender.store.max_object_size == MiB_bytes - 16
    assert "exceeds mm_processor_cache_gb" in caplog.records[0].getMessage()


def test_zero_copy_tensors_outlive_their_reader(pair):
    sender, _ = pair(int(1.5 * MiB_bytes))
    reader = ShmObjectStoreReceiverCache(sender.shm_name, zero_copy=True)
    handle, _ = sender.get_and_update_item((_item(MiB_bytes, fill=1), []), "A")
    tensor = reader.get_and_update_item(handle, "A")["pixel_values"].data
    out, _ = sender.get_and_update_item((_item(MiB_bytes), []), "B")
    assert "pixel_values" in out  # A is held by the unreleased zero-copy read
    reader.close()  # releases the read; the mapping stays until the tensor is freed
    assert int(tensor.sum()) == MiB_bytes
    del tensor
    out, _ = sender.get_and_update_item((_item(MiB_bytes), []), "B")
    assert sender.store.keys() == ["B"]


def test_attach_refuses_a_segment_too_small_to_be_a_cache():
    from multiprocessing import shared_memory

    tiny = shared_memory.SharedMemory(create=True, size=16)
    try:
        with pytest.raises(CacheError, match="too small"):
            ShmObjectStoreReceiverCache(tiny.name)
    finally:
        tiny.close()
        tiny.unlink()
