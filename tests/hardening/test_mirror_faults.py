"""Issue 13.7: a request that fails at any step leaves the P0 mirror as it was.

A failure is injected at every step of a request through ``EngineClient`` (an ``MMFrontError``
and a plain ``Exception`` each). Before the commit, the P0 shadow (epoch, seq, keys in LRU order)
must be exactly as before and nothing reaches P1. From the commit on (a failure half-way through
the commit, in the encoder, in the transport), the shadow has moved: P1 must get the mirror-only
message, so the next requests are served with no reset and no resend. Either way the same
request sent afterwards is admitted with the features a cache-less frontend gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.cache.mirror import MirroredReceiverCache, MirroredSenderCache
from mmfront.engine.client import EngineClient, RequestAdmitted
from mmfront.engine.receiver import EngineReceiver
from mmfront.engine.transports import BaseTransport
from mmfront.errors import MMFrontError, TransportError, ValidationError
from mmfront.inputs import MultiModalKwargsItems
from mmfront.media.connector import MediaConnector
from mmfront.models.gemma3 import Gemma3MultiModalProcessor
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import EngineCoreRequest
from mmfront.wire.messages import MIRROR_ONLY, REQUEST, Direction, decode_message

IMAGES = [image_data_url(make_image(40 + 8 * i, 24, seed=i)) for i in range(3)]
GiB = 1 << 30


class Injected(ValidationError):
    """The MMFrontError kind of injected failure."""


def chat(*urls: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "Compare."}]}]


class _Link(BaseTransport):
    """P1 in this thread: every send is handled at once; its replies wait in ``replies``."""

    def __init__(self, receiver: EngineReceiver) -> None:
        self.receiver = receiver
        self.replies: list[list[Any]] = []
        self.kinds: list[str] = []

    def send(self, frames: Sequence[Any]) -> None:
        frames = [bytes(memoryview(f).cast("B")) for f in frames]
        self.kinds.append(decode_message(frames, Direction.TO_ENGINE).kind)
        self.replies += self.receiver.handle(frames)[1]

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        raise AssertionError("replies are pumped by the test")

    def close(self) -> None:
        pass


@dataclass
class Frontend:
    processor: InputProcessor
    client: EngineClient
    link: _Link
    receiver_cache: MirroredReceiverCache

    @property
    def shadow(self) -> MirroredSenderCache:
        cache = self.processor.cache
        assert isinstance(cache, MirroredSenderCache)
        return cache

    def state(self) -> tuple[int, int, list[str]]:
        return self.shadow.epoch, self.shadow.seq, list(self.shadow._cache.order)

    def pump(self) -> dict[str, EngineCoreRequest]:
        admitted = {}
        while self.link.replies:
            for event in self.client.handle_reply(self.link.replies.pop(0)):
                assert isinstance(event, RequestAdmitted), event
                assert event.request is not None
                admitted[event.request_id] = event.request
        return admitted


def make_frontend(folder: Path) -> Frontend:
    config = MultiModalConfig(mm_processor_cache_gb=(1 << 20) / GiB)
    processor = InputProcessor(InputPreprocessor(folder, config))
    receiver_cache = MirroredReceiverCache(config.mm_processor_cache_bytes)
    link = _Link(EngineReceiver(receiver_cache, echo=True))
    return Frontend(processor, EngineClient(processor, link), link, receiver_cache)


@pytest.fixture(scope="module")
def baseline(gemma3_dir: Path) -> EngineCoreRequest:
    processor = InputProcessor(InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0)))
    return processor.process_inputs("want", chat(IMAGES[1], IMAGES[2]))


def same_request(got: EngineCoreRequest, want: EngineCoreRequest) -> None:
    assert got.prompt_token_ids == want.prompt_token_ids
    assert got.mm_features is not None and want.mm_features is not None
    for g, w in zip(got.mm_features, want.mm_features, strict=True):
        assert (g.mm_hash, g.mm_position) == (w.mm_hash, w.mm_position)
        assert g.data is not None and g.data == w.data


def _fail_on_call(n: int, error: Exception, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, except that call number ``n`` (from 1) raises ``error``."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == n:
            raise error
        return original(*args, **kwargs)

    return wrapper


def _raiser(error: Exception) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


def _inject(step: str, error: Exception, mp: pytest.MonkeyPatch, frontend: Frontend) -> None:
    fail = _raiser(error)
    if step == "media load":
        mp.setattr(MediaConnector, "fetch_bytes", fail)
    elif step == "hash":
        mp.setattr("mmfront.processing.processor.get_mm_hashes", fail)
    elif step == "cache lookup":
        mp.setattr(MirroredSenderCache, "peek_prompt_updates", fail)
    elif step == "HF call":
        mp.setattr(Gemma3MultiModalProcessor, "_call_hf_processor", fail)
    elif step == "split":
        mp.setattr(MultiModalKwargsItems, "from_hf_inputs", classmethod(fail))
    elif step == "prompt updates":
        mp.setattr(Gemma3MultiModalProcessor, "_get_prompt_updates", fail)
    elif step == "splice":
        mp.setattr(Gemma3MultiModalProcessor, "_apply_prompt_updates", fail)
    elif step == "validation":
        mp.setattr(InputProcessor, "_validate", fail)
    elif step == "commit entry":
        mp.setattr("mmfront.preprocess.pipeline.commit", fail)
    elif step == "commit half-way":  # the first item's operation is logged, the second fails
        mp.setattr(MirroredSenderCache, "get_and_update_item",
                   _fail_on_call(2, error, MirroredSenderCache.get_and_update_item))
    elif step == "encode":
        encode = frontend.client._encoder.encode
        mp.setattr(frontend.client._encoder, "encode",
                   lambda obj, *a, **k: fail() if isinstance(obj, EngineCoreRequest) else encode(obj, *a, **k))
    elif step == "send":
        send = frontend.link.send
        mp.setattr(frontend.link, "send",
                   lambda frames: fail() if decode_message(list(frames), Direction.TO_ENGINE).kind == REQUEST else send(frames))
    else:
        raise AssertionError(step)


BEFORE_COMMIT = ["media load", "hash", "cache lookup", "HF call", "split", "prompt updates", "splice",
                 "validation", "commit entry"]
AFTER_COMMIT = ["commit half-way", "encode", "send"]
ERRORS: dict[str, Callable[[], Exception]] = {
    "mmfront": lambda: Injected("injected", parameter="injected"),
    "builtin": lambda: RuntimeError("injected"),
}


@pytest.fixture
def warm(gemma3_dir: Path) -> Iterator[Frontend]:
    """A frontend whose mirror holds images 0 and 1, with P1 in step."""
    frontend = make_frontend(gemma3_dir)
    frontend.client.add_request("w1", chat(IMAGES[0], IMAGES[1]))
    assert set(frontend.pump()) == {"w1"}
    assert frontend.state()[1] == 1 and len(frontend.state()[2]) == 2
    yield frontend


def _check_next_requests_served(frontend: Frontend, baseline: EngineCoreRequest) -> None:
    """Image 1 (a hit) and image 2 (a miss) twice: admitted, right data, no reset, no resend."""
    for request_id in ("next-1", "next-2"):
        frontend.client.add_request(request_id, chat(IMAGES[1], IMAGES[2]))
        admitted = frontend.pump()
        assert set(admitted) == {request_id}
        same_request(admitted[request_id], baseline)
    assert frontend.client.stats.resends == 0 and frontend.client.stats.shadow_resets == 0
    assert frontend.receiver_cache.resets == 0
    assert frontend.receiver_cache.epoch == frontend.shadow.epoch
    assert list(frontend.receiver_cache._cache.order) == list(frontend.shadow._cache.order)


@pytest.mark.parametrize("kind", sorted(ERRORS))
@pytest.mark.parametrize("step", BEFORE_COMMIT)
def test_failure_before_the_commit_leaves_the_mirror_untouched(
    warm: Frontend, baseline: EngineCoreRequest, step: str, kind: str,
) -> None:
    before, sent = warm.state(), len(warm.link.kinds)
    with pytest.MonkeyPatch.context() as mp:
        error = ERRORS[kind]()
        _inject(step, error, mp, warm)
        with pytest.raises(type(error), match="injected"):
            warm.client.add_request("bad", chat(IMAGES[1], IMAGES[2]))
    assert warm.state() == before
    assert warm.link.kinds[sent:] == [] and warm.client.in_flight == []
    assert warm.shadow.take_stamp("bad") is None
    _check_next_requests_served(warm, baseline)


@pytest.mark.parametrize("kind", sorted(ERRORS))
@pytest.mark.parametrize("step", AFTER_COMMIT)
def test_failure_after_the_commit_keeps_p1_in_step(
    warm: Frontend, baseline: EngineCoreRequest, step: str, kind: str,
) -> None:
    epoch, seq, _ = warm.state()
    sent = len(warm.link.kinds)
    with pytest.MonkeyPatch.context() as mp:
        error = ERRORS[kind]()
        _inject(step, error, mp, warm)
        with pytest.raises(type(error), match="injected"):
            warm.client.add_request("bad", chat(IMAGES[1], IMAGES[2]))
    assert warm.state()[:2] == (epoch, seq + 1)  # the shadow moved, in the same epoch
    assert warm.link.kinds[sent:] == [MIRROR_ONLY] and warm.client.stats.mirror_only == 1
    assert warm.pump() == {} and warm.client.in_flight == []
    _check_next_requests_served(warm, baseline)


def test_lone_surrogate_uuid_does_not_poison_the_mirror(warm: Frontend, baseline: EngineCoreRequest) -> None:
    before = warm.state()
    message = chat(IMAGES[1], IMAGES[2])
    message[0]["content"][1]["uuid"] = "img-\ud800"
    with pytest.raises(ValidationError) as e:
        warm.client.add_request("bad", message)
    assert isinstance(e.value, MMFrontError) and "lone surrogate U+D800" in str(e.value)
    assert warm.state() == before and warm.client.in_flight == []
    _check_next_requests_served(warm, baseline)


def test_a_dead_transport_starts_a_new_epoch_instead_of_a_hole(warm: Frontend, baseline: EngineCoreRequest) -> None:
    """Neither the request nor its mirror-only message gets through: the shadow starts a new
    epoch, which P1 adopts with the next request (no gap to wait out, no resend)."""
    epoch = warm.state()[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warm.link, "send", _raiser(TransportError("injected: peer gone")))
        with pytest.raises(TransportError, match="peer gone"):
            warm.client.add_request("bad", chat(IMAGES[2]))
    new_epoch, seq, keys = warm.state()
    assert new_epoch != epoch and (seq, keys) == (0, [])
    assert warm.client.stats.shadow_resets == 1
    warm.client.stats.shadow_resets = 0
    _check_next_requests_served(warm, baseline)
