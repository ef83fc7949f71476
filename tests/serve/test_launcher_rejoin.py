"""With ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` the handshake socket stays open after start-up: a headless
engine that dies fails what it had at once, ``/health`` answers 503, and the same rank restarted
(``mmfront worker --data-parallel-address``, or vLLM's ``vllm serve --headless`` through
``../shared/peer/stock_engine.py``, skipped where the peer venv is absent) greets the handshake again,
rejoins, and ``/health`` answers 200 with requests answered as before. vLLM 0.33's API server closes
that socket, so its restarted engine waits forever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from serve_harness import run_app
from test_launcher_headless import CHAT, NO_PEER, PEER_MODEL, engine_command

from mmfront import MultiModalConfig
from mmfront.engine.handshake import DataParallelConfig
from mmfront.errors import EngineDeadError
from mmfront.network import get_open_port
from mmfront.serve.app import create_app
from mmfront.serve.launcher import Frontend, start_frontend
from mmfront.serve.settings import ServePlan, ServeSettings
from mmfront.testing.peer import SKIP_REASON
from mmfront.wire import SamplingParams

pytestmark = pytest.mark.slow


def start_engine(kind: str, model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command, cwd = engine_command(kind, model, port)
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)


def kill(engine: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(engine.pid, signal.SIGKILL)
    engine.wait(30)


def health(url: str) -> int:
    return httpx.get(url + "/health", timeout=10).status_code


def wait_for(check: object, what: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} within {timeout} s\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.2)


def tokens(frontend: Frontend, request_id: str) -> list[int]:
    async def answer() -> list[int]:
        stream = await frontend.client.add_request(request_id, CHAT, SamplingParams(max_tokens=3, temperature=0.0))
        return [t async for output in stream for t in output.new_token_ids]

    return asyncio.run(asyncio.wait_for(answer(), 120))


@pytest.mark.parametrize("kind", ["mmfront worker", pytest.param("vllm engine", marks=[
    pytest.mark.vllm_side_by_side, pytest.mark.skipif(NO_PEER, reason=SKIP_REASON)])])
def test_a_restarted_headless_engine_rejoins_with_keep_alive(gemma3_weights_dir: Path, tmp_path: Path,
                                                             kind: str) -> None:
    model = gemma3_weights_dir if kind == "mmfront worker" else PEER_MODEL
    assert model is not None
    port = get_open_port()
    log = tmp_path / "engine.log"
    plan = ServePlan(ServeSettings(model, served_model_name=("tiny",)),
                     MultiModalConfig(mm_processor_cache_gb=0.02, mm_processing_lanes=0),
                     DataParallelConfig(1, 0, "127.0.0.1", port), engine_ready_timeout_s=280, engine_timeout_s=3)
    engine = start_engine(kind, model, port, log)
    try:
        frontend = start_frontend(plan, keep_alive=True)
        try:
            assert frontend.rejoins is not None
            first = tokens(frontend, "before")
            with run_app(create_app(frontend.client, plan.settings)) as url:
                assert health(url) == 200
                kill(engine)
                with pytest.raises(EngineDeadError):  # an mmfront worker's silence is its death once a request waits
                    tokens(frontend, "on the dead engine")
                assert health(url) == 503
                engine = start_engine(kind, model, port, log)
                wait_for(lambda: health(url) == 200, "/health answers 200 again after the restart", 280, log)
            assert tokens(frontend, "after") == first
            if kind == "vllm engine":
                assert first == [1010, 1011, 1012]  # the stub executor: the image reached the new engine with its data
        finally:
            frontend.close()
    finally:
        kill(engine)


def test_without_keep_alive_the_handshake_closes_after_start_up(gemma3_weights_dir: Path, tmp_path: Path) -> None:
    port = get_open_port()
    plan = ServePlan(ServeSettings(gemma3_weights_dir), MultiModalConfig(mm_processor_cache_gb=0.02,
                                                                          mm_processing_lanes=0),
                     DataParallelConfig(1, 0, "127.0.0.1", port), engine_ready_timeout_s=280)
    engine = start_engine("mmfront worker", gemma3_weights_dir, port, tmp_path / "engine.log")
    try:
        frontend = start_frontend(plan)
        try:
            assert frontend.rejoins is None
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
        finally:
            frontend.close()
    finally:
        kill(engine)
