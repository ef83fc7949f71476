"""vLLM's request statistics from engine steps, exactly: a known sequence of steps (engine
timestamps, request events, prefill and scheduler statistics, as a stock engine sends them) gives
known ``vllm:`` series, stats lines and request-output logs; the start-up banner's options and
address; the SSE keep-alive comment. test_vllm_serve_metrics.py compares all of it with
``vllm serve`` over a real stock engine."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
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
from mmfront.serve.iteration_stats import IterationStats, StatsRecorder
from mmfront.serve.request_log import RequestLogger, logged_message
from mmfront.serve.responses import ChatMessage, FunctionCall, ToolCall
from mmfront.serve.settings import ServePlan, ServeSettings
from mmfront.serve.stats import FAMILIES, ServerMetrics, request_tokens_buckets
from mmfront.serve.stats_log import StatsLog
from mmfront.wire.structs import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason, RequestError

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


def test_the_queue_gauges_follow_every_step_when_steps_repeat_them(metrics: ServerMetrics, clock: Clock) -> None:
    """A step whose running, waiting and KV-cache figures repeat the last step's sets nothing (issue
    34: a decode step mostly repeats them); the gauges still read each step's figures."""
    recorder = StatsRecorder([metrics.record])
    seen = []
    for running, waiting, usage in [(2, 1, 0.5), (2, 1, 0.5), (1, 0, 0.25), (2, 1, 0.5), (2, 1, 0.5)]:
        step(recorder, clock, 100.0, 50.0, [], scheduler(running, waiting, usage))
        seen.append((value(metrics, "vllm:num_requests_running"), value(metrics, "vllm:num_requests_waiting"),
                     value(metrics, "vllm:num_requests_waiting_by_reason", reason="capacity"),
                     value(metrics, "vllm:kv_cache_usage_perc")))
    assert seen == [(2, 1, 1, 0.5), (2, 1, 1, 0.5), (1, 0, 0, 0.25), (2, 1, 1, 0.5), (2, 1, 1, 0.5)]


def test_n_choices_a_stop_string_and_a_dropped_request(metrics: ServerMetrics, clock: Clock) -> None:
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["0_b", "1_b"], 5, 4)
    recorder.add_requests(["c"], 5, 4, stop_strings=True)
    recorder.add_requests(["d"], 5, 4)
    step(recorder, clock, 101.0, 10.0, [output(r, [1], prefill=(5, 0)) for r in ("0_b", "1_b", "c", "d")], None)
    recorder.consumed("c", None)
    step(recorder, clock, 101.1, 10.1, [output("0_b", [2], finish=FinishReason.STOP), output("1_b", [2]),
                                        output("c", [2]), output("d", [2])], None)
    assert value(metrics, "vllm:request_params_n_count") == 0  # one child of two finished
    recorder.consumed("c", "stop")  # the server found a stop string
    recorder.drop("d")  # its client went away: vLLM counts no aborted request
    step(recorder, clock, 101.2, 10.2, [output("1_b", [3], finish=FinishReason.LENGTH), output("d", [3])], None)
    assert value(metrics, "vllm:request_success_total", finished_reason="stop") == 2
    assert value(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert value(metrics, "vllm:request_success_total", finished_reason="abort") == 0
    assert (value(metrics, "vllm:request_params_n_count"), value(metrics, "vllm:request_params_n_sum")) == (2, 3)
    assert value(metrics, "vllm:request_max_num_generation_tokens_sum") == 3 + 2  # b's longest child, c
    assert value(metrics, "vllm:generation_tokens_total") == 4 + 4 + 1  # d's last token came after the drop
    assert value(metrics, "vllm:prompt_tokens_total") == 20


# --- a request with stop strings counts each output once the app searched it ---------------------


def searched(recorder: StatsRecorder, request_id: str, times: int, finish: str | None = None) -> None:
    """The app takes ``times`` outputs of ``request_id``; ``finish``: how the last one ends it."""
    for k in range(times):
        recorder.consumed(request_id, finish if k == times - 1 else None)


def engine_steps(recorder: StatsRecorder, clock: Clock, request_id: str, count: int, *,
                 finish_last: FinishReason | None = None, tokens: int = 1) -> None:
    """``count`` one-output steps of ``request_id`` read from the engine (step ``k`` reaches the
    server at 101 + k/10, engine time 10 + k/10), ``tokens`` new tokens each."""
    for k in range(count):
        finish = finish_last if k == count - 1 else None
        step(recorder, clock, 101.0 + k / 10, 10.0 + k / 10,
             [output(request_id, [k] * tokens, finish=finish, prefill=(5, 0) if k == 0 else None)],
             scheduler(1, usage=0.5 - k / 100))


def test_tokens_the_engine_made_after_a_stop_string_never_count(metrics: ServerMetrics, clock: Clock) -> None:
    """The engine's steps run ahead of the app: six outputs are read before the app finds the stop
    string in the third, as a loaded event loop sees them; vLLM counts three tokens, finished by
    ``stop`` at the third step."""
    clock.now = 100.0
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["s"], 5, 6, stop_strings=True)
    engine_steps(recorder, clock, "s", 6, finish_last=FinishReason.LENGTH)
    assert value(metrics, "vllm:kv_cache_usage_perc") == pytest.approx(0.45)  # the gauges do not wait
    assert value(metrics, "vllm:iteration_tokens_total_count") == 0  # the steps wait for the app's search
    assert value(metrics, "vllm:generation_tokens_total") == 0
    searched(recorder, "s", 2)
    assert value(metrics, "vllm:iteration_tokens_total_count") == 2
    assert value(metrics, "vllm:generation_tokens_total") == 2
    clock.now = 200.0  # the app's own time is not the request's: its end is the third step's arrival
    searched(recorder, "s", 1, "stop")
    assert value(metrics, "vllm:generation_tokens_total") == 3
    assert value(metrics, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(metrics, "vllm:request_success_total", finished_reason="length") == 0
    assert value(metrics, "vllm:iteration_tokens_total_count") == 6  # the steps after the stop count no token
    assert value(metrics, "vllm:iteration_tokens_total_sum") == 5 + 3
    for name, count, total in [("vllm:request_generation_tokens", 1, 3), ("vllm:request_prompt_tokens", 1, 5),
                               ("vllm:request_max_num_generation_tokens", 1, 3),
                               ("vllm:time_to_first_token_seconds", 1, 1.0),
                               ("vllm:inter_token_latency_seconds", 2, 0.2),
                               ("vllm:e2e_request_latency_seconds", 1, 1.2),
                               ("vllm:request_decode_time_seconds", 1, 0.2)]:
        assert value(metrics, name + "_count") == count, name
        assert value(metrics, name + "_sum") == pytest.approx(total), name
    recorder.consumed("s", None)  # an output the app takes after the stop (it does not): nothing changes
    assert value(metrics, "vllm:generation_tokens_total") == 3


def test_a_stop_string_in_the_last_token_finishes_by_stop(metrics: ServerMetrics, clock: Clock) -> None:
    """The engine finished the request by length in the output that holds the stop string: vLLM's
    output processor says ``stop``."""
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["s"], 5, 3, stop_strings=True)
    engine_steps(recorder, clock, "s", 3, finish_last=FinishReason.LENGTH)
    searched(recorder, "s", 3, "stop")
    assert value(metrics, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(metrics, "vllm:request_success_total", finished_reason="length") == 0
    assert value(metrics, "vllm:generation_tokens_total") == 3
    assert value(metrics, "vllm:request_generation_tokens_sum") == 3
    assert value(metrics, "vllm:request_params_max_tokens_sum") == 3


def test_the_output_holding_the_stop_counts_whole(metrics: ServerMetrics, clock: Clock) -> None:
    """Several tokens in one output (speculative decoding) with the stop string in its first:
    vLLM counts them all, as it counts before it cuts the text."""
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["s"], 5, 12, stop_strings=True)
    engine_steps(recorder, clock, "s", 4, tokens=3)
    searched(recorder, "s", 2, "stop")
    assert value(metrics, "vllm:generation_tokens_total") == 6
    assert value(metrics, "vllm:request_generation_tokens_sum") == 6
    assert value(metrics, "vllm:iteration_tokens_total_count") == 4


def test_a_request_that_ends_by_length_with_stop_strings(metrics: ServerMetrics, clock: Clock) -> None:
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["s"], 5, 4, stop_strings=True)
    engine_steps(recorder, clock, "s", 4, finish_last=FinishReason.LENGTH)
    searched(recorder, "s", 4, "length")
    assert value(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert value(metrics, "vllm:generation_tokens_total") == 4
    assert value(metrics, "vllm:inter_token_latency_seconds_count") == 3


def test_n_2_with_one_choice_stopped(metrics: ServerMetrics, clock: Clock) -> None:
    """Both choices have the stop strings; the first meets one in its second token, the second
    runs to its four; the engine sends both choices' outputs in the same steps."""
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["0_n", "1_n"], 5, 4, stop_strings=True)
    for k in range(4):
        step(recorder, clock, 101.0 + k / 10, 10.0 + k / 10,
             [output(r, [k], finish=FinishReason.LENGTH if k == 3 else None, prefill=(5, 0) if k == 0 else None)
              for r in ("0_n", "1_n")], None)
    searched(recorder, "0_n", 2, "stop")
    assert value(metrics, "vllm:iteration_tokens_total_count") == 0  # each step waits for the second choice too
    searched(recorder, "1_n", 4, "length")
    assert value(metrics, "vllm:generation_tokens_total") == 2 + 4
    assert value(metrics, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(metrics, "vllm:request_success_total", finished_reason="length") == 1
    assert (value(metrics, "vllm:request_params_n_count"), value(metrics, "vllm:request_params_n_sum")) == (1, 2)
    assert value(metrics, "vllm:request_max_num_generation_tokens_sum") == 4
    assert (value(metrics, "vllm:request_generation_tokens_count"),
            value(metrics, "vllm:request_generation_tokens_sum")) == (2, 6)
    assert (value(metrics, "vllm:iteration_tokens_total_count"),
            value(metrics, "vllm:iteration_tokens_total_sum")) == (4, 10 + 2 + 4)


def test_a_request_its_client_gave_up(metrics: ServerMetrics, clock: Clock) -> None:
    """vLLM counts the outputs it read before the abort and no finished request; with stop
    strings, the outputs the app searched (it never searched the others for a stop)."""
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["s"], 5, 6, stop_strings=True)
    recorder.add_requests(["p"], 5, 6)
    for k in range(4):
        step(recorder, clock, 101.0 + k / 10, 10.0 + k / 10,
             [output(r, [k], prefill=(5, 0) if k == 0 else None) for r in ("s", "p")], None)
    searched(recorder, "s", 2)
    recorder.drop("s")
    recorder.drop("p")
    step(recorder, clock, 102.0, 11.0, [output("s", [4]), output("p", [4])], None)
    assert value(metrics, "vllm:generation_tokens_total") == 2 + 4
    assert value(metrics, "vllm:iteration_tokens_total_count") == 5
    for reason in ("stop", "length", "abort"):
        assert value(metrics, "vllm:request_success_total", finished_reason=reason) == 0
    assert value(metrics, "vllm:request_generation_tokens_count") == 0


def test_a_failed_output_keeps_the_engines_reason(metrics: ServerMetrics, clock: Clock) -> None:
    """The app raises the engine's error without searching the text: the request counts as vLLM
    counts it, finished by ``error``."""
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["s"], 5, 6, stop_strings=True)
    engine_steps(recorder, clock, "s", 2, finish_last=FinishReason.ERROR)
    searched(recorder, "s", 2)
    assert value(metrics, "vllm:request_success_total", finished_reason="error") == 1
    assert value(metrics, "vllm:iteration_tokens_total_count") == 2


def test_a_request_the_engine_refused_counts_nothing(metrics: ServerMetrics, clock: Clock) -> None:
    """vLLM's output processor hands the error of a request refused on arrival (a paused engine) to
    its caller and counts nothing of it, not even a finish."""
    recorder = StatsRecorder([metrics.record])
    recorder.add_requests(["r"], 5, 4)
    recorder.add_requests(["s"], 5, 4, stop_strings=True)
    paused = RequestError("engine_paused", "The engine is paused.")
    refused = [EngineCoreOutput(r, [], finish_reason=FinishReason.ERROR, error=paused) for r in ("r", "s")]
    step(recorder, clock, 101.0, 10.0, refused, None)
    recorder.consumed("s", None)
    assert value(metrics, "vllm:request_success_total", finished_reason="error") == 0
    assert value(metrics, "vllm:iteration_tokens_total_count") == 1
    assert value(metrics, "vllm:time_to_first_token_seconds_count") == 0


@dataclass(frozen=True)
class Traffic:
    """One request of the threaded test: ``stop_at``: the output whose text holds a stop string
    (``None``: no stop strings, it runs to ``STEPS`` tokens); ``left_after``: its client goes away
    after that many outputs."""

    request_id: str
    engine: int
    stop_at: int | None
    left_after: int | None = None

    def counted(self) -> int:
        """The tokens vLLM counts for it."""
        return self.left_after or self.stop_at or STEPS


STEPS = 12


class Snapshots:
    """A logger that keeps what each record held when it came, to check no record changes later."""

    def __init__(self) -> None:
        self.records: list[tuple[IterationStats, int, int]] = []
        self.lock = threading.Lock()

    def record(self, engine: int, scheduler: Any, stats: IterationStats | None) -> None:
        if stats is not None:
            with self.lock:
                self.records.append((stats, stats.num_generation_tokens, len(stats.finished_requests)))


def test_many_engines_and_one_event_loop_count_as_vllm(preprocessor: InputPreprocessor) -> None:
    """Four engines' reader threads and the app's event loop feed one recorder at once, as the
    client does (each step observed, then its outputs handed to the loop); the app searches each
    output of a request with stop strings as it takes it. Whatever the interleaving, the numbers
    are vLLM's, and every step reaches the loggers once, complete."""
    traffic = [Traffic(f"r{e}-{i}", e, stop_at=(None, 3, 7, 12, 5)[i % 5], left_after=2 if i % 7 == 6 else None)
               for e in range(4) for i in range(20)]
    # a client that leaves a request without stop strings: what counts is what the reader read first (timing)
    assert all(t.stop_at is not None for t in traffic if t.left_after is not None)
    metrics = ServerMetrics(MODEL, preprocessor, None, max_model_len=4096, engine_indexes=[0, 1, 2, 3])
    snapshots = Snapshots()
    recorder = StatsRecorder([metrics.record, snapshots.record])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        queues = {t.request_id: asyncio.Queue[EngineCoreOutput]() for t in traffic}
        for t in traffic:
            recorder.add_requests([t.request_id], 5, STEPS, stop_strings=t.stop_at is not None)

        def engine(index: int) -> None:  # the engine runs every request to its end: no abort reaches it in time
            mine = [t for t in traffic if t.engine == index]
            for k in range(STEPS):
                outputs = [output(t.request_id, [k], finish=FinishReason.LENGTH if k == STEPS - 1 else None,
                                  prefill=(5, 0) if k == 0 else None) for t in mine]
                recorder.on_step(EngineStep(index, float(k), scheduler(len(mine)), outputs),
                                 [o.request_id for o in outputs])
                for o in outputs:
                    loop.call_soon_threadsafe(queues[o.request_id].put_nowait, o)

        async def app(t: Traffic) -> None:
            for k in range(1, STEPS + 1):
                await queues[t.request_id].get()
                if t.left_after is not None and k > t.left_after:
                    recorder.drop(t.request_id)
                    return
                finish = "stop" if k == t.stop_at else "length" if k == STEPS else None
                recorder.consumed(t.request_id, finish)
                if finish is not None:
                    return

        readers = [threading.Thread(target=engine, args=(e,)) for e in range(4)]
        for reader in readers:
            reader.start()
        await asyncio.gather(*(app(t) for t in traffic))
        for reader in readers:
            await asyncio.to_thread(reader.join)

    asyncio.run(main())
    finished = [t for t in traffic if t.left_after is None]
    assert len(finished) == 72
    for e in range(4):
        mine = [t for t in traffic if t.engine == e]
        labels = {"engine": str(e)}
        assert value(metrics, "vllm:generation_tokens_total", **labels) == sum(t.counted() for t in mine)
        assert value(metrics, "vllm:prompt_tokens_total", **labels) == 5 * 20
        assert value(metrics, "vllm:iteration_tokens_total_count", **labels) == STEPS
        assert value(metrics, "vllm:iteration_tokens_total_sum", **labels) == 5 * 20 + sum(t.counted() for t in mine)
        for reason, expected in [("stop", sum(t.stop_at is not None and t.left_after is None for t in mine)),
                                 ("length", sum(t.stop_at is None and t.left_after is None for t in mine)),
                                 ("abort", 0)]:
            assert value(metrics, "vllm:request_success_total", finished_reason=reason, **labels) == expected
        assert value(metrics, "vllm:request_generation_tokens_sum", **labels) == sum(
            t.counted() for t in mine if t.left_after is None)
    assert len(snapshots.records) == 4 * STEPS
    assert len({id(stats) for stats, _, _ in snapshots.records}) == 4 * STEPS
    assert all((stats.num_generation_tokens, len(stats.finished_requests)) == (tokens, done)
               for stats, tokens, done in snapshots.records)


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
