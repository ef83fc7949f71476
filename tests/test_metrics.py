"""mmfront.metrics: exact numbers after a known workload, as a dict and under vLLM's Prometheus names.

The workload runs P0 against an in-process P1 (an ``EngineReceiver`` behind a loopback
transport): request ``a`` brings images 0 and 1, ``b`` images 1 and 2 (1 is a hit), then P1
clears its cache without telling P0, so ``c`` (image 0, a hit for P0) misses at P1 and is sent
again with its data.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.engine.client import EngineClient, RequestAdmitted
from mmfront.engine.receiver import EngineReceiver
from mmfront.engine.transports import BaseTransport
from mmfront.errors import ConfigError
from mmfront.metrics import CLIENT_KEYS, PrometheusExporter, snapshot
from mmfront.testing.media import image_data_url, make_image
from mmfront.timing import STAGES
from mmfront.wire import Frame

IMAGES = [image_data_url(make_image(20 + i, 16, seed=i)) for i in range(3)]


class Loopback(BaseTransport):
    """P1 in this thread: each send is handled at once and its replies queue for ``recv``."""

    def __init__(self, receiver: EngineReceiver) -> None:
        self.receiver = receiver
        self.replies: list[list[Frame]] = []
        self.sent_bytes = 0

    def send(self, frames: Sequence[Frame]) -> None:
        self.sent_bytes += sum(memoryview(frame).nbytes for frame in frames)
        self.replies += self.receiver.handle([bytearray(frame) for frame in frames])[1]

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        return self.replies.pop(0) if self.replies else None

    def close(self) -> None:
        self.replies.clear()


def chat(images: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": IMAGES[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is here?"}]}]


class Frontend:
    def __init__(self, model_dir: Path) -> None:
        config = MultiModalConfig(mm_processor_cache_gb=0.01)
        self.pre = InputPreprocessor(model_dir, config)
        self.link = Loopback(EngineReceiver(MirroredReceiverCache(config.mm_processor_cache_bytes)))
        self.client = EngineClient(InputProcessor(self.pre), self.link)

    def send(self, request_id: str, images: tuple[int, ...]) -> None:
        self.client.add_request(request_id, chat(images))
        events = []
        while (frames := self.link.recv()) is not None:
            events += self.client.handle_reply(frames)
        assert events == [RequestAdmitted(request_id)]

    def item_bytes(self, image: int) -> int:
        inputs = self.pre.preprocess(chat((image,)), skip_mm_cache=True)
        return sum(item.nbytes for items in inputs["mm_kwargs"].values() for item in items)

    def workload(self) -> None:
        self.send("a", (0, 1))
        self.send("b", (1, 2))
        assert self.link.receiver.reset_cache()  # P1 forgets; the MirrorReset it returns is dropped
        self.send("c", (0,))


@pytest.fixture
def frontend(gemma3_dir: Path) -> Frontend:
    return Frontend(gemma3_dir)


def test_snapshot_counts_the_workload_exactly(frontend: Frontend) -> None:
    frontend.workload()
    values = snapshot(frontend.pre, frontend.client)
    # prompts: a (2 queries), b (2, 1 hit), c (1, 1 hit); c's complete resend is the same prompt
    # again and counts nothing, as vLLM counts a prompt's lookups once (docs/caching.md)
    assert {k: values[k] for k in ("mm_cache_requests", "mm_cache_queries", "mm_cache_hits")} == {
        "mm_cache_requests": 3, "mm_cache_queries": 5, "mm_cache_hits": 2}
    assert values["mm_cache_hit_rate"] == pytest.approx(2 / 5)
    assert {k: values[k] for k in CLIENT_KEYS} == {
        "resends": 1, "shadow_resets": 1, "mirror_only": 0, "failures": 0, "engine_restarts": 0,
        "wire_bytes": frontend.link.sent_bytes,
        # image 1 in b and image 0 in c's first send went as references
        "saved_bytes": frontend.item_bytes(1) + frontend.item_bytes(0)}
    assert frontend.item_bytes(0) > 0 and frontend.link.sent_bytes > 0
    stages = {k.removeprefix("stage_seconds."): v for k, v in values.items() if k.startswith("stage_seconds.")}
    assert set(stages) >= set(STAGES)
    assert all(stages[name] > 0 for name in ("load", "hash", "cache", "hf", "encode", "send"))


def test_snapshot_without_a_client_has_only_the_cache_and_stages(gemma3_dir: Path) -> None:
    # two API processes: vLLM's processor-only cache, which preprocess commits to at once
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0.01, api_process_count=2))
    pre.preprocess(chat((0, 0)))
    values = snapshot(pre)
    assert not set(CLIENT_KEYS) & set(values)
    assert (values["mm_cache_requests"], values["mm_cache_queries"], values["mm_cache_hits"]) == (1, 2, 1)
    assert values["mm_cache_hit_rate"] == 0.5


def _sample(registry: CollectorRegistry, name: str, engine: str = "0", **labels: str) -> float | None:
    return registry.get_sample_value(name, {"model_name": "tiny-gemma3", "engine": engine, **labels})


def test_prometheus_counters_under_vllms_names_follow_the_snapshots(frontend: Frontend) -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter("tiny-gemma3", registry=registry)
    assert _sample(registry, "vllm:mm_cache_queries_total") == 0.0  # the series exist before any traffic
    frontend.workload()
    first = exporter.observe(frontend.pre, frontend.client)
    assert _sample(registry, "vllm:mm_cache_queries_total") == 5
    assert _sample(registry, "vllm:mm_cache_hits_total") == 2
    assert _sample(registry, "mmfront:mm_cache_requests_total") == 3
    assert _sample(registry, "mmfront:mm_cache_resends_total") == 1
    assert _sample(registry, "mmfront:mm_cache_shadow_resets_total") == 1
    assert _sample(registry, "mmfront:request_failures_total") == 0
    assert _sample(registry, "mmfront:request_wire_bytes_total") == frontend.link.sent_bytes
    assert _sample(registry, "mmfront:mm_cache_saved_bytes_total") == first["saved_bytes"]
    assert _sample(registry, "mmfront:stage_seconds_total", stage="hf") == pytest.approx(first["stage_seconds.hf"])

    frontend.send("d", (0,))  # a hit (c's resend put image 0 back): +1 query, +1 hit
    exporter.observe(frontend.pre, frontend.client)
    assert (_sample(registry, "vllm:mm_cache_queries_total"), _sample(registry, "vllm:mm_cache_hits_total")) == (6, 3)

    frontend.pre.stats.take()  # a consumer took the counts: the next snapshot starts from zero
    frontend.send("e", (0, 2))  # image 2 left P0's shadow with the reset: one hit
    exporter.observe(frontend.pre, frontend.client)
    assert (_sample(registry, "vllm:mm_cache_queries_total"), _sample(registry, "vllm:mm_cache_hits_total")) == (8, 4)

    text = generate_latest(registry).decode()
    assert "# TYPE vllm:mm_cache_queries_total counter" in text and "# TYPE vllm:mm_cache_hits_total counter" in text
    assert 'vllm:mm_cache_hits_total{engine="0",model_name="tiny-gemma3"} 4.0' in text


def test_two_exporters_share_a_registry_with_their_own_labels(frontend: Frontend) -> None:
    registry = CollectorRegistry()
    engine0 = PrometheusExporter("tiny-gemma3", registry=registry)
    engine1 = PrometheusExporter("tiny-gemma3", engine=1, registry=registry)
    engine0.update({"mm_cache_queries": 3, "mm_cache_hits": 1, "mm_cache_hit_rate": 1 / 3})
    engine1.update({"mm_cache_queries": 5})
    assert _sample(registry, "vllm:mm_cache_queries_total") == 3
    assert _sample(registry, "vllm:mm_cache_queries_total", engine="1") == 5
    assert _sample(registry, "vllm:mm_cache_hits_total", engine="1") == 0
    engine1.update({"stage_seconds.custom": 0.25})  # a stage outside STAGES gets its own label
    assert _sample(registry, "mmfront:stage_seconds_total", engine="1", stage="custom") == 0.25


def test_without_prometheus_client_the_exporter_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigError, match=r"pip install 'mmfront\[metrics\]'"):
        PrometheusExporter("tiny-gemma3")


def test_a_registry_already_holding_a_vllm_name_is_a_config_error() -> None:
    from prometheus_client import Counter

    registry = CollectorRegistry()
    Counter("vllm:mm_cache_hits", "registered by someone else", registry=registry)
    with pytest.raises(ConfigError, match=r"registry of its own"):
        PrometheusExporter("tiny-gemma3", registry=registry)
