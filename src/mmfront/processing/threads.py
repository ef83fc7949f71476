"""The thread budget: how many threads the frontend's processing runs at once.

Three kinds of thread compete for the cores: torch's intra-op threads (image resizing and
normalizing), the pool that decodes a request's images in parallel, and the processing lanes.
Left alone, torch starts one intra-op thread per core in *every* call, while several requests are
prepared at once, so a 2-core machine runs 2 x 2 torch threads plus the decoders; under outside
CPU load each of them waits for a core, and a miss takes twice as long (vLLM's frontend runs torch
on one thread). :class:`ThreadPlan` divides one budget (``MultiModalConfig.mm_thread_budget``,
the cores by default): torch gets one thread per caller (parallelism comes from the prepare
threads and the lanes, which never oversubscribe), each lane is one runnable thread, and the
decode pool gets what the lanes leave.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from mmfront.config import MultiModalConfig
from mmfront.parse import MediaWithBytes

T = TypeVar("T")
R = TypeVar("R")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers narrow), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadPlan:
    """How one budget of runnable threads is divided."""

    budget: int
    """Runnable threads in all (``mm_thread_budget``, or the cores)."""
    lanes: int
    """Worker processes (or actors) processing misses; 0 processes in the caller's threads."""
    torch_threads: int
    """Intra-op threads of torch in the frontend process and in each lane."""
    decode_threads: int
    """Threads of the frontend's pool that decodes several images of one request at once."""

    @classmethod
    def from_config(cls, config: MultiModalConfig, *, in_place_misses: bool = False) -> ThreadPlan:
        """``mm_processing_lanes=None`` is no lane where the processor's misses run in mmfront's
        own kernels (``in_place_misses``), else one per core of the budget but one (at least 1)."""
        budget = config.mm_thread_budget or available_cores()
        lanes = config.mm_processing_lanes
        if lanes is None:
            lanes = 0 if in_place_misses else max(1, budget - 1)
        decode = budget if lanes == 0 else max(1, budget - lanes)
        return cls(budget=budget, lanes=lanes, torch_threads=1, decode_threads=decode)


_decode_lock = threading.Lock()
_decode_pool: ThreadPoolExecutor | None = None
_decode_threads = available_cores()


class _PoolMark(threading.local):
    """Whether the current thread is one of the decode pool's."""

    active = False


_on_pool = _PoolMark()


def apply_thread_plan(plan: ThreadPlan) -> None:
    """Set torch's intra-op threads and the decode pool's size for this process (both are
    process-wide: the last plan applied wins)."""
    global _decode_pool, _decode_threads
    torch.set_num_threads(plan.torch_threads)
    with _decode_lock:
        if plan.decode_threads != _decode_threads:
            # A decode running on the old pool finishes there; its idle threads exit once the
            # pool is collected.
            _decode_threads, _decode_pool = plan.decode_threads, None


def map_items(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(item) for item in items]``, in parallel on the decode pool when there are several:
    for the per-item work of one request that runs without the GIL (Pillow's decoders, torch's
    resize, the pixel tables), so a request's images use the cores even with one request in flight.
    Called from a pool thread (an item's work mapping its own parts), it runs in that thread: a
    pool thread waiting on the pool could wait for ever."""
    global _decode_pool
    if len(items) <= 1 or _decode_threads == 1 or _on_pool.active:
        return [fn(item) for item in items]
    with _decode_lock:
        if _decode_pool is None:
            _decode_pool = ThreadPoolExecutor(max_workers=_decode_threads, thread_name_prefix="mmfront-decode",
                                              initializer=_mark_pool_thread)
        pool = _decode_pool
    return list(pool.map(fn, items))


def _mark_pool_thread() -> None:
    _on_pool.active = True


def decode_all(items: Sequence[MediaWithBytes[Any]], *, pixels: bool = False) -> None:
    """Decode lazy items, in parallel when there are several, on at most the plan's decode threads;
    ``pixels``: straight into arrays where they can (for a processor that ``reads_pixels``)."""
    map_items(lambda item: item.ensure_decoded(pixels=pixels), items)


__all__ = ["ThreadPlan", "apply_thread_plan", "available_cores", "decode_all", "map_items"]
