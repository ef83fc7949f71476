"""The soak (``make soak``; not part of ``make test`` or CI): many chat requests with images
through the real :class:`~mmfront.engine.async_client.AsyncEngineClient` and an engine process
over vLLM's ZMQ sockets, with a small P0/P1 cache and a seeded schedule of faults.

Faults: the engine is SIGKILLed and restarted every ~``--kill-every`` requests; between the kill
and the new engine's greeting the link drops about half of what P0 sends (what ZMQ loses with a
dead peer); the link holds back random messages and sends them after the next one (reorders);
a rogue second frontend feeds the same engine malformed frames the whole time and floods it
every ``--flood-every`` requests (garbage, 4 MiB bodies, its own request id over and over);
impostors connect to the ``ipc`` side channel with no or forged secrets (more while an engine
restarts); a processing lane is SIGKILLed every ~``--lane-kill-every`` requests; cancel storms
every ~``--storm-every`` requests abort or disconnect a share of the requests in flight (a
disconnected request's id is used again at once, for other images); random requests are aborted
while in flight; some requests carry an image over ``max_image_pixels``.

Every request must end in exactly one of these outcomes, or the run fails:

- ``finished``: its outputs end with a finish reason, and (echo engine) the first token is the
  checksum of the tensors the same chat gives in-process without a cache;
- ``rejected``: only the oversize requests, each with ``MediaTooLargeError`` on ``multi_modal_data``;
- ``aborted``: only the requests this script aborted (or a storm did), their stream ending
  without a finish;
- ``reused``: a request a storm disconnected, sent again under the same id with other images,
  whose outputs are those images' (never the first request's);
- ``lane_lost``: ``LaneError``, only for a request being prepared when a lane was killed;
- ``engine_dead``: ``EngineDeadError``, only for a request that was generating when an engine was
  killed (the client must not resend those: it would answer them twice).

Anything else (another error, a wrong token, no answer within ``--request-timeout-s``, a request id
finishing twice on the wire) is a violation. So is RSS growth after warm-up of 5 % or more
(frontend: from the warm-up mark to the end; engine: within each engine's life, from its first
``--engine-warmup`` requests to its kill), a descriptor handed to an impostor, the side channel
never used, the frontend holding more descriptors at the end than the side channel's pending cap
above its warm-up count, a request id the client still tracks at the end, and an ipc socket
folder or /dev/shm segment left behind.

The engine is ``echo`` (this file run as ``soak.py engine ...``: an ``EngineCoreReceiver`` loop that
answers every request with the checksum of its tensors, then the prompt length) or ``worker``
(``mmfront worker`` running the tiny Gemma 3 with random weights; tokens are not checked).
See docs/reliability.md for the figures of a full run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _soak_engine import Engines, engine_main, request_checksum, rss_kib, wait_for_epoch
from _soak_faults import FaultyLink, Rogue, RogueSettings, kill_a_lane
from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.transports.fd_channel import side_path
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.errors import EngineDeadError, LaneError, MediaTooLargeError, TransportError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.models import cached_model_dir
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput

STEPS = 2
"""Outputs per request from the echo engine: a kill can land between them (``engine_dead``)."""
MAX_IMAGE_PIXELS = 64 * 64
POOL_SIZE = 48
COMBOS = 96
MAX_GROWTH = 0.05
MAX_EXTRA_FDS = 64 + 16
"""Descriptors the frontend may hold at the end above its warm-up count: the side channel's
pending connections (64, its cap) and some slack."""

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

    def messages(self, planned: Planned, n: int, combo: int | None = None) -> list[dict[str, Any]]:
        """The chat of request ``n`` (with ``combo``'s images, else its own). Its text repeats every
        1,000 requests: the tokenizer caches each new word (up to 10,000, ~10 MiB), which would
        otherwise pass for growth."""
        combo = planned.combo[0] if combo is None else combo
        urls = [self.oversize] if planned.kind == "oversize" else [self.pool[i] for i in self.combos[combo]]
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
        return [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [*parts, {"type": "text", "text": f"Request {n % 1000}: what is here?"}]}]

    def checksums(self, model_dir: Path, config: MultiModalConfig) -> list[int]:
        with InputPreprocessor(model_dir, config.replace(mm_processor_cache_gb=0, mm_processing_lanes=0)) as pre:
            processor = InputProcessor(pre)
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
    lane_kills: int = 0
    lanes_killed: dict[int, float] = field(default_factory=dict)
    """Lane pid -> when it was killed (monotonic)."""
    storms: int = 0
    done: int = 0

    def record(self, request_id: str, outcome: str, problem: str | None = None) -> None:
        n = int(request_id.rsplit("-", 1)[1])
        if self.seen[n]:
            self.violations.append(f"{request_id}: answered twice (then {outcome})")
        self.seen[n] = 1
        self.outcomes[outcome] += 1
        if problem is not None:
            self.violations.append(f"{request_id}: {problem}")
            if len(self.violations) <= 50:  # a long run shows them as they come
                print(f"soak: violation: {self.violations[-1]}", file=sys.stderr, flush=True)
        self.done += 1


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
    rogue: Rogue | None = None
    fds: list[int] = field(default_factory=list)
    """The frontend's open descriptors: at the warm-up mark and at the end."""
    live: dict[str, asyncio.Future[Any] | None] = field(default_factory=dict)
    """Requests in flight: the task reading each one's stream (``None`` while it is prepared)."""
    stormed: set[str] = field(default_factory=set)
    """Requests a storm aborted or disconnected (until their outcome)."""
    disconnected: set[str] = field(default_factory=set)
    reused: set[int] = field(default_factory=set)
    tracked: list[str] = field(default_factory=list)
    """Request ids the client still tracked at the end (after 5 s to settle)."""
    """Request numbers sent twice (a disconnect, then the same id again): may finish twice on the wire."""
    _rng: random.Random = field(default_factory=random.Random)

    async def run(self) -> None:
        self._rng.seed(self.args.seed + 1)
        plan = make_plan(self.args.requests, self.args.seed, self.args.abort_p, self.args.oversize_p)
        monitor = asyncio.ensure_future(self.monitor())
        await asyncio.gather(*(self.worker(plan) for _ in range(self.args.concurrency)))
        monitor.cancel()
        self.rss.append(rss_kib())
        deadline = time.monotonic() + 5  # the reader thread aborts what the last storms disconnected
        while (tracked := self.client.client.in_flight + self.client.client.running) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.tracked = tracked

    async def worker(self, plan: Iterator[Planned]) -> None:
        for planned in plan:
            self.tally.planned[planned.kind] += 1
            kills = self.tally.kills
            try:
                await asyncio.wait_for(self.one(planned, kills), self.args.request_timeout_s)
            except asyncio.TimeoutError:
                self.tally.record(planned.request_id, "hung", f"no answer within {self.args.request_timeout_s} s")

    async def one(self, planned: Planned, kills: int) -> None:
        request_id = planned.request_id
        self.live[request_id] = None
        try:
            await self.attempt(planned, kills)
        finally:
            self.live.pop(request_id, None)
            self.stormed.discard(request_id)
            self.disconnected.discard(request_id)

    async def attempt(self, planned: Planned, kills: int, combo: int | None = None) -> None:
        """Send ``planned`` (with ``combo``'s images: a reuse of its id) and record its outcome."""
        request_id, tally = planned.request_id, self.tally
        n = int(request_id.rsplit("-", 1)[1])
        started = time.monotonic()
        try:
            stream = await self.client.add_request(request_id, self.media.messages(planned, n, combo),
                                                   SamplingParams(max_tokens=STEPS, temperature=0.0))
        except MediaTooLargeError as e:
            ok = planned.kind == "oversize" and e.parameter == "multi_modal_data"
            tally.record(request_id, "rejected", None if ok else f"refused: {e!r}")
            return
        except LaneError as e:
            tally.record(request_id, "lane_lost", None if lane_killed(e, tally.lanes_killed, started) else
                         f"its lane was not killed during the request: {e!r}")
            return
        except Exception as e:
            tally.record(request_id, "error", f"add_request raised {e!r}")
            return
        if planned.kind == "oversize":
            tally.record(request_id, "error", "an image over max_image_pixels was accepted")
            return
        aborting = asyncio.ensure_future(self.abort_later(request_id)) if planned.kind == "abort" else None
        outputs: list[EngineCoreOutput] = []
        held = [stream]  # the reader's only hold on the stream: a disconnect empties it
        reading = asyncio.ensure_future(self.read(held, outputs))
        self.live[request_id] = reading
        try:
            await reading
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if request_id not in self.disconnected or not reading.cancelled() or (current and current.cancelling()):
                raise
        except EngineDeadError as e:
            killed = tally.kills > kills or self.link.lossy
            tally.record(request_id, "engine_dead", None if killed and outputs else f"failed without a kill: {e}")
            return
        except Exception as e:
            tally.record(request_id, "error", f"the stream raised {e!r}")
            return
        finally:
            if aborting is not None:  # before the id is used again: it must abort the old request only
                await aborting
        combo = planned.combo[0] if combo is None else combo
        if reading.cancelled():  # disconnected: the consumer drops the stream, the id is used again at once
            del stream, reading
            held.clear()  # a reader cancelled before it ran keeps its frame (and arguments) alive a while
            self.live[request_id] = None
            self.stormed.discard(request_id)
            self.disconnected.discard(request_id)
            self.reused.add(n)
            await self.attempt(Planned(request_id, "ok", planned.combo), kills, (combo + 1) % COMBOS)
            return
        if outputs and outputs[-1].finish_reason is not None:
            tally.record(request_id, "finished" if n not in self.reused else "reused", self.check(combo, outputs))
        elif planned.kind == "abort" or request_id in self.stormed:
            tally.record(request_id, "aborted")
        else:
            tally.record(request_id, "error", f"the stream ended unfinished after {len(outputs)} outputs")

    @staticmethod
    async def read(held: list[Any], outputs: list[EngineCoreOutput]) -> None:
        async for output in held[0]:
            outputs.append(output)

    def check(self, combo: int, outputs: list[EngineCoreOutput]) -> str | None:
        if len(outputs) != STEPS:
            return f"{len(outputs)} outputs, expected {STEPS}"
        if self.args.engine == "echo" and outputs[0].new_token_ids != [self.expected[combo]]:
            return f"checksum {outputs[0].new_token_ids} != {self.expected[combo]}: wrong tensors"
        return None

    async def abort_later(self, request_id: str) -> None:
        await asyncio.sleep(self._rng.random() * 0.01)
        try:
            await self.client.abort(request_id)
        except TransportError:
            self.aborts_refused += 1  # the engine is down; the stream must still end (or the request hangs)

    async def monitor(self) -> None:
        """Kill and restart the engine, kill lanes and storm on schedule; sample RSS."""
        rng = random.Random(self.args.seed + 2)
        every = self.args.kill_every
        next_kill = rng.randint(every // 2, every * 3 // 2) if every else None
        next_lane_kill = self.args.lane_kill_every or None
        next_storm = self.args.storm_every or None
        next_sample = self.args.warmup
        while True:
            await asyncio.sleep(0.01)
            done = self.tally.done
            self.engines.sample(done)
            if self.rogue is not None:
                self.rogue.progress.value = done
            if next_lane_kill is not None and done >= next_lane_kill:
                pid = kill_a_lane(self.client.client.processor.preprocessor.item_executor, rng)
                if pid is not None:
                    self.tally.lane_kills += 1
                    self.tally.lanes_killed[pid] = time.monotonic()
                next_lane_kill = done + rng.randint(self.args.lane_kill_every // 2, self.args.lane_kill_every * 3 // 2)
            if next_storm is not None and done >= next_storm:
                await self.storm(rng)
                next_storm = done + rng.randint(self.args.storm_every // 2, self.args.storm_every * 3 // 2)
            if done >= next_sample:
                if not self.rss:
                    self.fds.append(open_fds())
                self.rss.append(rss_kib())
                next_sample += self.args.sample_every
                if len(self.rss) % 10 == 1:
                    print(f"soak: {done} requests, {dict(self.tally.outcomes)}, frontend RSS {self.rss[-1] // 1024} MiB",
                          file=sys.stderr, flush=True)
            if next_kill is not None and done >= next_kill:
                await self.restart(rng)
                next_kill = done + rng.randint(every // 2, every * 3 // 2)

    async def storm(self, rng: random.Random) -> None:
        """Abort (half) or disconnect (half) ``--storm-fraction`` of the requests in flight, at once."""
        self.tally.storms += 1
        victims = [rid for rid in self.live if rid not in self.stormed and rng.random() < self.args.storm_fraction]
        aborts = []
        for request_id in victims:
            self.stormed.add(request_id)
            if self.live[request_id] is not None and rng.random() < 0.5:
                self.disconnected.add(request_id)
                self.live[request_id].cancel()  # type: ignore[union-attr]  # the consumer goes away: the client aborts it
            else:
                aborts.append(self.abort_now(request_id))
        # no reference to a cancelled reader is kept here: its traceback holds the stream, which must go
        await asyncio.gather(*aborts)

    async def abort_now(self, request_id: str) -> None:
        try:
            await self.client.abort(request_id)
        except TransportError:
            self.aborts_refused += 1

    async def restart(self, rng: random.Random) -> None:
        old = self.client.client.ranks[0].epoch
        self.link.lossy = True
        self.engines.end(signal.SIGKILL)
        self.tally.kills += 1
        if self.rogue is not None:
            self.rogue.burst()  # impostors: the dead engine's place is free, try to take it
        await asyncio.sleep(rng.random() * 0.3)
        self.engines.start(self.tally.done)
        await wait_for_epoch(self.client, old, 120)


# --- the run -----------------------------------------------------------------------------------------


KILL_LANDS_S = 1.0
"""How long a SIGKILLed lane may still look alive (not yet reaped, its socket open) on a loaded
machine: an item handed to it then fails with ``LaneError``, as if the lane died holding it."""


def lane_killed(error: LaneError, killed: dict[int, float], started: float) -> bool:
    """Whether ``error`` names a lane this script killed during the request (or just before it:
    ``KILL_LANDS_S``). A lane killed earlier, idle, must have been replaced before it got work."""
    match = re.search(r"\(pid (\d+)\) exited", str(error))
    return match is not None and killed.get(int(match.group(1)), -1e9) >= started - KILL_LANDS_S


def gone(path: Path) -> bool:
    return not path.exists()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def summarize(soak: Soak, rogue: dict[str, int], wall_s: float, leftovers: list[str]) -> dict[str, Any]:
    tally, engines, args = soak.tally, soak.engines, soak.args
    twice = [f"soak-{n}" for n, count in enumerate(soak.link.finished) if count > 1 + (n in soak.reused)]
    missing = args.requests - sum(tally.seen)
    warm, end = soak.rss[0], soak.rss[-1]
    engine_growth = max((e / w - 1 for _, w, e in engines.lives), default=0.0)
    flood_step = max((w / early - 1 for early, w, _ in engines.lives), default=0.0)
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
    if not rogue:
        violations.append("the rogue process died: its attacks were not counted")
    if rogue.get("impostor_descriptors_received"):
        violations.append(f"impostors on the side channel received {rogue['impostor_descriptors_received']} descriptors")
    side_messages = soak.link.inner.side_channel_messages
    if not side_messages:
        violations.append("no request went on the side channel: the impostors attacked nothing")
    if soak.fds[-1] - soak.fds[0] > MAX_EXTRA_FDS:
        violations.append(f"the frontend holds {soak.fds[-1] - soak.fds[0]} more descriptors than at warm-up")
    tracked = soak.tracked
    if tracked:
        violations.append(f"the client still tracks {len(tracked)} requests: {tracked[:5]}")
    violations += leftovers
    stats = soak.client.stats
    return {
        "command": " ".join(["python benchmarks/soak.py", *sys.argv[1:]]),
        "engine": args.engine, "cache": args.cache, "cache_bytes": soak.engines.config.mm_processor_cache_bytes,
        "requests": args.requests, "wall_s": round(wall_s, 1), "requests_per_s": round(args.requests / wall_s, 1),
        "outcomes": dict(tally.outcomes),
        "faults": {"engine_kills": tally.kills, "planned": dict(tally.planned),
                   "aborts_refused_engine_down": soak.aborts_refused, **dict(soak.link.counts),
                   **rogue,
                   "side_channel_messages": side_messages, "lane_kills": tally.lane_kills,
                   "cancel_storms": tally.storms, "ids_reused": len(soak.reused)},
        "client": {"resends": stats.resends, "shadow_resets": stats.shadow_resets,
                   "engine_restarts": stats.engine_restarts, "failures": stats.failures},
        "p0_cache_hit_rate": round(soak.client.client.processor.preprocessor.stats.hit_ratio, 3),
        "frontend_rss_mib": {"warm": round(warm / 1024, 1), "end": round(end / 1024, 1),
                             "peak": round(max(soak.rss) / 1024, 1), "growth_pct": round(100 * (end / warm - 1), 2),
                             "samples": [round(kib / 1024, 1) for kib in soak.rss]},
        "engine_rss_mib": {"lives_compared": len(engines.lives),
                           "max_growth_pct": round(100 * engine_growth, 2),
                           "max_first_flood_step_pct": round(100 * flood_step, 2),
                           "warm_range": [round(min(w for _, w, _ in engines.lives) / 1024, 1),
                                          round(max(w for _, w, _ in engines.lives) / 1024, 1)] if engines.lives else None},
        "frontend_fds": {"warm": soak.fds[0], "end": soak.fds[-1]},
        "violations": violations[:50],
        "violation_count": len(violations),
    }


def main_soak(args: argparse.Namespace) -> int:
    config = MultiModalConfig(mm_processor_cache_gb=args.cache_gb, mm_processor_cache_type=args.cache,
                              max_image_pixels=MAX_IMAGE_PIXELS, mm_processing_lanes=args.lanes)
    model_dir = cached_model_dir("gemma3")
    media = Media(args.seed)
    expected = media.checksums(model_dir, config)
    pre = InputPreprocessor(model_dir, config)
    pre.warmup()
    shm_name: str | None = getattr(pre.cache, "shm_name", None)
    a = ZmqFrontendTransport("ipc", side_channel_min_bytes=args.side_channel_min_bytes)
    side = side_path(a.addresses.input)
    assert side is not None
    rogue = Rogue(RogueSettings(side, args.malformed_ratio, args.flood_every, args.flood_size, args.impostor_ratio,
                                args.impostor_burst, args.seed + 4))
    ipc_dirs = [Path(addresses.input[len("ipc://"):]).parent for addresses in (a.addresses, rogue.addresses)]
    link = FaultyLink(a, random.Random(args.seed + 3), args.reorder_p)
    link.finished = bytearray(args.requests)
    client = AsyncEngineClient(InputProcessor(pre), link, engine_timeout_s=60)
    engines = Engines(args, a.addresses, rogue.addresses, config, shm_name)
    soak = Soak(args, client, link, media, expected, engines, Tally(seen=bytearray(args.requests)), rogue=rogue)
    engines.start(0)
    started = time.perf_counter()
    counts: dict[str, int] = {}
    try:
        asyncio.run(wait_for_epoch(client, None, 120))
        asyncio.run(soak.run())
    finally:
        wall = time.perf_counter() - started
        counts = rogue.stop()
        soak.fds.append(open_fds())
        engines.end(signal.SIGTERM)
        client.close_blocking()
        pre.close()  # the lanes
        if pre.cache is not None:
            pre.cache.close()
    leftovers = [f"ipc socket folder left: {d}" for d in ipc_dirs if not gone(d)]
    if shm_name and not gone(Path("/dev/shm") / shm_name.lstrip("/")):
        leftovers.append(f"/dev/shm segment left: {shm_name}")
    if any(code is None for code in engines.reaped):
        leftovers.append("an engine process was not reaped")
    summary = summarize(soak, counts, wall, leftovers)
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
    parser.add_argument("--flood-every", type=int, default=1000, help="requests between the rogue frontend's floods")
    parser.add_argument("--flood-size", type=int, default=300, help="messages per flood")
    parser.add_argument("--impostor-ratio", type=float, default=0.05, help="side-channel impostors per request")
    parser.add_argument("--impostor-burst", type=int, default=40, help="impostors at each engine kill")
    parser.add_argument("--side-channel-min-bytes", type=int, default=4096,
                        help="frames of this size or more go on the side channel (small: most requests' do)")
    parser.add_argument("--lanes", type=int, default=2, help="processing lanes (processes) of the frontend")
    parser.add_argument("--lane-kill-every", type=int, default=1500, help="mean requests between lane kills (0: none)")
    parser.add_argument("--storm-every", type=int, default=1000, help="mean requests between cancel storms (0: none)")
    parser.add_argument("--storm-fraction", type=float, default=0.5, help="share of the requests in flight a storm ends")
    parser.add_argument("--warmup", type=int, default=0, help="requests before the frontend's RSS baseline "
                        "(default: 5 %% of --requests, at least 500)")
    parser.add_argument("--engine-warmup", type=int, default=500)
    parser.add_argument("--sample-every", type=int, default=1000, help="requests between frontend RSS samples")
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
