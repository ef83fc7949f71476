"""Fault injection on the P0 -> P1 hop: no drift, and no drift reaches the caller.

P1 runs in a child process (``serve_pipe`` with echo, so the test sees exactly what the engine
got); a fault-injecting link in front of it swaps messages, clears P1's cache, or kills P1 and
starts an empty one. Every scenario checks: every request is admitted (none lost), the caller
sees no error, and the features P1 hands to the engine equal, item by item, those of the same
requests preprocessed with the cache disabled.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import preloaded
from mmfront import MultiModalConfig
from mmfront.engine.client import EngineClient, RequestAdmitted, RequestFailed
from mmfront.engine.receiver import serve_pipe
from mmfront.engine.transports import BaseTransport, PipeTransport
from mmfront.errors import EncodeError, ValidationError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import make_audio, make_image
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.messages import RESET_CACHE, encode_envelope
from mmfront.wire.structs import EngineCoreRequest
from toy_models import toy

GiB = 1 << 30
IMAGE_BYTES, AUDIO_BYTES = 8, 4  # the toy processor's item sizes
CTX = preloaded.CONTEXT


class P1(BaseTransport):
    """P1 in a child process, behind a link that can swap, clear and restart."""

    def __init__(self, config: MultiModalConfig) -> None:
        self.config = config
        self.swap_armed = False
        self.held: list[Any] | None = None
        self.started = 0
        self._start()

    def _start(self) -> None:
        parent, child = CTX.Pipe()
        self.proc = CTX.Process(target=serve_pipe, args=(child, self.config), kwargs={"echo": True}, daemon=True)
        self.proc.start()
        child.close()
        self.link = PipeTransport(parent)
        self.started += 1

    def send(self, frames: Sequence[Any]) -> None:
        frames = list(frames)
        if self.swap_armed and self.held is None:
            self.swap_armed, self.held = False, frames
            return
        self.link.send(frames)
        if self.held is not None:
            held, self.held = self.held, None
            self.link.send(held)

    def swap_next_two(self) -> None:
        """Deliver the next message after the one that follows it."""
        self.swap_armed = True

    def flush(self) -> None:
        """Deliver a held message that found nothing to swap with."""
        self.swap_armed = False
        if self.held is not None:
            held, self.held = self.held, None
            self.link.send(held)

    def clear_cache(self) -> None:
        self.link.send(encode_envelope(RESET_CACHE, MsgpackEncoder().encode(None)))

    def restart(self) -> None:
        """Kill P1 (whatever it had not answered is lost) and start an empty one."""
        self.proc.kill()
        self.proc.join(5)
        self.link.close()
        self._start()

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        return self.link.recv(timeout)

    def close(self) -> None:
        self.link.close()  # EOF: serve_pipe returns
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


@pytest.fixture
def p1_factory() -> Iterator[Any]:
    made: list[P1] = []

    def make(config: MultiModalConfig) -> P1:
        p1 = P1(config)
        made.append(p1)
        return p1

    yield make
    for p1 in made:
        p1.close()
        assert p1.proc.exitcode is not None


def cache_config(capacity_bytes: int, **kwargs: Any) -> MultiModalConfig:
    return MultiModalConfig(mm_processor_cache_gb=capacity_bytes / GiB, **kwargs)


def toy_processor(config: MultiModalConfig) -> InputProcessor:
    return InputProcessor(InputPreprocessor("toy", config, processor=toy(config)))


class Harness:
    """One P0 (client over the mirrored cache) and its cache-disabled twin."""

    def __init__(self, processor: InputProcessor, baseline: InputProcessor, p1: P1) -> None:
        self.p1 = p1
        self.client = EngineClient(processor, p1)
        self.baseline = baseline
        self.expected: dict[str, EngineCoreRequest] = {}
        self.admitted: dict[str, EngineCoreRequest] = {}

    def add(self, request_id: str, prompt: Any, mm_data: dict[str, Any] | None = None) -> None:
        self.expected[request_id] = self.baseline.process_inputs(request_id, prompt, mm_data=mm_data)
        self.client.add_request(request_id, prompt, mm_data=mm_data)

    def pump(self, timeout: float = 20.0) -> None:
        """Handle replies until every request sent so far is admitted."""
        self.p1.flush()
        deadline = time.monotonic() + timeout
        while self.client.in_flight:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"requests lost: {self.client.in_flight}"
            reply = self.p1.link.recv(min(remaining, 0.5))
            if reply is not None:
                for event in self.client.handle_reply(reply):
                    assert not isinstance(event, RequestFailed), f"caller saw an error: {event.error}"
                    assert isinstance(event, RequestAdmitted) and event.request is not None
                    assert event.request_id not in self.admitted, "admitted twice"
                    self.admitted[event.request_id] = event.request

    def check(self) -> None:
        self.pump()
        assert set(self.admitted) == set(self.expected)
        for request_id, want in self.expected.items():
            got = self.admitted[request_id]
            assert got.prompt_token_ids == want.prompt_token_ids, request_id
            assert want.mm_features is not None and got.mm_features is not None
            assert len(got.mm_features) == len(want.mm_features)
            for g, w in zip(got.mm_features, want.mm_features):
                assert (g.modality, g.mm_hash, g.identifier, g.mm_position) == \
                       (w.modality, w.mm_hash, w.identifier, w.mm_position), request_id
                assert g.data is not None and g.data == w.data, f"{request_id}: item {g.mm_hash} differs"


def toy_harness(p1_factory: Any, capacity: int, **kwargs: Any) -> Harness:
    config = cache_config(capacity, **kwargs)
    return Harness(toy_processor(config), toy_processor(MultiModalConfig(mm_processor_cache_gb=0, **kwargs)),
                   p1_factory(config))


IMAGES = [make_image(4 + i, 3 + i % 2, seed=i) for i in range(8)]
AUDIOS = [make_audio(0.0005 * (i + 1), seed=i) for i in range(6)]


def random_request(rng: random.Random) -> tuple[str, dict[str, list[Any]]]:
    """A prompt that interleaves 1-5 image and audio items drawn from small pools."""
    slots = [rng.choice(["image", "audio"]) for _ in range(rng.randint(1, 5))]
    if slots.count("audio") > 4:
        slots = ["image" if s == "audio" else s for s in slots]
    data: dict[str, list[Any]] = {}
    words = []
    for n, slot in enumerate(slots):
        pool = IMAGES if slot == "image" else AUDIOS
        data.setdefault(slot, []).append(rng.choice(pool))
        words.append(f"w{n} {'<img>' if slot == 'image' else '<aud>'}")
    return " ".join(words) + " end", data


# --- the scenarios ------------------------------------------------------------------------------


def test_interleaved_image_audio_items_never_drift(p1_factory: Any) -> None:
    h = toy_harness(p1_factory, capacity=5 * IMAGE_BYTES)
    rng = random.Random(0)
    for n in range(80):
        h.add(f"r{n}", *random_request(rng))
        if n % 10 == 9:
            h.pump()
    h.check()
    stats = h.client.stats
    assert stats.resends == 0 and stats.shadow_resets == 0  # the mirror held exactly: nothing to recover
    cache = h.client.processor.preprocessor.cache
    assert cache is not None and 0 < cache.make_stats().hits < cache.make_stats().total


def test_two_requests_delivered_in_swapped_order(p1_factory: Any) -> None:
    h = toy_harness(p1_factory, capacity=8 * IMAGE_BYTES)
    h.add("warm", "a <img>", {"image": [IMAGES[0]]})
    h.pump()
    h.p1.swap_next_two()
    h.add("first", "a <img> b <aud>", {"image": [IMAGES[1]], "audio": [AUDIOS[0]]})
    h.add("second", "c <aud> d <img>", {"image": [IMAGES[1]], "audio": [AUDIOS[0]]})  # needs "first" applied
    h.check()
    assert h.p1.held is None
    assert h.client.stats.resends == 0 and h.client.stats.shadow_resets == 0


def test_p1_cache_cleared_between_and_during_requests(p1_factory: Any) -> None:
    h = toy_harness(p1_factory, capacity=6 * IMAGE_BYTES)
    rng = random.Random(1)
    for n in range(10):
        h.add(f"a{n}", *random_request(rng))
    h.pump()
    h.p1.clear_cache()
    for n in range(5):
        h.add(f"b{n}", *random_request(rng))
    h.pump()
    stats = h.client.stats
    assert stats.shadow_resets == 1 and stats.resends > 0
    for n in range(5, 12):
        h.add(f"b{n}", *random_request(rng))
        if n == 7:
            h.p1.clear_cache()  # with requests in flight
    h.check()
    assert stats.shadow_resets == 2 and stats.failures == 0


def test_p1_restarted_empty_behind_a_transparent_link(p1_factory: Any) -> None:
    h = toy_harness(p1_factory, capacity=6 * IMAGE_BYTES)
    rng = random.Random(2)
    for n in range(10):
        h.add(f"a{n}", *random_request(rng))
    h.pump()
    h.p1.restart()  # the client is not told: P1 finds out from the first stamp it sees
    for n in range(10):
        h.add(f"b{n}", *random_request(rng))
    h.check()
    assert h.p1.started == 2 and h.client.stats.shadow_resets == 1 and h.client.stats.resends > 0


def test_p1_restarted_empty_with_requests_in_flight(p1_factory: Any, gemma3_dir: Path) -> None:
    config = cache_config(1 << 20)
    pre = InputPreprocessor(gemma3_dir, config)
    base = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0))
    h = Harness(InputProcessor(pre), InputProcessor(base), p1_factory(config))
    images = [make_image(40 + 8 * i, 30, seed=i) for i in range(4)]
    prompt = "<start_of_turn>user\nA <start_of_image> B <start_of_image><end_of_turn>\n"
    for n in range(4):
        h.add(f"a{n}", prompt, {"image": [images[n % 4], images[(n + 1) % 4]]})
    h.pump()
    for n in range(4):
        h.add(f"b{n}", prompt, {"image": [images[(n + 2) % 4], images[n % 4]]})
    h.p1.restart()  # what the old P1 had not answered is gone
    assert h.client.engine_restarted() == []
    h.check()
    assert h.client.stats.failures == 0 and h.client.stats.shadow_resets == 1
    first = h.admitted["a0"].mm_features
    assert first is not None and first[0].data is not None and first[0].data.nbytes > 256  # travelled as aux frames


def test_oversize_items_are_never_cached_on_either_side(p1_factory: Any) -> None:
    h = toy_harness(p1_factory, capacity=IMAGE_BYTES - 1)  # audio fits, no image ever does
    rng = random.Random(3)
    for n in range(30):
        h.add(f"r{n}", *random_request(rng))
    h.check()
    cache = h.client.processor.preprocessor.cache
    assert cache is not None
    assert not any(cache.is_cached_item(h_) for r in h.expected.values() for f in r.mm_features or []
                   if f.modality == "image" for h_ in [f.mm_hash or ""])
    assert cache.make_stats().hits > 0  # audio still hits
    assert h.client.stats.resends == 0 and h.client.stats.shadow_resets == 0


def test_request_rejected_while_prepared_leaves_the_mirror_as_it_was(p1_factory: Any) -> None:
    h = toy_harness(p1_factory, capacity=3 * IMAGE_BYTES, max_model_len=16)
    h.add("warm", "a <img> b <img>", {"image": IMAGES[:2]})
    h.pump()
    cache = h.client.processor.cache
    epoch, seq = cache.epoch, cache.seq  # type: ignore[union-attr]
    held = list(cache._cache)  # type: ignore[union-attr]
    too_long = " ".join(["<img>"] * 5)
    with pytest.raises(ValidationError, match=r"^This model's maximum context length is 16 tokens"):
        h.client.add_request("rejected", too_long, mm_data={"image": IMAGES[2:7]})
    # Rejected before its commit: nothing to replay, nothing moved.
    assert h.client.stats.mirror_only == 0
    assert (cache.epoch, cache.seq) == (epoch, seq)  # type: ignore[union-attr]
    assert list(cache._cache) == held  # type: ignore[union-attr]
    h.add("after", "a <img> b <img> c <img>", {"image": [IMAGES[0], IMAGES[5], IMAGES[6]]})
    h.check()
    assert h.client.stats.resends == 0 and h.client.stats.shadow_resets == 0


def test_request_failing_after_its_commit_keeps_the_mirror(p1_factory: Any, monkeypatch: Any) -> None:
    h = toy_harness(p1_factory, capacity=3 * IMAGE_BYTES)
    h.add("warm", "a <img> b <img>", {"image": IMAGES[:2]})
    h.pump()
    encode = h.client._encoder.encode

    def fail_once(obj: Any) -> Any:
        monkeypatch.setattr(h.client._encoder, "encode", encode)
        raise EncodeError("injected")

    monkeypatch.setattr(h.client._encoder, "encode", fail_once)
    with pytest.raises(EncodeError, match="injected"):
        h.client.add_request("rejected", "<img> <img> <img>", mm_data={"image": IMAGES[2:5]})
    assert h.client.stats.mirror_only == 1
    # The rejected request's inserts evicted the warm items on P0; P1 replays that without data.
    h.add("after", "a <img> b <img> c <img>", {"image": [IMAGES[0], IMAGES[5], IMAGES[6]]})
    h.check()
    assert h.client.stats.resends == 0 and h.client.stats.shadow_resets == 0


def test_random_faults_end_to_end(p1_factory: Any) -> None:
    h = toy_harness(p1_factory, capacity=5 * IMAGE_BYTES)
    rng = random.Random(4)
    for n in range(150):
        h.add(f"r{n}", *random_request(rng))
        roll = rng.random()
        if roll < 0.08:
            h.p1.swap_next_two()
        elif roll < 0.11:
            h.pump()
            h.p1.clear_cache()
        elif roll < 0.13:
            h.pump()
            h.p1.restart()
        if n % 7 == 6:
            h.pump()
    h.check()
    assert h.client.stats.failures == 0 and h.client.stats.shadow_resets >= 1
