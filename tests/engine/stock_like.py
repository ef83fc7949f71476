"""An engine that speaks vLLM's protocol only, as a stock vLLM 0.33 engine core does, for tests
that need one without the vLLM venv (tests/engine/test_handshake.py, test_data_parallel.py).

It meets P0 through vLLM's handshake as rank ``engine_index`` announcing no mmfront extras.
Outputs are its one reply (token k of a request is 1000 + 10 * n + k, n = images that arrived
resolved); a reference to an item it does not hold is vLLM's miss output; it records the
requests and aborts it got, answers utility calls with ``(engine_index, method)``, and can
forget its cache, stall, or die.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import DataParallelConfig, EngineInfo, FrontendHandshake, engine_handshake
from mmfront.engine.transports.zmq import ZmqEngineTransport, ZmqFrontendTransport
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.handshake import EngineCoreReadyResponse
from mmfront.wire.messages import (
    ABORT,
    ENGINE_OUTPUTS,
    REQUEST,
    UTILITY,
    Direction,
    decode_message,
    encode_envelope,
    utility_result,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason, UtilityOutput

READY = EngineCoreReadyResponse(max_model_len=4096, num_gpu_blocks=1234, block_size=16)


def engine_in_thread(address: str, engine_index: int = 0, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``engine_handshake`` on a thread; its transport (or error) lands in the box."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["transport"] = engine_handshake(address, engine_index, READY, **kwargs)
        except Exception as e:  # handed to the test
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


class StockLikeEngine:
    def __init__(self, address: str, engine_index: int = 0, *, local: bool = False) -> None:
        self.engine_index = engine_index
        self.held: set[str] = set()
        self.seen: list[EngineCoreRequest] = []
        self.aborted: list[str] = []
        self.calls: list[str] = []
        self.stall_s = 0.0
        self.address = address
        self._stop = threading.Event()
        self._encoder = MsgpackEncoder()
        thread, self._box = engine_in_thread(address, engine_index, extras=(), local=local, side_channel=False)
        thread.join(30)
        self.transport: ZmqEngineTransport = self._box["transport"]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            frames = self.transport.recv(0.05)
            if frames is None:
                continue
            message = decode_message(frames, Direction.TO_ENGINE)
            if message.kind == ABORT:
                self.aborted += message.body
                continue
            if message.kind == UTILITY:
                self.calls.append(message.body.method_name)
                self._reply(EngineCoreOutputs(utility_output=UtilityOutput(
                    message.body.call_id, None, utility_result([self.engine_index, message.body.method_name]))))
                continue
            if message.kind != REQUEST:
                continue
            assert message.stamp is None  # no stamps for an engine that announced no mirror
            self._answer(message.body)

    def _answer(self, request: EngineCoreRequest) -> None:
        self.seen.append(request)
        features = request.mm_features or []
        missing = [f.mm_hash for f in features if f.data is None and f.mm_hash not in self.held]
        if missing:
            out = EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.ERROR,
                                   mm_cache_miss_hashes=missing)
        else:
            self.held.update(f.mm_hash for f in features if f.mm_hash is not None)
            if self._stop.wait(self.stall_s):
                return
            n = len(features)
            out = EngineCoreOutput(request.request_id, [1000 + 10 * n + k for k in range(2)],
                                   finish_reason=FinishReason.LENGTH)
        self._reply(EngineCoreOutputs(outputs=[out], finished_requests={request.request_id}))

    def _reply(self, outputs: EngineCoreOutputs) -> None:
        outputs.engine_index = self.engine_index
        self.transport.send(encode_envelope(ENGINE_OUTPUTS, self._encoder.encode(outputs)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.transport.close()


@dataclass
class Ranks:
    client: AsyncEngineClient
    engines: list[StockLikeEngine]
    infos: list[EngineInfo]
    pre: InputPreprocessor


def start_stock_like(model_dir: Path, size: int, *, local: bool, engine_timeout_s: float = 0.5) -> Ranks:
    """P0 (a client on ``model_dir``'s processor) and ``size`` stock-like ranks met through the handshake."""
    pre = InputPreprocessor(model_dir, MultiModalConfig(mm_processor_cache_gb=0.02))
    p0 = ZmqFrontendTransport("ipc" if local else "tcp")
    parallel = DataParallelConfig(size, size if local else 0, "127.0.0.1", 0)
    box: dict[str, Any] = {}
    with FrontendHandshake(p0, parallel) as handshake:
        waiting = threading.Thread(target=lambda: box.update(infos=handshake.wait(30)), daemon=True)
        waiting.start()
        engines = [StockLikeEngine(handshake.address, rank, local=local) for rank in range(size)]
        waiting.join(30)
    infos = box["infos"]
    return Ranks(AsyncEngineClient(InputProcessor(pre), p0, engine_timeout_s=engine_timeout_s, engines=infos), engines, infos, pre)
