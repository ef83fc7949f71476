"""``mmfront worker``: a reference engine process that runs a real HF model behind mmfront.

It is built only on what an existing engine would embed: :class:`EngineCoreReceiver` over one
transport per frontend (several API servers, one engine, each frontend with its own receiver
cache; ``mmfront worker`` connects over vLLM's ZMQ sockets) takes requests (features filled in from the P1 cache), a
:class:`~mmfront.engine.runner.ModelRunner` encodes the items, places their embeddings and
decodes greedily, and the receiver streams the outputs back. A request that asks for more than
greedy decoding of one sequence (sampling, logprobs, penalties, ...) is refused with the field it
names (:mod:`mmfront.engine.reference_limits`), never answered greedily. The loop below is the whole engine
(docs/engine.md walks through it as the example of embedding the receiver).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmfront.cache.base import BaseMultiModalReceiverCache
from mmfront.cache.factory import get_processor_cache_type, receiver_cache_from_config
from mmfront.config import MultiModalConfig
from mmfront.engine.handshake import engine_handshake_all
from mmfront.engine.receiver import EngineCoreReceiver, mm_feature_limit
from mmfront.engine.reference_limits import check_reference_request
from mmfront.engine.runner import ModelRunner, error_output
from mmfront.engine.transports import EngineTransportFactory
from mmfront.engine.utilities import WorkerUtilities
from mmfront.errors import ConfigError, MMFrontError
from mmfront.wire.handshake import (
    EXTRA_ADMITTED,
    EXTRA_HEARTBEAT,
    EXTRA_MIRROR,
    EXTRA_REFERENCE_LIMITS,
    EngineCoreReadyResponse,
)
from mmfront.wire.structs import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput

logger = logging.getLogger(__name__)

WORKER_EXTRAS = (EXTRA_MIRROR, EXTRA_ADMITTED, EXTRA_HEARTBEAT, EXTRA_REFERENCE_LIMITS)
"""What ``mmfront worker`` announces in vLLM's handshake: the receiver's extras, and that it is
the reference engine, so mmfront's client refuses what it cannot honour before sending it."""


@dataclass
class WorkerStats:
    """What the engine did: requests served, tokens generated, encoder cache hits and lookups,
    and messages dropped because their frontend did not read them (refusals, heartbeats)."""

    requests: int = 0
    tokens: int = 0
    encoder_hits: int = 0
    encoder_lookups: int = 0
    messages_dropped: int = 0


class StepStats:
    """What a stock vLLM engine that keeps statistics tells its API servers, kept for mmfront's
    engine: a request's first output carries its ``QUEUED`` and ``SCHEDULED`` events and its
    ``PrefillStats`` (every prompt token computed: the runner keeps no prefix cache), and every
    step its ``SchedulerStats`` (the requests running; no KV-cache blocks to count). The API
    server's ``vllm:`` metrics and stats line are made of these."""

    def __init__(self) -> None:
        self.queued: dict[str, tuple[float, int]] = {}
        """Requests admitted and not yet stepped: when, and their prompt's length."""

    def admitted(self, request_id: str, prompt_tokens: int) -> None:
        self.queued[request_id] = (time.time(), prompt_tokens)

    def aborted(self, request_id: str) -> None:
        self.queued.pop(request_id, None)

    def idle(self) -> dict[str, Any]:
        """The ``SchedulerStats`` of an engine with nothing to run."""
        return {"num_running_reqs": 0, "num_waiting_reqs": len(self.queued), "num_skipped_waiting_reqs": 0,
                "kv_cache_usage": 0.0}

    def stepped(self, outputs: Sequence[EngineCoreOutput], scheduled: float, running: int) -> dict[str, Any]:
        """Put the events and prefill statistics on the first outputs; the step's ``SchedulerStats``."""
        for output in outputs:
            first = self.queued.pop(output.request_id, None)
            if first is None:
                continue
            queued, prompt = first
            output.events = [EngineCoreEvent(EngineCoreEventType.QUEUED, queued),
                             EngineCoreEvent(EngineCoreEventType.SCHEDULED, scheduled)]
            output.prefill_stats = {"num_prompt_tokens": prompt, "num_computed_tokens": prompt, "num_cached_tokens": 0,
                                    "num_local_cached_tokens": 0, "num_external_cached_tokens": 0,
                                    "num_cache_creation_tokens": 0}
        return {"num_running_reqs": running, "num_waiting_reqs": len(self.queued), "num_skipped_waiting_reqs": 0,
                "kv_cache_usage": 0.0}


def serve(receiver: EngineCoreReceiver, runner: ModelRunner, stop: threading.Event, stats: WorkerStats) -> None:
    """The engine loop: admit what arrived (refusing what the reference engine cannot honour,
    :mod:`mmfront.engine.reference_limits`), drop what was aborted, run one step, send its outputs
    (with the statistics of :class:`StepStats`). While the engine sleeps
    (:class:`~mmfront.engine.utilities.WorkerUtilities`) it runs no step: requests are admitted and held."""
    utilities = WorkerUtilities(runner, receiver)
    receiver.utilities = utilities.methods
    step_stats = StepStats()
    while not stop.is_set():
        stepping = runner.has_unfinished_requests and not utilities.paused
        for request in receiver.poll(0.0 if stepping else 0.05):
            try:
                check_reference_request(request)
                runner.add(request)
                stats.requests += 1
                step_stats.admitted(request.request_id, len(request.prompt_token_ids or ()))
            except MMFrontError as e:
                receiver.send([error_output(request.request_id, e)])
        aborted = receiver.take_aborted()
        for request_id in aborted:
            runner.abort(request_id)
            step_stats.aborted(request_id)
        if aborted and not runner.has_unfinished_requests:  # no step will say so
            receiver.send_scheduler_stats(step_stats.idle())
        if runner.has_unfinished_requests and not utilities.paused:
            scheduled = time.time()
            outputs = runner.step()
            stats.tokens += sum(len(o.new_token_ids) for o in outputs)
            running = len(runner.request_ids)
            receiver.send(outputs, step_stats.stepped(outputs, scheduled, running))
    info = runner.encoder_cache_stats()
    stats.encoder_hits, stats.encoder_lookups = info.hits, info.total
    stats.messages_dropped = receiver.messages_dropped


class StopSignals:
    """SIGTERM and SIGINT in the process's main thread, taken as vLLM's engine core takes them:
    while the engine starts (loading the model, the handshake) they end the start-up at once
    (``SystemExit``; a handshake whose frontend is gone would otherwise wait out its timeout),
    and while it serves they set ``stop``, so the loop ends after its step. Only the first signal
    acts: the server's SIGTERM to the engine's group and the kernel's parent-death SIGTERM can
    come together, and a handler that ran ``stop.set()`` again inside the first one's
    ``stop.set()`` would wait forever on the lock that call holds (the orphan this guards
    against: a worker idle for half an hour after its server was killed)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.serving = False
        """Set once the engine serves: from then on a signal sets ``stop``."""
        self.received = False

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self)

    def __call__(self, signum: int, frame: object) -> None:
        if self.received:
            return
        self.received = True
        if not self.serving:
            raise SystemExit
        self.stop.set()


PARENT_POLL_S = 0.2
"""How often a local engine looks whether its server (its parent process) is still there."""


def stop_with_parent(poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """For an engine its server started (``mmfront worker --local``): SIGTERM this process (see
    :class:`StopSignals`) once the parent it has now is gone, whatever the stage. The kernel's
    parent-death signal (``PR_SET_PDEATHSIG``, set by the launcher) does this on Linux when the
    thread that started the engine ends; this watch also covers a server that died before that
    was set, a launcher without it, and other systems."""
    parent = os.getppid()

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        logger.error("The server (pid %d) that started this engine is gone: stopping.", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=run, name="mmfront-parent-watch", daemon=True)
    thread.start()
    return thread


def receiver_caches(
    config: MultiModalConfig, frontends: int, shm_name: str | Sequence[str] | None,
) -> list[BaseMultiModalReceiverCache | None]:
    """One receiver cache per frontend, so each keeps its own mirror (``lru``) or reads its own
    segment (``shm``: ``shm_name`` gives one segment name per frontend, in the same order)."""
    if get_processor_cache_type(config) != "shm":
        return [receiver_cache_from_config(config) for _ in range(frontends)]
    names = [shm_name] if shm_name is None or isinstance(shm_name, str) else list(shm_name)
    if len(names) != frontends:
        raise ConfigError(f"The shm cache needs one segment name per frontend: {frontends} frontends, "
                          f"{len(names)} names; pass the names in the order of the frontends' addresses.")
    return [receiver_cache_from_config(config, shm_name=name) for name in names]


def ready_response(runner: ModelRunner) -> EngineCoreReadyResponse:
    """What this engine tells a frontend at start-up. The runner keeps each sequence's whole KV
    cache, so its "blocks" are of one token: one sequence of ``max_model_len`` fits."""
    return EngineCoreReadyResponse(max_model_len=runner.max_model_len, num_gpu_blocks=runner.max_model_len,
                                   block_size=1, dtype=str(runner.dtype).removeprefix("torch."))


def run_worker(
    model_dir: str | Path, frontends: Sequence[EngineTransportFactory], config: MultiModalConfig | None = None,
    *, engine_index: int = 0, shm_name: str | Sequence[str] | None = None, device: str | None = None,
    dtype: str | None = None, stop: threading.Event | None = None, handshake: Sequence[str] = (),
    local: bool = False,
) -> WorkerStats:
    """Serve ``frontends`` (one engine, any number of API servers; each connects this engine's
    transport to one) until ``stop`` is set (in the process's main thread: also on SIGTERM or
    SIGINT).

    Each frontend gets its own receiver cache and its requests get its position in
    ``frontends`` as ``client_index``. Request ids must be distinct across frontends: a
    duplicate of a running id is refused to its sender (see docs/engine.md). A frontend whose
    link breaks is dropped with its requests; the others are served on.

    ``handshake`` lists more frontends by their handshake address: the engine meets each through
    vLLM's start-up handshake (as a ``local`` engine or a headless one), which tells it where
    the data sockets of every API server are (one frontend each) and tells the frontend this
    engine's limits and mmfront extras."""
    if not frontends and not handshake:
        raise ConfigError("run_worker needs at least one frontend to connect to.")
    config = config or MultiModalConfig()
    stop = stop or threading.Event()
    signals = StopSignals(stop)
    if threading.current_thread() is threading.main_thread():
        signals.install()
    runner = ModelRunner(model_dir, device=device, dtype=dtype)
    ready = ready_response(runner)
    transports = [connect(engine_index) for connect in frontends]
    try:
        for address in handshake:
            transports += engine_handshake_all(address, engine_index, ready, local=local, extras=WORKER_EXTRAS)
        caches = receiver_caches(config, len(transports), shm_name)
        signals.serving = True
    except BaseException:
        for transport in transports:
            transport.close()
        raise
    stats = WorkerStats()
    receiver = EngineCoreReceiver(transports[0], caches[0], engine_index=engine_index,
                                  max_mm_features=mm_feature_limit(config))
    with receiver:
        for transport, cache in zip(transports[1:], caches[1:]):
            receiver.add_frontend(transport, cache)
        logger.info("mmfront worker %d serving %s to %d frontends", engine_index, model_dir, len(transports))
        serve(receiver, runner, stop, stats)
    return stats


__all__ = ["PARENT_POLL_S", "WORKER_EXTRAS", "StepStats", "StopSignals", "WorkerStats", "ready_response",
           "receiver_caches", "run_worker", "serve", "stop_with_parent"]
