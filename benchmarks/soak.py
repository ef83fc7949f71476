"""The soak (``make soak``; not part of ``make test`` or CI): many chat requests with images
through the real :class:`~mmfront.engine.async_client.AsyncEngineClient` and an engine process
over vLLM's ZMQ sockets, with a small P0/P1 cache and a seeded schedule of faults.

Faults: the engine is SIGKILLed and restarted every ~``--kill-every`` requests; between the kill
and the new engine's greeting the link drops about half of what P0 sends (what ZMQ loses with a
dead peer); the link holds back random messages and sends them after the next one (reorders);
a second frontend feeds the same engine malformed frames the whole time; random requests are
aborted while in flight; some requests carry an image over ``max_image_pixels``.

Every request must end in exactly one of these outcomes, or the run fails:

- ``finished``: its outputs end with a finish reason, and (echo engine) the first token is the
  checksum of the tensors the same chat gives in-process without a cache;
- ``rejected``: only the oversize requests, each with ``MediaTooLargeError`` on ``multi_modal_data``;
- ``aborted``: only the requests this script aborted, their stream ending without a finish;
- ``engine_dead``: ``EngineDeadError``, only for a request that was generating when an engine was
  killed (the client must not resend those: it would answer them twice).

Anything else (another error, a wrong token, no answer within ``--request-timeout-s``, a request id
finishing twice on the wire) is a violation. So is RSS growth after warm-up of 5 % or more
(frontend: from the warm-up mark to the end; engine: within each engine's life, from its first
``--engine-warmup`` requests to its kill), and an ipc socket folder or /dev/shm segment left behind.

The engine is ``echo`` (this file run as ``soak.py engine ...``: an ``EngineCoreReceiver`` loop that
answers every request with the checksum of its tensors, then the prompt length) or ``worker``
(``mmfront worker`` running the tiny Gemma 3 with random weights; tokens are not checked).
See docs/reliability.md for the figures of a full run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from _soak_faults import FaultyLink, MalformedPeer
from mmfront import MultiModalConfig
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports.zmq import ZmqAddresses, ZmqEngineTransport, ZmqFrontendTransport
from mmfront.errors import EngineDeadError, MediaTooLargeError, TransportError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.models import cached_model_dir
from mmfront.wire import EngineCoreRequest, SamplingParams
from mmfront.wire.structs import EngineCoreOutput, FinishReason

STEPS = 2
"""Outputs per request from the echo engine: a kill can land between them (``engine_dead``)."""
MAX_IMAGE_PIXELS = 64 * 64
POOL_SIZE = 48
COMBOS = 96
MAX_GROWTH = 0.05

# --- the echo engine (a separate process) -----------------------------------------------------


def request_checksum(request: EngineCoreRequest) -> int:
    """A digest of every tensor of every feature, in offset order (31 bits: a token id)."""
    digest = hashlib.blake2b(digest_size=8)
    for feature in request.mm_features or []:
        for key in sorted(feature.data or {}):
            tensor = feature.data[key].data  # type: ignore[index]
            assert isinstance(tensor, torch.Tensor)
            digest.update(key.encode())
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF


def engine_main(args: argparse.Namespace) -> int:
    """Serve frontend A (with the P1 cache) and the malformed peer B (no cache) until SIGTERM."""
    if args.cache == "shm":
        cache: MirroredReceiverCache | ShmObjectStoreReceiverCache = ShmObjectStoreReceiverCache(args.shm_name)
    else:
        cache = MirroredReceiverCache(args.capacity_bytes)
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    a = ZmqEngineTransport(ZmqAddresses(args.input, args.output, bytes.fromhex(os.environ.get("SOAK_SIDE_SECRET", ""))), 0)
    with EngineCoreReceiver(a, cache, engine_index=0, heartbeat_s=0.2) as receiver:
        receiver.add_frontend(ZmqEngineTransport(ZmqAddresses(args.peer_input, args.peer_output), 0))
        running: dict[str, list[int]] = {}
        while not stop:
            for request in receiver.poll(0.02 if not running else 0.0):
                running[request.request_id] = [request_checksum(request), len(request.prompt_token_ids or [])]
            for request_id in receiver.take_aborted():
                running.pop(request_id, None)
            outputs = []
            for request_id, tokens in list(running.items()):
                token = tokens.pop(0)
                outputs.append(EngineCoreOutput(request_id, [token],
                                                finish_reason=None if tokens else FinishReason.LENGTH))
                if not tokens:
                    del running[request_id]
            if outputs:
                receiver.send(outputs)
    return 0


# --- the workload and its outcomes ---------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    request_id: str
    kind: str  # "ok", "abort" or "oversize"
    combo: tuple[int, ...]


def make_plan(count: int, seed: int, abort_p: float, oversize_p: float) -> Iterator[Planned]:
    rng = random.Random(seed)
    for n in range(count):
        draw = rng.random()
        kind = "oversize" if draw < oversize_p else "abort" if draw < oversize_p + abort_p else "ok"
        yield Planned(f"soak-{n}", kind, (rng.randrange(COMBOS),))


class Media:
    """The image pool (small images, so the cache holds few), the combos of 1-3 of them, and the
    checksum each combo's tensors give in-process without a cache."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.pool = [image_data_url(make_image(rng.randint(16, 60), rng.randint(16, 60), seed=i))
                     for i in range(POOL_SIZE)]
        self.combos = [tuple(rng.randrange(POOL_SIZE) for _ in range(rng.randint(1, 3))) for _ in range(COMBOS)]
        self.oversize = image_data_url(make_image(96, 96, seed=seed))

    def messages(self, planned: Planned, n: int) -> list[dict[str, Any]]:
        """The chat of request ``n``. Its text repeats every 1,000 requests: the tokenizer caches
        each new word (up to 10,000, ~10 MiB), which would otherwise pass for growth."""
        urls = [self.oversize] if planned.kind == "oversize" else [self.pool[i] for i in self.combos[planned.combo[0]]]
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
        return [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [*parts, {"type": "text", "text": f"Request {n % 1000}: what is here?"}]}]

    def checksums(self, model_dir: Path, config: MultiModalConfig) -> list[int]:
        processor = InputProcessor(InputPreprocessor(model_dir, config.replace(mm_processor_cache_gb=0)))
        return [request_checksum(processor.process_inputs("x", self.messages(Planned("x", "ok", (c,)), 0)))
                for c in range(COMBOS)]


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    seen: bytearray = field(default_factory=bytearray)
    """One byte per request number: 1 once it has an outcome."""
    planned: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    done: int = 0

    def record(self, request_id: str, outcome: str, problem: str | None = None) -> None:
        n = int(request_id.rsplit("-", 1)[1])
        if self.seen[n]:
            self.violations.append(f"{request_id}: answered twice (then {outcome})")
        self.seen[n] = 1
        self.outcomes[outcome] += 1
        if problem is not None:
            self.violations.append(f"{request_id}: {problem}")
        self.done += 1


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


# --- the engine processes --------------------------------------------------------------------------


class Engines:
    """Starts, kills and restarts the engine process; samples each one's RSS."""

    def __init__(self, args: argparse.Namespace, a: ZmqFrontendTransport, b: ZmqFrontendTransport,
                 config: MultiModalConfig, shm_name: str | None) -> None:
        self.args = args
        self.a, self.b = a.addresses, b.addresses
        self.config = config
        self.shm_name = shm_name
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0
        self.warm_kib: int | None = None
        self.lives: list[tuple[int, int]] = []
        """Per engine killed or stopped after its warm-up: (RSS after warm-up, RSS at the end) in KiB."""
        self.reaped: list[int | None] = []

    def command(self) -> list[str]:
        if self.args.engine == "worker":
            return [sys.executable, "-m", "mmfront.cli", "worker", str(cached_model_dir("gemma3", with_weights=True)),
                    "--input", self.a.input, "--input", self.b.input, "--output", self.a.output,
                    "--output", self.b.output, "--cache", "lru", "--cache-gb", str(self.config.mm_processor_cache_gb)]
        command = [sys.executable, __file__, "engine", self.a.input, self.a.output, self.b.input, self.b.output,
                   "--cache", self.args.cache, "--capacity-bytes", str(self.config.mm_processor_cache_bytes)]
        return command + (["--shm-name", self.shm_name] if self.shm_name else [])

    def start(self, done: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "SOAK_SIDE_SECRET": self.a.side_secret.hex()}  # not in argv
        self.process = subprocess.Popen(self.command(), env=env)
        self.started_at, self.warm_kib = done, None

    def sample(self, done: int) -> None:
        if self.process is not None and self.warm_kib is None and done - self.started_at >= self.args.engine_warmup:
            self.warm_kib = rss_kib(self.process.pid)

    def end(self, sig: int) -> None:
        """Sample, then end the engine with ``sig``."""
        process, self.process = self.process, None
        if process is None:
            return
        if self.warm_kib is not None:
            self.lives.append((self.warm_kib, rss_kib(process.pid)))
        process.send_signal(sig)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        self.reaped.append(process.returncode)


async def wait_for_epoch(client: AsyncEngineClient, old: int | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while client.client.ranks[0].epoch in (None, old):
        if time.monotonic() > deadline:
            raise TransportError(f"No engine greeted within {timeout_s} s.")
        await asyncio.sleep(0.01)


@dataclass
class Soak:
    args: argparse.Namespace
    client: AsyncEngineClient
    link: FaultyLink
    media: Media
    expected: list[int]
    engines: Engines
    tally: Tally = field(default_factory=Tally)
    rss: list[int] = field(default_factory=list)
    """The frontend's RSS in KiB: at the warm-up mark, then every 1,000 requests, then at the end."""
    aborts_refused: int = 0
    _rng: random.Random = field(default_factory=random.Random)

    async def run(self) -> None:
        self._rng.seed(self.args.seed + 1)
        plan = make_plan(self.args.requests, self.args.seed, self.args.abort_p, self.args.oversize_p)
        monitor = asyncio.ensure_future(self.monitor())
        await asyncio.gather(*(self.worker(plan) for _ in range(self.args.concurrency)))
        monitor.cancel()
        self.rss.append(rss_kib())

    async def worker(self, plan: Iterator[Planned]) -> None:
        for planned in plan:
            self.tally.planned[planned.kind] += 1
            kills = self.tally.kills
            try:
                await asyncio.wait_for(self.one(planned, kills), self.args.request_timeout_s)
            except asyncio.TimeoutError:
                self.tally.record(planned.request_id, "hung", f"no answer within {self.args.request_timeout_s} s")

    async def one(self, planned: Planned, kills: int) -> None:
        request_id, tally = planned.request_id, self.tally
        messages = self.media.messages(planned, int(request_id.rsplit("-", 1)[1]))
        try:
            stream = await self.client.add_request(request_id, messages, SamplingParams(max_tokens=STEPS))
        except MediaTooLargeError as e:
            ok = planned.kind == "oversize" and e.parameter == "multi_modal_data"
            tally.record(request_id, "rejected", None if ok else f"refused: {e!r}")
            return
        except Exception as e:
            tally.record(request_id, "error", f"add_request raised {e!r}")
            return
        if planned.kind == "oversize":
            tally.record(request_id, "error", "an image over max_image_pixels was accepted")
            return
        aborting = asyncio.ensure_future(self.abort_later(request_id)) if planned.kind == "abort" else None
        outputs: list[EngineCoreOutput] = []
        try:
            async for output in stream:
                outputs.append(output)
        except EngineDeadError as e:
            killed = tally.kills > kills or self.link.lossy
            tally.record(request_id, "engine_dead", None if killed and outputs else f"failed without a kill: {e}")
            return
        except Exception as e:
            tally.record(request_id, "error", f"the stream raised {e!r}")
            return
        finally:
            if aborting is not None:
                await aborting
        if outputs and outputs[-1].finish_reason is not None:
            tally.record(request_id, "finished", self.check(planned, outputs))
        elif planned.kind == "abort":
            tally.record(request_id, "aborted")
        else:
            tally.record(request_id, "error", f"the stream ended unfinished after {len(outputs)} outputs")

    def check(self, planned: Planned, outputs: list[EngineCoreOutput]) -> str | None:
        if len(outputs) != STEPS:
            return f"{len(outputs)} outputs, expected {STEPS}"
        if self.args.engine == "echo" and outputs[0].new_token_ids != [self.expected[planned.combo[0]]]:
            return f"checksum {outputs[0].new_token_ids} != {self.expected[planned.combo[0]]}: wrong tensors"
        return None

    async def abort_later(self, request_id: str) -> None:
        await asyncio.sleep(self._rng.random() * 0.01)
        try:
            await self.client.abort(request_id)
        except TransportError:
            self.aborts_refused += 1  # the engine is down; the stream must still end (or the request hangs)

    async def monitor(self) -> None:
        """Kill and restart the engine on schedule; sample RSS."""
        rng = random.Random(self.args.seed + 2)
        every = self.args.kill_every
        next_kill = rng.randint(every // 2, every * 3 // 2) if every else None
        next_sample = self.args.warmup
        while True:
            await asyncio.sleep(0.01)
            done = self.tally.done
            self.engines.sample(done)
            if done >= next_sample:
                self.rss.append(rss_kib())
                next_sample += 1000
                if len(self.rss) % 10 == 1:
                    print(f"soak: {done} requests, {dict(self.tally.outcomes)}, frontend RSS {self.rss[-1] // 1024} MiB",
                          file=sys.stderr, flush=True)
            if next_kill is not None and done >= next_kill:
                await self.restart(rng)
                next_kill = done + rng.randint(every // 2, every * 3 // 2)

    async def restart(self, rng: random.Random) -> None:
        old = self.client.client.ranks[0].epoch
        self.link.lossy = True
        self.engines.end(signal.SIGKILL)
        self.tally.kills += 1
        await asyncio.sleep(rng.random() * 0.3)
        self.engines.start(self.tally.done)
        await wait_for_epoch(self.client, old, 120)


# --- the run -----------------------------------------------------------------------------------------


def gone(path: Path) -> bool:
    return not path.exists()


def summarize(soak: Soak, peer: MalformedPeer, wall_s: float, leftovers: list[str]) -> dict[str, Any]:
    tally, engines, args = soak.tally, soak.engines, soak.args
    twice = [f"soak-{n}" for n, count in enumerate(soak.link.finished) if count > 1]
    missing = args.requests - sum(tally.seen)
    warm, end = soak.rss[0], soak.rss[-1]
    engine_growth = max((e / w - 1 for w, e in engines.lives), default=0.0)
    violations = list(tally.violations)
    violations += [f"{rid}: finished more than once on the wire" for rid in twice[:20]]
    if missing:
        violations.append(f"{missing} requests got no outcome")
    if end / warm - 1 >= MAX_GROWTH:
        violations.append(f"frontend RSS grew {100 * (end / warm - 1):.1f} % after warm-up")
    if engine_growth >= MAX_GROWTH:
        violations.append(f"an engine's RSS grew {100 * engine_growth:.1f} % after its warm-up")
    if tally.kills and not engines.lives:
        violations.append("no engine lived past --engine-warmup: its RSS was never compared")
    violations += leftovers
    stats = soak.client.stats
    return {
        "command": " ".join(["python benchmarks/soak.py", *sys.argv[1:]]),
        "engine": args.engine, "cache": args.cache, "cache_bytes": soak.engines.config.mm_processor_cache_bytes,
        "requests": args.requests, "wall_s": round(wall_s, 1), "requests_per_s": round(args.requests / wall_s, 1),
        "outcomes": dict(tally.outcomes),
        "faults": {"engine_kills": tally.kills, "planned": dict(tally.planned),
                   "aborts_refused_engine_down": soak.aborts_refused, **dict(soak.link.counts),
                   "malformed_messages": peer.sent, "malformed_unreachable": peer.unreachable,
                   "malformed_refusals_to_peer": peer.refusals},
        "client": {"resends": stats.resends, "shadow_resets": stats.shadow_resets,
                   "engine_restarts": stats.engine_restarts, "failures": stats.failures},
        "p0_cache_hit_rate": round(soak.client.client.processor.preprocessor.stats.hit_ratio, 3),
        "frontend_rss_mib": {"warm": round(warm / 1024, 1), "end": round(end / 1024, 1),
                             "peak": round(max(soak.rss) / 1024, 1), "growth_pct": round(100 * (end / warm - 1), 2)},
        "engine_rss_mib": {"lives_compared": len(engines.lives),
                           "max_growth_pct": round(100 * engine_growth, 2),
                           "warm_range": [round(min(w for w, _ in engines.lives) / 1024, 1),
                                          round(max(w for w, _ in engines.lives) / 1024, 1)] if engines.lives else None},
        "violations": violations[:50],
        "violation_count": len(violations),
    }


def main_soak(args: argparse.Namespace) -> int:
    config = MultiModalConfig(mm_processor_cache_gb=args.cache_gb, mm_processor_cache_type=args.cache,
                              max_image_pixels=MAX_IMAGE_PIXELS)
    model_dir = cached_model_dir("gemma3")
    media = Media(args.seed)
    expected = media.checksums(model_dir, config)
    pre = InputPreprocessor(model_dir, config)
    pre.warmup()
    shm_name: str | None = getattr(pre.cache, "shm_name", None)
    a, b = ZmqFrontendTransport("ipc"), ZmqFrontendTransport("ipc")
    ipc_dirs = [Path(t.addresses.input[len("ipc://"):]).parent for t in (a, b)]
    link = FaultyLink(a, random.Random(args.seed + 3), args.reorder_p)
    link.finished = bytearray(args.requests)
    client = AsyncEngineClient(InputProcessor(pre), link, engine_timeout_s=60)
    engines = Engines(args, a, b, config, shm_name)
    soak = Soak(args, client, link, media, expected, engines, Tally(seen=bytearray(args.requests)))
    peer = MalformedPeer(b, lambda: soak.tally.done, args.malformed_ratio, args.seed + 4)
    engines.start(0)
    started = time.perf_counter()
    try:
        asyncio.run(wait_for_epoch(client, None, 120))
        peer.start()
        asyncio.run(soak.run())
    finally:
        wall = time.perf_counter() - started
        peer.stop.set()
        peer.join(10)
        engines.end(signal.SIGTERM)
        client.close_blocking()
        b.close()
        if pre.cache is not None:
            pre.cache.close()
    leftovers = [f"ipc socket folder left: {d}" for d in ipc_dirs if not gone(d)]
    if shm_name and not gone(Path("/dev/shm") / shm_name.lstrip("/")):
        leftovers.append(f"/dev/shm segment left: {shm_name}")
    if any(code is None for code in engines.reaped):
        leftovers.append("an engine process was not reaped")
    summary = summarize(soak, peer, wall, leftovers)
    print(json.dumps(summary, indent=2))
    return 1 if summary["violation_count"] else 0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="mode")
    engine = sub.add_parser("engine", help="(internal) the echo engine process")
    for name in ("input", "output", "peer_input", "peer_output"):
        engine.add_argument(name)
    engine.add_argument("--cache", choices=["lru", "shm"], default="lru")
    engine.add_argument("--capacity-bytes", type=int, default=1 << 20)
    engine.add_argument("--shm-name")
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--engine", choices=["echo", "worker"], default="echo")
    parser.add_argument("--cache", choices=["lru", "shm"], default="lru")
    parser.add_argument("--cache-gb", type=float, default=0.0002, help="P0/P1 cache size (default ~200 KiB: ~15 items)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--kill-every", type=int, default=2500, help="mean requests between engine kills (0: none)")
    parser.add_argument("--abort-p", type=float, default=0.02)
    parser.add_argument("--oversize-p", type=float, default=0.01)
    parser.add_argument("--reorder-p", type=float, default=0.05)
    parser.add_argument("--malformed-ratio", type=float, default=0.2, help="malformed messages per request")
    parser.add_argument("--warmup", type=int, default=0, help="requests before the frontend's RSS baseline "
                        "(default: 5 %% of --requests, at least 500)")
    parser.add_argument("--engine-warmup", type=int, default=500)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args(argv)
    if args.mode is None:
        args.warmup = args.warmup or max(500, args.requests // 20)
        if args.engine == "worker" and args.cache == "shm":
            parser.error("--engine worker runs with --cache lru (the malformed peer has no shm segment)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    return engine_main(args) if args.mode == "engine" else main_soak(args)


if __name__ == "__main__":
    sys.exit(main())
