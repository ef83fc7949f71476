"""The serving-code contract: the mirror moves only at the commit, any order of calls a user can
make gives requests that carry their data, many threads and asyncio tasks at once."""

from __future__ import annotations

import asyncio
import queue
import random
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.engine.client import EngineClient, RequestAdmitted, RequestFailed
from mmfront.engine.receiver import EngineReceiver
from mmfront.engine.transports import BaseTransport
from mmfront.errors import InputTypeError, ValidationError
from mmfront.preprocess import InputPreprocessor, InputProcessor, RequestOptions
from mmfront.testing.media import make_audio, make_image
from mmfront.wire import EngineCoreRequest
from toy_models import toy

GiB = 1 << 30
IMAGES = [make_image(4 + i, 3 + i % 2, seed=i) for i in range(10)]
AUDIOS = [make_audio(0.0005 * (i + 1), seed=i) for i in range(6)]


def toy_processor(capacity_bytes: int) -> InputProcessor:
    config = MultiModalConfig(mm_processor_cache_gb=capacity_bytes / GiB)
    return InputProcessor(InputPreprocessor("toy", config, processor=toy(config)))


def baseline() -> InputProcessor:
    config = MultiModalConfig(mm_processor_cache_gb=0)
    return InputProcessor(InputPreprocessor("toy", config, processor=toy(config)))


def same_request(got: EngineCoreRequest, want: EngineCoreRequest) -> None:
    assert got.prompt_token_ids == want.prompt_token_ids
    assert got.mm_features is not None and want.mm_features is not None
    for g, w in zip(got.mm_features, want.mm_features, strict=True):
        assert (g.modality, g.mm_hash, g.mm_position) == (w.modality, w.mm_hash, w.mm_position)
        assert g.data is not None and g.data == w.data, g.mm_hash


def random_request(rng: random.Random) -> tuple[str, dict[str, list[Any]]]:
    slots = [rng.choice(["image", "audio"]) for _ in range(rng.randint(1, 4))]
    data: dict[str, list[Any]] = {}
    words = []
    for n, slot in enumerate(slots):
        data.setdefault(slot, []).append(rng.choice(IMAGES if slot == "image" else AUDIOS))
        words.append(f"w{n} {'<img>' if slot == 'image' else '<aud>'}")
    return " ".join(words) + " end", data


ONE_IMAGE = baseline().process_inputs("probe", "a <img>", mm_data={"image": [IMAGES[0]]})
IMAGE_BYTES = ONE_IMAGE.mm_features[0].data.nbytes  # type: ignore[index,union-attr]


# --- 1. the mirror moves only at the commit ------------------------------------------------------


def test_preprocess_then_process_inputs_carries_the_data() -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    pre = processor.preprocessor
    inputs = pre.preprocess("a <img> b <img>", {"image": IMAGES[:2]})
    assert inputs["mm_kwargs"]["image"][0] is not None
    request = processor.process_inputs("req-1", "a <img> b <img>", mm_data={"image": IMAGES[:2]})
    assert all(f.data is not None for f in request.mm_features or [])
    from_inputs = processor.process_inputs("req-2", inputs)
    assert all(f.data is not None for f in from_inputs.mm_features or [])
    assert pre.cache is not None and pre.cache.make_stats().total == 0  # nothing was committed
    assert processor.take_stamp("req-1") is None and processor.take_stamp("req-2") is None


def test_prepared_but_never_sent_leaves_no_trace() -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    cache = processor.cache
    epoch = cache.epoch  # type: ignore[union-attr]
    for n in range(5):
        processor.prepare(f"r{n}", "a <img> b <aud>", mm_data={"image": [IMAGES[n]], "audio": [AUDIOS[n]]})
    assert list(cache._cache) == [] and (cache.epoch, cache.seq) == (epoch, 0)  # type: ignore[union-attr]


def test_inputs_from_preprocess_committed_after_their_items_were_evicted_get_their_data_back() -> None:
    processor = toy_processor(2 * IMAGE_BYTES)
    first = processor.prepare("a", "x <img>", mm_data={"image": [IMAGES[0]]})
    processor.commit(first)
    processor.take_stamp("a")
    hit = processor.preprocessor.preprocess("y <img>", {"image": [IMAGES[0]]})
    assert hit["mm_kwargs"]["image"] == [None]  # a hit at preparation: no data yet
    for n in (1, 2, 3):  # evict it
        processor.commit(processor.prepare(f"e{n}", "z <img>", mm_data={"image": [IMAGES[n]]}))
        processor.take_stamp(f"e{n}")
    committed = processor.commit(processor.prepare("b", hit))
    same_request(committed, baseline().process_inputs("b", "y <img>", mm_data={"image": [IMAGES[0]]}))


@pytest.mark.parametrize("order", ["client-first", "preprocess-first", "process_inputs-first", "inputs-to-client"])
def test_every_order_of_calls_gives_admitted_requests_with_their_data(order: str) -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    loop = _InProcessEngine(processor)
    prompt, data = "a <img> b <aud> c <img>", {"image": IMAGES[:2], "audio": AUDIOS[:1]}
    want = baseline().process_inputs("r", prompt, mm_data=data)
    if order == "preprocess-first":
        processor.preprocessor.preprocess(prompt, data)
    if order == "process_inputs-first":
        same_request(processor.process_inputs("r0", prompt, mm_data=data), want)
    if order == "inputs-to-client":
        loop.client.add_request("r1", processor.preprocessor.preprocess(prompt, data))
    else:
        loop.client.add_request("r1", prompt, mm_data=data)
    loop.client.add_request("r2", prompt, mm_data=data)  # all hits now
    admitted = loop.drain(2)
    for request_id in ("r1", "r2"):
        same_request(admitted[request_id], want)
    assert loop.receiver_cache.resets == 0 and loop.client.stats.resends == 0


# --- 2. many threads, asyncio ---------------------------------------------------------------------


class _InProcessEngine:
    """A P1 on its own thread behind a queue: the shape of a real engine, without sockets."""

    def __init__(self, processor: InputProcessor) -> None:
        self.receiver_cache = MirroredReceiverCache(processor.config.mm_processor_cache_bytes)
        self.receiver = EngineReceiver(self.receiver_cache, echo=True)
        self.transport = _QueueTransport()
        self.client = EngineClient(processor, self.transport)
        self.events: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            frames = self.transport.outbox.get()
            if frames is None:
                return
            _, replies = self.receiver.handle(frames)
            for reply in replies:
                for event in self.client.handle_reply(reply):
                    self.events.put(event)

    def drain(self, count: int) -> dict[str, EngineCoreRequest]:
        admitted: dict[str, EngineCoreRequest] = {}
        while len(admitted) < count:
            event = self.events.get(timeout=30)
            assert not isinstance(event, RequestFailed), event.error
            assert isinstance(event, RequestAdmitted) and event.request is not None
            assert event.request_id not in admitted, "answered twice"
            admitted[event.request_id] = event.request
        self.transport.outbox.put(None)
        self._thread.join(10)
        return admitted


class _QueueTransport(BaseTransport):
    def __init__(self) -> None:
        self.outbox: queue.Queue[list[Any] | None] = queue.Queue()

    def send(self, frames: Sequence[Any]) -> None:
        self.outbox.put([bytes(memoryview(f).cast("B")) for f in frames])

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        raise AssertionError("replies are handled on the engine thread")

    def close(self) -> None:
        self.outbox.put(None)


def test_eight_threads_two_hundred_requests_each_never_drift() -> None:
    processor = toy_processor(4 * IMAGE_BYTES)  # small: evictions all the time
    engine = _InProcessEngine(processor)
    reference = baseline()
    plans = {f"t{t}-r{n}": random_request(random.Random(t * 1000 + n)) for t in range(8) for n in range(200)}

    def worker(t: int) -> None:
        for n in range(200):
            request_id = f"t{t}-r{n}"
            prompt, data = plans[request_id]
            engine.client.add_request(request_id, prompt, mm_data=data)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admitted = engine.drain(len(plans))
    for request_id, (prompt, data) in plans.items():
        same_request(admitted[request_id], reference.process_inputs(request_id, prompt, mm_data=data))
    assert engine.receiver_cache.resets == 0
    assert engine.client.stats.resends == 0 and engine.client.stats.shadow_resets == 0
    assert processor.preprocessor.stats.hits > 0


def test_asyncio_tasks_share_one_client() -> None:
    processor = toy_processor(4 * IMAGE_BYTES)
    engine = _InProcessEngine(processor)
    reference = baseline()
    plans = {f"a{n}": random_request(random.Random(n)) for n in range(120)}

    async def main() -> None:
        await asyncio.gather(*(engine.client.add_request_async(rid, p, mm_data=d) for rid, (p, d) in plans.items()))
        inputs = await processor.preprocessor.preprocess_async("a <img>", {"image": [IMAGES[0]]})
        assert inputs["mm_hashes"]["image"] == [ONE_IMAGE.mm_features[0].mm_hash]  # type: ignore[index]

    asyncio.run(main())
    admitted = engine.drain(len(plans))
    for request_id, (prompt, data) in plans.items():
        same_request(admitted[request_id], reference.process_inputs(request_id, prompt, mm_data=data))
    assert engine.receiver_cache.resets == 0 and engine.client.stats.resends == 0


def test_a_request_id_in_flight_is_refused_and_an_abort_while_preparing_sends_nothing() -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    transport = _QueueTransport()
    client = EngineClient(processor, transport)
    client.add_request("dup", "a <img>", mm_data={"image": [IMAGES[0]]})
    with pytest.raises(ValidationError, match="already in flight") as info:
        client.add_request("dup", "a <img>", mm_data={"image": [IMAGES[0]]})
    assert info.value.parameter == "request_id"
    real_prepare = processor.prepare

    def abort_meanwhile(request_id: str, *args: Any, **kwargs: Any) -> Any:
        client.abort_request(request_id)
        return real_prepare(request_id, *args, **kwargs)

    processor.prepare = abort_meanwhile  # type: ignore[method-assign]
    client.add_request("gone", "a <img>", mm_data={"image": [IMAGES[1]]})
    assert transport.outbox.qsize() == 1 and client.in_flight == ["dup"]


# --- 5. vLLM's habits ---------------------------------------------------------------------------


def test_vllm_prompt_dicts_are_accepted_wherever_a_prompt_is() -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    want = baseline().process_inputs("r", "a <img>", mm_data={"image": [IMAGES[0]]})
    text = processor.process_inputs("r", {"prompt": "a <img>", "multi_modal_data": {"image": [IMAGES[0]]}})
    same_request(text, want)
    token_ids = processor.preprocessor.tokenizer.encode("a <img>")
    ids = processor.process_inputs("r", {"prompt_token_ids": token_ids, "multi_modal_data": {"image": IMAGES[0]}})
    same_request(ids, want)
    uuid = processor.preprocessor.preprocess({"prompt": "a <img>", "multi_modal_data": {"image": [IMAGES[0]]},
                                              "multi_modal_uuids": {"image": ["u-1"]}, "mm_processor_kwargs": {}})
    assert uuid["mm_hashes"] == {"image": ["u-1"]}
    with pytest.raises(InputTypeError, match="Unknown prompt key"):
        processor.process_inputs("r", {"prompt": "a", "multimodal_data": {}})
    with pytest.raises(ValidationError, match="exactly one of"):
        processor.process_inputs("r", {"prompt": "a", "prompt_token_ids": [1]})
    with pytest.raises(InputTypeError, match="both in the prompt dict"):
        processor.process_inputs("r", {"prompt": "a <img>", "multi_modal_data": {"image": [IMAGES[0]]}},
                                 mm_data={"image": [IMAGES[0]]})


def test_request_options_are_one_struct_for_every_entry_point() -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    options = RequestOptions(mm_data={"image": [IMAGES[0]]}, cache_salt="s", priority=3, arrival_time=2.0)
    request = processor.process_inputs("r", "a <img>", options=options)
    assert (request.cache_salt, request.priority, request.arrival_time) == ("s", 3, 2.0)
    assert processor.process_inputs("r", "a <img>", options=options, priority=5).priority == 5
    with pytest.raises(InputTypeError, match="Unknown request option"):
        processor.process_inputs("r", "a <img>", options=options, cache_sault="s")


def test_reset_mm_cache_is_vllms_name() -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    epoch = processor.cache.epoch  # type: ignore[union-attr]
    processor.preprocessor.reset_mm_cache()
    assert processor.cache.epoch != epoch and processor.preprocessor.stats.reset  # type: ignore[union-attr]


# --- 7. a uuid is not a key to another user's data ------------------------------------------------


def test_uuids_only_match_within_the_same_cache_salt() -> None:
    processor = toy_processor(8 * IMAGE_BYTES)
    engine = _InProcessEngine(processor)
    engine.client.add_request("alice", "a <img>", mm_data={"image": [IMAGES[3]]}, mm_uuids={"image": ["photo"]},
                              cache_salt="alice")
    admitted = engine.drain(1)
    alice_hash = admitted["alice"].mm_features[0].mm_hash  # type: ignore[index]
    assert alice_hash != "photo" and alice_hash is not None and alice_hash.endswith(":photo")
    # Mallory names Alice's uuid without the data: under another salt it is not Alice's item.
    with pytest.raises(ValidationError, match="data is not provided"):
        processor.prepare("mallory", "a <img>", mm_data={"image": [None]}, mm_uuids={"image": ["photo"]},
                          cache_salt="mallory")
    with pytest.raises(ValidationError, match="data is not provided"):
        processor.prepare("anon", "a <img>", mm_data={"image": [None]}, mm_uuids={"image": ["photo"]})
    # Alice herself, same salt, gets her item back by uuid alone.
    again = processor.prepare("alice-2", "a <img>", mm_data={"image": [None]}, mm_uuids={"image": ["photo"]},
                              cache_salt="alice")
    assert again.inputs["mm_hashes"]["image"] == [alice_hash]
    # Without a salt the uuid is the key itself, as in vLLM.
    plain = processor.preprocessor.preprocess("a <img>", {"image": [IMAGES[3]]}, mm_uuids={"image": ["photo"]})
    assert plain["mm_hashes"]["image"] == ["photo"]
