"""Counterparts of vLLM 0.33's tests/multimodal/test_cache.py for the in-process caches."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from mmfront.cache.base import BaseMultiModalProcessorCache, BaseMultiModalReceiverCache, CacheInfo
from mmfront.cache.factory import engine_receiver_cache_from_config, processor_cache_from_config
from mmfront.cache.lru import (
    LruKeyReplicatedReceiverCache,
    LruKeyReplicatedSenderCache,
    MultiModalProcessorOnlyCache,
)
from mmfront.cache.stats import MultiModalCacheStats
from mmfront.config import MultiModalConfig
from mmfront.errors import CacheError, MultiModalCacheMissError
from mmfront.inputs import (
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    MultiModalSharedField,
    PlaceholderRange,
)

UPD = ["upd"]


def _item(sizes: dict[str, int], rng: np.random.RandomState | None = None) -> MultiModalKwargsItem:
    def elem(n: int) -> MultiModalFieldElem:
        data = torch.empty(n, dtype=torch.int8) if rng is None else torch.from_numpy(rng.randint(4, size=n, dtype=np.int8))
        return MultiModalFieldElem(data, MultiModalSharedField(batch_size=1))

    return MultiModalKwargsItem({key: elem(n) for key, n in sizes.items()})


def _feature(mm_hash: str, data: MultiModalKwargsItem | None, *, identifier: str | None = None,
             length: int = 4) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(data=data, modality="image", identifier=identifier or mm_hash,
                                 mm_position=PlaceholderRange(offset=0, length=length), mm_hash=mm_hash)


# --- size accounting --------------------------------------------------------------------------


@pytest.mark.parametrize(("sizes", "expected"), [({"a1": 100}, 100), ({"a1": 100, "a2": 110}, 210)])
def test_cache_item_size(sizes, expected):
    item = _item(sizes)
    only = MultiModalProcessorOnlyCache(2048)
    sender = LruKeyReplicatedSenderCache(2048)
    receiver = LruKeyReplicatedReceiverCache(2048)
    only.get_and_update_item((item, UPD), "h")
    sender.get_and_update_item((item, UPD), "h")
    receiver.get_and_update_item(item, "h")
    for cache in (only, sender, receiver):
        assert cache._cache.currsize == expected


def test_size_is_the_items_nbytes_never_a_walk():
    """Caches charge ``item.nbytes`` as maintained by the item; prompt updates are free."""
    item = _item({"a": 100})
    item.nbytes = 777
    sender = LruKeyReplicatedSenderCache(2048)
    receiver = LruKeyReplicatedReceiverCache(2048)
    sender.get_and_update_item((item, ["a long prompt update"] * 50), "h")
    receiver.get_and_update_item(item, "h")
    assert sender._cache.currsize == receiver._cache.currsize == 777


# --- IPC on / IPC off / cache off are indistinguishable -----------------------------------------


def _config(cache_gb: float, *, ipc: bool) -> MultiModalConfig:
    return MultiModalConfig(mm_processor_cache_gb=cache_gb, data_parallel_size=1 if ipc else 2)


def _run_p0_p1(p0, p1, items, hashes, is_cached_calls):
    if p0 is None:
        out = list(items)
    else:
        for _ in range(is_cached_calls):
            p0.is_cached(hashes)
        out = [item for item, _ in p0.get_and_update([(item, UPD) for item in items], hashes)]
    return out if p1 is None else p1.get_and_update(out, hashes)


def _compare(config_0, config_1, *, is_cached_calls: int, item_capacity=8, hit_rate=0.5, n_iter=100, seed=0):
    p0_0, p1_0 = processor_cache_from_config(config_0), engine_receiver_cache_from_config(config_0)
    p0_1, p1_1 = processor_cache_from_config(config_1), engine_receiver_cache_from_config(config_1)
    capacity = max(c.mm_processor_cache_bytes for c in (config_0, config_1))
    rng = np.random.RandomState(seed)
    all_items = [_item({"key": capacity // item_capacity}, rng) for _ in range(int(item_capacity / hit_rate))]
    all_hashes = [f"h{i}" for i in range(len(all_items))]
    for it in range(n_iter):
        idxs = rng.choice(len(all_items), rng.randint(0, 4))
        items = [all_items[i] for i in idxs]
        hashes = [all_hashes[i] for i in idxs]
        out_0 = _run_p0_p1(p0_0, p1_0, items, hashes, is_cached_calls)
        out_1 = _run_p0_p1(p0_1, p1_1, items, hashes, is_cached_calls)
        assert out_0 == out_1 == items, f"Failed at {it=}"
    return p0_0, p0_1


@pytest.mark.parametrize("is_cached_calls", [1, 2, 3])
def test_ipc_enable_disable_consistency(is_cached_calls):
    cache_gb = 1024 / (1 << 30)
    ipc_on = _config(cache_gb, ipc=True)
    ipc_off = _config(cache_gb, ipc=False)
    disabled = _config(0, ipc=True)
    assert isinstance(processor_cache_from_config(ipc_on), LruKeyReplicatedSenderCache)
    assert isinstance(processor_cache_from_config(ipc_off), MultiModalProcessorOnlyCache)
    assert processor_cache_from_config(disabled) is None
    sender, only = _compare(ipc_on, ipc_off, is_cached_calls=is_cached_calls)
    # The run really exercised hits and evictions (16 items compete for 8 slots).
    assert 0 < sender.make_stats().hits < sender.make_stats().total
    assert len(sender._cache) == 8
    assert sender._cache.order == only._cache.order
    _compare(ipc_off, disabled, is_cached_calls=is_cached_calls)
    _compare(disabled, ipc_on, is_cached_calls=is_cached_calls)


def test_sender_and_receiver_lrus_stay_identical():
    rng = np.random.RandomState(1)
    sender, receiver = LruKeyReplicatedSenderCache(1000), LruKeyReplicatedReceiverCache(1000)
    items = {f"h{i}": _item({"k": int(rng.randint(50, 400))}) for i in range(20)}
    for _ in range(200):
        hashes = [f"h{i}" for i in rng.choice(20, rng.randint(1, 4))]
        cached = sender.is_cached(hashes)
        for h in hashes:
            sender.touch_sender_cache_item(h)
        out = [sender.get_and_update_item(None if c else (items[h], UPD), h)[0] for h, c in zip(hashes, cached)]
        feats = receiver.get_and_update_features([_feature(h, o) for h, o in zip(hashes, out)])
        assert [f.data for f in feats] == [items[h] for h in hashes]
        assert sender._cache.order == receiver._cache.order
        assert sender._cache.currsize == receiver._cache.currsize


# --- oversize items ---------------------------------------------------------------------------


def test_oversize_items_are_served_uncached_with_one_warning(caplog):
    big = _item({"k": 2048})
    only = MultiModalProcessorOnlyCache(1024)
    sender = LruKeyReplicatedSenderCache(1024)
    receiver = LruKeyReplicatedReceiverCache(1024)
    with caplog.at_level(logging.WARNING, logger="mmfront.cache.lru"):
        for _ in range(2):
            assert only.get_and_update_item((big, UPD), "big") == (big, UPD)
            item, updates = sender.get_and_update_item((big, UPD), "big")
            assert item is big and updates == UPD
            assert receiver.get_and_update_item(item, "big") is big
    for cache in (only, sender, receiver):
        assert not cache.is_cached_item("big")
        assert cache._cache.currsize == 0
    warnings = [r for r in caplog.records if "Skipping multi-modal processor cache insert" in r.getMessage()]
    assert len(warnings) == 3
    assert "mm_processor_cache_gb" in warnings[0].getMessage()


def test_oversize_resend_drops_the_stale_receiver_copy():
    receiver = LruKeyReplicatedReceiverCache(1024)
    receiver.get_and_update_item(_item({"k": 100}), "h")
    big = _item({"k": 2048})
    assert receiver.get_and_update_item(big, "h") is big
    assert not receiver.is_cached_item("h")


# --- drift ------------------------------------------------------------------------------------


def test_drift_raises_then_invalidate_and_resend_repopulate():
    sender, receiver = LruKeyReplicatedSenderCache(4096), LruKeyReplicatedReceiverCache(4096)
    item = _item({"k": 128})
    assert sender.get_and_update_item((item, UPD), "X") == (item, UPD)
    receiver.get_and_update_item(item, "X")
    receiver.clear_cache()  # P1 reset without P0 (vLLM #42995)
    assert sender.get_and_update_item((item, UPD), "X") == (None, UPD)
    with pytest.raises(MultiModalCacheMissError, match="P0/P1 cache drift") as exc:
        receiver.get_and_update_item(None, "X")
    assert exc.value.mm_hashes == ["X"]
    sender.invalidate("X")
    assert not sender.is_cached_item("X")
    assert sender.get_and_update_item((item, UPD), "X") == (item, UPD)
    assert receiver.get_and_update_item(item, "X") is item
    # A later request that carries only the hash (a UUID-only item) succeeds.
    assert sender.get_and_update_item(None, "X") == (None, UPD)
    assert receiver.get_and_update_item(None, "X") is item


def test_one_error_carries_every_drifted_hash_and_stores_the_rest():
    receiver = LruKeyReplicatedReceiverCache(4096)
    a, c = _item({"k": 10}), _item({"k": 20})
    features = [_feature("A", a), _feature("B", None), _feature("C", c), _feature("D", None), _feature("E", None)]
    with pytest.raises(MultiModalCacheMissError) as exc:
        receiver.get_and_update_features(features)
    assert exc.value.mm_hashes == ["B", "D", "E"]
    assert receiver._cache.order == ["A", "C"]
    out = receiver.get_and_update_features([_feature("C", None), _feature("A", None)])
    assert [f.data for f in out] == [c, a]


def test_sleep_dual_clear_invariant():
    sender, receiver = LruKeyReplicatedSenderCache(4096), LruKeyReplicatedReceiverCache(4096)
    item = _item({"k": 128})
    sender.get_and_update_item((item, UPD), "X")
    receiver.get_and_update_item(item, "X")
    sender.clear_cache()
    receiver.clear_cache()
    assert not sender.is_cached_item("X")
    assert sender.get_and_update_item((item, UPD), "X") == (item, UPD)
    assert receiver.get_and_update_item(item, "X") is item


def test_fresh_payload_replaces_stale_entry():
    receiver = LruKeyReplicatedReceiverCache(4096)
    small, large = _item({"k": 10}), _item({"k": 100})
    receiver.get_and_update_item(small, "h")
    receiver.get_and_update_item(large, "h")
    assert receiver.get_and_update_item(None, "h") is large
    assert receiver._cache.currsize == 100


def test_fresh_payload_replaces_stale_entry_through_features():
    receiver = LruKeyReplicatedReceiverCache(4096)
    small, large = _item({"k": 10}), _item({"k": 100})
    receiver.get_and_update_features([_feature("h", small, length=3)])
    receiver.get_and_update_features([_feature("h", large, length=9)])
    (out,) = receiver.get_and_update_features([_feature("h", None, length=9)])
    assert out.data is large
    assert out.mm_position == PlaceholderRange(offset=0, length=9)


def test_missing_item_without_data_on_p0_is_a_typed_error():
    for cache in (MultiModalProcessorOnlyCache(100), LruKeyReplicatedSenderCache(100)):
        with pytest.raises(CacheError, match="no item was given"):
            cache.get_and_update_item(None, "nope")


# --- LRU order with touches ---------------------------------------------------------------------


def _run_lru_eviction(p0: BaseMultiModalProcessorCache, p1: BaseMultiModalReceiverCache) -> None:
    request1 = ["image_A", "image_B", "image_C"]
    items1 = {h: MultiModalKwargsItem.dummy(2) for h in request1}
    request2 = ["image_D", "image_E", "image_A", "image_C"]
    items2 = {h: MultiModalKwargsItem.dummy(1) for h in request2}
    for hashes, items, expected_cached, expected_order in (
        (request1, items1, [False, False, False], ["image_A", "image_B", "image_C"]),
        (request2, items2, [False, False, True, True], ["image_D", "image_E", "image_A", "image_C"]),
    ):
        cached = p0.is_cached(hashes)
        assert cached == expected_cached
        for h in hashes:
            p0.touch_sender_cache_item(h)
        out = [p0.get_and_update_item(None if c else (items[h], []), h)[0] for h, c in zip(hashes, cached)]
        for h in hashes:
            p1.touch_receiver_cache_item(h)
        for h, o in zip(hashes, out):
            p1.get_and_update_item(o, h)
        assert p0._cache.order == expected_order  # type: ignore[attr-defined]
        assert p1._cache.order == expected_order  # type: ignore[attr-defined]


def test_cache_eviction_lru_cache():
    _run_lru_eviction(LruKeyReplicatedSenderCache(6), LruKeyReplicatedReceiverCache(6))


# --- LoRA, read-only calls, stats -------------------------------------------------------------


def test_processor_cache_shared_across_loras():
    receiver = LruKeyReplicatedReceiverCache(1 << 20)
    item = MultiModalKwargsItem.dummy(1024)
    receiver.get_and_update_features([_feature("abc", item, identifier="12345:abc")])
    assert receiver.is_cached_item("abc")
    (out,) = receiver.get_and_update_features([_feature("abc", None, identifier="67890:abc")])
    assert out.data is item


def test_read_only_calls_change_neither_order_nor_stats():
    for cache in (MultiModalProcessorOnlyCache(100), LruKeyReplicatedSenderCache(100)):
        cache.get_and_update_item((MultiModalKwargsItem.dummy(1), ["a"]), "A")
        cache.get_and_update_item((MultiModalKwargsItem.dummy(1), ["b"]), "B")
        before = cache.make_stats()
        assert cache.is_cached(["A", "B", "C"]) == [True, True, False]
        assert cache.peek_prompt_updates("A") == ["a"]
        assert cache.peek_prompt_updates("C") is None
        assert cache._cache.order == ["A", "B"]
        assert cache.make_stats() == before == CacheInfo(hits=0, total=2)
        cache.touch_sender_cache_item("A")
        assert cache._cache.order == ["B", "A"]
        assert cache.make_stats() == before


def test_processor_only_hit_returns_full_item_and_updates():
    cache = MultiModalProcessorOnlyCache(100)
    item = MultiModalKwargsItem.dummy(10)
    cache.get_and_update_item((item, ["u"]), "A")
    out_item, out_updates = cache.get_and_update_item(None, "A")
    assert out_item is item and out_updates == ["u"]
    cache.invalidate("A")
    assert not cache.is_cached_item("A")


def test_stats_delta_and_request_records():
    sender = LruKeyReplicatedSenderCache(100)
    stats = MultiModalCacheStats()
    sender.get_and_update_item((MultiModalKwargsItem.dummy(1), UPD), "A")
    sender.get_and_update_item((MultiModalKwargsItem.dummy(1), UPD), "B")
    stats.record_request(sender)
    sender.get_and_update_item(None, "A")
    stats.record_request(sender)
    assert (stats.requests, stats.queries, stats.hits, stats.reset) == (2, 3, 1, False)
    assert stats.hit_ratio == pytest.approx(1 / 3)
    assert sender.make_stats() == CacheInfo(hits=1, total=3)
    stats.clear_cache(sender)
    assert stats.reset
    assert sender.make_stats() == CacheInfo(0, 0)
    assert not sender.is_cached_item("A")
    taken = stats.take()
    assert (taken.requests, taken.queries, taken.hits, taken.reset) == (2, 3, 1, True)
    assert (stats.requests, stats.queries, stats.hits, stats.reset) == (0, 0, 0, False)
    sender.get_and_update_item((MultiModalKwargsItem.dummy(1), UPD), "A")
    stats.record_request(sender)
    assert (stats.requests, stats.queries, stats.hits) == (1, 1, 0)


def test_receiver_counts_lookups_of_items_sent_without_data_only():
    receiver = LruKeyReplicatedReceiverCache(100)
    receiver.get_and_update_item(MultiModalKwargsItem.dummy(1), "A")
    receiver.get_and_update_item(None, "A")
    with pytest.raises(MultiModalCacheMissError):
        receiver.get_and_update_item(None, "B")
    assert receiver.make_stats(delta=True) == CacheInfo(hits=1, total=2)
    assert receiver.make_stats(delta=True) == CacheInfo(hits=0, total=0)
