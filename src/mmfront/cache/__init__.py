"""Processor caches: P0's sender caches, P1's receiver caches, and the factories that pick them.

See docs/caching.md for the modes, the P0/P1 mirror invariant and how to size the cache.
"""

from __future__ import annotations

from mmfront.cache._lrumap import LRUCache
from mmfront.cache._shm_ring import cleanup_stale_segments
from mmfront.cache.base import (
    BaseMultiModalCache,
    BaseMultiModalProcessorCache,
    BaseMultiModalReceiverCache,
    CacheInfo,
)
from mmfront.cache.factory import (
    engine_receiver_cache_from_config,
    get_processor_cache_type,
    processor_cache_from_config,
    processor_only_cache_from_config,
    receiver_cache_from_config,
    worker_receiver_cache_from_config,
)
from mmfront.cache.lru import (
    LruKeyReplicatedReceiverCache,
    LruKeyReplicatedSenderCache,
    MultiModalProcessorOnlyCache,
)
from mmfront.cache.mirror import MirroredReceiverCache, MirroredSenderCache
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache, ShmObjectStoreSenderCache
from mmfront.cache.stats import MultiModalCacheStats

__all__ = [
    "BaseMultiModalCache",
    "BaseMultiModalProcessorCache",
    "BaseMultiModalReceiverCache",
    "CacheInfo",
    "LRUCache",
    "LruKeyReplicatedReceiverCache",
    "LruKeyReplicatedSenderCache",
    "MirroredReceiverCache",
    "MirroredSenderCache",
    "MultiModalCacheStats",
    "MultiModalProcessorOnlyCache",
    "ShmObjectStoreReceiverCache",
    "ShmObjectStoreSenderCache",
    "cleanup_stale_segments",
    "engine_receiver_cache_from_config",
    "get_processor_cache_type",
    "processor_cache_from_config",
    "processor_only_cache_from_config",
    "receiver_cache_from_config",
    "worker_receiver_cache_from_config",
]
