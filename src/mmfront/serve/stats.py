"""``/metrics`` of one app: vLLM's request metrics, under its names and labels, next to the
frontend's own (:class:`mmfront.metrics.PrometheusExporter`: ``vllm:mm_cache_queries``/``hits``
and the ``mmfront:`` counters), all in one registry per app, so several apps (tests, several
mounts) in one process never share or clash."""

from __future__ import annotations

import prometheus_client

from mmfront.engine.async_client import AsyncEngineClient
from mmfront.metrics import PrometheusExporter
from mmfront.preprocess import InputPreprocessor

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


class ServerMetrics:
    """The counters and gauges ``vllm serve`` exports for requests, labelled ``model_name`` and
    ``engine`` as vLLM labels them. The app calls the ``on_*`` hooks; :meth:`render` is the
    scrape."""

    def __init__(self, model_name: str, preprocessor: InputPreprocessor, client: AsyncEngineClient,
                 *, engine: str = "0") -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self._preprocessor, self._client = preprocessor, client
        self._exporter = PrometheusExporter(model_name, engine=engine, registry=self.registry)
        labels = ("model_name", "engine")
        values = (model_name, engine)
        r = self.registry
        self.running = prometheus_client.Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels,
            registry=r).labels(*values)
        self.waiting = prometheus_client.Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
            registry=r).labels(*values)
        self.prompt_tokens = prometheus_client.Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r).labels(*values)
        self.generation_tokens = prometheus_client.Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r).labels(*values)
        success = prometheus_client.Counter(
            "vllm:request_success", "Count of successfully processed requests.", (*labels, "finished_reason"),
            registry=r)
        self.success = {reason: success.labels(*values, reason) for reason in FINISHED_REASONS}

    def on_added(self, prompt_tokens: int) -> None:
        """An engine request was sent: it waits until its first output."""
        self.prompt_tokens.inc(prompt_tokens)
        self.waiting.inc()

    def on_first_output(self) -> None:
        self.waiting.dec()
        self.running.inc()

    def on_tokens(self, count: int) -> None:
        self.generation_tokens.inc(count)

    def on_finished(self, reason: str | None, *, started: bool) -> None:
        """An engine request ended (``reason`` None: it failed or was given up before finishing)."""
        (self.running if started else self.waiting).dec()
        if reason is not None:
            self.success[reason if reason in self.success else "error"].inc()

    def render(self) -> tuple[bytes, str]:
        """The scrape: the frontend's cache and link counters brought up to date, then everything."""
        self._exporter.observe(self._preprocessor, self._client)
        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST


__all__ = ["FINISHED_REASONS", "ServerMetrics"]
