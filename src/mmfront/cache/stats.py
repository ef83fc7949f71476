"""Per-request processor-cache statistics for the frontend's metrics and logs.

The caches count lookups (``CacheInfo``); the frontend turns those counts into per-request
records after each multimodal request, and flags a reset when the cache is cleared so a
rolling hit-rate window can start over instead of mixing two cache lifetimes.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmfront.cache.base import BaseMultiModalProcessorCache


@dataclass
class MultiModalCacheStats:
    """Requests, item lookups (``queries``) and hits since the last :meth:`take` (vLLM's names)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    reset: bool = False
    """The cache was cleared; consumers drop the history they aggregated before."""

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def record(self, num_queries: int, num_hits: int) -> None:
        """Count one multimodal request that made ``num_queries`` lookups, ``num_hits`` of them hits."""
        self.requests += 1
        self.queries += num_queries
        self.hits += num_hits

    def record_request(self, cache: BaseMultiModalProcessorCache, *, counted: bool = True) -> None:
        """Record the lookups ``cache`` counted since the previous call (call once per commit).
        ``counted=False`` drops them instead: a prompt's later commits (its other choices, beam
        steps, resends), which vLLM, processing the prompt once, never looks up."""
        delta = cache.make_stats(delta=True)
        if counted:
            self.record(delta.total, delta.hits)

    def clear_cache(self, cache: BaseMultiModalProcessorCache) -> None:
        """Clear ``cache`` (vLLM's ``reset_mm_cache``) and flag the reset for the consumers."""
        cache.clear_cache()
        self.reset = True

    def take(self) -> MultiModalCacheStats:
        """The counts so far, leaving this record empty for the next logging interval."""
        out = MultiModalCacheStats(self.requests, self.queries, self.hits, self.reset)
        self.requests = self.queries = self.hits = 0
        self.reset = False
        return out
