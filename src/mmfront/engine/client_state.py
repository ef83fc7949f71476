"""What the engine client keeps track of: each data-parallel rank (its P0 cache, what it
announced, how busy it is), each request in flight (prepared, so it can be sent again), and what
drift cost. Mutated in the client's commit lane only."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mmfront.engine.handshake import EngineInfo
from mmfront.preprocess import InputProcessor, PreparedRequest


@dataclass
class EngineRank:
    """One data-parallel rank as this client sees it. Mutated in the commit lane only."""

    index: int
    processor: InputProcessor
    """Prepares and commits this rank's requests against its own P0 cache."""
    info: EngineInfo | None
    extras: frozenset[str]
    """The mmfront extras this engine announced; none for a stock vLLM engine."""
    epoch: int | None = None
    """The engine process's epoch (mmfront engines greet with one); a new one means a restart."""
    outstanding: int = 0
    """Requests of this client on this rank: chosen for it and not finished."""
    sent: int = 0
    """Requests sent to it (resends not counted)."""
    last_heard: float = field(default_factory=time.monotonic)
    """When a message last arrived from it (``time.monotonic``)."""


@dataclass
class InFlight:
    """A request sent (or being sent) and not yet admitted, or admitted and still running: kept
    prepared, so a cache miss or an engine restart can send it again without processing it again."""

    prepared: PreparedRequest
    rank: EngineRank
    complete: bool = False
    """Its latest send carried the data of every item, which P1 admits in any state (in the
    mirror, outside it, with an empty cache): a miss arriving now answers an earlier copy (one
    in transit through a restart or reset, a duplicate) and is ignored."""
    produced: bool = False


@dataclass
class ClientStats:
    """What drift cost: ``resends`` after a cache miss, ``shadow_resets`` of P0's mirror,
    ``mirror_only`` messages for requests rejected after their commit, and ``failures``:
    requests reported to the caller as failed."""

    resends: int = 0
    shadow_resets: int = 0
    mirror_only: int = 0
    failures: int = 0
    engine_restarts: int = 0
    wire_bytes: int = 0
    """Bytes of every request envelope sent (resends included)."""
    saved_bytes: int = 0
    """Bytes of the items sent as references to what P1 holds instead of with their data."""



__all__ = ["ClientStats", "EngineRank", "InFlight"]
