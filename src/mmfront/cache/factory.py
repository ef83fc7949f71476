"""Which processor caches a deployment gets, from its :class:`MultiModalConfig` (vLLM §4.5).

* no cache when ``mm_processor_cache_gb <= 0``;
* ``processor_only`` when P0 cannot mirror P1: several API processes, or data parallelism with
  internal load balancing (a P0 cannot know which engine, hence which P1 cache, gets a request);
* otherwise the configured ``mm_processor_cache_type``: ``lru`` (default) or ``shm``. In ``lru``
  mode the pair is the stamped mirror (:mod:`mmfront.cache.mirror`), which detects drift.
"""

from __future__ import annotations

from typing import Literal

from mmfront.cache._shm_store import Lock
from mmfront.cache.base import BaseMultiModalProcessorCache, BaseMultiModalReceiverCache
from mmfront.cache.lru import MultiModalProcessorOnlyCache
from mmfront.cache.mirror import MirroredReceiverCache, MirroredSenderCache
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache, ShmObjectStoreSenderCache
from mmfront.config import MultiModalConfig
from mmfront.errors import CacheError

ProcessorCacheType = Literal["processor_only", "lru", "shm"]


def get_processor_cache_type(config: MultiModalConfig) -> ProcessorCacheType | None:
    if config.mm_processor_cache_gb <= 0:
        return None
    single_engine = config.data_parallel_size == 1 or config.data_parallel_external_lb
    if config.api_process_count != 1 or not single_engine:
        return "processor_only"
    return config.mm_processor_cache_type


def processor_cache_from_config(
    config: MultiModalConfig, *, n_readers: int = 1, lock: Lock | None = None,
) -> BaseMultiModalProcessorCache | None:
    """P0's cache. ``n_readers`` (the engine's worker count) and ``lock`` matter for ``shm`` only."""
    cache_type = get_processor_cache_type(config)
    capacity = config.mm_processor_cache_bytes
    if cache_type is None:
        return None
    if cache_type == "processor_only":
        return MultiModalProcessorOnlyCache(capacity)
    if cache_type == "lru":
        return MirroredSenderCache(capacity)
    return ShmObjectStoreSenderCache(
        capacity, max_object_size=config.mm_shm_cache_max_object_size_bytes, n_readers=n_readers, lock=lock,
    )


def processor_only_cache_from_config(config: MultiModalConfig) -> MultiModalProcessorOnlyCache | None:
    """A separate cache for warm-up and tokenize-only requests, whatever the cache type.

    Those requests never reach P1, so running them through the mirrored sender would make P0
    believe P1 holds items it never received."""
    if get_processor_cache_type(config) is None:
        return None
    return MultiModalProcessorOnlyCache(config.mm_processor_cache_bytes)


def receiver_cache_from_config(
    config: MultiModalConfig, *, shm_name: str | None = None, reader_rank: int = 0, lock: Lock | None = None,
    zero_copy: bool = False,
) -> BaseMultiModalReceiverCache | None:
    """The P1 cache ``config`` gets: the mirrored LRU (``lru``), a reader of P0's segment
    (``shm``, with the arguments of :func:`worker_receiver_cache_from_config`), or none."""
    if get_processor_cache_type(config) == "shm":
        return worker_receiver_cache_from_config(config, shm_name=shm_name, reader_rank=reader_rank, lock=lock,
                                                 zero_copy=zero_copy)
    return engine_receiver_cache_from_config(config)


def engine_receiver_cache_from_config(config: MultiModalConfig) -> MirroredReceiverCache | None:
    """P1's engine-core cache: only in ``lru`` mode. It checks the drift stamps P0's
    :class:`MirroredSenderCache` puts on each request (see docs/caching.md, "Drift")."""
    if get_processor_cache_type(config) != "lru":
        return None
    return MirroredReceiverCache(config.mm_processor_cache_bytes)


def worker_receiver_cache_from_config(
    config: MultiModalConfig, *, shm_name: str | None, reader_rank: int = 0, lock: Lock | None = None,
    zero_copy: bool = False,
) -> ShmObjectStoreReceiverCache | None:
    """A P1 worker's cache: only in ``shm`` mode, attached to the segment P0 created."""
    if get_processor_cache_type(config) != "shm":
        return None
    if shm_name is None:
        raise CacheError(
            "The shm processor cache needs the segment name of P0's cache on every worker: pass "
            "shm_name=<ShmObjectStoreSenderCache.shm_name>."
        )
    return ShmObjectStoreReceiverCache(shm_name, reader_rank=reader_rank, lock=lock, zero_copy=zero_copy)
