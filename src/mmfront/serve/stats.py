"""``/metrics`` of one app: vLLM 0.33's ``PrometheusStatLogger`` (every ``vllm:`` family its API
server exports by default, with its names, types, labels, HELP text and buckets), recorded from
the engine's steps (:mod:`mmfront.serve.iteration_stats`), next to the frontend's own counters
(:class:`mmfront.metrics.PrometheusExporter`: ``vllm:mm_cache_queries``/``hits`` and the
``mmfront:`` counters), all in one registry per app, so several apps (tests, several mounts) in
one process never share or clash.

Families vLLM adds only with a feature mmfront's API server does not configure are not made:
speculative decoding, KV and encoder-cache connectors, LoRA, watermarks, NaN counting, KV-block
residency. ``vllm:cache_config_info`` describes the engine's KV cache configuration,
which a stock engine does not tell its API server (vLLM's builds it from its own copy of the
configuration); docs/serving.md lists it among the differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import prometheus_client

from mmfront.engine.async_client import AsyncEngineClient
from mmfront.metrics import PrometheusExporter
from mmfront.preprocess import InputPreprocessor
from mmfront.serve.iteration_stats import IterationStats, PromptTokenStats, SchedulerStats
from mmfront.wire.structs import FinishReason

REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                               20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
"""vLLM's ``CacheHitSource`` values, the ``source`` label of ``vllm:prompt_tokens_cached_by_source``."""
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def request_tokens_buckets(max_model_len: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, ... up to the context."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


Kind = Literal["gauge", "counter", "histogram"]
Buckets = Sequence[float] | Literal["request_tokens"]


@dataclass(frozen=True)
class Family:
    """One ``vllm:`` metric as vLLM declares it (``extra``: labels after ``model_name, engine``)."""

    name: str
    kind: Kind
    documentation: str
    extra: tuple[str, ...] = ()
    buckets: Buckets = ()
    per_engine: bool = True
    """Labelled ``engine`` (all but ``vllm:admission_rejections``)."""


FAMILIES = (
    Family("vllm:estimated_flops_per_gpu_total", "counter",
           "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations)."),
    Family("vllm:estimated_read_bytes_per_gpu_total", "counter",
           "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations)."),
    Family("vllm:estimated_write_bytes_per_gpu_total", "counter",
           "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations)."),
    Family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    Family("vllm:num_requests_waiting_by_reason", "gauge",
           "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
           "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all "
           "reasons equals vllm:num_requests_waiting.", ("reason",)),
    Family("vllm:engine_sleep_state", "gauge",
           "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
           "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.", ("sleep_state",)),
    Family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    Family("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    Family("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    Family("vllm:external_prefix_cache_queries", "counter",
           "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
           "queried tokens."),
    Family("vllm:external_prefix_cache_hits", "counter",
           "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached "
           "tokens."),
    Family("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
    Family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    Family("vllm:prompt_tokens_by_source", "counter", "Number of prompt tokens by source.", ("source",)),
    Family("vllm:prompt_tokens_cached", "counter", "Number of cached prompt tokens (local + external)."),
    Family("vllm:prompt_tokens_cached_by_source", "counter",
           "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
           "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
           "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", ("source",)),
    Family("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
    Family("vllm:request_success", "counter", "Count of successfully processed requests.", ("finished_reason",)),
    Family("vllm:admission_rejections", "counter",
           "Number of admission attempts rejected by a queue limit, by reason.", ("reason",), per_engine=False),
    Family("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.",
           buckets="request_tokens"),
    Family("vllm:request_generation_tokens", "histogram", "Number of generation tokens processed.",
           buckets="request_tokens"),
    Family("vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.",
           buckets=ITERATION_TOKENS_BUCKETS),
    Family("vllm:request_max_num_generation_tokens", "histogram",
           "Histogram of maximum number of requested generation tokens.", buckets="request_tokens"),
    Family("vllm:request_params_n", "histogram", "Histogram of the n request parameter.",
           buckets=REQUEST_PARAMS_N_BUCKETS),
    Family("vllm:request_params_max_tokens", "histogram", "Histogram of the max_tokens request parameter.",
           buckets="request_tokens"),
    Family("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
           buckets=TIME_TO_FIRST_TOKEN_BUCKETS),
    Family("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
           buckets=INTER_TOKEN_LATENCY_BUCKETS),
    Family("vllm:request_time_per_output_token_seconds", "histogram",
           "Histogram of time_per_output_token_seconds per request.", buckets=INTER_TOKEN_LATENCY_BUCKETS),
    Family("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.",
           buckets=REQUEST_LATENCY_BUCKETS),
    Family("vllm:request_queue_time_seconds", "histogram", "Histogram of time spent in WAITING phase for request.",
           buckets=REQUEST_LATENCY_BUCKETS),
    Family("vllm:request_inference_time_seconds", "histogram",
           "Histogram of time spent in RUNNING phase for request.", buckets=REQUEST_LATENCY_BUCKETS),
    Family("vllm:request_prefill_time_seconds", "histogram", "Histogram of time spent in PREFILL phase for request.",
           buckets=REQUEST_LATENCY_BUCKETS),
    Family("vllm:request_decode_time_seconds", "histogram", "Histogram of time spent in DECODE phase for request.",
           buckets=REQUEST_LATENCY_BUCKETS),
    Family("vllm:request_num_preemptions", "histogram", "Histogram of the number of times a request was preempted.",
           buckets=REQUEST_NUM_PREEMPTIONS_BUCKETS),
    Family("vllm:request_prefill_kv_computed_tokens", "histogram",
           "Histogram of new KV tokens computed during prefill (excluding cached tokens).", buckets="request_tokens"),
)
"""vLLM 0.33's request and scheduler families, in its order (the multimodal cache's two are
:mod:`mmfront.metrics`'s)."""

LABEL_VALUES = {
    "vllm:num_requests_waiting_by_reason": ("capacity", "deferred"),
    "vllm:engine_sleep_state": SLEEP_STATES,
    "vllm:prompt_tokens_by_source": PromptTokenStats.SOURCES,
    "vllm:prompt_tokens_cached_by_source": CACHE_HIT_SOURCES,
    "vllm:request_success": tuple(str(reason) for reason in FinishReason),
    "vllm:admission_rejections": ADMISSION_REASONS,
}
"""The values of each family's extra label that exist from the start, as vLLM creates them."""


class ServerMetrics:
    """vLLM's ``PrometheusStatLogger`` for the engines ``engine_indexes``: :meth:`record` takes
    each step's statistics; :meth:`render` is the scrape."""

    def __init__(self, model_name: str, preprocessor: InputPreprocessor, client: AsyncEngineClient | None, *,
                 max_model_len: int, engine_indexes: Sequence[int] = (0,), engine_stats: bool = True) -> None:
        """``engine_stats`` False (``--disable-log-stats``): only the frontend's counters, as vLLM's
        server then exports none of these families."""
        self.registry = prometheus_client.CollectorRegistry()
        self._preprocessor, self._client = preprocessor, client
        self._exporter = PrometheusExporter(model_name, engine=engine_indexes[0], registry=self.registry)
        self.model_name = model_name
        self._metrics: dict[str, Any] = {}
        self._children: dict[tuple[str, int, tuple[str, ...]], Any] = {}
        self._queue_gauges: dict[int, tuple[float, ...]] = {}
        """Each engine's last running, waiting and KV-cache gauges, as set (only
        :meth:`_record_scheduler` sets those series)."""
        for family in FAMILIES if engine_stats else ():
            labels = ("model_name", "engine", *family.extra) if family.per_engine else ("model_name", *family.extra)
            if family.kind == "histogram":
                buckets = (request_tokens_buckets(max_model_len) if family.buckets == "request_tokens"
                           else family.buckets)
                metric: Any = prometheus_client.Histogram(family.name, family.documentation, labels, buckets=buckets,
                                                          registry=self.registry)
            elif family.kind == "gauge":
                metric = prometheus_client.Gauge(family.name, family.documentation, labels, registry=self.registry)
            else:
                metric = prometheus_client.Counter(family.name, family.documentation, labels, registry=self.registry)
            self._metrics[family.name] = metric
            for values in LABEL_VALUES.get(family.name, [()]):
                extra = values if isinstance(values, tuple) else (values,)
                for index in engine_indexes if family.per_engine else [None]:
                    metric.labels(*(model_name, *(() if index is None else (str(index),)), *extra))
        for index in engine_indexes if engine_stats else ():
            self._child("vllm:engine_sleep_state", index, "awake").set(1)

    def _child(self, name: str, engine: int, *extra: str) -> Any:
        """The series of ``name`` for these labels, looked up once: prometheus_client's ``labels``
        checks and joins the label values under a lock each time, and a step records ~20 series
        (the engine output reader's largest cost per step)."""
        key = (name, engine, extra)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metrics[name].labels(self.model_name, str(engine), *extra)
        return child

    def record(self, engine: int, scheduler: SchedulerStats | None, stats: IterationStats | None) -> None:
        """vLLM's ``PrometheusStatLogger.record`` (the multimodal cache is counted at the scrape)."""
        if scheduler is not None:
            self._record_scheduler(engine, scheduler)
        if stats is not None:
            self._record_iteration(engine, stats)

    def _record_scheduler(self, engine: int, s: SchedulerStats) -> None:
        child = self._child
        gauges = (s.num_running_reqs, s.num_waiting_reqs, s.num_skipped_waiting_reqs, s.kv_cache_usage)
        if self._queue_gauges.get(engine) != gauges:  # a decode step mostly repeats them (each set takes a lock)
            self._queue_gauges[engine] = gauges
            child("vllm:num_requests_running", engine).set(s.num_running_reqs)
            child("vllm:num_requests_waiting", engine).set(s.num_waiting_reqs + s.num_skipped_waiting_reqs)
            child("vllm:num_requests_waiting_by_reason", engine, "capacity").set(s.num_waiting_reqs)
            child("vllm:num_requests_waiting_by_reason", engine, "deferred").set(s.num_skipped_waiting_reqs)
            child("vllm:kv_cache_usage_perc", engine).set(s.kv_cache_usage)
        _count(child("vllm:prefix_cache_queries", engine), s.prefix_cache_stats.queries)
        _count(child("vllm:prefix_cache_hits", engine), s.prefix_cache_stats.hits)
        _count(child("vllm:prompt_tokens_cached_by_source", engine, "device"), s.prefix_cache_stats.hits)
        if s.connector_prefix_cache_stats is not None:
            _count(child("vllm:external_prefix_cache_queries", engine), s.connector_prefix_cache_stats.queries)
            _count(child("vllm:external_prefix_cache_hits", engine), s.connector_prefix_cache_stats.hits)
            for source, tokens in s.connector_prefix_cache_stats.hits_by_source.items():
                _count(child("vllm:prompt_tokens_cached_by_source", engine, source), tokens)
        perf = s.perf_stats
        if perf is not None and (perf.num_flops_per_gpu or perf.num_read_bytes_per_gpu or perf.num_write_bytes_per_gpu):
            _count(child("vllm:estimated_flops_per_gpu_total", engine), perf.num_flops_per_gpu)
            _count(child("vllm:estimated_read_bytes_per_gpu_total", engine), perf.num_read_bytes_per_gpu)
            _count(child("vllm:estimated_write_bytes_per_gpu_total", engine), perf.num_write_bytes_per_gpu)

    def _record_iteration(self, engine: int, it: IterationStats) -> None:
        child = self._child
        prompt = it.prompt_token_stats
        _count(child("vllm:num_preemptions", engine), it.num_preempted_reqs)
        if prompt.total or prompt.computed or prompt.cached_tokens or prompt.local_cache_hit or prompt.external_kv_transfer:
            _count(child("vllm:prompt_tokens", engine), prompt.total)  # a decode step has no prompt tokens to count
            for source in PromptTokenStats.SOURCES:
                _count(child("vllm:prompt_tokens_by_source", engine, source), prompt.by_source(source))
            _count(child("vllm:prompt_tokens_cached", engine), prompt.cached_tokens)
        _count(child("vllm:generation_tokens", engine), it.num_generation_tokens)
        child("vllm:iteration_tokens_total", engine).observe(prompt.computed + it.num_generation_tokens)
        for tokens in it.max_num_generation_tokens_iter:
            child("vllm:request_max_num_generation_tokens", engine).observe(tokens)
        for n in it.n_params_iter:
            child("vllm:request_params_n", engine).observe(n)
        for ttft in it.time_to_first_tokens_iter:
            child("vllm:time_to_first_token_seconds", engine).observe(ttft)
        for itl in it.inter_token_latencies_iter:
            child("vllm:inter_token_latency_seconds", engine).observe(itl)
        for done in it.finished_requests:
            child("vllm:request_success", engine, str(done.finish_reason)).inc()
            child("vllm:e2e_request_latency_seconds", engine).observe(done.e2e_latency)
            child("vllm:request_queue_time_seconds", engine).observe(done.queued_time)
            child("vllm:request_prefill_time_seconds", engine).observe(done.prefill_time)
            child("vllm:request_inference_time_seconds", engine).observe(done.inference_time)
            child("vllm:request_decode_time_seconds", engine).observe(done.decode_time)
            child("vllm:request_num_preemptions", engine).observe(done.num_preemptions)
            child("vllm:request_prefill_kv_computed_tokens", engine).observe(
                done.num_prompt_tokens - max(done.num_cached_tokens, 0))
            child("vllm:request_prompt_tokens", engine).observe(done.num_prompt_tokens)
            child("vllm:request_generation_tokens", engine).observe(done.num_generation_tokens)
            child("vllm:request_time_per_output_token_seconds", engine).observe(done.mean_time_per_output_token)
            if done.max_tokens_param:
                child("vllm:request_params_max_tokens", engine).observe(done.max_tokens_param)

    def render(self) -> tuple[bytes, str]:
        """The scrape: the frontend's cache and link counters brought up to date, then everything."""
        self._exporter.observe(self._preprocessor, self._client)
        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST


def _count(counter: Any, amount: float) -> None:
    """``counter.inc(amount)``, skipped for 0 (the same series): a decode step adds nothing to
    most of the ~15 counters it records, and each ``inc`` takes the series' lock."""
    if amount:
        counter.inc(amount)


__all__ = ["FAMILIES", "LABEL_VALUES", "Family", "ServerMetrics", "request_tokens_buckets"]
