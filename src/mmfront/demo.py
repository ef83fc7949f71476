"""``mmfront demo`` (what ``make demo`` runs): the whole system doing real work, verified, the way a
user runs it: ``mmfront serve`` in front of ``mmfront worker``, and OpenAI's own client.

The demo starts ``mmfront serve`` on a model (the embedded default: Gemma 3's processor at real
sizes, 896 px and 256 image tokens, with small random weights); the server starts its engine,
``mmfront worker``, and meets it through vLLM's handshake. Chat requests with images go over HTTP
with the official ``openai`` client, 8 in flight, half of them streamed; the server does the
frontend's work (chat template, media loading, hashing, the P0 cache, the HF processor) and
detokenizes the answers. A sample of answers' text is checked against transformers' own
``generate`` run in this process, decoded as the server decodes; the summary says where the time
went and what the caches saved (read from the server's ``/metrics``). The exit status is 0 only
if every check held.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmfront.config import MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.network import get_open_port
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.threads import available_cores
from mmfront.testing.api import DEFAULT_MODEL_KIND, cached_model_dir, image_data_url, make_image
from mmfront.timing import STAGES

IN_FLIGHT = 8
MAX_TOKENS = 8
CHECKED_SAMPLE = 4
MODEL_NAME = "demo"
SERVER_START_S = 300.0


@dataclass
class DemoRequest:
    request_id: str
    messages: list[dict[str, Any]]
    max_tokens: int = MAX_TOKENS


@dataclass
class Outcome:
    stream: bool = False
    text: str = ""
    tokens: int = 0
    finish: str | None = None
    error: str | None = None
    latency_s: float = 0.0
    first_token_s: float | None = None
    chunks: list[str] = field(default_factory=list)


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


# --- the server ---------------------------------------------------------------------------------


@dataclass
class Server:
    """``mmfront serve`` in a child process; its output goes to a file, read when it stops."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigError(f"mmfront serve exited with status {self.process.returncode} before it was "
                                  f"ready:\n{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise ConfigError(f"mmfront serve was not ready within {timeout:.0f} s:\n{self.output()[-4000:]}")

    def metrics(self) -> dict[str, float]:
        """The server's ``/metrics``, summed by name and ``stage`` label."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        totals: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
            if match is None:
                continue
            name, labels, value = match.groups()
            stage = re.search(r'stage="([^"]+)"', labels or "")
            key = f"{name}[{stage.group(1)}]" if stage else name
            totals[key] = totals.get(key, 0.0) + float(value)
        return totals

    def stop(self) -> str:
        """SIGTERM (the server stops its engine in order); its whole output."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        out = self.output()
        self.log.unlink(missing_ok=True)
        return out


def start_server(model_dir: Path, cache: str, lanes: int | None, engine: str | None) -> Server:
    """``mmfront serve`` on a free loopback port, as a user starts it; its misses on ``lanes``
    processing lanes (default: the cores but one, at least one: the demo drives the lanes, which
    ``mmfront serve`` leaves off by default for a model whose misses run in mmfront's kernels, as
    the embedded Gemma 3's do)."""
    port = get_open_port()
    command = [sys.executable, "-m", "mmfront.cli", "serve", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", MODEL_NAME, "--uvicorn-log-level", "warning",
               "--mm-processor-cache-gb", "0" if cache == "none" else "1"]
    if cache != "none":
        command += ["--mm-processor-cache-type", cache]
    command += ["--processing-lanes", str(max(1, available_cores() - 1) if lanes is None else lanes)]
    if engine:
        scheme, _, where = engine.partition("://")
        host, _, rpc_port = where.rpartition(":")
        if scheme != "tcp" or not rpc_port.isdigit() or not host:
            raise ConfigError("--engine takes tcp://HOST:PORT (the headless engine's handshake address).")
        command += ["--data-parallel-size-local", "0", "--data-parallel-address", host,
                    "--data-parallel-rpc-port", rpc_port]
        print(f"waiting for an engine: mmfront worker MODEL --data-parallel-address {host} "
              f"--data-parallel-rpc-port {rpc_port}", flush=True)
    log = Path(tempfile.mkstemp(prefix="mmfront-demo-serve-", suffix=".log")[1])
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Server(process, f"http://127.0.0.1:{port}", log)


# --- the workload over HTTP -----------------------------------------------------------------------


async def run_workload(client: Any, requests: Sequence[DemoRequest], progress: Any) -> dict[str, Outcome]:
    """Every request through ``client`` (``openai.AsyncOpenAI``), ``IN_FLIGHT`` at a time; the
    even ones streamed."""
    import openai

    gate = asyncio.Semaphore(IN_FLIGHT)
    outcomes: dict[str, Outcome] = {}

    async def one(n: int, request: DemoRequest) -> None:
        outcome = outcomes[request.request_id] = Outcome(stream=n % 2 == 0)
        async with gate:
            started = time.perf_counter()
            common: dict[str, Any] = {"model": MODEL_NAME, "messages": request.messages,
                                      "max_tokens": request.max_tokens, "temperature": 0.0,
                                      "extra_headers": {"X-Request-Id": request.request_id}}
            try:
                if outcome.stream:
                    stream = await client.chat.completions.create(
                        **common, stream=True, stream_options={"include_usage": True})
                    async for chunk in stream:
                        if chunk.usage is not None:
                            outcome.tokens = chunk.usage.completion_tokens
                        for choice in chunk.choices:
                            if choice.delta.content:
                                outcome.first_token_s = outcome.first_token_s or time.perf_counter() - started
                                outcome.chunks.append(choice.delta.content)
                            outcome.finish = choice.finish_reason or outcome.finish
                    outcome.text = "".join(outcome.chunks)
                else:
                    answer = await client.chat.completions.create(**common)
                    [choice] = answer.choices
                    outcome.text = choice.message.content or ""
                    outcome.finish = choice.finish_reason
                    outcome.tokens = answer.usage.completion_tokens if answer.usage else 0
            except openai.OpenAIError as e:
                outcome.error = f"{type(e).__name__}: {e}"
            outcome.latency_s = time.perf_counter() - started
            progress()

    await asyncio.gather(*(one(n, r) for n, r in enumerate(requests)))
    return outcomes


def check_with_transformers(model_dir: Path, requests: Sequence[DemoRequest],
                            outcomes: dict[str, Outcome]) -> list[str]:
    """Greedy ``generate`` of transformers on the same conversations, decoded as the server
    decodes (special tokens skipped); the answers whose text differs."""
    import torch
    import transformers
    from PIL import Image

    pre = InputPreprocessor(model_dir, MultiModalConfig(mm_processor_cache_gb=0, mm_processing_lanes=0))
    try:
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
            batch = hf(text=inputs["prompt"], images=images or None, return_tensors="pt", add_special_tokens=False)
            with torch.inference_mode():
                out = model.generate(**batch, do_sample=False, max_new_tokens=request.max_tokens)
            want = hf.tokenizer.decode(out[0, batch["input_ids"].shape[1]:].tolist(), skip_special_tokens=True)
            got = outcomes[request.request_id].text
            if got != want:
                problems.append(f"{request.request_id}: server {got!r} != transformers {want!r}")
        return problems
    finally:
        pre.close()


# --- the summary ------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _engine_stats(server_output: str) -> tuple[int, int] | None:
    """The worker's closing line: encoder cache hits and lookups."""
    found = re.findall(r"encoder cache (\d+)/(\d+) hits", server_output)
    return (sum(int(h) for h, _ in found), sum(int(n) for _, n in found)) if found else None


def summarize(requests: Sequence[DemoRequest], outcomes: dict[str, Outcome], wall_s: float, *,
              metrics: dict[str, float], encoder: tuple[int, int] | None, checks: dict[str, bool]) -> dict[str, Any]:
    answered = [o for o in outcomes.values() if o.error is None]
    queries = metrics.get("vllm:mm_cache_queries_total", 0.0)
    return {
        "requests": len(requests),
        "requests_per_s": len(requests) / wall_s if wall_s else 0.0,
        "latency_p50_ms": 1e3 * _percentile([o.latency_s for o in answered], 0.5),
        "latency_p99_ms": 1e3 * _percentile([o.latency_s for o in answered], 0.99),
        "first_token_p50_ms": 1e3 * _percentile([o.first_token_s for o in answered if o.first_token_s], 0.5),
        "streamed": sum(o.stream for o in outcomes.values()),
        "stage_seconds": {name: metrics.get(f"mmfront:stage_seconds_total[{name}]", 0.0) for name in STAGES},
        "p0_cache_hit_rate": metrics.get("vllm:mm_cache_hits_total", 0.0) / queries if queries else 0.0,
        "encoder_cache_hit_rate": (encoder[0] / encoder[1]) if encoder and encoder[1] else None,
        "wire_bytes": int(metrics.get("mmfront:request_wire_bytes_total", 0)),
        "cache_saved_bytes": int(metrics.get("mmfront:mm_cache_saved_bytes_total", 0)),
        "tokens": sum(o.tokens for o in answered),
        "resends": int(metrics.get("mmfront:mm_cache_resends_total", 0)),
        "checks": checks,
    }


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="mmfront demo: mmfront serve + mmfront worker, OpenAI client", show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("requests (streamed)", f"{summary['requests']} ({summary['streamed']})")
    table.add_row("requests/s (end to end, HTTP)", f"{summary['requests_per_s']:.2f}")
    table.add_row("latency p50 / p99", f"{summary['latency_p50_ms']:.0f} / {summary['latency_p99_ms']:.0f} ms")
    table.add_row("time to first token p50 (streamed)", f"{summary['first_token_p50_ms']:.0f} ms")
    for name in STAGES:
        table.add_row(f"  server time in {name}", f"{summary['stage_seconds'].get(name, 0.0):.2f} s")
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
    try:
        import openai
    except ImportError:
        raise ConfigError("mmfront demo sends its requests with OpenAI's client: pip install 'mmfront[demo]' "
                          "(make demo does).") from None
    model_dir = Path(model) if model else cached_model_dir(DEFAULT_MODEL_KIND, with_weights=True)
    workload = read_workload(Path(requests_file)) if requests_file else generate_workload(num_requests)
    server = start_server(model_dir, cache, lanes, engine)
    try:
        server.wait_ready(600 if engine else SERVER_START_S)
        if not as_json:
            print(f"mmfront serve is up at {server.url}; sending {len(workload)} requests, {IN_FLIGHT} in flight",
                  flush=True)
        started = time.perf_counter()
        outcomes = _run_with_progress(openai, server.url, workload, quiet=as_json)
        wall = time.perf_counter() - started
        metrics = server.metrics()
    finally:
        output = server.stop()
    answered = [o for o in outcomes.values() if o.error is None and o.finish is not None]
    sample = [r for r in workload if outcomes[r.request_id].error is None][:CHECKED_SAMPLE]
    problems = check_with_transformers(model_dir, sample, outcomes) if sample else ["no request was answered"]
    checks = {
        "every request answered once": len(answered) == len(workload),
        f"{len(sample)} answers' text equals transformers' generate, decoded": not problems,
    }
    summary = summarize(workload, outcomes, wall, metrics=metrics, encoder=_engine_stats(output), checks=checks)
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


def _run_with_progress(openai: Any, url: str, workload: Sequence[DemoRequest], *, quiet: bool) -> dict[str, Outcome]:
    async def run(progress: Any) -> dict[str, Outcome]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="demo", max_retries=0, timeout=600) as client:
            return await run_workload(client, workload, progress)

    if quiet:
        return asyncio.run(run(lambda: None))
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("requests", total=len(workload))
        return asyncio.run(run(lambda: progress.advance(task)))


__all__ = ["DemoRequest", "generate_workload", "read_workload", "run_demo"]
