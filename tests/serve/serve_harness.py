"""One ``mmfront worker`` engine (a thread, met through vLLM's handshake), the client over it and
the app served by uvicorn on a free loopback port, for the tests of ``mmfront.serve``; and the
text vLLM's streaming detokenizer makes of the model's own answers
(``local_services.greedy_answers``), to compare the server's text with."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import uvicorn

from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake, engine_handshake
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.runner import ModelRunner
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.engine.worker import WORKER_EXTRAS, WorkerStats, ready_response, receiver_caches
from mmfront.engine.worker import serve as serve_engine
from mmfront.serve.app import create_app
from mmfront.serve.settings import ServeSettings
from mmfront.testing.servers import run_uvicorn

MODEL_NAME = "tiny"


@dataclass
class Served:
    """A running server: its base URL, the client and preprocessor behind it, and the worker."""

    url: str
    client: AsyncEngineClient
    preprocessor: InputPreprocessor
    stop_worker: threading.Event
    worker: threading.Thread
    worker_stats: WorkerStats
    """The engine's counts, live (requests admitted, tokens generated)."""

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def stop_engine(self) -> WorkerStats:
        """Stop the worker (the engine goes away; the server stays up); what it did."""
        self.stop_worker.set()
        self.worker.join(60)
        return self.worker_stats


@contextmanager
def serve(model_dir: Path, settings: ServeSettings | None = None, *, engine_timeout_s: float = 120,
          config: MultiModalConfig | None = None,
          runner: Callable[[Path], ModelRunner] = ModelRunner) -> Iterator[Served]:
    """``runner``: makes the engine's model runner from the folder (a test's own, to hold a step)."""
    config = config or MultiModalConfig(mm_processor_cache_gb=0.02)
    settings = replace(settings or ServeSettings(model_dir, served_model_name=(MODEL_NAME,)), model=model_dir)
    preprocessor = InputPreprocessor(model_dir, config)
    transport = ZmqFrontendTransport()
    stop = threading.Event()
    stats = WorkerStats()
    with FrontendHandshake(transport, DataParallelConfig()) as handshake:
        worker = threading.Thread(target=_worker, args=(model_dir, config, handshake.address, stop, stats, runner),
                                  daemon=True)
        worker.start()
        infos = handshake.wait(120)
    client = AsyncEngineClient(InputProcessor(preprocessor), transport, engine_timeout_s=engine_timeout_s,
                               engines=infos)
    try:
        with run_app(create_app(client, settings)) as url:
            yield Served(url, client, preprocessor, stop, worker, stats)
    finally:
        stop.set()
        worker.join(60)
        client.close_blocking()
        preprocessor.close()
        if preprocessor.cache is not None:
            preprocessor.cache.close()


def _worker(model_dir: Path, config: MultiModalConfig, address: str, stop: threading.Event,
            stats: WorkerStats, make_runner: Callable[[Path], ModelRunner]) -> None:
    """``run_worker`` met through the handshake, with ``stats`` the caller can read while it runs."""
    runner = make_runner(model_dir)
    transport = engine_handshake(address, 0, ready_response(runner), local=True, extras=WORKER_EXTRAS)
    with EngineCoreReceiver(transport, receiver_caches(config, 1, None)[0]) as receiver:
        serve_engine(receiver, runner, stop, stats)


@contextmanager
def run_app(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port (a thread); its base URL."""
    with run_uvicorn(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")) as port:
        yield f"http://127.0.0.1:{port}"


def expected_text(tokenizer: Any, token_ids: list[int]) -> str:
    """The text vLLM's streaming detokenizer makes of ``token_ids``: the whole decode, less a
    character the last tokens left incomplete (it is never completed, so never sent)."""
    ids = list(token_ids)
    while ids and str(tokenizer.decode(ids, skip_special_tokens=True)).endswith("\ufffd"):
        ids.pop()
    return str(tokenizer.decode(ids, skip_special_tokens=True))
