"""10,000 random requests over a small mirrored cache, with and without faults, at the cache level.

P0 is a ``MirroredSenderCache`` driven the way ``BaseMultiModalProcessor.apply`` drives it, P1 a
``MirroredReceiverCache``; between them a transit queue that delivers in batches. The loop plays
the client's part (``EngineClient`` is tested end to end in test_drift.py): resend once on a
miss, clear the shadow on a reset. The uncached run of a request is its items themselves.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from mmfront.cache.mirror import MirrorDelivery, MirroredReceiverCache, MirroredSenderCache
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.wire.messages import MirrorReset

CAPACITY = 256
N_REQUESTS = 10_000


def item(nbytes: int, value: int) -> MultiModalKwargsItem:
    data = torch.full((nbytes,), value % 256, dtype=torch.uint8)
    return MultiModalKwargsItem({"x": MultiModalFieldElem(data, MultiModalBatchedField())})


@dataclass
class Run:
    rng: random.Random
    faults: bool
    pool: list[tuple[str, MultiModalKwargsItem]]
    sender: MirroredSenderCache = field(default_factory=lambda: MirroredSenderCache(CAPACITY))
    receiver: MirroredReceiverCache = field(default_factory=lambda: MirroredReceiverCache(CAPACITY))
    transit: list[tuple[Any, ...]] = field(default_factory=list)
    requests: dict[str, list[int]] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    admitted: set[str] = field(default_factory=set)
    resent: set[str] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)

    def submit(self, rid: str) -> None:
        """Preprocess and send: commit in placeholder order, then the request or its mirror ops."""
        sender = self.sender
        keys = [self.pool[k] for k in self.requests[rid]]
        sender.begin_request(rid)
        for h, _ in keys:
            sender.touch_sender_cache_item(h)
        features = []
        for pos, (h, it) in enumerate(keys):
            out, _ = sender.get_and_update_item(None if sender.is_cached_item(h) else (it, ["u"]), h)
            features.append(MultiModalFeatureSpec(out, "image", h, PlaceholderRange(pos * 8, 4), h))
            self.counts["sent without data"] += out is None
        sender.release_sender_touches()
        if rid in self.rejected:  # failed a request-level check after its commit
            taken = sender.take_mirror_only(rid)
            assert taken is not None
            self.transit.append(("mirror-only", *taken))
        else:
            self.transit.append(("request", sender.take_stamp(rid), features, rid))

    def deliver(self, count: int) -> None:
        for _ in range(min(count, len(self.transit))):
            kind, stamp, body, *rest = self.transit.pop(0)
            if kind == "request":
                self.handle(self.receiver.receive(stamp, body, rest[0]))
            else:
                self.handle(self.receiver.receive_mirror_only(stamp, body))
        self.handle(self.receiver.poll())

    def handle(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, MirrorReset):
                if event.epoch == self.sender.epoch:
                    self.sender.clear_cache()
                    self.counts["shadow resets"] += 1
                continue
            assert isinstance(event, MirrorDelivery)
            rid = event.payload
            if event.missing:
                assert rid not in self.resent, f"{rid} missed twice: the caller would see an error"
                self.resent.add(rid)
                self.counts["resends"] += 1
                if event.stale_epoch == self.sender.epoch:
                    self.sender.clear_cache()
                for h in event.missing:
                    self.sender.invalidate(h)
                self.submit(rid)
                continue
            assert rid not in self.admitted, f"{rid} admitted twice"
            self.admitted.add(rid)
            want = [self.pool[k][1] for k in self.requests[rid]]
            assert [f.data for f in event.features] == want, f"{rid}: P1 handed other data than the uncached run"

    def fault(self) -> None:
        roll = self.rng.random()
        if roll < 0.3:
            self.receiver.clear_cache()
            self.handle(self.receiver.poll())
            self.counts["clears"] += 1
        elif roll < 0.6:  # P1 replaced behind a transparent link: messages in transit reach the new one
            self.receiver = MirroredReceiverCache(CAPACITY)
            self.counts["restarts"] += 1
        else:  # P1 replaced, and what was in transit is lost: the client is told and resends
            self.receiver = MirroredReceiverCache(CAPACITY)
            self.transit.clear()
            self.sender.clear_cache()
            for rid in self.requests:
                if rid not in self.admitted and rid not in self.rejected:
                    self.submit(rid)
            self.counts["restarts losing messages"] += 1

    def play(self) -> None:
        rng = self.rng
        for n in range(N_REQUESTS):
            rid = f"r{n}"
            self.requests[rid] = [rng.randrange(len(self.pool)) for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.02:
                self.rejected.add(rid)
            self.submit(rid)
            if len(self.transit) >= 2 and rng.random() < 0.05:
                self.transit[-1], self.transit[-2] = self.transit[-2], self.transit[-1]
                self.counts["swaps"] += 1
            if self.faults and rng.random() < 0.004 and self.resent <= self.admitted:
                self.fault()
            if rng.random() < 0.3:
                self.deliver(rng.randint(1, 6))
        while self.transit:
            self.deliver(len(self.transit))


@pytest.mark.parametrize("faults", [False, True], ids=["reordered+aborted", "with-p1-faults"])
def test_ten_thousand_random_requests_match_the_uncached_run(faults: bool) -> None:
    rng = random.Random(20240 + faults)
    sizes = [rng.randint(1, 48) for _ in range(58)] + [CAPACITY + 1, 3 * CAPACITY]  # two never fit
    run = Run(rng, faults, [(f"h{k:02d}", item(size, k)) for k, size in enumerate(sizes)])
    run.play()

    served = set(run.requests) - run.rejected
    assert run.admitted == served  # zero lost
    assert run.receiver.pending == 0
    assert run.counts["swaps"] > 300 and len(run.rejected) > 100 and run.counts["sent without data"] > 3000
    if faults:
        assert run.counts["clears"] + run.counts["restarts"] + run.counts["restarts losing messages"] >= 20
        assert run.counts["resends"] > 0 and run.counts["shadow resets"] > 0
    else:
        # Reordering and aborted requests never cost a resend or a reset: the mirror holds exactly.
        assert run.counts["resends"] == 0 and run.counts["shadow resets"] == 0 and run.receiver.resets == 0
