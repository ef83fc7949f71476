"""vLLM's request statistics, made as vLLM's ``OutputProcessor`` makes them: from each message of
engine outputs (:class:`~mmfront.engine.client_events.EngineStep`), the requests' timings and
token counts of that step (:class:`IterationStats`), with the engine's ``SchedulerStats`` beside
them. :class:`StatsRecorder` keeps each running request's state and hands every step to the
loggers (``/metrics``: :class:`~mmfront.serve.stats.ServerMetrics`; the periodic line:
:class:`~mmfront.serve.stats_log.StatsLog`).

vLLM counts an output as it searches it for the request's stop strings, and drops what the engine
sends after the stop. mmfront searches in the app, after the engine client's reader thread has
read the step: so an output of a request with stop strings counts when the app has searched it
(:meth:`StatsRecorder.consumed`), and its step is handed to the loggers once every such output
of it has been searched; the outputs of a request without stop strings count as their step
comes, where vLLM counts them. Either way a request that finishes counts exactly what vLLM's would.

Times follow vLLM: the time to first token and the end-to-end latency run from the request's
arrival (this host's ``time.time()``) to the step's arrival here; the queue, prefill, decode and
inference times and the inter-token latencies are differences of the engine's own timestamps
(its request events and its step timestamps), which only an engine that keeps statistics sends.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from mmfront.engine.client_events import EngineStep
from mmfront.wire.structs import EngineCoreEventType, EngineCoreOutput, FinishReason


class PrefixCacheStats(msgspec.Struct):
    """vLLM's ``PrefixCacheStats`` (what these statistics read of it)."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    hits_by_source: dict[str, int] = msgspec.field(default_factory=dict)
    """Hits by the cache tier that supplied them (a connector's statistics only)."""


class PerfStats(msgspec.Struct):
    """vLLM's ``PerfStats`` (with ``--enable-mfu-metrics`` on the engine)."""

    num_flops_per_gpu: int = 0
    num_read_bytes_per_gpu: int = 0
    num_write_bytes_per_gpu: int = 0


class SchedulerStats(msgspec.Struct):
    """vLLM's ``SchedulerStats`` (what the API server's loggers read of it)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: PrefixCacheStats = msgspec.field(default_factory=PrefixCacheStats)
    connector_prefix_cache_stats: PrefixCacheStats | None = None
    perf_stats: PerfStats | None = None


class PrefillStats(msgspec.Struct):
    """vLLM's ``PrefillStats``: where a request's prompt tokens came from."""

    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_local_cached_tokens: int = 0
    num_external_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0


def prefill_stats(raw: Any) -> PrefillStats:
    """An output's ``prefill_stats`` (sent as a msgpack map) as a struct."""
    return msgspec.convert(raw, PrefillStats)


def scheduler_stats(raw: Any) -> SchedulerStats | None:
    """The engine's ``SchedulerStats`` (sent as a msgpack map) as a struct; ``None`` when absent."""
    return None if raw is None else msgspec.convert(raw, SchedulerStats)


@dataclass
class PromptTokenStats:
    """vLLM's prompt tokens of one step by source (``computed + local_cache_hit +
    external_kv_transfer == total``)."""

    computed: int = 0
    local_cache_hit: int = 0
    external_kv_transfer: int = 0
    cached_tokens: int = 0
    total: int = 0

    SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")

    def add(self, prefill: PrefillStats) -> None:
        self.computed += prefill.num_computed_tokens
        self.cached_tokens += prefill.num_cached_tokens
        self.total += prefill.num_prompt_tokens
        self.local_cache_hit += prefill.num_local_cached_tokens
        self.external_kv_transfer += prefill.num_external_cached_tokens

    def by_source(self, source: str) -> int:
        return {"local_compute": self.computed, "local_cache_hit": self.local_cache_hit,
                "external_kv_transfer": self.external_kv_transfer}[source]


@dataclass(frozen=True)
class FinishedRequestStats:
    """vLLM's ``FinishedRequestStats``: one request's totals when it finished."""

    finish_reason: FinishReason
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    max_tokens_param: int | None
    queued_time: float
    prefill_time: float
    inference_time: float
    decode_time: float
    mean_time_per_output_token: float
    num_preemptions: int
    num_cached_tokens: int


@dataclass
class IterationStats:
    """vLLM's ``IterationStats``: what one message of engine outputs tells."""

    iteration_timestamp: float
    num_generation_tokens: int = 0
    prompt_token_stats: PromptTokenStats = field(default_factory=PromptTokenStats)
    num_preempted_reqs: int = 0
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    max_num_generation_tokens_iter: list[int] = field(default_factory=list)
    n_params_iter: list[int] = field(default_factory=list)
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)


@dataclass
class _Parent:
    """vLLM's ``ParentRequest`` as its statistics see it: ``n`` choices of one prompt."""

    n: int
    open_children: int
    max_generation_tokens: int = 0


@dataclass(frozen=True)
class RequestTimings:
    """A finished request's timestamps, as vLLM's ``RequestStateStats`` holds them: the engine's
    ``queued_ts`` and ``scheduled_ts`` events (0 from an engine that keeps no statistics) and the
    engine timestamps of the steps that brought its first and last tokens."""

    queued_ts: float
    scheduled_ts: float
    first_token_ts: float
    last_token_ts: float


@dataclass
class _Step:
    """One message of outputs on its way to the loggers: recorded once the app has searched every
    output of it that belongs to a request with stop strings (``unsearched`` of them are left)."""

    engine_index: int
    engine_ts: float
    stats: IterationStats
    unsearched: int = 0


@dataclass
class _RequestState:
    arrival_time: float
    prompt_len: int
    max_tokens: int | None
    parent: _Parent | None
    stop_strings: bool = False
    """The app searches its text for stop strings: each output counts once searched."""
    keep_timings: bool = False
    """Whether its :class:`RequestTimings` are kept for the app when it finishes."""
    unsearched: deque[tuple[_Step, EngineCoreOutput]] = field(default_factory=deque)
    """Its outputs read from the engine that the app has yet to search, oldest first."""
    prefilling: bool = True
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


Recorder = Callable[[int, SchedulerStats | None, IterationStats | None], None]
"""A logger's ``record(engine_index, scheduler_stats, iteration_stats)``."""


class StatsRecorder:
    """The running requests' statistics, fed by the engine client's steps (:meth:`on_step`, on its
    reader thread) and by the app (a request added, an output searched, a request given up).

    Thread-safe: any thread may call any method. One lock is the one lane everything goes through
    in order: the requests' states, the steps waiting for the app's search, and the records handed
    to the loggers (each logger gets them one at a time, scheduler statistics in step order). The
    :class:`IterationStats` a logger gets is complete and never changed afterwards."""

    def __init__(self, loggers: list[Recorder]) -> None:
        self.loggers = loggers
        self._requests: dict[str, _RequestState] = {}
        self._timings: dict[str, RequestTimings] = {}
        self._lock = threading.Lock()

    def add_requests(self, request_ids: list[str], prompt_len: int, max_tokens: int | None, *,
                     stop_strings: bool = False, keep_timings: bool = False) -> None:
        """The ``n`` choices of one prompt were sent (``len(request_ids) == n``); they arrived now.
        ``stop_strings``: the app searches their text for stop strings, so each of their outputs
        counts once the app reports it searched (:meth:`consumed`). ``keep_timings``: keep each
        one's :class:`RequestTimings` when it finishes, until :meth:`take_timings`
        (``--enable-per-request-metrics``)."""
        now = time.time()
        parent = _Parent(len(request_ids), len(request_ids)) if len(request_ids) > 1 else None
        with self._lock:
            for request_id in request_ids:
                self._requests[request_id] = _RequestState(now, prompt_len, max_tokens, parent, stop_strings,
                                                           keep_timings)

    def take_timings(self, request_id: str) -> RequestTimings | None:
        """A finished request's timings, if they were kept (the app takes them as it sees it finish)."""
        with self._lock:
            return self._timings.pop(request_id, None)

    def drop(self, request_id: str) -> None:
        """The request was given up before it finished (its client left, it failed): vLLM counts
        nothing more for an aborted request, and no output the app did not search."""
        with self._lock:
            state = self._requests.pop(request_id, None)
            self._timings.pop(request_id, None)
            if state is not None:
                self._forget_unsearched(state)

    def consumed(self, request_id: str, finish_reason: str | None) -> None:
        """The app took the request's next output and searched it for stop strings;
        ``finish_reason``: how the request ended there as the app answers it (``"stop"`` for a
        stop string, even in an output the engine finished by length, as vLLM's output processor
        says), ``None`` while it goes on (an output that ends it by the engine's word, unsearched
        because it failed, keeps the engine's reason). vLLM counts the output that holds the stop
        with all its tokens, and nothing the engine sends after it."""
        with self._lock:
            state = self._requests.get(request_id)
            if state is None:
                return
            if not state.unsearched:  # counted as its step came; or no step was observed (no statistics)
                if finish_reason is not None:
                    del self._requests[request_id]
                return
            step, output = state.unsearched.popleft()
            step.unsearched -= 1
            reason = _FINISH_REASONS[finish_reason] if finish_reason is not None else output.finish_reason
            self._count(step, request_id, state, output, reason)
            self._record_when_searched(step)
            if reason is not None:
                self._forget_unsearched(state)

    def on_step(self, step: EngineStep, request_ids: list[str]) -> None:
        """One message of outputs: :meth:`AsyncEngineClient.add_step_observer`'s callback."""
        with self._lock:
            scheduler = scheduler_stats(step.scheduler_stats)
            if not step.outputs:
                self._record(step.engine_index, scheduler, None)
                return
            pending = _Step(step.engine_index, step.timestamp, IterationStats(time.time()))
            for output, request_id in zip(step.outputs, request_ids):
                state = self._requests.get(request_id)
                if state is None:
                    continue
                if output.error is not None:  # refused as it arrived (a paused engine): vLLM counts nothing of it
                    del self._requests[request_id]
                    self._forget_unsearched(state)
                elif state.stop_strings:
                    state.unsearched.append((pending, output))
                    pending.unsearched += 1
                else:
                    self._count(pending, request_id, state, output, output.finish_reason)
            self._record(step.engine_index, scheduler, None if pending.unsearched else pending.stats)

    def _count(self, step: _Step, request_id: str, state: _RequestState, output: EngineCoreOutput,
               reason: FinishReason | None) -> None:
        """``output`` counts in ``step``; ``reason``: the request finished with it."""
        _update(step.stats, state, output, step.engine_ts)
        if reason is not None:
            del self._requests[request_id]
            _finished(step.stats, state, FinishReason(reason))
            self._keep_timings(request_id, state)

    def _forget_unsearched(self, state: _RequestState) -> None:
        """The request is over: its outputs the app has not searched never count."""
        while state.unsearched:
            step, _ = state.unsearched.popleft()
            step.unsearched -= 1
            self._record_when_searched(step)

    def _record_when_searched(self, step: _Step) -> None:
        if not step.unsearched:
            self._record(step.engine_index, None, step.stats)

    def _keep_timings(self, request_id: str, state: _RequestState) -> None:
        if state.keep_timings:
            self._timings[request_id] = RequestTimings(state.queued_ts, state.scheduled_ts, state.first_token_ts,
                                                       state.last_token_ts)

    def _record(self, engine_index: int, scheduler: SchedulerStats | None, stats: IterationStats | None) -> None:
        for record in self.loggers:
            record(engine_index, scheduler, stats)


_FINISH_REASONS = {str(reason): reason for reason in FinishReason}
"""A finish reason as the app answers it (``"stop"``) to the engine's."""


def _update(stats: IterationStats, state: _RequestState, output: EngineCoreOutput, engine_ts: float) -> None:
    """vLLM's ``IterationStats.update_from_output`` (with its events)."""
    new_tokens = len(output.new_token_ids)
    stats.num_generation_tokens += new_tokens
    prefilling = state.prefilling
    if prefilling:
        if output.prefill_stats is not None:
            prefill = prefill_stats(output.prefill_stats)
            stats.prompt_token_stats.add(prefill)
            state.num_cached_tokens = prefill.num_cached_tokens
        stats.time_to_first_tokens_iter.append(stats.iteration_timestamp - state.arrival_time)
        state.prefilling = False
    state.num_generation_tokens += new_tokens
    for event in output.events or ():
        if event.type == EngineCoreEventType.QUEUED:
            state.queued_ts = event.timestamp
        elif event.type == EngineCoreEventType.SCHEDULED:
            if state.scheduled_ts == 0.0:  # a preempted request is scheduled again
                state.scheduled_ts = event.timestamp
        elif event.type == EngineCoreEventType.PREEMPTED:
            stats.num_preempted_reqs += 1
            state.num_preemptions += 1
    if prefilling:
        state.first_token_ts = engine_ts
    else:
        stats.inter_token_latencies_iter.append(engine_ts - state.last_token_ts)
    state.last_token_ts = engine_ts


def _finished(stats: IterationStats, state: _RequestState, reason: FinishReason) -> None:
    """vLLM's ``update_from_finished_request`` and ``ParentRequest.observe_finished_request``."""
    decode_time = state.last_token_ts - state.first_token_ts
    stats.finished_requests.append(FinishedRequestStats(
        finish_reason=reason, e2e_latency=stats.iteration_timestamp - state.arrival_time,
        num_prompt_tokens=state.prompt_len, num_generation_tokens=state.num_generation_tokens,
        max_tokens_param=state.max_tokens, queued_time=state.scheduled_ts - state.queued_ts,
        prefill_time=state.first_token_ts - state.scheduled_ts,
        inference_time=state.last_token_ts - state.scheduled_ts, decode_time=decode_time,
        mean_time_per_output_token=(decode_time / (state.num_generation_tokens - 1)
                                    if state.num_generation_tokens > 1 else 0),
        num_preemptions=state.num_preemptions, num_cached_tokens=state.num_cached_tokens))
    parent = state.parent
    if parent is None:
        stats.max_num_generation_tokens_iter.append(state.num_generation_tokens)
        stats.n_params_iter.append(1)
        return
    parent.max_generation_tokens = max(parent.max_generation_tokens, state.num_generation_tokens)
    parent.open_children -= 1
    if not parent.open_children:
        stats.max_num_generation_tokens_iter.append(parent.max_generation_tokens)
        stats.n_params_iter.append(parent.n)


__all__ = [
    "FinishedRequestStats",
    "IterationStats",
    "PerfStats",
    "PrefillStats",
    "PrefixCacheStats",
    "PromptTokenStats",
    "Recorder",
    "RequestTimings",
    "SchedulerStats",
    "StatsRecorder",
    "prefill_stats",
    "scheduler_stats",
]
