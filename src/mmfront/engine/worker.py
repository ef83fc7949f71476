"""``mmfront worker``: a reference engine process that runs a real HF model behind mmfront.

It is built only on what an existing engine would embed: :class:`EngineCoreReceiver` over the
ZMQ transport takes requests (features filled in from the P1 cache), a
:class:`~mmfront.engine.runner.ModelRunner` encodes the items, places their embeddings and
decodes greedily, and the receiver streams the outputs back. The loop below is the whole engine
(docs/engine.md walks through it as the example of embedding the receiver).
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from mmfront.cache.base import BaseMultiModalReceiverCache
from mmfront.cache.factory import engine_receiver_cache_from_config, worker_receiver_cache_from_config
from mmfront.config import MultiModalConfig
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.runner import ModelRunner
from mmfront.engine.zmq import ZmqAddresses, ZmqEngineTransport
from mmfront.errors import MMFrontError
from mmfront.wire.structs import EngineCoreOutput, FinishReason, RequestError

logger = logging.getLogger(__name__)


@dataclass
class WorkerStats:
    """What the engine did: requests served, tokens generated, encoder cache hits and lookups."""

    requests: int = 0
    tokens: int = 0
    encoder_hits: int = 0
    encoder_lookups: int = 0


def receiver_cache(config: MultiModalConfig, shm_name: str | None) -> BaseMultiModalReceiverCache | None:
    """P1's cache for ``config``: the mirrored LRU (``lru``), a reader of P0's segment (``shm``)."""
    if config.mm_processor_cache_type == "shm":
        return worker_receiver_cache_from_config(config, shm_name=shm_name)
    return engine_receiver_cache_from_config(config)


def serve(receiver: EngineCoreReceiver, runner: ModelRunner, stop: threading.Event, stats: WorkerStats) -> None:
    """The engine loop: admit what arrived, drop what was aborted, run one step, send its outputs."""
    while not stop.is_set():
        for request in receiver.poll(0.0 if runner.has_unfinished_requests else 0.05):
            try:
                runner.add(request)
                stats.requests += 1
            except MMFrontError as e:
                receiver.send([EngineCoreOutput(
                    request.request_id, [], finish_reason=FinishReason.ERROR,
                    error=RequestError(type(e).__name__, str(e)))])
        for request_id in receiver.take_aborted():
            runner.abort(request_id)
        if runner.has_unfinished_requests:
            outputs = runner.step()
            stats.tokens += sum(len(o.new_token_ids) for o in outputs)
            receiver.send(outputs)
    info = runner.encoder_cache_stats()
    stats.encoder_hits, stats.encoder_lookups = info.hits, info.total


def run_worker(
    model_dir: str | Path, addresses: ZmqAddresses, config: MultiModalConfig | None = None, *,
    engine_index: int = 0, shm_name: str | None = None, device: str | None = None, dtype: str | None = None,
    stop: threading.Event | None = None,
) -> WorkerStats:
    """Serve until ``stop`` is set (in the process's main thread: also on SIGTERM or SIGINT)."""
    config = config or MultiModalConfig()
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    runner = ModelRunner(model_dir, device=device, dtype=dtype)
    stats = WorkerStats()
    transport = ZmqEngineTransport(addresses, engine_index)
    with EngineCoreReceiver(transport, receiver_cache(config, shm_name), engine_index=engine_index) as receiver:
        logger.info("mmfront worker %d serving %s on %s", engine_index, model_dir, addresses)
        serve(receiver, runner, stop, stats)
    return stats


__all__ = ["WorkerStats", "receiver_cache", "run_worker", "serve"]
