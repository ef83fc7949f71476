"""The stamped mirror: P0's stamps and digest chain, P1's in-order apply, reorder buffer and resets."""

from __future__ import annotations

import hashlib

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.cache.mirror import (
    MirrorDelivery,
    MirroredReceiverCache,
    MirroredSenderCache,
    chain_digest,
    initial_digest,
)
from mmfront.errors import CacheError, MultiModalCacheMissError
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.wire.messages import MirrorOnly, MirrorOp, MirrorReset, MirrorStamp

UPD = ["update"]


def item(nbytes: int, value: int = 1) -> MultiModalKwargsItem:
    data = torch.full((nbytes,), value % 256, dtype=torch.uint8)
    return MultiModalKwargsItem({"x": MultiModalFieldElem(data, MultiModalBatchedField())})


def commit(sender: MirroredSenderCache, request_id: str, items: list[tuple[str, MultiModalKwargsItem]]
           ) -> list[MultiModalFeatureSpec]:
    """What BaseMultiModalProcessor.apply does to the cache for one request, plus the features."""
    sender.begin_request(request_id)
    for h, _ in items:
        sender.touch_sender_cache_item(h)
    features = []
    for pos, (h, it) in enumerate(items):
        out, _ = sender.get_and_update_item(None if sender.is_cached_item(h) else (it, UPD), h)
        features.append(MultiModalFeatureSpec(out, "image", h, PlaceholderRange(pos * 10, 4), h))
    sender.release_sender_touches()
    return features


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def deliver(sender: MirroredSenderCache, receiver: MirroredReceiverCache, request_id: str,
            items: list[tuple[str, MultiModalKwargsItem]]) -> list:
    features = commit(sender, request_id, items)
    return receiver.receive(sender.take_stamp(request_id), features, request_id)


def deliveries(events: list) -> list[MirrorDelivery]:
    return [e for e in events if isinstance(e, MirrorDelivery)]


# --- P0 stamps --------------------------------------------------------------------------------


def test_digest_format_is_fixed() -> None:
    # P0 and P1 may run different mmfront builds: the chain's bytes are part of the protocol.
    assert initial_digest(0, 100) == hashlib.blake2b(bytes(8) + (100).to_bytes(8, "little"), digest_size=16).digest()
    assert initial_digest(0, 100).hex() == "8241e580e35d78f869991d830d348b72"
    assert initial_digest(0, 101) != initial_digest(0, 100)  # P0 and P1 must agree on the capacity too
    ops = ["N", "a", "E", "b"]
    start = initial_digest(7, 100)
    expected = hashlib.blake2b(start + msgspec.msgpack.encode([["x"], ops]), digest_size=16).digest()
    assert chain_digest(start, ("x",), ops) == expected
    stamp = MirrorStamp(1, 2, b"\x00" * 16, ("k",))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(stamp), type=MirrorStamp) == stamp
    assert msgspec.msgpack.encode(MirrorStamp(1, 2, b"d")) == b"\x94\x01\x02\xc4\x01d\x90"


def test_each_committing_request_gets_the_next_stamp() -> None:
    sender = MirroredSenderCache(100)
    a, b, c = item(40, 1), item(40, 2), item(40, 3)
    epoch = sender.epoch
    commit(sender, "r1", [("a", a), ("b", b)])
    s1 = sender.take_stamp("r1")
    d1 = chain_digest(initial_digest(epoch, 100), (), ["N", "a", "N", "b"])
    assert s1 == MirrorStamp(epoch, 1, d1)
    assert sender.take_stamp("r1") is None  # taken once

    commit(sender, "r2", [("b", b), ("c", c)])  # c evicts a (b was touched, so it stays)
    d2 = chain_digest(d1, (), ["H", "b", "N", "c", "E", "a"])
    assert sender.take_stamp("r2") == MirrorStamp(epoch, 2, d2)

    sender.begin_request("text-only")  # nothing committed: no stamp, no seq consumed
    assert sender.take_stamp("text-only") is None

    commit(sender, "r3", [("big", item(101))])
    d3 = chain_digest(d2, (), ["O", "big"])
    assert sender.take_stamp("r3") == MirrorStamp(epoch, 3, d3)
    assert not sender.is_cached_item("big")


def test_invalidations_travel_with_the_next_stamp_and_clear_starts_an_epoch() -> None:
    sender = MirroredSenderCache(100)
    commit(sender, "r1", [("a", item(10))])
    d1 = sender.take_stamp("r1").digest  # type: ignore[union-attr]
    sender.invalidate("a")
    sender.invalidate("zz")  # unknown keys are dropped on both sides alike
    assert not sender.is_cached_item("a")
    commit(sender, "r2", [("a", item(10))])
    stamp = sender.take_stamp("r2")
    assert stamp is not None and stamp.invalidated == ("a", "zz") and stamp.seq == 2
    assert stamp.digest == chain_digest(d1, ("a", "zz"), ["N", "a"])

    old = sender.epoch
    sender.invalidate("a")
    sender.clear_cache()
    assert sender.epoch != old and sender.seq == 0
    commit(sender, "r3", [("b", item(10))])
    assert sender.take_stamp("r3") == MirrorStamp(sender.epoch, 1, chain_digest(initial_digest(sender.epoch, 100), (), ["N", "b"]))


def test_uncollected_stamps_are_bounded() -> None:
    sender = MirroredSenderCache(100)
    sender.max_untaken = 3
    for i in range(5):
        commit(sender, f"r{i}", [("a", item(1))])
    assert sender.take_stamp("r0") is None and sender.take_stamp("r1") is None
    assert sender.take_stamp("r4").seq == 5  # type: ignore[union-attr]


# --- P1 in order --------------------------------------------------------------------------------


def test_p1_mirrors_p0_and_fills_hits() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    items = {k: item(30, i) for i, k in enumerate("abcd")}
    plan = [["a", "b"], ["b", "c"], ["d", "a", "b"], ["c", "c"], ["a"]]
    for n, keys in enumerate(plan):
        features = commit(sender, f"r{n}", [(k, items[k]) for k in keys])
        sent_without_data = [f.mm_hash for f in features if f.data is None]
        events = receiver.receive(sender.take_stamp(f"r{n}"), features, f"r{n}")
        assert events == [MirrorDelivery(f"r{n}", features, [])]
        assert [f.data for f in features] == [items[k] for k in keys]
        assert receiver._cache.order == sender._cache.order
        if n == 1:
            assert sent_without_data == ["b"]
    assert receiver.resets == 0 and receiver.epoch == sender.epoch
    assert receiver.make_stats().hits == sender.make_stats().hits == 5


def test_swapped_requests_are_applied_in_p0_order() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    deliver(sender, receiver, "r0", [("x", item(5))])
    a = item(30)
    f1 = commit(sender, "r1", [("a", a)])
    f2 = commit(sender, "r2", [("a", a)])  # a hit: sent without data, needs r1 applied first
    s1, s2 = sender.take_stamp("r1"), sender.take_stamp("r2")
    assert f2[0].data is None
    assert receiver.receive(s2, f2, "r2") == []
    assert receiver.pending == 1
    events = receiver.receive(s1, f1, "r1")
    assert [(d.payload, d.missing) for d in deliveries(events)] == [("r1", []), ("r2", [])]
    assert f2[0].data == a and receiver.pending == 0 and receiver.resets == 0


def test_gap_that_never_fills_resets_after_the_timeout() -> None:
    clock = Clock()
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100, gap_timeout_s=2.0, clock=clock)
    a = item(30)
    f1 = commit(sender, "r1", [("a", a)])
    receiver.receive(sender.take_stamp("r1"), f1, "r1")
    commit(sender, "lost", [("b", item(30))])
    sender.take_stamp("lost")
    f3 = commit(sender, "r3", [("a", a), ("c", item(5))])
    assert receiver.receive(sender.take_stamp("r3"), f3, "r3") == []
    clock.now += 1.9
    assert receiver.poll() == []
    clock.now += 0.2
    events = receiver.poll()
    assert events[0] == MirrorReset(sender.epoch)
    # r3 is answered outside the retired mirror: its data-less item is gone with the reset.
    assert [(d.payload, d.missing, d.stale_epoch) for d in deliveries(events)] == [("r3", ["a"], sender.epoch)]
    assert receiver.resets == 1 and receiver.epoch is None and len(receiver._cache) == 0


def test_too_many_early_arrivals_reset() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100, max_pending=2)
    deliver(sender, receiver, "r0", [("a", item(1))])
    commit(sender, "lost", [("a", item(1))])
    sender.take_stamp("lost")
    arrivals = []
    for n in range(2, 5):
        feats = commit(sender, f"r{n}", [("a", item(1))])
        arrivals.append(receiver.receive(sender.take_stamp(f"r{n}"), feats, f"r{n}"))
    assert arrivals[0] == [] and arrivals[1] == [] and receiver.resets == 1
    assert arrivals[2][0] == MirrorReset(sender.epoch)
    assert [(d.payload, d.missing) for d in deliveries(arrivals[2])] == [("r2", ["a"]), ("r3", ["a"]), ("r4", ["a"])]


def test_tampered_digest_resets_and_announces() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    f1 = commit(sender, "r1", [("a", item(30))])
    receiver.receive(sender.take_stamp("r1"), f1, "r1")
    f2 = commit(sender, "r2", [("a", item(30)), ("b", item(30))])
    stamp = sender.take_stamp("r2")
    assert stamp is not None
    bad = MirrorStamp(stamp.epoch, stamp.seq, bytes(16), stamp.invalidated)
    events = receiver.receive(bad, f2, "r2")
    assert events[0] == MirrorReset(sender.epoch)
    # The hit was filled before the walk ended; content under a hash is the same in any epoch.
    assert [(d.payload, d.missing) for d in deliveries(events)] == [("r2", [])]
    assert receiver.epoch is None and len(receiver._cache) == 0


def test_p1_holding_what_p0_evicted_is_drift() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    f1 = commit(sender, "r1", [("a", item(30))])
    receiver.receive(sender.take_stamp("r1"), f1, "r1")
    sender._cache.pop("a")  # P0 lost "a" without telling P1 (what vLLM's drift looks like)
    f2 = commit(sender, "r2", [("a", item(30))])
    assert f2[0].data is not None
    events = receiver.receive(sender.take_stamp("r2"), f2, "r2")
    assert events[0] == MirrorReset(sender.epoch) and deliveries(events)[0].missing == []


def test_p0_believing_p1_holds_a_missing_item_is_drift() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    f1 = commit(sender, "r1", [("a", item(30))])
    receiver.receive(sender.take_stamp("r1"), f1, "r1")
    receiver._cache.pop("a")
    f2 = commit(sender, "r2", [("a", item(30))])
    events = receiver.receive(sender.take_stamp("r2"), f2, "r2")
    assert events[0] == MirrorReset(sender.epoch)
    assert [(d.missing, d.stale_epoch) for d in deliveries(events)] == [(["a"], sender.epoch)]


def test_new_epoch_clears_p1_and_retired_epochs_are_served_outside() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    a = item(30)
    f1 = commit(sender, "r1", [("a", a)])
    receiver.receive(sender.take_stamp("r1"), f1, "r1")
    old_epoch = sender.epoch
    late = commit(sender, "late", [("a", a)])  # still in the old epoch, delivered after the switch
    late_stamp = sender.take_stamp("late")
    sender.clear_cache()
    f2 = commit(sender, "r2", [("b", item(30))])
    events = receiver.receive(sender.take_stamp("r2"), f2, "r2")
    assert events == [MirrorDelivery("r2", f2, [])]  # no reset announced: P0 left the epoch itself
    assert receiver.epoch == sender.epoch and receiver._cache.order == ["b"]
    events = receiver.receive(late_stamp, late, "late")
    assert [(d.missing, d.stale_epoch) for d in deliveries(events)] == [(["a"], old_epoch)]
    assert receiver._cache.order == ["b"] and receiver.resets == 0


def test_fresh_p1_joining_mid_stream_resets_at_once() -> None:
    sender = MirroredSenderCache(100)
    for n in range(3):
        commit(sender, f"r{n}", [("a", item(30))])
        sender.take_stamp(f"r{n}")
    f = commit(sender, "r3", [("a", item(30)), ("b", item(30))])
    events = MirroredReceiverCache(100).receive(sender.take_stamp("r3"), f, "r3")
    assert events[0] == MirrorReset(sender.epoch)
    assert [(d.missing, d.stale_epoch) for d in deliveries(events)] == [(["a"], sender.epoch)]


def test_first_requests_of_a_new_epoch_may_arrive_swapped() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    f0 = commit(sender, "r0", [("x", item(5))])
    receiver.receive(sender.take_stamp("r0"), f0, "r0")
    sender.clear_cache()
    f1 = commit(sender, "r1", [("a", item(30))])
    f2 = commit(sender, "r2", [("a", item(30))])
    s1, s2 = sender.take_stamp("r1"), sender.take_stamp("r2")
    assert receiver.receive(s2, f2, "r2") == []
    events = receiver.receive(s1, f1, "r1")
    assert [(d.payload, d.missing) for d in deliveries(events)] == [("r1", []), ("r2", [])]
    assert receiver.resets == 0 and receiver.epoch == sender.epoch


def test_unstamped_requests_are_served_without_changing_the_cache() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    a, b = item(30, 1), item(30, 2)
    deliver(sender, receiver, "r1", [("a", a), ("b", b)])
    order, stats = receiver._cache.order, receiver.make_stats()
    feats = [MultiModalFeatureSpec(None, "image", "a", PlaceholderRange(0, 1), "a"),
             MultiModalFeatureSpec(item(3), "image", "emb", PlaceholderRange(2, 1), "emb"),
             MultiModalFeatureSpec(None, "image", "gone", PlaceholderRange(4, 1), "gone")]
    events = receiver.receive(None, feats, "emb-request")
    assert [(d.missing, d.stale_epoch) for d in deliveries(events)] == [(["gone"], None)]
    assert feats[0].data == a
    assert receiver._cache.order == order and receiver.make_stats() == stats and "emb" not in receiver._cache


def test_p1_clear_is_announced_on_the_next_poll() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    deliver(sender, receiver, "r1", [("a", item(30))])
    receiver.clear_cache()
    assert receiver.poll() == [MirrorReset(sender.epoch)]
    assert receiver.poll() == []
    f2 = commit(sender, "r2", [("a", item(30))])
    events = receiver.receive(sender.take_stamp("r2"), f2, "r2")
    assert [(d.missing, d.stale_epoch) for d in deliveries(events)] == [(["a"], sender.epoch)]
    with pytest.raises(CacheError, match="gap_timeout_s"):
        MirroredReceiverCache(100, gap_timeout_s=0)


# --- requests committed but never sent ------------------------------------------------------


def test_mirror_only_replay_keeps_both_lrus_identical() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    a, b, c = item(40, 1), item(40, 2), item(50, 3)
    deliver(sender, receiver, "r1", [("a", a), ("b", b)])
    commit(sender, "aborted", [("b", b), ("c", c), ("huge", item(101))])  # c evicts a
    taken = sender.take_mirror_only("aborted")
    assert taken is not None
    stamp, message = taken
    assert message == MirrorOnly([MirrorOp("H", "b"), MirrorOp("N", "c", 50), MirrorOp("O", "huge")])
    assert not sender.is_cached_item("c")  # P1 never gets c's data: P0 forgets it
    assert receiver.receive_mirror_only(stamp, message) == []
    assert "a" not in receiver._cache and "c" in receiver._cache
    f3 = commit(sender, "r3", [("c", c), ("b", b)])
    s3 = sender.take_stamp("r3")
    assert s3 is not None and s3.invalidated == ("c",) and f3[0].data is not None
    assert deliveries(receiver.receive(s3, f3, "r3")) == [MirrorDelivery("r3", f3, [])]
    assert receiver._cache.order == sender._cache.order and receiver.resets == 0
    assert [f.data for f in f3] == [c, b]


def test_hit_on_a_replayed_insert_is_a_miss_not_drift() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    c = item(30)
    commit(sender, "aborted", [("c", c)])
    f2 = commit(sender, "r2", [("c", c)])  # committed before the abort was known: a hit
    taken = sender.take_mirror_only("aborted")
    assert taken is not None
    receiver.receive_mirror_only(*taken)
    events = receiver.receive(sender.take_stamp("r2"), f2, "r2")
    assert [(d.missing, d.stale_epoch) for d in deliveries(events)] == [(["c"], None)]
    assert receiver.resets == 0
    # The plain per-item path treats the data-less placeholder as absent.
    with pytest.raises(MultiModalCacheMissError):
        receiver.get_and_update_item(None, "c")


# --- property: the mirror holds under any request sequence -----------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 11), st.booleans()), min_size=0, max_size=5), max_size=40),
       st.integers(1, 3))
def test_mirror_never_drifts_and_always_fills(requests: list[list[tuple[int, bool]]], cap_items: int) -> None:
    sizes = [3 + (k * 7) % 23 for k in range(12)]
    items = [item(s, k) for k, s in enumerate(sizes)]
    capacity = cap_items * 20
    sender, receiver = MirroredSenderCache(capacity), MirroredReceiverCache(capacity)
    replayed: set[str] = set()  # placeholders P1 drops with the next stamp
    for n, request in enumerate(requests):
        keys = [(f"k{k}", items[k]) for k, _ in request]
        if not keys:
            continue
        features = commit(sender, f"r{n}", keys)
        if request[0][1] and n % 3 == 0:
            taken = sender.take_mirror_only(f"r{n}")
            assert taken is not None
            assert receiver.receive_mirror_only(*taken) == []
            replayed |= {op.mm_hash for op in taken[1].ops if op.kind == "N"}
        else:
            events = receiver.receive(sender.take_stamp(f"r{n}"), features, f"r{n}")
            assert events == [MirrorDelivery(f"r{n}", features, [])]
            assert [f.data for f in features] == [it for _, it in keys]
            replayed.clear()
        assert [k for k in receiver._cache.order if k not in replayed] == sender._cache.order
    assert receiver.resets == 0


def test_p0_and_p1_of_different_capacities_disagree_at_once() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(200)
    events = deliver(sender, receiver, "r1", [("a", item(10))])
    assert events[0] == MirrorReset(sender.epoch) and deliveries(events)[0].missing == []


def test_new_epoch_whose_first_request_never_arrives_is_reset_after_the_timeout() -> None:
    clock = Clock()
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100, gap_timeout_s=1.0, clock=clock)
    deliver(sender, receiver, "r0", [("a", item(30))])
    old = sender.epoch
    sender.clear_cache()
    commit(sender, "lost", [("b", item(30))])
    sender.take_stamp("lost")
    f2 = commit(sender, "r2", [("b", item(30))])
    assert receiver.receive(sender.take_stamp("r2"), f2, "r2") == []
    assert receiver.epoch == old and receiver.pending == 1
    clock.now += 1.0
    events = receiver.poll()
    assert events[0] == MirrorReset(sender.epoch)
    assert [(d.missing, d.stale_epoch) for d in deliveries(events)] == [(["b"], sender.epoch)]
    assert receiver.epoch == old  # the epoch P1 follows is untouched; P0 starts another one


def test_duplicates_are_served_without_being_applied_twice() -> None:
    sender, receiver = MirroredSenderCache(100), MirroredReceiverCache(100)
    f1 = commit(sender, "r1", [("a", item(30))])
    s1 = sender.take_stamp("r1")
    receiver.receive(s1, f1, "r1")
    again = [MultiModalFeatureSpec(None, "image", "a", PlaceholderRange(0, 4), "a")]
    events = receiver.receive(s1, again, "r1-again")
    assert [(d.payload, d.missing, d.stale_epoch) for d in deliveries(events)] == [("r1-again", [], None)]
    assert receiver.resets == 0 and receiver.make_stats().total == 0  # served by peeking
