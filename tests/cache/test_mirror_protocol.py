"""The mirror interfaces every cache answers: the mirrored halves answer them themselves, every
other cache (and no cache at all) through the null halves of ``mmfront.cache.base``."""

from __future__ import annotations

import pytest

from mmfront.cache import (
    LruKeyReplicatedReceiverCache,
    LruKeyReplicatedSenderCache,
    MirroredReceiverCache,
    MirroredSenderCache,
    MultiModalProcessorOnlyCache,
)
from mmfront.cache.base import (
    MirrorDelivery,
    NullReceiverMirror,
    NullSenderMirror,
    ReceiverMirror,
    SenderMirror,
)
from mmfront.cache.mirror import OpLog, chain_digest, initial_digest
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from mmfront.wire.messages import MirrorOnly, MirrorOp, MirrorOpKind, MirrorStamp


def feature(key: str, data: MultiModalKwargsItem | None, offset: int = 0) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(data, "image", key, PlaceholderRange(offset, 2), key)


@pytest.mark.parametrize("cache", [MultiModalProcessorOnlyCache(100), LruKeyReplicatedSenderCache(100)])
def test_a_plain_p0_cache_answers_through_the_null_mirror(cache: LruKeyReplicatedSenderCache) -> None:
    mirror = cache.mirror
    assert isinstance(mirror, NullSenderMirror)
    assert mirror.epoch is None
    cache.begin_request("r")
    cache.get_and_update_item((MultiModalKwargsItem.dummy(10), []), "a")
    cache.release_sender_touches()
    assert mirror.take_stamp("r", keep=True) is None and mirror.take_stamp("r") is None
    assert mirror.take_mirror_only("r") is None


def test_the_mirrored_p0_cache_is_its_own_mirror() -> None:
    cache = MirroredSenderCache(100)
    assert cache.mirror is cache and isinstance(cache.mirror, SenderMirror)
    assert cache.mirror.epoch == cache.epoch


def test_a_plain_p1_cache_serves_at_once_through_the_null_mirror() -> None:
    cache = LruKeyReplicatedReceiverCache(100)
    mirror = cache.mirror
    assert isinstance(mirror, NullReceiverMirror)
    item = MultiModalKwargsItem.dummy(10)
    stamp = MirrorStamp(1, 1, bytes(16))  # ignored: nothing here is mirrored
    sent = [feature("a", item)]
    assert mirror.receive(stamp, sent, "r1") == [MirrorDelivery("r1", sent, [])]
    again = [feature("a", None), feature("b", None, 4)]
    (delivery,) = mirror.receive(None, again, "r2")
    assert delivery.missing == ["b"] and again[0].data is item
    assert mirror.receive_mirror_only(stamp, MirrorOnly([MirrorOp(MirrorOpKind.HIT, "a")])) == []
    assert mirror.poll() == []


def test_no_p1_cache_needs_every_item_with_its_data() -> None:
    mirror = NullReceiverMirror(None)
    with_data = [feature("a", MultiModalKwargsItem.dummy(10))]
    assert mirror.receive(None, with_data, "r") == [MirrorDelivery("r", with_data, [])]
    (delivery,) = mirror.receive(None, [feature("a", None), feature("b", None, 4)], "s")
    assert delivery.missing == ["a", "b"]
    assert mirror.receive(None, [], "text") == [MirrorDelivery("text", [], [])]


def test_per_item_use_of_a_stamped_p1_cache_is_drift_that_resets() -> None:
    """The per-item methods are the unstamped LRU mirror; used on a cache that follows stamps,
    they change it outside P0's log, which the next digest catches."""
    sender, receiver = MirroredSenderCache(30), MirroredReceiverCache(30)
    assert receiver.mirror is receiver and isinstance(receiver.mirror, ReceiverMirror)
    items = {k: MultiModalKwargsItem.dummy(10) for k in "abcd"}

    def send(request_id: str, keys: str) -> list[MirrorDelivery]:
        sender.begin_request(request_id)
        features = []
        for offset, key in enumerate(keys):
            cached = sender.is_cached_item(key)
            data = sender.get_and_update_item(None if cached else (items[key], []), key)[0]
            features.append(feature(key, data, 4 * offset))
        sender.release_sender_touches()
        return [e for e in receiver.receive(sender.take_stamp(request_id), features, request_id)
                if isinstance(e, MirrorDelivery)]

    assert [d.missing for d in send("r1", "abc")] == [[]]
    receiver.get_and_update_item(None, "a")  # outside the mirror: "a" becomes P1's newest
    assert receiver.resets == 0
    send("r2", "d")  # P0 evicts "a", P1 evicts "b": the digests disagree
    assert receiver.resets == 1 and receiver.epoch is None


def test_the_op_log_is_what_the_digest_chain_hashes() -> None:
    log = OpLog()
    assert not log
    log.insert("a", 10, [])
    log.hit("a")
    log.insert("b", 20, ["a"])
    log.oversize("big")
    assert log.ops == ["N", "a", "H", "a", "N", "b", "E", "a", "O", "big"] and log.sizes == [10, 20]
    start = initial_digest(3, 100)
    assert log.digest(start, ("z",)) == chain_digest(start, ("z",), log.ops)
    assert log.mirror_ops() == [MirrorOp(MirrorOpKind.INSERT, "a", 10), MirrorOp(MirrorOpKind.HIT, "a"),
                                MirrorOp(MirrorOpKind.INSERT, "b", 20), MirrorOp(MirrorOpKind.OVERSIZE, "big")]
