"""``mmfront serve`` against ``vllm serve``, measured by vLLM's own benchmark client, each server in
front of a fresh STOCK vLLM 0.33 engine core; next to them, what that engine allows.

The engine is ``../shared/peer/stock_engine.py`` (``vllm serve --headless`` with the stub
executor: no model, generated token k = 1000 + 10 * images + k). Each server starts with
``--data-parallel-size-local 0`` and the engine connects to it; the client is
``vllm bench serve --backend openai-chat`` from the peer venv: the ``random-mm`` dataset, one
896x896 JPEG (vLLM's random pixels) and ``INPUT_TOKENS`` random text tokens per request,
``OUTPUT_TOKENS`` output tokens (``--ignore-eos``), ``IN_FLIGHT`` requests in flight. After one
warm-up request (a small image of its own), a server gets two passes with the same seed: the
first with all-new images, the second with the same images again (cache hits). Three servers
per repeat, each on its own fresh engine: ``mmfront serve``, ``vllm serve``, and ``mmfront
serve --api-server-count 2`` (whose repeated pass is compared with one API server's; each API
server has its own processor cache, and the kernel spreads the client's connections over them).

The engine ceiling, on another fresh engine in the same repeat: the same kind of requests
(one 896x896 JPEG each) prepared and encoded beforehand by mmfront's ``EngineClient`` into a
recording transport, then sent as they are over the engine's sockets with ``IN_FLIGHT`` in
flight, every answer checked against the stub's tokens: no HTTP, no frontend work. The
repeated pass sends the second encoding, whose images are references to the engine's cache.

Ratios are taken within a repeat and their median reported; the order of the servers flips
every repeat. Targets (issue 21): requests/s with new images >= 2x vLLM's, with the same images
again >= 3x, median time to first token <= 0.5x vLLM's, two API servers against one on the
repeated pass >= 1.7x.

Needs the vLLM peer venv (:func:`mmfront.testing.peer.vllm_peer_python`) and ``../shared/peer``;
without them the benchmark is skipped and says so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

from _harness import Report, log_tail, stop_process, wait_healthy
from mmfront.config import MultiModalConfig
from mmfront.engine.client import EngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake
from mmfront.engine.transports import BaseTransport
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.network import get_open_port, get_open_ports_list
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python
from mmfront.wire import SamplingParams
from mmfront.wire.messages import ENGINE_OUTPUTS, Direction, decode_message

GROUP = "serve vs vllm serve"
REPO = Path(__file__).resolve().parents[1]
PEER_DIR = REPO.parent / "shared" / "peer"
SERVED_NAME = "tiny-gemma3"
IN_FLIGHT = 8
OUTPUT_TOKENS = 8
INPUT_TOKENS = 32
IMAGE_PX = 896
SERVER_FLAGS = ["--max-model-len", "4096", "--limit-mm-per-prompt", '{"image": 4}']
STARTUP_S = 300.0
"""How long an engine and its server may take to start."""
PASS_S = 400.0
"""How long one ``vllm bench serve`` run may take, its own start-up included."""
EXPECTED = [1010 + k for k in range(OUTPUT_TOKENS)]
"""The stub executor's answer to a request with one image."""
SERVERS = ("mmfront", "vLLM", "mmfront, 2 API servers")


class Pass(NamedTuple):
    requests_per_s: float
    median_ttft_ms: float


class Served(NamedTuple):
    new: Pass
    repeated: Pass


def _launch_engine(python: Path, model: Path, address: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(python), str(PEER_DIR / "stock_engine.py"), str(model), address], cwd=PEER_DIR,
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                            start_new_session=True)


def _peer_env() -> dict[str, str]:
    return dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")


def _server_command(side: str, python: Path, model: Path, port: int, rpc: int) -> list[str]:
    if side == "vLLM":
        program = [str(python.parent / "vllm")]
    else:
        program = [sys.executable, "-m", "mmfront.cli"]
    extra = ["--api-server-count", "2"] if side.endswith("2 API servers") else []
    return [*program, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", SERVED_NAME, "--data-parallel-size", "1", "--data-parallel-size-local", "0",
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc), *SERVER_FLAGS, *extra]


def _post_chat(base: str, max_tokens: int) -> None:
    """One small image chat, so both servers have served a request before the clock starts."""
    image = image_data_url(make_image(64, 48, seed=7), "JPEG")
    body = {"model": SERVED_NAME, "max_tokens": max_tokens, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is in this picture?"}]}]}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        json.load(reply)


def _bench_serve(python: Path, model: Path, base: str, seed: int, prompts: int, result: Path, log: IO[bytes]) -> Pass:
    """One pass of vLLM's own client; its saved result's throughput and median TTFT."""
    command = [str(python.parent / "vllm"), "bench", "serve", "--backend", "openai-chat", "--base-url", base,
               "--endpoint", "/v1/chat/completions", "--model", str(model), "--served-model-name", SERVED_NAME,
               "--dataset-name", "random-mm", "--num-prompts", str(prompts), "--seed", str(seed),
               "--random-input-len", str(INPUT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS),
               "--random-range-ratio", "0", "--random-mm-base-items-per-request", "1",
               "--random-mm-num-mm-items-range-ratio", "0",
               "--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}',
               "--random-mm-bucket-config", f"{{({IMAGE_PX}, {IMAGE_PX}, 1): 1.0}}",
               "--max-concurrency", str(IN_FLIGHT), "--request-rate", "inf", "--ignore-eos", "--disable-tqdm",
               "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    log.write(f"$ {' '.join(command)}\n".encode())
    log.flush()
    code = subprocess.run(command, check=False, stdout=log, stderr=subprocess.STDOUT, env=_peer_env(),
                          timeout=PASS_S, start_new_session=True).returncode
    if code != 0 or not result.is_file():
        raise RuntimeError(f"vllm bench serve exited with code {code}: {log_tail(Path(log.name))}")
    saved = json.loads(result.read_text())
    if saved["completed"] != prompts or saved.get("failed", 0):
        raise RuntimeError(f"vllm bench serve: {saved['completed']} of {prompts} requests completed, "
                           f"{saved.get('failed')} failed: {log_tail(Path(log.name))}")
    return Pass(float(saved["request_throughput"]), float(saved["median_ttft_ms"]))


def _run_server(side: str, python: Path, model: Path, seed: int, prompts: int, folder: Path) -> Served:
    rpc, port = get_open_ports_list(2)
    base = f"http://127.0.0.1:{port}"
    tag = side.replace(" ", "-").replace(",", "")
    engine_log, server_log, bench_log = (folder / f"{tag}-{seed}-{name}.log" for name in ("engine", "server", "bench"))
    with engine_log.open("wb") as elog, server_log.open("wb") as slog, bench_log.open("wb") as blog:
        server = subprocess.Popen(_server_command(side, python, model, port, rpc), stdout=slog,
                                  stderr=subprocess.STDOUT, env=_peer_env(), start_new_session=True)
        engine = _launch_engine(python, model, f"tcp://127.0.0.1:{rpc}", elog)
        try:
            wait_healthy(base, [server, engine], [server_log, engine_log], STARTUP_S)
            _post_chat(base, OUTPUT_TOKENS)
            passes = [_bench_serve(python, model, base, seed, prompts, folder / f"{tag}-{seed}-{n}.json", blog)
                      for n in range(2)]
        finally:
            stop_process(server, grace_s=10)
            stop_process(engine)
    return Served(*passes)


class _Recorder(BaseTransport):
    """Keeps every envelope the client would send, to send them later as they are."""

    def __init__(self) -> None:
        self.envelopes: list[list[Any]] = []

    def send(self, frames: Sequence[Any]) -> None:
        self.envelopes.append(list(frames))

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        raise RuntimeError("the recorder sends nothing anywhere")

    def close(self) -> None:
        self.envelopes.clear()


def _chat(seed: int, n: int) -> list[dict[str, Any]]:
    image = image_data_url(make_image(IMAGE_PX, IMAGE_PX, seed=seed * 100_000 + n), "JPEG")
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                         {"type": "text", "text": f"Request {n}: what is in this picture?"}]}]


def _pump(transport: ZmqFrontendTransport, requests: list[tuple[str, list[Any]]]) -> float:
    """Requests/s of sending ``requests`` as they are, ``IN_FLIGHT`` at a time, to their last token."""
    pending = deque(requests)
    tokens: dict[str, list[int]] = {}
    started = time.perf_counter()
    while pending or tokens:
        while pending and len(tokens) < IN_FLIGHT:
            request_id, envelope = pending.popleft()
            tokens[request_id] = []
            transport.send(envelope)
        frames = transport.recv(PASS_S)
        if frames is None:
            raise RuntimeError(f"the engine sent nothing for {PASS_S:.0f} s")
        message = decode_message(frames, Direction.TO_FRONTEND)
        if message.kind != ENGINE_OUTPUTS:
            continue
        for output in message.body.outputs:
            tokens[output.request_id].extend(output.new_token_ids)
            if output.finish_reason is not None:
                got = tokens.pop(output.request_id)
                if got != EXPECTED:
                    raise RuntimeError(f"{output.request_id} answered {got}, expected {EXPECTED}")
    return len(requests) / (time.perf_counter() - started)


def _run_ceiling(python: Path, model: Path, seed: int, prompts: int, folder: Path) -> tuple[float, float]:
    log_path = folder / f"ceiling-{seed}-engine.log"
    transport = ZmqFrontendTransport("tcp")
    handshake = FrontendHandshake(transport, DataParallelConfig(1, 0, "127.0.0.1", get_open_port()))
    with log_path.open("wb") as log:
        engine = _launch_engine(python, model, handshake.address, log)
        preprocessor: InputPreprocessor | None = None
        try:
            preprocessor = InputPreprocessor(model, MultiModalConfig())
            chats = [_chat(seed, n) for n in range(prompts)]
            try:
                [info] = handshake.wait(STARTUP_S)
            except Exception as e:
                raise RuntimeError(f"the stock engine did not start ({e}): {log_tail(log_path)}") from e
            finally:
                handshake.close()
            recorder = _Recorder()
            client = EngineClient(InputProcessor(preprocessor), recorder, engines=[info])
            params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
            passes = []
            for name in ("new", "repeated"):
                ids = [f"ceiling-{seed}-{name}-{n}" for n in range(prompts)]
                for request_id, chat in zip(ids, chats):
                    client.add_request(request_id, chat, params)
                passes.append(list(zip(ids, recorder.envelopes)))
                recorder.envelopes = []
            new, repeated = (_pump(transport, requests) for requests in passes)
        finally:
            transport.close()
            stop_process(engine)
            if preprocessor is not None:
                preprocessor.close()
    return new, repeated


def run(report: Report, quick: bool) -> None:
    python = vllm_peer_python()
    model = None if python is None else vllm_peer_model_dir(python)
    if python is None or model is None or not (PEER_DIR / "stock_engine.py").is_file():
        print(f"  {GROUP}: {SKIP_REASON} (and ../shared/peer/stock_engine.py)", file=sys.stderr)
        report.add(GROUP, "vLLM peer not found: skipped (no stock engine)", 0.0, "")
        return
    repeats, prompts = (1, 32) if quick else (2, 64)
    served: dict[str, list[Served]] = {side: [] for side in SERVERS}
    ceilings: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="mmfront-serve-bench-") as name:
        folder = Path(name)
        for repeat in range(repeats):
            seed = 1000 + repeat
            order = [*SERVERS, "ceiling"]
            for side in order if repeat % 2 == 0 else reversed(order):
                if side == "ceiling":
                    ceilings.append(_run_ceiling(python, model, seed, prompts, folder))
                else:
                    served[side].append(_run_server(side, python, model, seed, prompts, folder))
    _report(report, served, ceilings, prompts)


def _report(report: Report, served: dict[str, list[Served]], ceilings: list[tuple[float, float]],
            prompts: int) -> None:
    mm, vl, two = (served[side] for side in SERVERS)
    for n, what in enumerate(("new images", "same images again")):
        for side in SERVERS:
            report.add(GROUP, f"{side}: {what}, requests/s", statistics.median(s[n].requests_per_s for s in served[side]),
                       "/s")
            report.add(GROUP, f"{side}: {what}, median TTFT",
                       statistics.median(s[n].median_ttft_ms for s in served[side]), "ms")
        report.add(GROUP, f"engine ceiling (pre-encoded): {what}, requests/s",
                   statistics.median(c[n] for c in ceilings), "/s")
        report.ratio(GROUP, f"{what}: mmfront / vLLM requests/s",
                     statistics.median(m[n].requests_per_s / v[n].requests_per_s for m, v in zip(mm, vl)),
                     at_least=2.0 if n == 0 else 3.0)
        report.ratio(GROUP, f"{what}: mmfront / vLLM median TTFT",
                     statistics.median(m[n].median_ttft_ms / v[n].median_ttft_ms for m, v in zip(mm, vl)), at_most=0.5)
        for side, runs in (("mmfront", mm), ("vLLM", vl)):
            report.ratio(GROUP, f"{what}: {side} / engine ceiling requests/s",
                         statistics.median(s[n].requests_per_s / c[n] for s, c in zip(runs, ceilings)))
    report.ratio(GROUP, "same images again: 2 API servers / 1, requests/s",
                 statistics.median(t.repeated.requests_per_s / m.repeated.requests_per_s for t, m in zip(two, mm)),
                 at_least=1.7)
    report.add(GROUP, f"({prompts} requests a pass, {IN_FLIGHT} in flight, {len(mm)} repeats)", 0.0, "")
