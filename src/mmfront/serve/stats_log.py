"""The periodic stats line of ``vllm serve`` (vLLM's ``LoggingStatLogger``): every
``VLLM_LOG_STATS_INTERVAL`` seconds (10 by default), per engine, the prompt and generation
throughput since the last line, the scheduler's running and waiting requests, the KV-cache usage
and the prefix and multimodal cache hit rates over the last 1000 requests, in vLLM's words, so log
searches and dashboards written for vLLM read mmfront's unchanged. ``--disable-log-stats`` turns it
off. An idle engine's line (no tokens in this interval or the last) is logged at DEBUG, as vLLM's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mmfront.cache.stats import MultiModalCacheStats
from mmfront.serve.iteration_stats import IterationStats, PrefixCacheStats, SchedulerStats

logger = logging.getLogger("mmfront.serve.stats")

DEFAULT_INTERVAL_S = 10.0


def log_stats_interval() -> float:
    """vLLM's ``VLLM_LOG_STATS_INTERVAL`` (seconds; 10 unless set to a positive number)."""
    value = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", DEFAULT_INTERVAL_S))
    return value if value > 0 else DEFAULT_INTERVAL_S


class CachingMetrics:
    """vLLM's ``CachingMetrics``: the hit rate of the most recent ``max_recent_requests`` requests."""

    def __init__(self, max_recent_requests: int = 1000) -> None:
        self.max_recent_requests = max_recent_requests
        self.requests = self.queries = self.hits = 0
        self.window: deque[tuple[int, int, int]] = deque()

    def observe(self, stats: PrefixCacheStats) -> None:
        if stats.reset:
            self.requests = self.queries = self.hits = 0
            self.window.clear()
        if stats.requests == 0:
            return
        self.window.append((stats.requests, stats.queries, stats.hits))
        self.requests += stats.requests
        self.queries += stats.queries
        self.hits += stats.hits
        while len(self.window) > 1 and self.requests > self.max_recent_requests:
            requests, queries, hits = self.window.popleft()
            self.requests -= requests
            self.queries -= queries
            self.hits -= hits

    @property
    def empty(self) -> bool:
        return self.requests == 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class _EngineLog:
    engine_index: int
    last_log: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    last_prompt_throughput: float = 0.0
    last_generation_throughput: float = 0.0
    scheduler: SchedulerStats = field(default_factory=SchedulerStats)
    prefix_cache: CachingMetrics = field(default_factory=CachingMetrics)
    connector_cache: CachingMetrics = field(default_factory=CachingMetrics)


MultiModalCounts = Callable[[], PrefixCacheStats]
"""The multimodal cache's requests, queries and hits since the previous call (and whether it was reset)."""


class MultiModalCacheDelta:
    """The processor cache's counts (:class:`~mmfront.cache.stats.MultiModalCacheStats`, which
    only grow until someone takes them) since the previous call, as a :data:`MultiModalCounts`."""

    def __init__(self, stats: MultiModalCacheStats) -> None:
        self.stats = stats
        self.last = (0, 0, 0)
        self.was_reset = stats.reset

    def __call__(self) -> PrefixCacheStats:
        now = (self.stats.requests, self.stats.queries, self.stats.hits)
        taken = any(a < b for a, b in zip(now, self.last))  # someone took the counts: count from zero
        since = now if taken else tuple(a - b for a, b in zip(now, self.last))
        reset = self.stats.reset and not self.was_reset  # the flag stays up until the counts are taken
        self.last, self.was_reset = now, self.stats.reset
        return PrefixCacheStats(reset=reset, requests=since[0], queries=since[1], hits=since[2])


def kv_cache_device() -> str:
    """How vLLM's line names the KV cache's device: ``GPU`` on a CUDA host, else the platform (``CPU``)."""
    import torch

    return "GPU" if torch.cuda.is_available() else "CPU"


class StatsLog:
    """One ``vllm serve``'s stats lines: :meth:`record` takes each step, :meth:`log` writes a line
    per engine (the app calls it every :func:`log_stats_interval` seconds). The multimodal cache
    is the frontend's, read at each line (``mm_cache``), and shown on engine 0's line."""

    def __init__(self, engine_indexes: Sequence[int], mm_cache: MultiModalCounts, *, kv_cache_device: str) -> None:
        now = time.monotonic()
        self.engines = {index: _EngineLog(index, now) for index in engine_indexes}
        self.kv_cache_device = kv_cache_device
        self.mm_cache = mm_cache
        self.mm_caching = CachingMetrics()
        self._lock = threading.Lock()
        """:meth:`record` runs on the engine client's reader thread, :meth:`log` on the app's."""

    def record(self, engine: int, scheduler: SchedulerStats | None, stats: IterationStats | None) -> None:
        """vLLM's ``LoggingStatLogger.record``."""
        state = self.engines.get(engine)
        if state is None:
            return
        with self._lock:
            self._record(state, scheduler, stats)

    @staticmethod
    def _record(state: _EngineLog, scheduler: SchedulerStats | None, stats: IterationStats | None) -> None:
        if stats is not None:
            state.prompt_tokens += stats.prompt_token_stats.computed
            state.generation_tokens += stats.num_generation_tokens
            state.preemptions += stats.num_preempted_reqs
        if scheduler is not None:
            state.prefix_cache.observe(scheduler.prefix_cache_stats)
            if scheduler.connector_prefix_cache_stats is not None:
                state.connector_cache.observe(scheduler.connector_prefix_cache_stats)
            state.scheduler = scheduler

    def log(self) -> None:
        """vLLM's ``LoggingStatLogger.log``, once per engine."""
        self.mm_caching.observe(self.mm_cache())
        for state in self.engines.values():
            with self._lock:
                self._log_engine(state)

    def _log_engine(self, state: _EngineLog) -> None:
        now = time.monotonic()
        elapsed = now - state.last_log
        prompt = state.prompt_tokens / elapsed if elapsed > 0 else 0.0
        generation = state.generation_tokens / elapsed if elapsed > 0 else 0.0
        idle = not any((prompt, generation, state.last_prompt_throughput, state.last_generation_throughput))
        state.last_prompt_throughput, state.last_generation_throughput = prompt, generation
        preemptions = state.preemptions
        state.last_log, state.prompt_tokens, state.generation_tokens, state.preemptions = now, 0, 0, 0
        s = state.scheduler
        parts = ["Avg prompt throughput: %.1f tokens/s", "Avg generation throughput: %.1f tokens/s",
                 "Running: %d reqs", "Waiting: %d reqs"]
        args: list[float | int | str] = [prompt, generation, s.num_running_reqs,
                                         s.num_waiting_reqs + s.num_skipped_waiting_reqs]
        if s.num_skipped_waiting_reqs > 0:
            parts.append("Deferred: %d reqs")
            args.append(s.num_skipped_waiting_reqs)
        if preemptions > 0:
            parts.append("Preemptions: %d")
            args.append(preemptions)
        parts.append("%s KV cache usage: %.1f%%")
        args += [self.kv_cache_device, s.kv_cache_usage * 100]
        if not state.prefix_cache.empty:
            parts.append("Prefix cache hit rate: %.1f%%")
            args.append(state.prefix_cache.hit_rate * 100)
        if not state.connector_cache.empty:
            parts.append("External prefix cache hit rate: %.1f%%")
            args.append(state.connector_cache.hit_rate * 100)
        if state.engine_index == min(self.engines) and not self.mm_caching.empty:
            parts.append("MM cache hit rate: %.1f%%")
            args.append(self.mm_caching.hit_rate * 100)
        level = logging.DEBUG if idle else logging.INFO
        logger.log(level, "Engine %03d: " + ", ".join(parts), state.engine_index, *args)


__all__ = ["DEFAULT_INTERVAL_S", "CachingMetrics", "MultiModalCacheDelta", "MultiModalCounts", "StatsLog",
           "kv_cache_device", "log_stats_interval", "logger"]
