"""mmfront's client on a STOCK vLLM 0.33 engine core, against vLLM's own ``AsyncLLM`` on the same
kind of engine: how long until the first request answers, and request round trips.

The engine is ``../shared/peer/stock_engine.py`` (``vllm serve --headless`` with the stub
executor: no model, generated token k = 1000 + 10 * images + k, so every answer is checked and a
wrong one fails the run). Each side gets a fresh engine and serves, in this order, one first
request, a workload with 1 request in flight, then another with 8: the demo's image chats
(``mmfront.demo.generate_workload``: 1-3 PNG/JPEG data-URL images, 40% of the image slots
repeated), ``MAX_TOKENS`` tokens each, the same requests on both sides.

- Handshake to first request, what a user sees: the clock starts as the frontend starts; the
  engine process is launched at that moment. "handshake" ends when the engine is ready (so it is
  mostly the engine's own start-up); "first request" ends at the first output of the first
  request. mmfront: ``ZmqFrontendTransport`` + ``FrontendHandshake`` bound, the engine launched,
  the ``InputPreprocessor`` built and warmed up while the engine starts, ``handshake.wait``, then
  ``AsyncEngineClient.add_request``. vLLM: ``AsyncLLM.from_vllm_config`` with
  ``data_parallel_size_local=0`` (``benchmarks/peer/vllm_link.py``; its imports and config are
  done before the clock starts, as mmfront's are), then ``render_chat_async`` + ``generate``.
- Round trip: requests/s from the first send to the last token of the workload, both sides as
  coroutines on one event loop (an ``asyncio.Semaphore`` for the in-flight bound), token ids
  only (vLLM with ``detokenize=False``). The ratio is mmfront's requests/s over vLLM's, the median
  over pairs of runs; the order of the two sides flips every pair (vLLM first in the first pair:
  its peer's imports warm the page cache before its clock starts). Target >= 1.0x.

Needs the vLLM peer venv (:func:`mmfront.testing.peer.vllm_peer_python`) and ``../shared/peer``;
without them the benchmark is skipped and says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

from _harness import Report, log_tail, stop_process
from mmfront.config import MultiModalConfig
from mmfront.demo import DemoRequest, generate_workload
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.network import get_open_port
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python
from mmfront.wire import SamplingParams

GROUP = "stock engine link"
REPO = Path(__file__).resolve().parents[1]
PEER_DIR = REPO.parent / "shared" / "peer"
IN_FLIGHT = (1, 8)
MAX_TOKENS = 4
STARTUP_S = 300.0
"""How long an engine (and vLLM's frontend) may take to start; vLLM's own waits are longer."""
REQUESTS_S = 300.0
"""How long one side's requests may take, all together."""


class Workload(NamedTuple):
    """One pair's requests: the first request, then one list per ``IN_FLIGHT`` bound."""

    first: list[DemoRequest]
    rounds: list[list[DemoRequest]]
    paths: list[Path]
    """The same, as JSON lines for the peer: ``first`` then each round."""


class Side(NamedTuple):
    handshake_s: float
    first_request_s: float
    requests_per_s: list[float]


def _workload(pair: int, count: int, folder: Path) -> Workload:
    base = 10 * (pair + 1)
    lists = [generate_workload(1, seed=base)] + [generate_workload(count, seed=base + 1 + n) for n in range(len(IN_FLIGHT))]
    lists = [[dataclasses.replace(r, request_id=f"p{pair}s{n}-{r.request_id}", max_tokens=MAX_TOKENS) for r in requests]
             for n, requests in enumerate(lists)]
    paths = []
    for n, requests in enumerate(lists):
        path = folder / f"workload-{pair}-{n}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for r in requests:
                f.write(json.dumps({"request_id": r.request_id, "messages": r.messages, "max_tokens": r.max_tokens}) + "\n")
        paths.append(path)
    return Workload(lists[0], lists[1:], paths)


def _expected_tokens(request: DemoRequest) -> list[int]:
    images = sum(1 for message in request.messages if isinstance(message["content"], list)
                 for part in message["content"] if part.get("type") == "image_url")
    return [1000 + 10 * images + k for k in range(request.max_tokens)]


def _launch_engine(python: Path, model: Path, address: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(python), str(PEER_DIR / "stock_engine.py"), str(model), address], cwd=PEER_DIR,
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                            start_new_session=True)


async def _mmfront_requests(client: AsyncEngineClient, work: Workload) -> tuple[float, list[float]]:
    async def answer(request: DemoRequest) -> float:
        stream = await client.add_request(request.request_id, request.messages,
                                          SamplingParams(max_tokens=request.max_tokens, temperature=0.0))
        tokens: list[int] = []
        first_at = 0.0
        async for output in stream:
            first_at = first_at or time.time()
            tokens.extend(output.new_token_ids)
        if tokens != _expected_tokens(request):
            raise RuntimeError(f"{request.request_id} answered {tokens}, expected {_expected_tokens(request)}")
        return first_at

    async def run(requests: Sequence[DemoRequest], in_flight: int) -> float:
        gate = asyncio.Semaphore(in_flight)

        async def gated(request: DemoRequest) -> None:
            async with gate:
                await answer(request)

        t0 = time.perf_counter()
        await asyncio.gather(*(gated(r) for r in requests))
        return len(requests) / (time.perf_counter() - t0)

    [first_output_at] = [await answer(request) for request in work.first]
    rates = [await run(requests, in_flight) for requests, in_flight in zip(work.rounds, IN_FLIGHT)]
    return first_output_at, rates


def _run_mmfront(python: Path, model: Path, work: Workload, folder: Path) -> Side:
    log_path = folder / "engine-mmfront.log"
    with log_path.open("wb") as log:
        started = time.time()
        transport = ZmqFrontendTransport("tcp")
        handshake = FrontendHandshake(transport, DataParallelConfig(1, 0, "127.0.0.1", get_open_port()))
        engine = _launch_engine(python, model, handshake.address, log)
        preprocessor: InputPreprocessor | None = None
        client: AsyncEngineClient | None = None
        try:
            preprocessor = InputPreprocessor(model, MultiModalConfig())
            preprocessor.warmup()
            try:
                [info] = handshake.wait(STARTUP_S)
            except Exception as e:
                raise RuntimeError(f"the stock engine did not start for mmfront ({e}): {log_tail(log_path)}") from e
            finally:
                handshake.close()
            connected = time.time()
            client = AsyncEngineClient(InputProcessor(preprocessor), transport, engines=[info])
            first_output_at, rates = asyncio.run(asyncio.wait_for(_mmfront_requests(client, work), REQUESTS_S))
        finally:
            if client is not None:
                client.close_blocking()
            else:
                transport.close()
            stop_process(engine)
            if preprocessor is not None:
                preprocessor.close()
    return Side(connected - started, first_output_at - connected, rates)


def _read_json(proc: subprocess.Popen[str], *logs: Path) -> dict[str, Any]:
    """The peer's next JSON line (anything else it prints is skipped)."""
    assert proc.stdout is not None
    while line := proc.stdout.readline():
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    code = proc.wait(60)
    raise RuntimeError(f"the vLLM peer exited with code {code}: {[log_tail(log) for log in logs]}")


def _watch(peer: subprocess.Popen[str], engine: subprocess.Popen[bytes], done: threading.Event) -> None:
    """End the peer when its engine exits or the run outlives its time: vLLM's frontend waits for
    remote engines without a deadline, and does not notice one that died."""
    deadline = time.monotonic() + STARTUP_S + REQUESTS_S
    while not done.wait(0.5):
        if engine.poll() is not None or time.monotonic() > deadline:
            stop_process(peer)
            return


def _run_vllm(python: Path, model: Path, work: Workload, folder: Path) -> Side:
    address = f"tcp://127.0.0.1:{get_open_port()}"
    peer_log, engine_log = folder / "peer-vllm.log", folder / "engine-vllm.log"
    with peer_log.open("wb") as peer_err, engine_log.open("wb") as log:
        peer = subprocess.Popen([str(python), str(REPO / "benchmarks" / "peer" / "vllm_link.py"), str(model), address],
                                env=dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1",
                                         VLLM_LOGGING_STREAM="ext://sys.stderr"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=peer_err, text=True,
                                start_new_session=True)
        engine: subprocess.Popen[bytes] | None = None
        done = threading.Event()
        try:
            _read_json(peer, peer_log)
            started = time.time()
            engine = _launch_engine(python, model, address, log)
            threading.Thread(target=_watch, args=(peer, engine, done), daemon=True).start()
            assert peer.stdin is not None
            peer.stdin.write(json.dumps({"first": str(work.paths[0]),
                                         "rounds": [[str(p), k] for p, k in zip(work.paths[1:], IN_FLIGHT)]}) + "\n")
            peer.stdin.flush()
            result = _read_json(peer, peer_log, engine_log)
        finally:
            done.set()
            if engine is not None:
                stop_process(engine)
            if peer.poll() is None:
                stop_process(peer)
    return Side(result["connected_at"] - started, result["first_output_at"] - result["connected_at"],
                result["requests_per_s"])


def run(report: Report, quick: bool) -> None:
    python = vllm_peer_python()
    model = None if python is None else vllm_peer_model_dir(python)
    if python is None or model is None or not (PEER_DIR / "stock_engine.py").is_file():
        print(f"  {GROUP}: {SKIP_REASON} (and ../shared/peer/stock_engine.py)", file=sys.stderr)
        report.add(GROUP, "vLLM peer not found: skipped (no stock engine)", 0.0, "")
        return
    pairs, count = (1, 24) if quick else (3, 48)
    sides: dict[str, list[Side]] = {"mmfront": [], "vLLM": []}
    with tempfile.TemporaryDirectory(prefix="mmfront-link-") as name:
        folder = Path(name)
        for pair in range(pairs):
            work = _workload(pair, count, folder)
            for side in ("vLLM", "mmfront") if pair % 2 == 0 else ("mmfront", "vLLM"):
                measure = _run_mmfront if side == "mmfront" else _run_vllm
                sides[side].append(measure(python, model, work, folder))
    for side, runs in sides.items():
        report.add(GROUP, f"{side}: handshake (engine start included)",
                   statistics.median(r.handshake_s for r in runs), "s")
        report.add(GROUP, f"{side}: first request, to its first output",
                   statistics.median(r.first_request_s for r in runs), "s")
        report.add(GROUP, f"{side}: handshake to first output",
                   statistics.median(r.handshake_s + r.first_request_s for r in runs), "s")
    report.ratio(GROUP, "handshake to first output: mmfront / vLLM", statistics.median(
        (m.handshake_s + m.first_request_s) / (v.handshake_s + v.first_request_s)
        for m, v in zip(sides["mmfront"], sides["vLLM"])))
    for n, in_flight in enumerate(IN_FLIGHT):
        for side in ("mmfront", "vLLM"):
            report.add(GROUP, f"{side}: {count} requests, {in_flight} in flight, requests/s",
                       statistics.median(r.requests_per_s[n] for r in sides[side]), "/s")
        report.ratio(GROUP, f"{in_flight} in flight: mmfront / vLLM requests/s", statistics.median(
            m.requests_per_s[n] / v.requests_per_s[n] for m, v in zip(sides["mmfront"], sides["vLLM"])),
            at_least=1.0)
