from __future__ import annotations

import pytest

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
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache, ShmObjectStoreSenderCache
from mmfront.config import MultiModalConfig
from mmfront.errors import CacheError
from mmfront.inputs import MultiModalKwargsItem

SMALL_GB = 1 / 1024  # 1 MiB


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"mm_processor_cache_gb": 0}, None),
        ({"mm_processor_cache_gb": 0, "mm_processor_cache_type": "shm"}, None),
        ({}, "lru"),
        ({"mm_processor_cache_type": "shm"}, "shm"),
        ({"api_process_count": 2}, "processor_only"),
        ({"api_process_count": 2, "mm_processor_cache_type": "shm"}, "processor_only"),
        ({"data_parallel_size": 2}, "processor_only"),
        ({"data_parallel_size": 2, "data_parallel_external_lb": True}, "lru"),
        ({"data_parallel_size": 2, "data_parallel_external_lb": True, "api_process_count": 2}, "processor_only"),
    ],
)
def test_cache_type(changes, expected):
    assert get_processor_cache_type(MultiModalConfig(**changes)) == expected


def test_lru_deployment_gets_mirrored_pair_and_separate_processor_only_cache():
    config = MultiModalConfig(mm_processor_cache_gb=SMALL_GB)
    p0 = processor_cache_from_config(config)
    p1 = engine_receiver_cache_from_config(config)
    warmup = processor_only_cache_from_config(config)
    assert isinstance(p0, LruKeyReplicatedSenderCache)
    assert isinstance(p1, LruKeyReplicatedReceiverCache)
    assert isinstance(warmup, MultiModalProcessorOnlyCache)
    assert p0._cache.capacity == p1._cache.capacity == warmup._cache.capacity == 1 << 20
    assert worker_receiver_cache_from_config(config, shm_name=None) is None
    # Warm-up traffic never touches the mirror.
    warmup.get_and_update_item((MultiModalKwargsItem.dummy(8), []), "warm")
    assert not p0.is_cached_item("warm")
    assert p0.make_stats().total == 0


def test_disabled_cache_gets_nothing():
    config = MultiModalConfig(mm_processor_cache_gb=0)
    assert processor_cache_from_config(config) is None
    assert engine_receiver_cache_from_config(config) is None
    assert processor_only_cache_from_config(config) is None


def test_processor_only_deployment_has_no_receivers():
    config = MultiModalConfig(mm_processor_cache_gb=SMALL_GB, api_process_count=4)
    assert isinstance(processor_cache_from_config(config), MultiModalProcessorOnlyCache)
    assert engine_receiver_cache_from_config(config) is None
    assert isinstance(processor_only_cache_from_config(config), MultiModalProcessorOnlyCache)


def test_shm_deployment_gets_writer_and_worker_readers():
    config = MultiModalConfig(mm_processor_cache_gb=2 * SMALL_GB, mm_processor_cache_type="shm",
                              mm_shm_cache_max_object_size_mb=1)
    p0 = processor_cache_from_config(config, n_readers=2)
    assert isinstance(p0, ShmObjectStoreSenderCache)
    try:
        assert p0.n_readers == 2
        assert p0.store.max_object_size == 1 << 20
        assert engine_receiver_cache_from_config(config) is None
        with pytest.raises(CacheError, match="shm_name"):
            worker_receiver_cache_from_config(config, shm_name=None)
        readers = [worker_receiver_cache_from_config(config, shm_name=p0.shm_name, reader_rank=r) for r in (0, 1)]
        assert all(isinstance(r, ShmObjectStoreReceiverCache) for r in readers)
        for r in readers:
            r.close()
    finally:
        p0.close()


def test_receiver_cache_from_config_is_the_one_rule_for_p1():
    lru = MultiModalConfig(mm_processor_cache_gb=SMALL_GB)
    assert isinstance(receiver_cache_from_config(lru), MirroredReceiverCache)
    assert receiver_cache_from_config(MultiModalConfig(mm_processor_cache_gb=0)) is None
    assert receiver_cache_from_config(MultiModalConfig(mm_processor_cache_gb=SMALL_GB, api_process_count=2)) is None
    shm = MultiModalConfig(mm_processor_cache_gb=2 * SMALL_GB, mm_processor_cache_type="shm",
                           mm_shm_cache_max_object_size_mb=1)
    p0 = processor_cache_from_config(shm)
    assert isinstance(p0, ShmObjectStoreSenderCache)
    try:
        with pytest.raises(CacheError, match="shm_name"):
            receiver_cache_from_config(shm)
        reader = receiver_cache_from_config(shm, shm_name=p0.shm_name)
        assert isinstance(reader, ShmObjectStoreReceiverCache)
        reader.close()
    finally:
        p0.close()
