"""Shared-memory cache hardening: stale handles never read another item's bytes, corrupt segments
and bad reader names are typed errors, and SIGTERM does not leave a segment in /dev/shm."""

from __future__ import annotations

import gc
import os
import signal
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.cache._shm_ring import CHUNK_HEADER, SEGMENT_HEADER_SIZE, SEGMENT_PREFIX, ShmSegment, align_up
from mmfront.cache._shm_store import frame_offsets
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache, ShmObjectStoreSenderCache
from mmfront.errors import CacheError, ShmHandleError
from mmfront.inputs import MultiModalFieldElem, MultiModalKwargsItem, MultiModalSharedField
from mmfront.wire import MsgpackEncoder, frame_views

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shared memory in /dev/shm")

RING = 32 * 1024
DECOY_FILL = 255
"""The fill of the decoy item planted in payloads; real items use other fills."""
TENSOR_FRAME = 1
"""Tensors of 300 bytes and more travel as frame 1, after the msgpack body."""


def _item(nbytes: int, fill: int) -> MultiModalKwargsItem:
    data = torch.full((nbytes,), fill, dtype=torch.uint8)
    return MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(data, MultiModalSharedField(batch_size=1))})


def _layout(item: MultiModalKwargsItem) -> tuple[list[memoryview], list[int], int]:
    """The item's frames, their offsets in a chunk, and the chunk's size, as the store lays them out."""
    frames = frame_views(MsgpackEncoder().encode(item))
    offsets, used = frame_offsets(1, [f.nbytes for f in frames])
    return frames, offsets, align_up(used)


def _chunk_image(monotonic_id: int, item: MultiModalKwargsItem) -> bytes:
    """The bytes of a chunk holding ``item`` under ``monotonic_id``: what a payload can imitate."""
    frames, offsets, size = _layout(item)
    image = bytearray(size)
    CHUNK_HEADER.pack_into(image, 0, monotonic_id, size)
    pos = CHUNK_HEADER.size + 4
    struct.pack_into(f"<I{len(frames)}Q", image, pos, len(frames), *(f.nbytes for f in frames))
    for frame, offset in zip(frames, offsets):
        image[offset:offset + frame.nbytes] = frame
    return bytes(image)


DECOY = _item(64, DECOY_FILL)


def _handle_fields(handle: MultiModalKwargsItem) -> tuple[int, int]:
    return handle["address"].data, handle["monotonic_id"].data


def _planted_item(
    sender: ShmObjectStoreSenderCache, nbytes: int, fill: int, stale: list[MultiModalKwargsItem],
) -> MultiModalKwargsItem:
    """An item whose tensor holds, wherever a handle in ``stale`` would land inside the chunk the
    item is about to get, the image of a chunk with that handle's id and the decoy's bytes."""
    ring = sender.store._ring
    _, offsets, size = _layout(_item(nbytes, fill))
    address = ring._end
    if address % ring.data_size + size > ring.data_size:
        address += ring.data_size - address % ring.data_size
    tensor_start = address + offsets[TENSOR_FRAME]
    payload = bytearray([fill]) * nbytes
    taken = 0
    for handle in sorted(stale, key=lambda h: h["address"].data % ring.data_size):
        old_address, old_id = _handle_fields(handle)
        image = _chunk_image(old_id, DECOY)
        # The old chunk's offset, in the lap of the new chunk.
        landing = old_address + (address - old_address) // ring.data_size * ring.data_size
        if landing < tensor_start:
            landing += ring.data_size
        at = landing - tensor_start
        if old_address < address and at >= taken and at + len(image) <= nbytes:
            payload[at:at + len(image)] = image
            taken = at + len(image)
    return MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(
        torch.frombuffer(payload, dtype=torch.uint8).clone(), MultiModalSharedField(batch_size=1))})


@pytest.fixture
def pair():
    sender = ShmObjectStoreSenderCache(RING)
    receiver = ShmObjectStoreReceiverCache(sender.shm_name)
    yield sender, receiver
    receiver.close()
    sender.close()


# --- stale handles -----------------------------------------------------------------------------


def test_stale_handle_after_clear_and_a_lap_cannot_read_a_payload_that_imitates_its_chunk(pair):
    sender, receiver = pair
    sender.get_and_update_item((_item(2000, fill=1), []), "P")  # puts A away from the lap's start
    a = _item(1000, fill=2)
    handle_a, _ = sender.get_and_update_item((a, []), "A")
    assert receiver.get_and_update_item(handle_a, "A") == a
    sender.clear_cache()
    # B is too long for the rest of the lap: it starts the next lap, over P and A.
    b = _planted_item(sender, 30_000, 3, [handle_a])
    handle_b, _ = sender.get_and_update_item((b, []), "B")
    assert _handle_fields(handle_b) == (RING, 2)
    assert b["pixel_values"].data.numpy().tobytes().count(_chunk_image(1, DECOY)) == 1
    with pytest.raises(ShmHandleError, match=r"^Data for address:id '2240:1' has been modified or is invalid: "
                                             r"the writer reused that memory"):
        receiver.get_and_update_item(handle_a, "A")
    assert receiver.get_and_update_item(handle_b, "B") == b


def test_handle_before_clear_still_resolves_while_its_memory_is_intact(pair):
    sender, receiver = pair
    a = _item(1000, fill=2)
    handle_a, _ = sender.get_and_update_item((a, []), "A")
    sender.clear_cache()
    sender.get_and_update_item((_item(20_000, fill=3), []), "B")  # fills the lap, after A
    assert receiver.get_and_update_item(handle_a, "A") == a


def test_a_handle_moved_to_a_later_lap_is_refused_by_its_signature(pair):
    sender, receiver = pair
    handle, _ = sender.get_and_update_item((_item(1000, fill=2), []), "A")
    address, _ = _handle_fields(handle)
    moved = MultiModalKwargsItem(dict(handle.data))
    moved["address"] = MultiModalFieldElem(address + RING, handle["address"].field)
    with pytest.raises(ShmHandleError, match=r"^Invalid SHM handle signature for cache key 'A' \(HMAC mismatch\)"):
        receiver.get_and_update_item(moved, "A")


@st.composite
def _ops(draw: st.DrawFn) -> list[tuple[str, int]]:
    return draw(st.lists(st.one_of(
        st.tuples(st.just("put"), st.sampled_from([300, 1500, 5000, 12_000])),
        st.tuples(st.just("read"), st.integers(0, 63)),
        st.tuples(st.just("hit"), st.integers(0, 63)),
        st.tuples(st.just("clear"), st.just(0)),
    ), min_size=1, max_size=40))


@settings(max_examples=150, deadline=None)
@given(ops=_ops())
def test_interleaved_put_clear_read_never_return_another_items_bytes(ops: list[tuple[str, int]]) -> None:
    sender = ShmObjectStoreSenderCache(RING)
    receiver = ShmObjectStoreReceiverCache(sender.shm_name)
    items: dict[str, MultiModalKwargsItem] = {}
    handles: list[tuple[str, MultiModalKwargsItem]] = []
    try:
        for op, arg in ops:
            if op == "put":
                key = f"k{len(items)}"
                items[key] = _planted_item(sender, arg, len(items) % DECOY_FILL, [h for _, h in handles])
                out, _ = sender.get_and_update_item((items[key], []), key)
                if out is not items[key]:
                    handles.append((key, out))
            elif op == "hit" and items:
                key = f"k{arg % len(items)}"
                if sender.is_cached_item(key):
                    handles.append((key, sender.get_and_update_item(None, key)[0]))
            elif op == "read" and handles:
                key, handle = handles[arg % len(handles)]
                live = sender.is_cached_item(key) and sender.store._index[key].handle is handle
                try:
                    read = receiver.get_and_update_item(handle, key)
                except ShmHandleError:
                    assert not live, f"a live handle for {key} was refused"
                else:
                    assert read == items[key]
            elif op == "clear":
                sender.clear_cache()
    finally:
        receiver.close()
        sender.close()


# --- corrupt segments --------------------------------------------------------------------------


def _poke(name: str, offset: int, data: bytes) -> None:
    """Write ``data`` into a segment the way a stray process would, through its own mapping."""
    segment = ShmSegment.attach(name)
    try:
        segment.buf[offset:offset + len(data)] = data
    finally:
        segment.close()


CHUNK_A = SEGMENT_HEADER_SIZE
"""Segment offset of the first chunk (the pair's first put lands at address 0)."""


@pytest.mark.parametrize(("offset", "data"), [
    pytest.param(0, struct.pack("<Q", 7), id="chunk-id"),
    pytest.param(8, struct.pack("<Q", 0), id="size-zero"),
    pytest.param(8, struct.pack("<Q", 16), id="size-header-only"),
    pytest.param(8, struct.pack("<Q", 20), id="size-unaligned"),
    pytest.param(8, struct.pack("<Q", 64), id="size-too-small-for-frames"),
    pytest.param(8, struct.pack("<Q", 2**64 - 64), id="size-huge"),
    pytest.param(8, struct.pack("<Q", RING), id="size-past-frontier"),
    pytest.param(20, struct.pack("<I", 2**32 - 1), id="frame-count-huge"),
    pytest.param(24, struct.pack("<Q", 2**63), id="frame-length-huge"),
    pytest.param(64, b"\xc1" * 72, id="body-not-msgpack"),
    pytest.param(64, b"\x81\xa1x\xc7\xff\x01", id="body-truncated-ext"),
])
def test_corrupt_chunk_bytes_are_a_typed_error(pair, offset, data):
    sender, receiver = pair
    handle, _ = sender.get_and_update_item((_item(1000, fill=2), []), "A")
    _poke(sender.shm_name, CHUNK_A + offset, data)
    with pytest.raises(ShmHandleError, match=r"^Data for address:id '0:0' has been modified or is invalid") as exc:
        receiver.get_and_update_item(handle, "A")
    assert "Resend the request with its data" in str(exc.value)


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(0, 191), data=st.binary(min_size=1, max_size=16))
def test_any_corruption_of_chunk_metadata_reads_an_item_or_fails_typed(offset: int, data: bytes) -> None:
    """The metadata is everything before the tensor frame at byte 192: the chunk header, read
    count, frame table and msgpack body."""
    sender = ShmObjectStoreSenderCache(RING)
    receiver = ShmObjectStoreReceiverCache(sender.shm_name)
    try:
        handle, _ = sender.get_and_update_item((_item(1000, fill=2), []), "A")
        _poke(sender.shm_name, CHUNK_A + offset, data)
        try:
            read = receiver.get_and_update_item(handle, "A")
        except ShmHandleError:
            return
        assert isinstance(read, MultiModalKwargsItem)
    finally:
        receiver.close()
        sender.close()


def test_a_frontier_moved_back_is_a_typed_error(pair):
    from mmfront.cache._shm_ring import FRONTIER_OFFSET

    sender, receiver = pair
    handle, _ = sender.get_and_update_item((_item(1000, fill=2), []), "A")
    _poke(sender.shm_name, FRONTIER_OFFSET, struct.pack("@Q", 0))
    with pytest.raises(ShmHandleError, match=r"its chunk header \(id 0, size 1216\) does not match the handle"):
        receiver.get_and_update_item(handle, "A")


@pytest.mark.parametrize(("offset", "data", "message"), [
    pytest.param(0, b"MMFRSHM0", "bad magic", id="magic"),
    pytest.param(8, struct.pack("<Q", 2**40), "data size 1099511627776 does not fit", id="data-size-huge"),
    pytest.param(8, struct.pack("<Q", 1000), "data size 1000 does not fit", id="data-size-unaligned"),
    pytest.param(16, struct.pack("<I", 0), "0 readers cannot fit", id="no-readers"),
    pytest.param(16, struct.pack("<I", 2**32 - 1), "4294967295 readers cannot fit", id="readers-huge"),
])
def test_corrupt_segment_header_is_a_cache_error_on_attach(pair, offset, data, message):
    sender, _ = pair
    _poke(sender.shm_name, offset, data)
    with pytest.raises(CacheError, match=message):
        ShmObjectStoreReceiverCache(sender.shm_name)


# --- reader names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    pytest.param("", id="empty"),
    pytest.param("a/b", id="slash"),
    pytest.param("x" * 256, id="too-long"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param(123, id="not-str"),
    pytest.param(None, id="none"),
])
def test_bad_reader_name_is_a_cache_error(name):
    with pytest.raises(CacheError, match="is not a shared-memory segment name"):
        ShmObjectStoreReceiverCache(name)


def test_name_with_a_nul_does_not_open_the_segment_before_it(pair):
    sender, _ = pair
    with pytest.raises(CacheError, match="is not a shared-memory segment name"):
        ShmObjectStoreReceiverCache(sender.shm_name + "\0other")


def test_unopenable_name_is_a_cache_error():
    directory = f"/dev/shm/{SEGMENT_PREFIX}-test-dir-{os.getpid()}"
    os.mkdir(directory)
    try:
        with pytest.raises(CacheError, match=r"^Cannot open shared-memory segment .*\(Invalid argument\)"):
            ShmObjectStoreReceiverCache(os.path.basename(directory))
    finally:
        os.rmdir(directory)


# --- SIGTERM -----------------------------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import signal, sys, threading
    from mmfront.cache.shm_cache import ShmObjectStoreSenderCache
    from mmfront.inputs import MultiModalKwargsItem
    {setup}
    cache = ShmObjectStoreSenderCache(1 << 20)
    cache.get_and_update_item((MultiModalKwargsItem.dummy(1000), []), "A")
    print(cache.shm_name, flush=True)
    {then}
""")


def _run_writer(setup: str = "", then: str = "", kill: bool = True) -> tuple[str, int, str]:
    """Runs a writer script; returns its segment name, exit code and the rest of its output."""
    code = _WRITER.format(setup=setup, then=then)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        name = proc.stdout.readline().strip()
        if kill:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        out, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): readline buffered ahead
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert name.startswith(SEGMENT_PREFIX), err
    return name, proc.returncode, out.strip()


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", name))


def test_sigterm_removes_the_writers_segment_and_still_kills():
    name, code, _ = _run_writer(then="signal.pause()")
    try:
        assert code == -signal.SIGTERM
        assert not _exists(name)
    finally:
        if _exists(name):
            os.unlink(os.path.join("/dev/shm", name))


def test_an_applications_own_sigterm_handler_is_kept():
    name, code, _ = _run_writer(
        setup="signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\nmine = signal.getsignal(signal.SIGTERM)",
        then="assert signal.getsignal(signal.SIGTERM) is mine\nsignal.pause()",
    )
    assert code == 3  # the application's handler ran, and its exit ran the unlinking finalizer
    assert not _exists(name)


def test_an_ignored_sigterm_stays_ignored():
    _, code, out = _run_writer(setup="signal.signal(signal.SIGTERM, signal.SIG_IGN)",
                               then="print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)", kill=False)
    assert (code, out) == (0, "True")


def test_a_writer_made_in_a_thread_installs_nothing_and_works():
    code = textwrap.dedent("""
        import signal, threading
        from mmfront.cache.shm_cache import ShmObjectStoreSenderCache
        from mmfront.inputs import MultiModalKwargsItem
        made = []
        t = threading.Thread(target=lambda: made.append(ShmObjectStoreSenderCache(1 << 20)))
        t.start(); t.join()
        out, _ = made[0].get_and_update_item((MultiModalKwargsItem.dummy(1000), []), "A")
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, sorted(out))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "True ['address', 'monotonic_id', 'signature']"


def test_sigterm_in_a_forked_child_leaves_the_parents_segment():
    name, code, out = _run_writer(then=textwrap.dedent("""
        import os, time
        ready, told = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(told, b"x")
            while True:  # not signal.pause(): a SIGTERM that lands just before the pause() call is never seen
                time.sleep(0.05)
        os.read(ready, 1)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, os.path.exists("/dev/shm/" + cache.shm_name))
    """), kill=False)
    assert (code, out) == (0, "True True")
    assert not _exists(name)


def test_sigterm_handler_unlinks_only_this_processs_segments(monkeypatch):
    """In-process: the handler's unlinking, with the kill replaced so the test process survives."""
    from mmfront.cache import _shm_ring as shm_ring

    mine = ShmObjectStoreSenderCache(1 << 20)
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(shm_ring.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setattr(shm_ring.signal, "signal", lambda *a: None)
    monkeypatch.setitem(shm_ring._owned, "mmfront-shm-1-000000000000", 1)  # a parent's, inherited by fork
    try:
        shm_ring._on_sigterm(signal.SIGTERM, None)
        assert not _exists(mine.shm_name)
        assert "mmfront-shm-1-000000000000" in shm_ring._owned
        assert kills == [(os.getpid(), signal.SIGTERM)]
    finally:
        mine.close()
    gc.collect()
    assert mine.shm_name not in shm_ring._owned


def test_handler_is_not_installed_twice_or_over_a_non_default_one(monkeypatch):
    from mmfront.cache import _shm_ring as shm_ring

    installed: list[object] = []
    monkeypatch.setattr(shm_ring.signal, "getsignal", lambda sig: signal.SIG_DFL if not installed else installed[-1])
    monkeypatch.setattr(shm_ring.signal, "signal", lambda sig, handler: installed.append(handler))
    for _ in range(2):
        ShmObjectStoreSenderCache(1 << 20).close()
    assert installed == [shm_ring._on_sigterm]
