"""Starts tests/engine/echo_engine.py behind an mmfront client over ipc://, and stops both."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from test_engine_link import ECHO, stop

import preloaded
from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient, BlockingEngineClient
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.preprocess import InputPreprocessor, InputProcessor


class EchoLinks:
    """``start(*engine_args, blocking=False, **client_kwargs) -> (client, engine process)``; ``close``
    stops every engine and client it started."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.made: list[tuple[AsyncEngineClient | BlockingEngineClient, preloaded.Preloaded, InputPreprocessor]] = []

    def start(self, *engine_args: str, blocking: bool = False, **client_kwargs: Any) -> tuple[Any, preloaded.Preloaded]:
        config = MultiModalConfig(mm_processor_cache_gb=0.02)
        pre = InputPreprocessor(self.model_dir, config)
        transport = ZmqFrontendTransport("ipc")
        args = [sys.executable, str(ECHO), transport.addresses.input, transport.addresses.output, "--cache", "lru",
                "--capacity-bytes", str(config.mm_processor_cache_bytes), *engine_args]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ECHO.parent), os.environ.get("PYTHONPATH", "")])}
        proc = preloaded.popen(args, env=env)
        transport.wait_for_engines([0], 60)
        client_kwargs.setdefault("engine_timeout_s", 60.0)
        kind = BlockingEngineClient if blocking else AsyncEngineClient
        client = kind(InputProcessor(pre), transport, **client_kwargs)
        self.made.append((client, proc, pre))
        return client, proc

    def close(self) -> None:
        for client, proc, pre in self.made:
            stop(proc)
            if isinstance(client, BlockingEngineClient):
                client.close()
            else:
                client.close_blocking()
            if pre.cache is not None:
                pre.cache.close()
