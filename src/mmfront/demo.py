"""``mmfront demo`` (what ``make demo`` runs): the whole system doing real work, verified.

Chat requests with images go through the frontend (chat template, media loading, hashing, the
P0 cache, the HF processor), over vLLM's ZMQ sockets, into ``mmfront worker`` running a real
model (the embedded default: Gemma 3's processor at real sizes, 896 px and 256 image tokens,
with small random weights), and the answers come back. A sample of answers is checked against
transformers' own ``generate`` run in this process; the summary says where the time went and
what the caches saved. The exit status is 0 only if every check held.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmfront.cache import ShmObjectStoreSenderCache
from mmfront.config import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.transports import ZmqFrontendTransport
from mmfront.errors import ConfigError, MMFrontError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.models import DEFAULT_MODEL_KIND, cached_model_dir
from mmfront.timing import STAGES, take_stage_times
from mmfront.wire import SamplingParams
from mmfront.wire.structs import FinishReason

IN_FLIGHT = 8
MAX_TOKENS = 8
CHECKED_SAMPLE = 4


@dataclass
class DemoRequest:
    request_id: str
    messages: list[dict[str, Any]]
    max_tokens: int = MAX_TOKENS


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    error: str | None = None
    frontend_s: float = 0.0


def generate_workload(count: int, *, seed: int = 0, repeat_share: float = 0.4) -> list[DemoRequest]:
    """``count`` chat requests: a system prompt and an earlier turn, then 1-3 images (PNG and
    JPEG data URLs) and a question; ``repeat_share`` of the image slots reuse an earlier image."""
    rng = random.Random(seed)
    used: list[str] = []
    requests = []
    for n in range(count):
        parts: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 3)):
            if used and rng.random() < repeat_share:
                url = rng.choice(used)
            else:
                image = make_image(rng.randint(200, 480), rng.randint(160, 400), seed=seed * 100_000 + len(used))
                url = image_data_url(image, "PNG" if len(used) % 2 == 0 else "JPEG")
                used.append(url)
            parts.append({"type": "image_url", "image_url": {"url": url}})
        parts.append({"type": "text", "text": f"Request {n}: what do these {len(parts)} pictures show?"})
        requests.append(DemoRequest(f"demo-{n}", [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Hi. Send me pictures."},
            {"role": "user", "content": parts},
        ]))
    return requests


def read_workload(path: Path) -> list[DemoRequest]:
    """A JSON-lines file: one ``{"messages": [...], "max_tokens": N, "request_id": "..."}`` per line."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{path}:{n + 1} is not JSON ({e}); write one request object per line.") from None
        if not isinstance(item, dict) or not isinstance(item.get("messages"), list):
            raise ConfigError(f"{path}:{n + 1} needs a \"messages\" list (OpenAI chat format).")
        out.append(DemoRequest(str(item.get("request_id", f"demo-{n}")), item["messages"],
                               int(item.get("max_tokens", MAX_TOKENS))))
    return out


@dataclass
class Engine:
    """The worker process (None when an external engine connects to ``--engine``)."""

    process: subprocess.Popen[str] | None

    def stop(self) -> dict[str, Any]:
        """Stop the worker; its closing statistics (encoder cache hits, tokens)."""
        if self.process is None:
            return {}
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        for line in reversed((out or "").splitlines()):
            if line.startswith("{"):
                return dict(json.loads(line))
        return {}


def start_worker(model_dir: Path, transport: ZmqFrontendTransport, config: MultiModalConfig,
                 shm_name: str | None) -> Engine:
    args = [sys.executable, "-m", "mmfront.cli", "worker", str(model_dir), "--input", transport.addresses.input,
            "--output", transport.addresses.output, "--cache", config.mm_processor_cache_type,
            "--cache-gb", str(config.mm_processor_cache_gb), "--json"]
    if shm_name:
        args += ["--shm-name", shm_name]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    try:
        transport.wait_for_engines([0], 120)
    except MMFrontError:
        process.kill()
        raise
    return Engine(process)


async def run_workload(client: AsyncEngineClient, requests: Sequence[DemoRequest], progress: Any) -> dict[str, Outcome]:
    gate = asyncio.Semaphore(IN_FLIGHT)
    outcomes: dict[str, Outcome] = {}

    async def one(request: DemoRequest) -> None:
        outcome = outcomes[request.request_id] = Outcome()
        async with gate:
            started = time.perf_counter()
            try:
                stream = await client.add_request(request.request_id, request.messages,
                                                  SamplingParams(max_tokens=request.max_tokens, temperature=0.0))
                outcome.frontend_s = time.perf_counter() - started
                async for output in stream:
                    outcome.tokens += output.new_token_ids
                    outcome.finish = output.finish_reason
                    if output.error is not None:
                        outcome.error = f"{output.error.code}: {output.error.message}"
            except MMFrontError as e:
                outcome.error = f"{type(e).__name__}: {e}"
            progress()

    await asyncio.gather(*(one(r) for r in requests))
    return outcomes


def check_with_transformers(model_dir: Path, pre: InputPreprocessor, requests: Sequence[DemoRequest],
                            outcomes: dict[str, Outcome]) -> list[str]:
    """Greedy ``generate`` of transformers on the same conversations; the mismatches."""
    import torch
    import transformers
    from PIL import Image

    config = transformers.AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    model_class = getattr(transformers, config.architectures[0])
    model = model_class.from_pretrained(str(model_dir), local_files_only=True).eval()
    hf = pre.processor.info.hf_processor
    problems = []
    for request in requests:
        inputs = pre.preprocess(request.messages, skip_mm_cache=True)
        images = [Image.open(io.BytesIO(base64.b64decode(part["image_url"]["url"].split(",", 1)[1]))).convert("RGB")
                  for message in request.messages if isinstance(message["content"], list)
                  for part in message["content"] if part.get("type") == "image_url"]
        batch = hf(text=inputs["prompt"], images=images, return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=False, max_new_tokens=request.max_tokens)
        want = out[0, batch["input_ids"].shape[1]:].tolist()
        got = outcomes[request.request_id].tokens
        if got[:len(want)] != want:
            problems.append(f"{request.request_id}: worker {got} != transformers {want}")
    return problems


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(requests: Sequence[DemoRequest], outcomes: dict[str, Outcome], wall_s: float, *,
              pre: InputPreprocessor, client: AsyncEngineClient, engine_stats: dict[str, Any],
              checks: dict[str, bool]) -> dict[str, Any]:
    latencies = [o.frontend_s for o in outcomes.values() if o.error is None]
    stats = pre.stats
    encoder_lookups = engine_stats.get("encoder_lookups") or 0
    return {
        "requests": len(requests),
        "requests_per_s": len(requests) / wall_s if wall_s else 0.0,
        "frontend_latency_p50_ms": 1e3 * _percentile(latencies, 0.5),
        "frontend_latency_p99_ms": 1e3 * _percentile(latencies, 0.99),
        "stage_seconds": take_stage_times(),
        "p0_cache_hit_rate": stats.hit_ratio,
        "encoder_cache_hit_rate": (engine_stats.get("encoder_hits", 0) / encoder_lookups) if encoder_lookups else None,
        "wire_bytes": client.stats.wire_bytes,
        "cache_saved_bytes": client.stats.saved_bytes,
        "tokens": sum(len(o.tokens) for o in outcomes.values()),
        "resends": client.stats.resends,
        "checks": checks,
    }


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="mmfront demo", show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("requests", f"{summary['requests']}")
    table.add_row("requests/s (end to end)", f"{summary['requests_per_s']:.2f}")
    table.add_row("frontend latency p50 / p99", f"{summary['frontend_latency_p50_ms']:.1f} / "
                                                  f"{summary['frontend_latency_p99_ms']:.1f} ms")
    for name in STAGES:
        table.add_row(f"  time in {name}", f"{summary['stage_seconds'].get(name, 0.0):.2f} s")
    table.add_row("P0 cache hit rate", f"{summary['p0_cache_hit_rate']:.0%}")
    rate = summary["encoder_cache_hit_rate"]
    table.add_row("encoder cache hit rate", "n/a (external engine)" if rate is None else f"{rate:.0%}")
    table.add_row("bytes on the wire", f"{summary['wire_bytes'] / 1e6:.1f} MB")
    table.add_row("bytes the cache saved", f"{summary['cache_saved_bytes'] / 1e6:.1f} MB")
    table.add_row("tokens generated", f"{summary['tokens']}")
    for name, ok in summary["checks"].items():
        table.add_row(f"check: {name}", "ok" if ok else "FAILED")
    Console().print(table)


def run_demo(
    *, model: str | None = None, requests_file: str | None = None, cache: str = "lru", lanes: int | None = None,
    engine: str | None = None, as_json: bool = False, num_requests: int = 200,
) -> int:
    config_kwargs: dict[str, Any] = {"mm_processor_cache_gb": 0 if cache == "none" else 1.0}
    if cache != "none":
        config_kwargs["mm_processor_cache_type"] = cache
    config_kwargs["mm_processing_lanes"] = lanes  # None: cores - 1 (at least 1), the serving default
    config = MultiModalConfig(**config_kwargs)
    model_dir = Path(model) if model else cached_model_dir(DEFAULT_MODEL_KIND, with_weights=True)
    workload = read_workload(Path(requests_file)) if requests_file else generate_workload(num_requests)
    pre = InputPreprocessor(model_dir, config)
    pre.warmup()
    if engine:
        scheme, _, where = engine.partition("://")
        host, _, port = where.rpartition(":")
        if scheme != "tcp" or not port.isdigit():
            raise ConfigError("--engine takes tcp://HOST:PORT (the engine connects there, and to PORT+1).")
        transport = ZmqFrontendTransport("tcp", host=host, ports=(int(port), int(port) + 1))
        print(f"waiting for an engine: mmfront worker MODEL --input {transport.addresses.input} "
              f"--output {transport.addresses.output}", flush=True)
        transport.wait_for_engines([0], 600)
        worker = Engine(None)
    else:
        transport = ZmqFrontendTransport("ipc")
        shm_name = pre.cache.shm_name if isinstance(pre.cache, ShmObjectStoreSenderCache) else None
        worker = start_worker(model_dir, transport, config, shm_name)
    client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=120)
    take_stage_times()
    try:
        started = time.perf_counter()
        outcomes = _run_with_progress(client, workload, quiet=as_json)
        wall = time.perf_counter() - started
    finally:
        client.close_blocking()
        engine_stats = worker.stop()
    answered = [o for o in outcomes.values() if o.error is None and o.finish is not None]
    sample = [r for r in workload if outcomes[r.request_id].error is None][:CHECKED_SAMPLE]
    problems = check_with_transformers(model_dir, pre, sample, outcomes) if sample else ["no request was answered"]
    checks = {
        "every request answered once": len(answered) == len(workload),
        f"{len(sample)} answers equal transformers' generate": not problems,
    }
    summary = summarize(workload, outcomes, wall, pre=pre, client=client, engine_stats=engine_stats, checks=checks)
    pre.close()
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_table(summary)
        for request_id, outcome in outcomes.items():
            if outcome.error is not None:
                print(f"{request_id}: {outcome.error}")
        for problem in problems:
            print(problem)
    return 0 if all(checks.values()) else 1


def _run_with_progress(client: AsyncEngineClient, workload: Sequence[DemoRequest], *, quiet: bool) -> dict[str, Outcome]:
    if quiet:
        return asyncio.run(run_workload(client, workload, lambda: None))
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("requests", total=len(workload))
        return asyncio.run(run_workload(client, workload, lambda: progress.advance(task)))


__all__ = ["DemoRequest", "generate_workload", "read_workload", "run_demo"]
