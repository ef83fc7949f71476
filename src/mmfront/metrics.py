"""The frontend's statistics as plain numbers, and as Prometheus counters under vLLM's names.

:func:`snapshot` reads what the frontend already counts (the P0 cache's requests, queries and
hits, the client's resends and resets, the stage times of :mod:`mmfront.timing`) into a flat
``dict`` of numbers: log it, serve it as JSON, or feed it to any metrics system.

:class:`PrometheusExporter` turns successive snapshots into counters. The processor-cache
counters keep vLLM 0.33's names and labels (``vllm:mm_cache_queries`` and ``vllm:mm_cache_hits``,
labelled ``model_name`` and ``engine``), so dashboards built for vLLM read mmfront unchanged;
what vLLM does not count (cache-miss resends, shadow resets, bytes on the wire) goes under
``mmfront:`` names. ``prometheus_client`` is optional: ``pip install 'mmfront[metrics]'``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.client import EngineClient
from mmfront.errors import ConfigError
from mmfront.preprocess import InputPreprocessor
from mmfront.timing import STAGES, take_stage_times

Snapshot = dict[str, float]
"""Metric key -> value; counts are whole numbers, times in seconds, the hit rate in [0, 1]."""

CLIENT_KEYS = ("resends", "shadow_resets", "mirror_only", "failures", "engine_restarts", "wire_bytes",
               "saved_bytes")
"""The fields of :class:`~mmfront.engine.client_state.ClientStats` a snapshot carries when given a client."""

STAGE_PREFIX = "stage_seconds."


def snapshot(preprocessor: InputPreprocessor, client: EngineClient | AsyncEngineClient | None = None) -> Snapshot:
    """The frontend's statistics now, as cumulative numbers.

    The cache counts run since the preprocessor's statistics were last taken
    (``preprocessor.stats.take()``); the stage times are the whole process's, since the last
    ``take_stage_times()`` (they sum every preprocessor of the process). Client keys are
    present only when ``client`` is given."""
    stats = preprocessor.stats
    out: Snapshot = {
        "mm_cache_requests": stats.requests,
        "mm_cache_queries": stats.queries,
        "mm_cache_hits": stats.hits,
        "mm_cache_hit_rate": stats.hit_ratio,
    }
    if client is not None:
        client_stats = client.stats
        out.update({key: getattr(client_stats, key) for key in CLIENT_KEYS})
    out.update({STAGE_PREFIX + name: seconds for name, seconds in take_stage_times(reset=False).items()})
    return out


@dataclass(frozen=True)
class _Metric:
    name: str
    documentation: str
    key: str | None
    """The snapshot key it counts; ``None`` for the per-stage counter (label ``stage``)."""


METRICS = (
    _Metric("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.",
            "mm_cache_queries"),
    _Metric("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.",
            "mm_cache_hits"),
    _Metric("mmfront:mm_cache_requests", "Multi-modal requests that looked items up in the processor cache.",
            "mm_cache_requests"),
    _Metric("mmfront:mm_cache_resends", "Requests sent again with their data after the engine lacked an item.",
            "resends"),
    _Metric("mmfront:mm_cache_shadow_resets", "Resets of P0's copy of the engine's cache (engine reset or restart).",
            "shadow_resets"),
    _Metric("mmfront:mm_cache_mirror_only", "Mirror-only messages for requests not sent after their commit.",
            "mirror_only"),
    _Metric("mmfront:request_failures", "Requests reported to the caller as failed by the engine link.",
            "failures"),
    _Metric("mmfront:engine_restarts", "Engine restarts the frontend noticed.", "engine_restarts"),
    _Metric("mmfront:request_wire_bytes", "Bytes of request messages sent to the engine, resends included.",
            "wire_bytes"),
    _Metric("mmfront:mm_cache_saved_bytes", "Item bytes not sent because the engine's cache held the item.",
            "saved_bytes"),
    _Metric("mmfront:stage_seconds", "Frontend seconds per pipeline stage, summed over threads.", None),
)

_LABELS = ("model_name", "engine")
_registered: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_registered_lock = threading.Lock()


def _counters(registry: Any) -> dict[str, Any]:
    """One counter per metric and registry, shared by every exporter on that registry (each adds
    its own label values), since a registry refuses a second metric of the same name."""
    import prometheus_client

    with _registered_lock:
        counters = _registered.get(registry)
        if counters is None:
            try:
                counters = {m.name: prometheus_client.Counter(
                    m.name, m.documentation, (*_LABELS, "stage") if m.key is None else _LABELS, registry=registry)
                    for m in METRICS}
            except ValueError as e:  # the registry already holds a metric of one of these names
                raise ConfigError(f"Cannot register mmfront's metrics: {e}. Pass PrometheusExporter a registry "
                                  "of its own (prometheus_client.CollectorRegistry()).") from e
            _registered[registry] = counters
        return counters


class PrometheusExporter:
    """Adds what changed between snapshots to Prometheus counters labelled ``model_name`` and
    ``engine`` (vLLM's labels; ``engine`` is the engine index as a string).

    Call :meth:`update` (or :meth:`observe`) as often as the scrape interval needs; each call
    costs a dict of numbers. A value lower than the previous one means its source was reset
    (``stats.take()``, ``take_stage_times()``): the new value is counted as what accrued since.
    ``registry`` defaults to prometheus_client's global one, as vLLM's metrics do."""

    def __init__(self, model_name: str, *, engine: int | str = 0, registry: Any = None) -> None:
        try:
            import prometheus_client
        except ImportError as e:
            raise ConfigError("PrometheusExporter needs prometheus_client: pip install 'mmfront[metrics]' "
                              "(or use mmfront.metrics.snapshot, a plain dict).") from e
        self.model_name = model_name
        self.engine = str(engine)
        self.registry = prometheus_client.REGISTRY if registry is None else registry
        counters = _counters(self.registry)
        labels = (model_name, self.engine)
        self._children = {m.key: counters[m.name].labels(*labels) for m in METRICS if m.key is not None}
        self._stages = counters["mmfront:stage_seconds"]
        for name in STAGES:
            self._stage_child(name)
        self._last: dict[str, float] = {}

    def _stage_child(self, name: str) -> Any:
        child = self._stages.labels(self.model_name, self.engine, name)
        self._children[STAGE_PREFIX + name] = child
        return child

    def update(self, values: Mapping[str, float]) -> None:
        """Count the increase of every key of ``values`` (a :func:`snapshot`) that is a counter."""
        for key, value in values.items():
            child = self._children.get(key)
            if child is None and key.startswith(STAGE_PREFIX):
                child = self._stage_child(key.removeprefix(STAGE_PREFIX))  # a stage outside STAGES
            if child is None:
                continue  # the hit rate, a ratio of two counters, is left to PromQL as in vLLM
            last = self._last.get(key, 0.0)
            increase = value - last if value >= last else value
            if increase > 0:
                child.inc(increase)
            self._last[key] = value

    def observe(self, preprocessor: InputPreprocessor, client: EngineClient | AsyncEngineClient | None = None,
                ) -> Snapshot:
        """:func:`snapshot`, counted; returns it for logging."""
        values = snapshot(preprocessor, client)
        self.update(values)
        return values


__all__ = ["CLIENT_KEYS", "METRICS", "PrometheusExporter", "Snapshot", "snapshot"]
