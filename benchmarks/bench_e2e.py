"""End to end: OpenAI chat requests -> the frames sent to the engine, mmfront against vLLM 0.33's
own path on the same workload, same machine, same run, rounds alternated.

The workload is the demo's (``mmfront.demo.generate_workload``): a system prompt and an earlier
turn, then 1-3 PNG/JPEG data-URL images (200-480 px) and a question, 40% of the image slots
repeating an earlier image. Each round has its own workload (seed), written once as JSON lines
and run by both sides, each starting from an empty P0 cache.

- mmfront: ``EngineClient.add_request_async`` (chat parsing, media loading and hashing, the chat
  template, the P0 cache and the HF processor on the prepare threads; commit, stamp and encode in
  the commit lane) into a transport that drops the frames (the client counts their bytes); a
  null P1 admits each request right away, as an engine would.
- vLLM: ``benchmarks/peer/vllm_e2e.py`` in the peer venv: ``render_chat_async`` +
  ``InputProcessor.process_inputs`` + ``MsgpackEncoder.encode``, AsyncLLM's path.

Both sides are driven alike: all requests are coroutines on one event loop, at most
``in_flight`` (1, then 8) at a time. A round times one side, then the other (the order flips
every round); the ratio reported is the median over rounds of mmfront's requests/s over vLLM's in
that round, so a change of machine load between rounds cancels out. Targets: >= 2.5x with one
request in flight, >= 3x with 8. Both sides must see the same P0 hit ratio (asserted): the same
requests, the same repeats.

The peer: :func:`mmfront.testing.peer.vllm_peer_python` (``MMFRONT_VLLM_PEER``, default /tmp/vllm-peer-venv), its
model folder is ``<venv>/models/tiny-gemma3-896`` (built by ../shared/peer/vllm_peer_setup.sh).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from _harness import Report
from mmfront.config import MultiModalConfig
from mmfront.demo import DemoRequest, generate_workload
from mmfront.engine.client import EngineClient
from mmfront.engine.transports import BaseTransport
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.models import cached_model_dir
from mmfront.testing.peer import vllm_peer_model_dir, vllm_peer_python
from mmfront.wire import Frame, MsgpackEncoder, SamplingParams
from mmfront.wire.messages import ADMITTED, Admitted, encode_envelope

GROUP = "e2e chat -> frames"
REPO = Path(__file__).resolve().parents[1]
IN_FLIGHT = (1, 8)
TARGETS = {1: 2.5, 8: 3.0}


class _DropTransport(BaseTransport):
    """The wire ends here: what would be sent is dropped (``EngineClient`` counts its bytes)."""

    def send(self, frames: Sequence[Frame]) -> None:
        pass

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        return None

    def close(self) -> None:
        pass


class _Mmfront:
    def __init__(self) -> None:
        self.preprocessor = InputPreprocessor(cached_model_dir("gemma3-896"), MultiModalConfig())
        self.preprocessor.warmup()
        self.processor = InputProcessor(self.preprocessor)
        self.client = EngineClient(self.processor, _DropTransport())
        self._encoder = MsgpackEncoder()
        self._runs = 0

    def run(self, requests: Sequence[DemoRequest], in_flight: int) -> dict[str, float]:
        self.preprocessor.clear_cache()
        stats = self.preprocessor.stats
        queries, hits, wire_bytes = stats.queries, stats.hits, self.client.stats.wire_bytes
        client = self.client
        self._runs += 1
        tag = f"r{self._runs}-"
        gate = asyncio.Semaphore(in_flight)

        async def one(request: DemoRequest) -> None:
            async with gate:
                request_id = tag + request.request_id
                await client.add_request_async(request_id, request.messages,
                                               SamplingParams(max_tokens=request.max_tokens, temperature=0.0))
                client.handle_reply(encode_envelope(ADMITTED, self._encoder.encode(Admitted(request_id))))

        async def all_requests() -> float:
            t0 = time.perf_counter()
            await asyncio.gather(*(one(r) for r in requests))
            return time.perf_counter() - t0

        wall = asyncio.run(all_requests())
        assert not client.in_flight, "every request must have been sent and admitted"
        queried = stats.queries - queries
        return {"requests_per_s": len(requests) / wall, "wire_bytes": client.stats.wire_bytes - wire_bytes,
                "hit_ratio": (stats.hits - hits) / queried if queried else 0.0}

    def close(self) -> None:
        self.preprocessor.close()


class _Peer:
    """vLLM's path in its own venv, kept running (its start-up takes ~40 s)."""

    def __init__(self, python: Path, model_dir: Path) -> None:
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (the peer's stderr; closed in close())
        self._proc = subprocess.Popen([str(python), str(REPO / "benchmarks" / "peer" / "vllm_e2e.py"), str(model_dir)],
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._read()

    def _read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self._proc.stdout
        line = stdout.readline() if stdout is not None else ""
        if not line:
            code = self._proc.wait(60)
            self._log.seek(0)
            tail = self._log.read().strip().splitlines()[-3:]
            raise RuntimeError(f"the vLLM peer exited with code {code}: {tail}")
        result: dict[str, Any] = json.loads(line)
        return result

    def run(self, workload: Path, in_flight: int) -> dict[str, float]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"workload": str(workload), "in_flight": in_flight}) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(60)
        self._log.close()


def _start_peer() -> _Peer | None:
    python = vllm_peer_python()
    model_dir = None if python is None else vllm_peer_model_dir(python)
    if python is None or model_dir is None:
        return None
    try:
        return _Peer(python, model_dir)
    except (RuntimeError, json.JSONDecodeError) as e:
        print(f"  vLLM peer failed: {e}", file=sys.stderr)
        return None


def _write(requests: Sequence[DemoRequest], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps({"request_id": r.request_id, "messages": r.messages, "max_tokens": r.max_tokens}) + "\n")


def run(report: Report, quick: bool) -> None:
    rounds, count = (2, 24) if quick else (3, 60)
    peer = _start_peer()
    ours = _Mmfront()
    rates: dict[tuple[str, int], list[float]] = {}
    ratios: dict[int, list[float]] = {k: [] for k in IN_FLIGHT}
    hit_ratio = 0.0
    try:
        with tempfile.TemporaryDirectory(prefix="mmfront-e2e-") as folder:
            for seed in range(rounds + 1):  # seed 0: an untimed warm-up round for both sides
                requests = generate_workload(8 if seed == 0 else count, seed=seed)
                path = Path(folder) / f"workload-{seed}.jsonl"
                _write(requests, path)
                for in_flight in IN_FLIGHT:
                    order = ["mmfront", "vLLM"] if peer is not None else ["mmfront"]
                    results = {}
                    for name in order if seed % 2 else order[::-1]:
                        results[name] = ours.run(requests, in_flight) if name == "mmfront" \
                            else peer.run(path, in_flight)  # type: ignore[union-attr]
                    if seed == 0:
                        continue
                    for name, result in results.items():
                        rates.setdefault((name, in_flight), []).append(result["requests_per_s"])
                    hit_ratio = results["mmfront"]["hit_ratio"]
                    if "vLLM" in results:
                        assert abs(results["vLLM"]["hit_ratio"] - hit_ratio) < 1e-9, \
                            f"both sides must see the same repeats: {results}"
                        ratios[in_flight].append(results["mmfront"]["requests_per_s"]
                                                 / results["vLLM"]["requests_per_s"])
    finally:
        ours.close()
        if peer is not None:
            peer.close()
    report.add(GROUP, f"P0 hit ratio ({count} requests, 40% repeated images)", hit_ratio, "")
    for in_flight in IN_FLIGHT:
        for name in ("mmfront", "vLLM"):
            if (name, in_flight) in rates:
                report.add(GROUP, f"{name}: {in_flight} in flight, requests/s",
                           statistics.median(rates[(name, in_flight)]), "/s")
    if peer is None:
        report.add(GROUP, "vLLM peer not found: ratios skipped", 0.0, "")
        return
    for in_flight in IN_FLIGHT:
        report.ratio(GROUP, f"{in_flight} in flight: mmfront / vLLM requests/s", statistics.median(ratios[in_flight]),
                     at_least=TARGETS[in_flight])
