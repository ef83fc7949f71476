"""Issue 13, class 11: drift under faults never reaches the caller.

A P1 restart plus reordered delivery used to fail requests (5 of 120 in one seeded run): a fresh
P1 reset at every new epoch whose first arrival was not seq 1, and a request that missed twice
failed. Now a fresh P1 resets once, then follows the epoch P0 starts even if its first request
is overtaken; and a resend carries every item of its request, which P1 admits in any state.

Everything runs in one process: P0's ``EngineClient`` and P1's ``EngineReceiver`` exchange
envelopes through two queues that a fault schedule delivers, reorders, duplicates or drops,
while P1 is reset or replaced; P1's clock is a number the schedule advances.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfront import MultiModalConfig
from mmfront.cache.mirror import MirrorDelivery, MirroredReceiverCache, MirroredSenderCache
from mmfront.engine.client import EngineClient, RequestAdmitted, RequestFailed
from mmfront.engine.receiver import EngineReceiver
from mmfront.engine.transports import BaseTransport
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import make_audio, make_image
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.messages import ENGINE_HELLO, RESET_CACHE, EngineHello, MirrorReset, MirrorStamp, encode_envelope
from mmfront.wire.structs import EngineCoreRequest
from toy_models import toy

GiB = 1 << 30
CAPACITY = 40  # five toy images of 8 bytes: small enough to evict all the time
ENC = MsgpackEncoder()
IMAGES = [make_image(4 + i, 3 + i % 2, seed=i) for i in range(6)]
AUDIOS = [make_audio(0.0005 * (i + 1), seed=i) for i in range(4)]
CONFIG = MultiModalConfig(mm_processor_cache_gb=CAPACITY / GiB)
TOY = toy(CONFIG)  # stateless apart from its call log: shared, while each run gets a fresh cache


def template(rng: random.Random) -> tuple[str, dict[str, list[Any]]]:
    """A prompt interleaving 1-4 image and audio items from small pools (repeats included)."""
    words, data = [], {}  # type: ignore[var-annotated]
    for n in range(rng.randint(1, 4)):
        modality = rng.choice(["image", "audio"])
        data.setdefault(modality, []).append(rng.choice(IMAGES if modality == "image" else AUDIOS))
        words.append(f"w{n} {'<img>' if modality == 'image' else '<aud>'}")
    return " ".join(words) + " end", data


_rng = random.Random(13)
TEMPLATES = [template(_rng) for _ in range(16)]
_baseline = InputProcessor(InputPreprocessor("toy", MultiModalConfig(mm_processor_cache_gb=0), processor=TOY))
EXPECTED = [_baseline.process_inputs(f"t{i}", prompt, mm_data=data) for i, (prompt, data) in enumerate(TEMPLATES)]
"""Each template's request preprocessed with the cache disabled: what P1 must hand the engine."""


class Link(BaseTransport):
    """P0's client and P1's receiver, with everything in transit held in two queues."""

    def __init__(self) -> None:
        self.to_p1: list[list[Any]] = []
        self.to_p0: list[list[Any]] = []
        self.now = 0.0
        self.engine_epoch = 0
        self.p1 = self._start_p1()
        self.client = EngineClient(InputProcessor(InputPreprocessor("toy", CONFIG, processor=TOY)), self)
        self.template_of: dict[str, int] = {}
        self.admitted: dict[str, EngineCoreRequest] = {}
        self.failed: list[RequestFailed] = []
        self.reply(1)  # P0 knows the engine before it sends anything

    # BaseTransport: what P0 sends waits in to_p1
    def send(self, frames: Sequence[Any]) -> None:
        self.to_p1.append(list(frames))

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        return None

    def close(self) -> None:
        self.to_p1.clear()

    def _start_p1(self) -> EngineReceiver:
        """A new, empty P1; its greeting tells P0 (in order with the replies) that it restarted."""
        self.engine_epoch += 1
        self.to_p0.append(encode_envelope(ENGINE_HELLO, ENC.encode(EngineHello(0, self.engine_epoch))))
        return EngineReceiver(MirroredReceiverCache(CAPACITY, clock=lambda: self.now), echo=True)

    @property
    def resets(self) -> int:
        cache = self.p1.cache
        assert isinstance(cache, MirroredReceiverCache)
        return cache.resets

    # --- the schedule's moves ------------------------------------------------------------------

    def add(self, request_id: str, index: int) -> None:
        self.template_of[request_id] = index
        prompt, data = TEMPLATES[index]
        self.client.add_request(request_id, prompt, mm_data=data)

    def deliver(self, count: int) -> None:
        for _ in range(min(count, len(self.to_p1))):
            self.to_p0 += self.p1.handle(self.to_p1.pop(0))[1]

    def reply(self, count: int) -> None:
        for _ in range(min(count, len(self.to_p0))):
            for event in self.client.handle_reply(self.to_p0.pop(0)):
                if isinstance(event, RequestFailed):
                    self.failed.append(event)
                else:
                    assert isinstance(event, RequestAdmitted) and event.request is not None
                    assert event.request_id not in self.admitted, f"{event.request_id} admitted twice"
                    self.admitted[event.request_id] = event.request

    def swap(self, i: int, j: int) -> None:
        if self.to_p1:
            i, j = i % len(self.to_p1), j % len(self.to_p1)
            self.to_p1[i], self.to_p1[j] = self.to_p1[j], self.to_p1[i]

    def duplicate(self, i: int) -> None:
        if self.to_p1:
            i %= len(self.to_p1)
            self.to_p1.insert(i + 1, list(self.to_p1[i]))

    def reset(self) -> None:
        """P1's cache is cleared (reset_mm_cache, sleep)."""
        self.to_p0 += self.p1.handle(encode_envelope(RESET_CACHE, ENC.encode(None)))[1]

    def restart(self, lose_in_transit: bool) -> None:
        """P1 is replaced by an empty one; what was in transit either way may be lost."""
        if lose_in_transit:
            self.to_p1.clear()
            self.to_p0.clear()
        self.p1 = self._start_p1()

    def tick(self) -> None:
        """Time passes: gaps older than P1's gap timeout reset."""
        self.now += 10.0
        self.to_p0 += self.p1.poll()[1]

    def settle(self) -> None:
        """Deliver everything, letting time pass while nothing arrives, until P0 waits for nothing."""
        for _ in range(20):
            if not (self.client.in_flight or self.to_p1 or self.to_p0):
                break
            self.deliver(len(self.to_p1))
            self.reply(len(self.to_p0))
            if not self.to_p0 and self.client.in_flight:
                self.tick()
        assert not self.client.in_flight, f"requests lost: {self.client.in_flight}"

    def check(self) -> None:
        """No failure, every request admitted once, with what the uncached run hands the engine."""
        self.settle()
        assert self.failed == [], [f"{f.request_id}: {f.error}" for f in self.failed]
        assert set(self.admitted) == set(self.template_of)
        for request_id, index in self.template_of.items():
            got, want = self.admitted[request_id], EXPECTED[index]
            assert got.prompt_token_ids == want.prompt_token_ids, request_id
            assert got.mm_features is not None and want.mm_features is not None
            assert [(f.modality, f.mm_hash, f.mm_position) for f in got.mm_features] == \
                   [(f.modality, f.mm_hash, f.mm_position) for f in want.mm_features], request_id
            for g, w in zip(got.mm_features, want.mm_features):
                assert g.data is not None and g.data == w.data, f"{request_id}: item {g.mm_hash} differs"


# --- P1 alone -------------------------------------------------------------------------------------


def _item(value: int) -> MultiModalKwargsItem:
    return MultiModalKwargsItem({"x": MultiModalFieldElem(torch.full((4,), value, dtype=torch.uint8),
                                                          MultiModalBatchedField())})


def commit(sender: MirroredSenderCache, request_id: str, keys: Sequence[str]) -> tuple[MirrorStamp, list[Any]]:
    """One request committed on P0 as the processor does it: its stamp and its features."""
    sender.begin_request(request_id)
    for key in keys:
        sender.touch_sender_cache_item(key)
    features = []
    for pos, key in enumerate(keys):
        data, _ = sender.get_and_update_item(None if sender.is_cached_item(key) else (_item(ord(key)), []), key)
        features.append(MultiModalFeatureSpec(data, "image", key, PlaceholderRange(pos * 8, 4), key))
    sender.release_sender_touches()
    stamp = sender.take_stamp(request_id)
    assert stamp is not None
    return stamp, features


def test_a_fresh_p1_resets_once_then_waits_for_the_new_epochs_overtaken_first_request() -> None:
    p0, p1 = MirroredSenderCache(64), MirroredReceiverCache(64)
    commit(p0, "before", ["a"])  # went to the P1 that died
    stamp, features = commit(p0, "mid", ["a", "b"])
    events = p1.receive(stamp, features, "mid")
    assert events[0] == MirrorReset(p0.epoch) and p1.resets == 1
    assert isinstance(events[1], MirrorDelivery) and events[1].missing == ["a"] and events[1].stale_epoch == p0.epoch
    stamp, features = commit(p0, "late", ["b"])  # still the old epoch: served outside, no second reset
    assert [type(e) for e in p1.receive(stamp, features, "late")] == [MirrorDelivery] and p1.resets == 1

    p0.clear_cache()  # P0 follows the reset: a new epoch
    first, second = commit(p0, "n1", ["c", "d"]), commit(p0, "n2", ["c", "e"])
    assert first[0].seq == 1 and second[0].seq == 2 and second[1][0].data is None  # n2 needs n1's "c"
    assert p1.receive(second[0], second[1], "n2") == [] and p1.pending == 1  # overtaken: waited for
    events = p1.receive(first[0], first[1], "n1")
    assert [(e.payload, e.missing) for e in events] == [("n1", []), ("n2", [])]  # type: ignore[union-attr]
    assert p1.resets == 1 and p1.epoch == p0.epoch and p1.pending == 0
    assert events[1].features[0].data == _item(ord("c"))  # type: ignore[union-attr]


def test_a_request_carrying_an_item_twice_is_filled_from_itself_outside_the_mirror() -> None:
    p0, p1 = MirroredSenderCache(64), MirroredReceiverCache(64)
    commit(p0, "lost", ["z"])
    stamp, features = commit(p0, "twice", ["a", "a"])  # the second "a" is a hit: no data
    assert features[0].data is not None and features[1].data is None
    events = p1.receive(stamp, features, "twice")  # a fresh P1 serves it outside the mirror
    delivery = events[-1]
    assert isinstance(delivery, MirrorDelivery) and delivery.stale_epoch == p0.epoch
    assert delivery.missing == [] and delivery.features[1].data == _item(ord("a"))


# --- P0 and P1 ------------------------------------------------------------------------------------


def test_restart_then_the_resend_overtaken_by_the_new_epochs_first_request() -> None:
    """The issue's failure, step by step: one restart, one reordering, zero failures."""
    link = Link()
    x, z = IMAGES[0], IMAGES[1]
    link.client.add_request("warm", "a <img>", mm_data={"image": [x]})
    link.deliver(1)
    link.reply(1)
    link.to_p0.clear()
    link.p1 = EngineReceiver(MirroredReceiverCache(CAPACITY, clock=lambda: link.now), echo=True)  # not told
    link.client.add_request("r1", "a <img> b <img>", mm_data={"image": [x, z]})  # x a hit, z with data
    link.deliver(1)  # the fresh P1: MirrorReset(E), CacheMiss(r1, [x], stale E)
    assert link.resets == 1 and len(link.to_p0) == 2
    link.reply(1)  # P0 clears its shadow: epoch E'
    link.client.add_request("r2", "c <img>", mm_data={"image": [z]})  # E' #1 inserts z
    link.reply(1)  # r1 resent as E' #2, with every item (z too, although P0's shadow holds it)
    assert len(link.to_p1) == 2 and link.client.stats.resends == 1
    link.swap(0, 1)  # E' #2 overtakes E' #1
    link.deliver(2)
    link.reply(len(link.to_p0))
    assert link.resets == 1 and link.failed == [] and link.client.in_flight == []
    assert set(link.admitted) == {"warm", "r1", "r2"}
    assert [f.data is not None for f in link.admitted["r1"].mm_features or []] == [True, True]


def test_a_resend_caught_by_a_second_reset_is_still_admitted() -> None:
    """Two faults on one request: it missed once, then P1 reset again before its resend arrived."""
    link = Link()
    a, b = IMAGES[2], IMAGES[3]
    link.client.add_request("warm", "a <img>", mm_data={"image": [a]})
    link.settle()
    link.client.add_request("r", "a <img> b <img>", mm_data={"image": [a, b]})  # a a hit, b with data
    link.reset()  # P1 cleared: MirrorReset(E)
    link.deliver(1)  # CacheMiss(r, [a], stale E)
    link.reply(1)  # P0 clears its shadow: epoch E'
    link.client.add_request("s", "c <img>", mm_data={"image": [b]})  # E' #1 inserts b
    link.reply(1)  # r resent as E' #2, with b too although P0's shadow holds it
    link.deliver(1)  # P1 follows E'
    link.reset()  # and is cleared again before r's resend arrives: it is served outside the mirror
    link.deliver(1)
    link.reply(len(link.to_p0))
    assert link.failed == [] and set(link.admitted) == {"warm", "r", "s"}
    assert link.resets == 2 and link.client.stats.resends == 1


def test_seeded_restarts_and_reordering_never_fail() -> None:
    """The issue's seeded run: 120 requests, P1 restarts and reordered delivery."""
    link = Link()
    rng = random.Random(120)
    for n in range(120):
        link.add(f"r{n}", rng.randrange(len(TEMPLATES)))
        roll = rng.random()
        if roll < 0.15:
            link.swap(-1, -2)
        elif roll < 0.19:
            link.restart(lose_in_transit=rng.random() < 0.5)
        if rng.random() < 0.4:
            link.deliver(rng.randint(1, 4))
        if rng.random() < 0.4:
            link.reply(rng.randint(1, 4))
    link.check()
    stats = link.client.stats
    assert stats.engine_restarts >= 3 and stats.resends > 0 and stats.failures == 0


def test_duplicated_requests_are_admitted_once() -> None:
    link = Link()
    for n in range(12):
        link.add(f"r{n}", n % len(TEMPLATES))
        link.duplicate(-1)
        if n % 3 == 2:
            link.swap(0, -1)
            link.deliver(3)
            link.reply(3)
    link.check()


# --- any mix of faults ----------------------------------------------------------------------------

MOVES = st.one_of(
    st.tuples(st.just("deliver"), st.integers(1, 4)),
    st.tuples(st.just("reply"), st.integers(1, 4)),
    st.tuples(st.just("swap"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("duplicate"), st.integers(0, 7)),
    st.tuples(st.just("reset")),
    st.tuples(st.just("restart"), st.booleans()),
    st.tuples(st.just("tick")),
)
SCHEDULES = st.lists(st.tuples(st.integers(0, len(TEMPLATES) - 1), st.lists(MOVES, max_size=3)),
                     min_size=1, max_size=16)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEDULES)
def test_no_mix_of_restart_reorder_duplicate_and_reset_fails_a_request(schedule: list[Any]) -> None:
    link = Link()
    for n, (index, moves) in enumerate(schedule):
        link.add(f"r{n}", index)
        for name, *args in moves:
            getattr(link, name)(*args)
    link.check()
