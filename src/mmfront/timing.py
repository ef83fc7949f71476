"""Where the frontend's time goes: wall time per pipeline stage, summed over every thread.

The stages are the ones a request passes through on P0: ``load`` (chat parsing, media loading,
the chat template), ``hash``, ``cache`` (lookups and the commit), ``hf`` (the HF processor on the
misses), ``updates`` (placing the placeholders), ``encode`` and ``send``. Recording costs two
``perf_counter`` calls and a locked add (well under a microsecond), so it is always on; a
reader takes a snapshot with :func:`take_stage_times`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

STAGES: Final = ("load", "hash", "cache", "hf", "updates", "encode", "send")

_lock = threading.Lock()
_seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Charge the time spent in the ``with`` block to stage ``name``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        with _lock:
            _seconds[name] = _seconds.get(name, 0.0) + elapsed


def take_stage_times(*, reset: bool = True) -> dict[str, float]:
    """Seconds per stage since the last reset (summed over threads, so they may exceed wall time)."""
    with _lock:
        out = dict(_seconds)
        if reset:
            for name in _seconds:
                _seconds[name] = 0.0
    return out


__all__ = ["STAGES", "stage", "take_stage_times"]
