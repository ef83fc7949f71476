"""What the engine client tells its caller: a request admitted, failed or producing output, and a
utility call answered. ``EngineClient.handle_reply`` returns these; the asyncio client turns them
into stream items and errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmfront.errors import MMFrontError
from mmfront.wire import EngineCoreRequest
from mmfront.wire.structs import EngineCoreOutput, UtilityOutput


@dataclass(frozen=True)
class RequestAdmitted:
    """P1 admitted the request. ``request`` is what the engine got, when P1 echoes it."""

    request_id: str
    request: EngineCoreRequest | None = None


@dataclass(frozen=True)
class RequestFailed:
    """The request cannot be served: committing or sending it again failed, or the engine
    restarted while it was generating. Cache misses never fail a request (see ``InFlight``)."""

    request_id: str
    error: MMFrontError


@dataclass(frozen=True)
class RequestOutput:
    """One step output of an admitted request (its last has ``finish_reason`` set)."""

    request_id: str
    output: EngineCoreOutput


@dataclass(frozen=True)
class UtilityReply:
    """The engine answered a utility call (:meth:`EngineClient.call_utility`)."""

    output: UtilityOutput


@dataclass(frozen=True)
class EngineStep:
    """One message of engine outputs, for statistics (``EngineClient(step_events=True)``): what
    vLLM's output handler reads besides the outputs themselves. It comes before the step's
    :class:`RequestOutput` events, and ``outputs`` holds theirs (the requests this client runs)."""

    engine_index: int
    timestamp: float
    """The engine's clock when it sent the step (``time.monotonic`` of the engine's host)."""
    scheduler_stats: Any
    """vLLM's ``SchedulerStats`` as msgpack decoded it (a ``dict``), or ``None`` from an engine
    started with ``--disable-log-stats`` or one that keeps none."""
    outputs: list[EngineCoreOutput]
    weight_version: str | None = None
    """The label of the weights that made the step (vLLM's engine sends ``"default"`` until its
    weights are updated)."""


ClientEvent = RequestAdmitted | RequestFailed | RequestOutput | UtilityReply | EngineStep


__all__ = ["ClientEvent", "EngineStep", "RequestAdmitted", "RequestFailed", "RequestOutput", "UtilityReply"]
