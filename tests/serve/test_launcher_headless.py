"""``mmfront serve --data-parallel-size-local 0`` starts no engine and waits for a headless one on
``tcp://data_parallel_address:data_parallel_rpc_port``, as ``vllm serve`` does: mmfront's own
(``mmfront worker --data-parallel-address``) or a stock vLLM 0.33 engine core
(``../shared/peer/stock_engine.py``, ``vllm serve --headless`` with a stub executor; skipped
where the peer venv is absent)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.engine.handshake import DataParallelConfig
from mmfront.network import get_open_port
from mmfront.serve.launcher import Frontend, start_frontend
from mmfront.serve.settings import ServePlan, ServeSettings
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import EXTRA_MIRROR

pytestmark = pytest.mark.slow

PEER = vllm_peer_python()
PEER_MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
PEER_DIR = Path(__file__).resolve().parents[3] / "shared" / "peer"
NO_PEER = PEER is None or PEER_MODEL is None or not PEER_DIR.is_dir()
IMAGE = image_data_url(make_image(40, 32, seed=3))
CHAT: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                                           {"type": "text", "text": "What is this?"}]}]


def engine_command(kind: str, model: Path, port: int) -> tuple[list[str], Path | None]:
    if kind == "mmfront worker":
        return [sys.executable, "-m", "mmfront.cli", "worker", str(model), "--data-parallel-address", "127.0.0.1",
                "--data-parallel-rpc-port", str(port), "--cache-gb", "0.02"], None
    assert PEER is not None
    return [str(PEER), str(PEER_DIR / "stock_engine.py"), str(model), f"tcp://127.0.0.1:{port}"], PEER_DIR


@pytest.mark.parametrize("kind", ["mmfront worker", pytest.param("vllm engine", marks=pytest.mark.skipif(
    NO_PEER, reason=SKIP_REASON))])
def test_with_no_local_engine_it_waits_for_a_headless_one(gemma3_weights_dir: Path, kind: str) -> None:
    model = gemma3_weights_dir if kind == "mmfront worker" else PEER_MODEL
    assert model is not None
    port = get_open_port()
    plan = ServePlan(ServeSettings(model), MultiModalConfig(mm_processor_cache_gb=0.02, mm_processing_lanes=0),
                     DataParallelConfig(1, 0, "127.0.0.1", port), engine_ready_timeout_s=280)
    started: list[Frontend | BaseException] = []

    def serve() -> None:
        try:
            started.append(start_frontend(plan))
        except BaseException as e:
            started.append(e)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    command, cwd = engine_command(kind, model, port)
    engine = subprocess.Popen(command, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                              stdout=subprocess.DEVNULL)
    try:
        server.join(290)
        [frontend] = started
        assert isinstance(frontend, Frontend), frontend
        try:
            [info] = frontend.infos
            assert not info.local and frontend.engines is None
            assert (EXTRA_MIRROR in info.extras) == (kind == "mmfront worker")

            async def answer() -> list[int]:
                stream = await frontend.client.add_request("h", CHAT, SamplingParams(max_tokens=3, temperature=0.0))
                return [t async for output in stream for t in output.new_token_ids]

            tokens = asyncio.run(asyncio.wait_for(answer(), 120))
            assert len(tokens) == 3
            if kind == "vllm engine":
                assert tokens == [1010, 1011, 1012]  # the stub executor: the image arrived with its data
        finally:
            frontend.close()
        assert engine.poll() is None  # a headless engine is not this server's to stop
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)
        engine.wait(30)
