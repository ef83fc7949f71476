"""``mmfront serve --api-server-count 2``: two API server processes share the port, the one engine
connects to both (a local ``mmfront worker``, or a headless stock vLLM engine that meets API
server 0's handshake, which names both servers' sockets), each server keeps its own processor
cache (hits in both), and SIGTERM stops them all. One server per case."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mmfront.config import DataParallelConfig
from mmfront.network import get_open_port
from mmfront.serve.api_servers import no_rejoin
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

IMAGE = image_data_url(make_image(60, 40, seed=11))
PEER = vllm_peer_python()
PEER_MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
PEER_DIR = Path(__file__).resolve().parents[3] / "shared" / "peer"
NO_PEER = PEER is None or PEER_MODEL is None or not PEER_DIR.is_dir()
REQUESTS = 15
"""Odd, so the two servers' counts differ and each shows as its own value."""


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def per_server(url: str, name: str, connections: int = 40) -> set[float]:
    """``name``'s value as each API server reports it, reached over fresh connections (the
    kernel spreads them over the servers sharing the port)."""
    seen = set()
    for _ in range(connections):
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        seen.add(sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)))
    return seen


@pytest.mark.parametrize("engine", ["local mmfront worker", pytest.param("headless vllm engine", marks=[
    pytest.mark.skipif(NO_PEER, reason=SKIP_REASON)])])
def test_two_api_servers_share_the_port_and_the_engine(gemma3_weights_dir: Path, tmp_path: Path, engine: str) -> None:
    port = get_open_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    model = gemma3_weights_dir if engine == "local mmfront worker" else PEER_MODEL
    assert model is not None
    flags = []
    headless: subprocess.Popen[bytes] | None = None
    if engine == "headless vllm engine":
        rpc_port = get_open_port()
        flags = ["--data-parallel-size-local", "0", "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port",
                 str(rpc_port)]
        assert PEER is not None
        headless = subprocess.Popen([str(PEER), str(PEER_DIR / "stock_engine.py"), str(model),
                                     f"tcp://127.0.0.1:{rpc_port}"], cwd=PEER_DIR, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mmfront.cli", "serve", str(model), "--host", "127.0.0.1", "--port",
             str(port), "--api-server-count", "2", "--served-model-name", "tiny", "--mm-processor-cache-gb", "0.05",
             "--processing-lanes", "0", "--uvicorn-log-level", "warning", *flags],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 280
        while True:
            assert server.poll() is None, log.read_text()
            with contextlib.suppress(OSError, urllib.error.URLError), \
                    urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                             {"type": "text", "text": "What is this?"}]}]
        texts = set()
        for _ in range(REQUESTS):  # a fresh connection each, so both servers get some
            with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30) as client:
                answer = client.chat.completions.create(model="tiny", messages=chat, max_tokens=3, temperature=0)
            texts.add(answer.choices[0].message.content)
        assert len(texts) == 1  # the same answer from either server
        served = per_server(url, "vllm:request_success_total")
        assert len(served) == 2 and sum(served) == REQUESTS and min(served) > 0, served
        hits = per_server(url, "vllm:mm_cache_hits_total")
        assert sorted(hits) == sorted(n - 1 for n in served)  # each server: one miss, then hits in its own cache
        family = descendants(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(90) == 0, log.read_text()
        deadline = time.monotonic() + 30
        while left := [pid for pid in family if Path(f"/proc/{pid}").exists()]:
            assert time.monotonic() < deadline, left
            time.sleep(0.1)
        if headless is None:
            assert f"mmfront worker: {REQUESTS} requests" in log.read_text()  # the engine stopped in order
        else:
            assert headless.poll() is None  # a headless engine is not the server's to stop
    finally:
        if headless is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(headless.pid, signal.SIGKILL)
            headless.wait(30)
        if server.poll() is None:
            for pid in descendants(server.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            server.kill()
            server.wait(30)


@pytest.mark.parametrize(("size", "local", "count", "keep_alive", "refused"), [
    (2, 1, 2, True, True), (2, 0, 3, True, True),
    (2, 1, 1, True, False), (2, 1, 2, False, False), (2, 2, 2, True, False),
])
def test_keep_alive_rejoin_with_several_api_servers_is_refused_with_the_reason(
        size: int, local: int, count: int, keep_alive: bool, refused: bool) -> None:
    said = no_rejoin(DataParallelConfig(data_parallel_size=size, data_parallel_size_local=local), count, keep_alive)
    assert said == (f"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 with --api-server-count {count}: a headless engine restarted "
                    "after its death cannot rejoin (the handshake closes after start-up; rejoining needs one API "
                    "server). The API servers stay up, answering 503 on /health, until the whole server is "
                    "restarted." if refused else None)
