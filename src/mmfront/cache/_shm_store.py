"""Keyed objects in the shm ring: layout, signed handles, reader counts and reclamation.

Object layout inside a chunk (after the ring's 16-byte chunk header), all offsets from the
chunk start, which is 64-byte aligned::

    [u32 read count] * n_readers      one slot per reader, each written only by its reader
    [u32 frame count][u64 length] * frame count
    frames, each starting on a 64-byte boundary (frame 0: msgpack body, then the aux frames)

A chunk may be freed when the writer has not protected it with a touch and either every reader
has read it as many times as handles were issued for it, or every request that was issued a
handle has ended. The second rule is what vLLM 0.33 lacks: a handle issued to a request that is
aborted before any reader reads it would otherwise pin its chunk, and every chunk behind it in
FIFO order, forever.

Reader counting needs no atomics: each counter word has exactly one writer (its reader) and
the store only reads it. An optional cross-process lock (vLLM's ``shared_worker_lock``) orders the
reader's loads of the data before its counter update on weakly ordered CPUs (aarch64); x86-64
already guarantees that order.

Handles are vLLM-shaped ``MultiModalKwargsItem``s with the batched elements ``address``,
``monotonic_id`` and ``signature`` (HMAC-SHA256 over ``sha256(key) || address || id`` with the
segment's secret), so a handle cannot be forged or pointed at another key's data. The signature
says which chunk a handle was issued for; the ring's write frontier says whether that chunk's
memory is still intact (see :mod:`mmfront.cache._shm_ring`), so a stale handle fails even where
its address now falls inside another item's bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from mmfront.cache._shm_ring import (
    CHUNK_HEADER,
    ID_MODULUS,
    RingChunk,
    ShmRingReader,
    SingleWriterShmRingBuffer,
    align_up,
)
from mmfront.errors import CacheError, ShmHandleError
from mmfront.inputs import MultiModalBatchedField, MultiModalFieldElem, MultiModalKwargsItem, NestedTensors

HANDLE_KEYS = frozenset({"address", "monotonic_id", "signature"})
ADDRESS_LIMIT = 1 << 64

_COUNT = struct.Struct("@I")
"""Native layout: one aligned 4-byte store per update (the ``<`` layouts pack byte by byte)."""
_NFRAMES = struct.Struct("<I")
_LENGTH_SIZE = 8
_COUNT_MASK = 0xFFFFFFFF

Lock = AbstractContextManager[Any]


# --- layout and signing -----------------------------------------------------------------------


def frame_offsets(n_readers: int, lengths: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of the frames in a chunk and the chunk's used size (its header included)."""
    pos = CHUNK_HEADER.size + _COUNT.size * n_readers + _NFRAMES.size + _LENGTH_SIZE * len(lengths)
    offsets = []
    for n in lengths:
        pos = align_up(pos)
        offsets.append(pos)
        pos += n
    return offsets, pos


def sign_handle(secret: bytes, key: str, address: int, monotonic_id: int) -> bytes:
    message = hashlib.sha256(key.encode()).digest() + address.to_bytes(8, "little") + monotonic_id.to_bytes(4, "little")
    return hmac.digest(secret, message, "sha256")


_BATCHED = MultiModalBatchedField()


def make_address_item(address: int, monotonic_id: int, signature: bytes) -> MultiModalKwargsItem:
    signature_bytes: list[NestedTensors] = list(signature)
    item = MultiModalKwargsItem()
    # The elements are plain ints: size them directly (the same sizes the item's generic
    # per-leaf walk computes, at a tenth of the cost, which matters on every put).
    item.data.update(
        address=MultiModalFieldElem(address, _BATCHED),
        monotonic_id=MultiModalFieldElem(monotonic_id, _BATCHED),
        signature=MultiModalFieldElem(signature_bytes, _BATCHED),
    )
    item.nbytes = sys.getsizeof(address) + sys.getsizeof(monotonic_id) + sum(map(sys.getsizeof, signature_bytes))
    return item


def is_address_item(item: MultiModalKwargsItem) -> bool:
    """Whether ``item`` is (or claims to be) a handle; a partial one is then refused, not passed on."""
    return not HANDLE_KEYS.isdisjoint(item.data)


def _bad_signature(key: str, why: str) -> ShmHandleError:
    return ShmHandleError(
        f"Invalid SHM handle signature for cache key {key!r} ({why}). Handles are issued by the frontend's shm "
        "cache and bound to one key; a client-made or altered handle is refused."
    )


def parse_address_item(item: MultiModalKwargsItem, key: str) -> tuple[int, int, bytes]:
    """``(address, monotonic_id, signature)`` of a handle, with every field range-checked."""
    if item.keys() != HANDLE_KEYS:
        raise _bad_signature(key, f"a handle has exactly the elements {sorted(HANDLE_KEYS)}, got {sorted(item)}")
    address = item["address"].data
    monotonic_id = item["monotonic_id"].data
    signature = item["signature"].data
    if type(address) is not int or not 0 <= address < ADDRESS_LIMIT:
        raise _bad_signature(key, "address out of range")
    if type(monotonic_id) is not int or not 0 <= monotonic_id < ID_MODULUS:
        raise _bad_signature(key, "monotonic id out of range")
    if not isinstance(signature, (list, tuple)) or len(signature) != 32:
        raise _bad_signature(key, "signature must be 32 byte values")
    try:
        raw = bytes(signature)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _bad_signature(key, "signature must be 32 byte values") from None
    return address, monotonic_id, raw


# --- writer -----------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Entry:
    key: str
    chunk: RingChunk
    handle: MultiModalKwargsItem
    issued: int = 0
    """Handles issued for this chunk (the put and every hit)."""
    ended: int = 0
    """Of those, handles whose request has finished (or was aborted and its grace has passed)."""
    touched: bool = False


@dataclass(slots=True)
class _Abort:
    deadline: float
    entries: list[_Entry] = field(default_factory=list)


class ShmObjectStore:
    """The writer (P0) side: puts frames under a key and issues signed handles for them."""

    def __init__(
        self, capacity_bytes: int, max_object_size: int, n_readers: int, *,
        on_evict: Callable[[str], object] | None = None, lock: Lock | None = None, abort_grace_s: float = 10.0,
    ) -> None:
        if n_readers < 1:
            raise CacheError(f"The shm cache needs at least one reader, got n_readers={n_readers}")
        self.n_readers = n_readers
        self.abort_grace_s = abort_grace_s
        self._ring = SingleWriterShmRingBuffer(capacity_bytes, n_readers)
        self.max_object_size = min(max_object_size, self._ring.data_size - CHUNK_HEADER.size)
        """Largest object :meth:`put` accepts: the configured limit, or the ring if that is smaller."""
        self._counts = struct.Struct(f"@{n_readers}I")
        self._lock: Lock = lock if lock is not None else nullcontext()
        self._on_evict = on_evict
        self._index: dict[str, _Entry] = {}
        self._by_id: dict[int, _Entry] = {}
        self._touched: list[_Entry] = []
        self._requests: dict[str, list[_Entry]] = {}
        self._current: list[_Entry] | None = None
        self._aborts: deque[_Abort] = deque()

    @property
    def name(self) -> str:
        """The segment name readers attach to."""
        return self._ring.name

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def keys(self) -> list[str]:
        """Stored keys, oldest first."""
        return list(self._index)

    def object_size(self, frames: Sequence[memoryview]) -> int:
        """Bytes ``frames`` take in a chunk, excluding the ring's chunk header."""
        return frame_offsets(self.n_readers, [f.nbytes for f in frames])[1] - CHUNK_HEADER.size

    def put(self, key: str, frames: Sequence[memoryview]) -> MultiModalKwargsItem | None:
        """Store ``frames`` (flat byte views) under ``key`` and issue a handle; ``None`` when the
        ring stays full after freeing what can be freed. The caller checks :meth:`object_size`
        against :attr:`max_object_size` first."""
        if key in self._index:
            raise CacheError(f"Key {key!r} is already in the shm store; issue a handle with get_cached()")
        lengths = [f.nbytes for f in frames]
        offsets, used = frame_offsets(self.n_readers, lengths)
        nbytes = used - CHUNK_HEADER.size
        chunk = self._ring.allocate(nbytes)
        while chunk is None:
            # Free only what this object needs (a tail too short for it may cost one more round),
            # so every other item stays cached as long as possible.
            if not self.free_unused(nbytes):
                return None
            chunk = self._ring.allocate(nbytes)
        view = self._ring.view(chunk)
        pos = CHUNK_HEADER.size
        view[pos:pos + self._counts.size] = bytes(self._counts.size)
        pos += self._counts.size
        _NFRAMES.pack_into(view, pos, len(frames))
        struct.pack_into(f"<{len(lengths)}Q", view, pos + _NFRAMES.size, *lengths)
        for frame, offset, n in zip(frames, offsets, lengths):
            view[offset:offset + n] = frame
        view.release()
        signature = sign_handle(self._ring.secret, key, chunk.address, chunk.monotonic_id)
        entry = _Entry(key, chunk, make_address_item(chunk.address, chunk.monotonic_id, signature))
        self._index[key] = entry
        self._by_id[chunk.monotonic_id] = entry
        return self._issue(entry)

    def get_cached(self, key: str) -> MultiModalKwargsItem:
        """Issue another handle for a stored key (a hit); ends the key's touch protection."""
        entry = self._index[key]
        entry.touched = False
        return self._issue(entry)

    def _issue(self, entry: _Entry) -> MultiModalKwargsItem:
        entry.issued += 1
        if self._current is not None:
            self._current.append(entry)
        return entry.handle

    def touch(self, key: str) -> None:
        """Protect ``key`` from being freed until it is issued or :meth:`release_touches`."""
        entry = self._index.get(key)
        if entry is not None and not entry.touched:
            entry.touched = True
            self._touched.append(entry)

    def release_touches(self) -> None:
        """End every touch protection and the current request binding (end of a request)."""
        for entry in self._touched:
            entry.touched = False
        self._touched.clear()
        self._current = None

    def begin_request(self, request_id: str) -> None:
        """Attribute the handles issued from now on (until :meth:`release_touches`) to ``request_id``."""
        self._current = self._requests.setdefault(request_id, [])

    def end_request(self, request_id: str, *, aborted: bool) -> None:
        """The request's handles will not be read (any more): let their chunks be freed.

        A finished request has been through the engine, so its reads are done. An aborted one
        may still be read by a step already running, so its handles count as ended only after
        ``abort_grace_s``."""
        entries = self._requests.pop(request_id, None)
        if entries is None:
            return
        if self._current is entries:
            self._current = None
        if aborted:
            self._aborts.append(_Abort(time.monotonic() + self.abort_grace_s, entries))
        else:
            for entry in entries:
                entry.ended += 1

    def pending_requests(self) -> int:
        """Requests holding handles that have not been reported finished or aborted."""
        return len(self._requests)

    def _expire_aborts(self) -> None:
        now = time.monotonic()
        while self._aborts and self._aborts[0].deadline <= now:
            for entry in self._aborts.popleft().entries:
                entry.ended += 1

    def _is_free(self, chunk: RingChunk) -> bool:
        entry = self._by_id[chunk.monotonic_id]
        if entry.touched:
            return False
        if entry.ended >= entry.issued:
            return True
        view = self._ring.view(chunk)
        with self._lock:
            counts = self._counts.unpack_from(view, CHUNK_HEADER.size)
        view.release()
        return min(counts) >= entry.issued

    def free_unused(self, nbytes: int) -> int:
        """Free up to ``nbytes`` of the oldest unused chunks; returns the bytes freed."""
        self._expire_aborts()
        freed = self._ring.free_oldest(self._is_free, nbytes)
        for chunk in freed:
            entry = self._by_id.pop(chunk.monotonic_id)
            if self._index.get(entry.key) is entry:
                del self._index[entry.key]
                if self._on_evict is not None:
                    self._on_evict(entry.key)
        return sum(chunk.size for chunk in freed)

    def invalidate(self, key: str) -> None:
        """Forget ``key`` so the next put stores a fresh copy; its chunk is freed in FIFO turn."""
        if self._index.pop(key, None) is not None and self._on_evict is not None:
            self._on_evict(key)

    def clear(self) -> None:
        """Drop every key and reuse the whole ring; outstanding handles fail once overwritten."""
        self._ring.clear()
        self._index.clear()
        self._by_id.clear()
        self._touched.clear()
        self._requests.clear()
        self._current = None
        self._aborts.clear()

    def close(self) -> None:
        self._ring.close()


# --- reader -----------------------------------------------------------------------------------


class ShmObjectReader:
    """A reader (P1 worker) side: verifies handles, exposes frames, acknowledges reads."""

    def __init__(self, name: str, reader_rank: int, *, lock: Lock | None = None) -> None:
        self._ring = ShmRingReader(name)
        self.n_readers = self._ring.n_readers
        if not 0 <= reader_rank < self.n_readers:
            self._ring.close()
            raise CacheError(
                f"reader_rank must be in [0, {self.n_readers}) for this shm cache (created for {self.n_readers} "
                f"readers), got {reader_rank}"
            )
        self.reader_rank = reader_rank
        self._count_offset = CHUNK_HEADER.size + _COUNT.size * reader_rank
        self._lock: Lock = lock if lock is not None else nullcontext()

    def resolve(self, key: str, handle: MultiModalKwargsItem) -> tuple[int, int, list[memoryview]]:
        """Verify ``handle`` for ``key``; ``(address, monotonic_id, frames)`` viewing shared memory."""
        address, monotonic_id, signature = parse_address_item(handle, key)
        expected = sign_handle(self._ring.secret, key, address, monotonic_id)
        if not hmac.compare_digest(signature, expected):
            raise _bad_signature(key, "HMAC mismatch")
        chunk = self._ring.chunk(address, monotonic_id)
        return address, monotonic_id, self._frames(chunk, address, monotonic_id)

    def _frames(self, chunk: memoryview, address: int, monotonic_id: int) -> list[memoryview]:
        pos = CHUNK_HEADER.size + _COUNT.size * self.n_readers
        if pos + _NFRAMES.size > len(chunk):
            raise self._corrupt(address, monotonic_id)
        (count,) = _NFRAMES.unpack_from(chunk, pos)
        pos += _NFRAMES.size
        if pos + _LENGTH_SIZE * count > len(chunk):
            raise self._corrupt(address, monotonic_id)
        lengths = struct.unpack_from(f"<{count}Q", chunk, pos)
        offsets, used = frame_offsets(self.n_readers, lengths)
        if used > len(chunk):
            raise self._corrupt(address, monotonic_id)
        return [chunk[offset:offset + n] for offset, n in zip(offsets, lengths)]

    @staticmethod
    def _corrupt(address: int, monotonic_id: int) -> ShmHandleError:
        return ShmHandleError(
            f"Data for address:id '{address}:{monotonic_id}' has been modified or is invalid (its frame table "
            "does not fit the chunk). Resend the request with its data; if this recurs, restart the writer (P0)."
        )

    def holds(self, address: int, monotonic_id: int) -> bool:
        return self._ring.holds(address, monotonic_id)

    def acknowledge(self, address: int, monotonic_id: int) -> None:
        """Count one read of the chunk by this reader, unless its memory was reused meanwhile."""
        if not self._ring.holds(address, monotonic_id):
            return
        offset = address % self._ring.data_size + self._count_offset
        data = self._ring.data
        with self._lock:
            (count,) = _COUNT.unpack_from(data, offset)
            _COUNT.pack_into(data, offset, (count + 1) & _COUNT_MASK)

    def close(self) -> None:
        self._ring.close()
