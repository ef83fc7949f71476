"""The shm processor caches: P0 writes items into shared memory, each P1 worker reads them.

Items travel P0 -> shared memory -> every worker directly; the engine core only relays the
small signed handles. The sender keeps the prompt updates of stored items, so a hit sends a
handle and needs neither the media nor the HF processor.

Zero-copy reads: a receiver made with ``zero_copy=True`` returns tensors that view the shared
memory. Their chunk stays reserved for this reader until it calls
:meth:`ShmObjectStoreReceiverCache.release_reads` (after the tensors have been copied to the
device or are otherwise no longer used); the tensors must be treated as read-only. The default
copies each tensor out once and acknowledges the read at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmfront.cache._shm_store import Lock, ShmObjectReader, ShmObjectStore, is_address_item
from mmfront.cache.base import (
    BaseMultiModalProcessorCache,
    BaseMultiModalReceiverCache,
    CacheInfo,
    HitCounter,
    ProcessorCacheInput,
    ProcessorCacheOutput,
    PromptUpdates,
)
from mmfront.cache.lru import OversizeWarning
from mmfront.errors import CacheError, DecodeError, MultiModalCacheMissError, ShmHandleError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem
from mmfront.wire import MsgpackDecoder, MsgpackEncoder, frame_views

DEFAULT_MAX_OBJECT_SIZE = 128 << 20


class ShmObjectStoreSenderCache(BaseMultiModalProcessorCache):
    """P0's shm cache: a miss is stored in the ring and sent as a handle, a hit issues a handle.

    An item larger than ``max_object_size``, or one that does not fit while the ring is full of
    unread items, is sent inline instead (the request never fails for lack of cache space).

    For abort-safe reclamation, bracket each request's cache updates with
    :meth:`begin_request` and :meth:`release_sender_touches`, and report its end with
    :meth:`on_request_finished` or :meth:`on_request_aborted`.
    """

    commit_at_send = True

    def __init__(
        self, capacity_bytes: int, *, max_object_size: int = DEFAULT_MAX_OBJECT_SIZE, n_readers: int = 1,
        lock: Lock | None = None, abort_grace_s: float = 10.0,
    ) -> None:
        self._updates: dict[str, PromptUpdates] = {}
        self._store = ShmObjectStore(
            capacity_bytes, max_object_size, n_readers, on_evict=self._forget, lock=lock, abort_grace_s=abort_grace_s,
        )
        self._encoder = MsgpackEncoder()
        limited_by_ring = self._store.max_object_size < max_object_size
        self._oversize = OversizeWarning("mm_processor_cache_gb" if limited_by_ring else "mm_shm_cache_max_object_size_mb")
        self._counter = HitCounter()

    def _forget(self, key: str) -> None:
        self._updates.pop(key, None)

    @property
    def shm_name(self) -> str:
        """The segment name to pass to every reader (``worker_receiver_cache_from_config``)."""
        return self._store.name

    @property
    def n_readers(self) -> int:
        return self._store.n_readers

    @property
    def store(self) -> ShmObjectStore:
        return self._store

    def is_cached_item(self, mm_hash: str) -> bool:
        return mm_hash in self._store

    def peek_prompt_updates(self, mm_hash: str) -> PromptUpdates | None:
        return self._updates.get(mm_hash) if mm_hash in self._store else None

    def touch_sender_cache_item(self, mm_hash: str) -> None:
        self._store.touch(mm_hash)

    def release_sender_touches(self) -> None:
        self._store.release_touches()

    def begin_request(self, request_id: str) -> None:
        """Attribute the handles issued until :meth:`release_sender_touches` to ``request_id``."""
        self._store.begin_request(request_id)

    def on_request_finished(self, request_id: str) -> None:
        """The request is done: its handles no longer hold their chunks."""
        self._store.end_request(request_id, aborted=False)

    def on_request_aborted(self, request_id: str) -> None:
        """The request was aborted: its handles stop holding their chunks after the abort grace."""
        self._store.end_request(request_id, aborted=True)

    def get_and_update_item(self, mm_item: ProcessorCacheInput | None, mm_hash: str) -> ProcessorCacheOutput:
        self._counter.total += 1
        if mm_hash in self._store:
            self._counter.hits += 1
            return self._store.get_cached(mm_hash), self._updates[mm_hash]
        if mm_item is None:
            raise CacheError(
                f"The shm cache has no entry for mm_hash {mm_hash!r} and no item was given; pass "
                "(item, prompt_updates) for every item is_cached() reported missing."
            )
        item, updates = mm_item
        frames = frame_views(self._encoder.encode(item))
        size = self._store.object_size(frames)
        if size > self._store.max_object_size:
            self._oversize(size, self._store.max_object_size)
            return mm_item
        handle = self._store.put(mm_hash, frames)
        if handle is None:
            return mm_item
        self._updates[mm_hash] = updates
        return handle, updates

    def invalidate(self, mm_hash: str) -> None:
        self._store.invalidate(mm_hash)

    def clear_cache(self) -> None:
        self._store.clear()
        self._updates.clear()
        self._counter.reset()

    def make_stats(self, *, delta: bool = False) -> CacheInfo:
        return self._counter.stat(delta=delta)

    def close(self) -> None:
        self._store.close()


class ShmObjectStoreReceiverCache(BaseMultiModalReceiverCache):
    """A P1 worker's view of P0's shm cache: turns handles back into items.

    Items that arrived inline pass through; features without data (prefix-covered items whose
    payload the scheduler stripped) are left alone.
    """

    def __init__(self, shm_name: str, *, reader_rank: int = 0, lock: Lock | None = None,
                 zero_copy: bool = False) -> None:
        self._reader = ShmObjectReader(shm_name, reader_rank, lock=lock)
        self.zero_copy = zero_copy
        self._decoder = MsgpackDecoder(MultiModalKwargsItem, share_mem=zero_copy)
        self._unreleased: list[tuple[int, int]] = []

    def touch_receiver_cache_item(self, mm_hash: str, mm_item: MultiModalKwargsItem | None = None) -> None:
        """Nothing to do: the writer alone decides what stays in the ring."""

    def get_and_update_item(self, mm_item: MultiModalKwargsItem | None, mm_hash: str) -> MultiModalKwargsItem:
        if mm_item is None:
            raise MultiModalCacheMissError([mm_hash])
        if not is_address_item(mm_item):
            return mm_item
        address, monotonic_id, frames = self._reader.resolve(mm_hash, mm_item)
        try:
            item = self._decoder.decode(frames)
        except DecodeError as e:
            raise ShmHandleError(
                f"Data for address:id '{address}:{monotonic_id}' has been modified or is invalid: it does not "
                f"decode ({e}). Resend the request with its data; if this recurs, restart the writer (P0)."
            ) from e
        # Checked after decoding in both modes: decoding reads the body (and copies, by default).
        if not self._reader.holds(address, monotonic_id):
            raise ShmHandleError(
                f"Data for address:id '{address}:{monotonic_id}' has been modified or is invalid: it was "
                "overwritten while being read. Resend the request with its data."
            )
        if self.zero_copy:
            self._unreleased.append((address, monotonic_id))
            return item
        self._reader.acknowledge(address, monotonic_id)
        return item

    def get_and_update_features(self, mm_features: Sequence[MultiModalFeatureSpec]) -> list[MultiModalFeatureSpec]:
        for feature in mm_features:
            if feature.data is not None:
                feature.data = self.get_and_update_item(feature.data, feature.cache_key)
        return list(mm_features)

    def release_reads(self) -> None:
        """Zero-copy mode: the tensors returned so far are no longer used; let the writer reuse them."""
        for address, monotonic_id in self._unreleased:
            self._reader.acknowledge(address, monotonic_id)
        self._unreleased.clear()

    def clear_cache(self) -> None:
        """Nothing is stored on the reader side."""

    def close(self) -> None:
        self.release_reads()
        self._reader.close()
