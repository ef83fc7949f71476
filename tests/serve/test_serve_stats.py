"""vLLM's request statistics from engine steps, exactly: a known sequence of steps (engine
timestamps, request events, prefill and scheduler statistics, as a stock engine sends them) gives
known ``vllm:`` series, stats lines and request-output logs; the start-up banner's options and
address; the SSE keep-alive comment. test_vllm_serve_metrics.py compares all of it with
``vllm serve`` over a real stock engine."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mmfront import InputPreprocessor, MultiModalConfig
from mmfront.config import DataParallelConfig
from mmfront.engine.client_events import EngineStep
from mmfront.errors import ConfigError
from mmfront.serve import iteration_stats
from mmfront.serve.args import add_serve_parser, plan_from_args, serve_argv
from mmfront.serve.banner import listen_address, non_default_args
from mmfront.serve.event_stream import SSE_KEEP_ALIVE_COMMENT, with_sse_keep_alive
from mmfront.serve.iteration_stats import StatsRecorder
from mmfront.serve.request_log import RequestLogger, logged_message
from mmfront.serve.responses import ChatMessage, FunctionCall, ToolCall
from mmfront.serve.settings import ServePlan, ServeSettings
from mmfront.serve.stats import FAMILIES, ServerMetrics, request_tokens_buckets
from mmfront.serve.stats_log import StatsLog
from mmfront.wire.structs import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason

MODEL = "tiny"
LABELS = {"model_name": MODEL, "engine": "0"}


class Clock:
    """``time.time`` of :mod:`mmfront.serve.iteration_stats`, set by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(iteration_stats.time, "time", clock.time)
    return clock


@pytest.fixture(scope="module")
def preprocessor(gemma3_dir: Path) -> Iterator[InputPreprocessor]:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig())
    yield pre
    pre.close()


@pytest.fixture
def metrics(preprocessor: InputPreprocessor) -> ServerMetrics:
    return ServerMetrics(MODEL, preprocessor, None, max_model_len=4096)


def scheduler(running: int, waiting: int = 0, usage: float = 0.0, queries: int = 0, hits: int = 0) -> dict[str, Any]:
    """A stock engine's ``SchedulerStats`` as msgpack decodes it."""
    return {"num_running_reqs": running, "num_waiting_reqs": waiting, "num_skipped_waiting_reqs": 0,
            "kv_cache_usage": usage, "step_counter": 3, "current_wave": 0,
            "prefix_cache_stats": {"reset": False, "requests": 1 if queries else 0, "queries": queries, "hits": hits,
                                   "preempted_requests": 0, "preempted_queries": 0, "preempted_hits": 0,
                                   "hits_by_source": {}},
            "connector_prefix_cache_stats": None, "kv_cache_eviction_events": [], "spec_decoding_stats": None,
            "waiting_lora_adapters": {}, "running_lora_adapters": {}, "perf_stats": None}


def output(request_id: str, tokens: list[int], *, finish: FinishReason | None = None,
           events: list[tuple[EngineCoreEventType, float]] = (), prefill: tuple[int, int] | None = None,
           ) -> EngineCoreOutput:
    """``prefill``: (prompt tokens, of them cached) on the first output."""
    return EngineCoreOutput(
        request_id, tokens, finish_reason=finish,
        events=[EngineCoreEvent(kind, ts) for kind, ts in events] or None,
        prefill_stats=None if prefill is None else {
            "num_prompt_tokens": prefill[0], "num_computed_tokens": prefill[0] - prefill[1],
            "num_cached_tokens": prefill[1], "num_local_cached_tokens": prefill[1], "num_external_cached_tokens": 0,
            "num_cache_creation_tokens": 0})


def step(recorder: StatsRecorder, clock: Clock, at: float, engine_ts: float, outputs: list[EngineCoreOutput],
         stats: dict[str, Any] | None) -> None:
    clock.now = at
    recorder.on_step(EngineStep(0, engine_ts, stats, outputs), [o.request_id for o in outputs])


def value(metrics: ServerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {**LABELS, **labels})


def run_one_request(metrics: ServerMetrics, clock: Clock) -> StatsRecorder:
    """Request ``a``: 10 prompt tokens (4 cached), queued at engine time 49.0, scheduled at 49.5,
    tokens at 50.0, 50.2, 50.5; it arrived at 100.0 and its steps reached the server at 100.5,
    100.7, 101.0."""
    recorder = StatsRecorder([metrics.record])
    clock.now = 100.0
    recorder.add_requests(["a"], 10, 3)
    step(recorder, clock, 100.5, 50.0, [output("a", [7], prefill=(10, 4), events=[
        (EngineCoreEventType.QUEUED, 49.0), (EngineCoreEventType.SCHEDULED, 49.5)])],
        scheduler(1, usage=0.25, queries=10, hits=4))
    step(recorder, clock, 100.7, 50.2, [output("a", [8])], scheduler(1, usage=0.25))
    step(recorder, clock, 101.0, 50.5, [output("a", [9], finish=FinishReason.LENGTH)], scheduler(0))
    return recorder


def test_one_request_gives_vllms_numbers(metrics: ServerMetrics, clock: Clock) -> None:
    run_one_request(metrics, clock)
    assert value(metrics, "vllm:prompt_tokens_total") == 10
    assert value(metrics, "vllm:prompt_tokens_by_source_total", source="local_compute") == 6
    assert value(metrics, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 4
    assert value(metrics, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert value(metrics, "vllm:prompt_tokens_cached_total") == 4
    assert value(metrics, "vllm:generation_tokens_total") == 3
    assert value(metrics, "vllm:prefix_cache_queries_total") == 10
    assert value(metrics, "vllm:prefix_cache_hits_total") == 4
    assert value(metrics, "vllm:prompt_tokens_cached_by_source_total", source="device") == 4
    assert value(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert value(metrics, "vllm:request_success_total", finished_reason="stop") == 0
    assert (value(metrics, "vllm:num_requests_running"), value(metrics, "vllm:kv_cache_usage_perc")) == (0, 0)
    assert value(metrics, "vllm:iteration_tokens_total_sum") == 6 + 3  # computed prompt tokens + generated
    assert value(metrics, "vllm:iteration_tokens_total_count") == 3
    assert value(metrics, "vllm:iteration_tokens_total_bucket", le="8.0") == 3
    expected = {
        "vllm:time_to_first_token_seconds": 0.5, "vllm:e2e_request_latency_seconds": 1.0,
        "vllm:request_queue_time_seconds": 0.5, "vllm:request_prefill_time_seconds": 0.5,
        "vllm:request_decode_time_seconds": 0.5, "vllm:request_inference_time_seconds": 1.0,
        "vllm:request_time_per_output_token_seconds": 0.25, "vllm:request_prompt_tokens": 10,
        "vllm:request_generation_tokens": 3, "vllm:request_max_num_generation_tokens": 3,
        "vllm:request_params_n": 1, "vllm:request_params_max_tokens": 3, "vllm:request_num_preemptions": 0,
        "vllm:request_prefill_kv_computed_tokens": 6}
    for name, observed in expected.items():
        assert value(metrics, name + "_count") == 1, name
        assert value(metrics, name + "_sum") == pytest.approx(observed), name
    assert value(metrics, "vllm:inter_token_latency_seconds_count") == 2
    assert value(metrics, "vllm:inter_token_latency_seconds_sum") == pytest.approx(0.5)
    assert value(metrics, "vllm:inter_token_latency_seconds_bucket", le="0.2") == 0
    assert value(metrics, "vllm:inter_token_latency_seconds_bucket", le="0.3") == 2


def test_n_choices_a_stop_string_and_a_dropped_request(metrics: ServerMetrics, clock: Clock) -> None:
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["0_b", "1_b"], 5, 4)
    recorder.add_requests(["c"], 5, 4)
    recorder.add_requests(["d"], 5, 4)
    step(recorder, clock, 101.0, 10.0, [output(r, [1], prefill=(5, 0)) for r in ("0_b", "1_b", "c", "d")], None)
    step(recorder, clock, 101.1, 10.1, [output("0_b", [2], finish=FinishReason.STOP), output("1_b", [2]),
                                        output("c", [2]), output("d", [2])], None)
    assert value(metrics, "vllm:request_params_n_count") == 0  # one child of two finished
    recorder.finish("c", FinishReason.STOP)  # the server found a stop string
    recorder.drop("d")  # its client went away: vLLM counts no aborted request
    step(recorder, clock, 101.2, 10.2, [output("1_b", [3], finish=FinishReason.LENGTH), output("d", [3])], None)
    assert value(metrics, "vllm:request_success_total", finished_reason="stop") == 2
    assert value(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert value(metrics, "vllm:request_success_total", finished_reason="abort") == 0
    assert (value(metrics, "vllm:request_params_n_count"), value(metrics, "vllm:request_params_n_sum")) == (2, 3)
    assert value(metrics, "vllm:request_max_num_generation_tokens_sum") == 3 + 2  # b's longest child, c
    assert value(metrics, "vllm:generation_tokens_total") == 4 + 4 + 1  # d's last token came after the drop
    assert value(metrics, "vllm:prompt_tokens_total") == 20


def test_families_bucket_and_label_as_vllm(metrics: ServerMetrics) -> None:
    assert request_tokens_buckets(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert value(metrics, "vllm:request_prompt_tokens_bucket", le="2000.0") == 0
    assert value(metrics, "vllm:request_prompt_tokens_bucket", le="5000.0") is None
    assert value(metrics, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert value(metrics, "vllm:engine_sleep_state", sleep_state="discard_all") == 0
    assert metrics.registry.get_sample_value(
        "vllm:admission_rejections_total", {"model_name": MODEL, "reason": "max_num_queued_reqs"}) == 0
    assert len(FAMILIES) == 36  # with the frontend's vllm:mm_cache_queries and _hits: vLLM's 39 but cache_config_info


def test_disable_log_stats_leaves_only_the_frontends_counters(preprocessor: InputPreprocessor) -> None:
    quiet = ServerMetrics(MODEL, preprocessor, None, max_model_len=4096, engine_stats=False)
    text = quiet.render()[0].decode()
    assert "vllm:mm_cache_queries_total" in text
    assert "vllm:num_requests_running" not in text and "vllm:e2e_request_latency_seconds" not in text


class MultiModal:
    def __init__(self) -> None:
        self.counts = iteration_stats.PrefixCacheStats(requests=2, queries=2, hits=1)

    def __call__(self) -> iteration_stats.PrefixCacheStats:
        counts, self.counts = self.counts, iteration_stats.PrefixCacheStats()
        return counts


def test_the_stats_line(clock: Clock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    log = StatsLog([0], MultiModal(), kv_cache_device="CPU")
    monotonic = iter([20.0, 22.0, 32.0])  # the last line's time, then two lines' times
    monkeypatch.setattr("mmfront.serve.stats_log.time.monotonic", lambda: next(monotonic))
    log.engines[0].last_log = 10.0
    recorder = StatsRecorder([log.record])
    recorder.add_requests(["a"], 10, 3)
    step(recorder, clock, 100.5, 50.0, [output("a", [7], prefill=(10, 4))], scheduler(1, usage=0.125, queries=10,
                                                                                      hits=4))
    step(recorder, clock, 100.7, 50.2, [output("a", [8])], scheduler(1, waiting=2, usage=0.25))
    with caplog.at_level(logging.DEBUG, logger="mmfront.serve.stats"):
        log.log()  # 6 prompt tokens computed and 2 generated in the 10 s since the last line
        log.log()  # nothing since: idle, but the interval before was not
        log.log()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines[0] == (logging.INFO, "Engine 000: Avg prompt throughput: 0.6 tokens/s, Avg generation throughput: "
                                      "0.2 tokens/s, Running: 1 reqs, Waiting: 2 reqs, CPU KV cache usage: 25.0%, "
                                      "Prefix cache hit rate: 40.0%, MM cache hit rate: 50.0%")
    assert lines[1][0] == logging.INFO and lines[1][1].startswith("Engine 000: Avg prompt throughput: 0.0 tokens/s")
    assert lines[2][0] == logging.DEBUG


def test_output_logs_in_vllms_words(caplog: pytest.LogCaptureFixture) -> None:
    log = RequestLogger(max_log_len=4)
    with caplog.at_level(logging.DEBUG, logger="mmfront.serve.requests"):
        log.log_outputs("chatcmpl-1", "hello world", [5, 6, 7, 8, 9], "length")
        log.log_outputs("cmpl-2", "he", [5], None, is_streaming=True, delta=True)
        log.log_outputs("cmpl-2", "hello", None, "streaming_complete", is_streaming=True)
    assert [r.getMessage() for r in caplog.records] == [
        "Generated response chatcmpl-1 details: output_token_ids: [5, 6, 7, 8]",
        "Generated response chatcmpl-1: output: 'hell', finish_reason: length",
        "Generated response cmpl-2 (streaming delta) details: output_token_ids: [5]",
        "Generated response cmpl-2 (streaming delta): output: 'he', finish_reason: None",
        "Generated response cmpl-2 (streaming complete) details: output_token_ids: None",
        "Generated response cmpl-2 (streaming complete): output: 'hell', finish_reason: streaming_complete"]
    call = ToolCall(id="c1", function=FunctionCall("get_weather", '{"city": "Paris"}'))
    assert logged_message(ChatMessage(content="hi")) == "hi"
    assert logged_message(ChatMessage(content=None, tool_calls=[call])) == \
        '[tool_calls: get_weather({"city": "Paris"})]'
    assert logged_message(ChatMessage(content=None)) == ""


def test_the_banners_options_and_address(tmp_path: Path) -> None:
    settings = ServeSettings(tmp_path, port=9000, api_key="secret", served_model_name=("a",), enable_log_outputs=True)
    plan = ServePlan(settings, MultiModalConfig(max_model_len=2048), DataParallelConfig(data_parallel_size_local=0))
    assert non_default_args(plan) == {"model": tmp_path, "served_model_name": ("a",), "port": 9000,
                                      "api_key": "***", "enable_log_outputs": True, "max_model_len": 2048,
                                      "data_parallel_size_local": 0}
    assert listen_address(settings) == "http://0.0.0.0:9000"
    assert listen_address(ServeSettings(tmp_path, host="::1", ssl_keyfile="k", ssl_certfile="c")) == "https://[::1]:8000"
    assert listen_address(ServeSettings(tmp_path, uds="/tmp/s.sock")) == "unix:/tmp/s.sock"


def test_sse_keep_alive_comments_fill_the_silences() -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        await asyncio.sleep(0.35)
        yield b"data: 2\n\n"

    async def read() -> list[bytes]:
        return [chunk async for chunk in with_sse_keep_alive(slow(), 0.1)]

    chunks = asyncio.run(read())
    assert chunks[0] == b"data: 1\n\n" and chunks[-1] == b"data: 2\n\n"
    assert set(chunks[1:-1]) == {SSE_KEEP_ALIVE_COMMENT} and 2 <= len(chunks) - 2 <= 3
    assert SSE_KEEP_ALIVE_COMMENT == b": keep-alive\n\n"


def parse_serve(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mmfront")
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(serve_argv(["serve", *argv]))


def test_the_flags_reach_the_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = plan_from_args(parse_serve(
        str(tmp_path), "--disable-log-stats", "--enable-log-outputs", "--disable-log-deltas",
        "--enable-prompt-tokens-details", "--sse-keep-alive-interval", "15")).settings
    assert (settings.disable_log_stats, settings.enable_log_outputs, settings.enable_log_deltas,
            settings.enable_prompt_tokens_details, settings.sse_keep_alive_interval) == (True, True, False, True, 15)
    defaults = plan_from_args(parse_serve(str(tmp_path))).settings
    assert (defaults.disable_log_stats, defaults.enable_log_outputs, defaults.enable_log_deltas,
            defaults.enable_prompt_tokens_details, defaults.sse_keep_alive_interval) == (False, False, True, False, 0)
    with pytest.raises(SystemExit):
        parse_serve(str(tmp_path), "--sse-keep-alive-interval", "-1")
    assert "--sse-keep-alive-interval" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="must be a non-negative integer"):
        ServeSettings(tmp_path, sse_keep_alive_interval=-1)
