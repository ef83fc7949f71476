"""The HTTP soak (issue 36): normal chats through ``mmfront serve --api-key`` while a second
process attacks the same server with every class of the issue's table; what the normal requests
get is measured against an attack-free phase on the same server.

The server is ``mmfront serve`` in front of its own local engine, ``mmfront worker`` running the
tiny Gemma 3 with random weights (the engine of ``benchmarks/soak.py --engine worker``). A few
clients (``--clients``) send normal chats (an image and a question, or text alone), greedy, with
``return_token_ids``: each distinct chat's expected tokens are its answer at warm-up, before any
attack, checked once more at once (greedy decoding on one machine answers the same every time).

Phases: warm-up; ``--baseline-minutes`` of normal traffic alone; ``--minutes`` of normal traffic
with the attacks; ``--settle-s`` with nothing. The attacker (this file run as
``bench_soak_http.py attack ...``) runs each class on its own, paced (light ones every
``--light-period-s``, costly ones every ``--heavy-period-s``): slow heads, slow bodies, idle
connections up to ``--idle-connections``, ``--big-bodies`` concurrent bodies of
``--big-body-mb``, a million messages, a million text parts, JSON nested 1,000 deep in five places,
out-of-range integers, ``n`` = 10^9, 100,000 stop strings, a header value of ``--huge-header-mb``,
a 1 MiB ``X-Request-Id`` on a stream, and streams dropped after their first chunk. ``--scale``
shrinks the sizes (the smoke test's few seconds).

Reported: wrong answers to normal requests (an error, a timeout or other tokens; target 0), p50
and p99 latency of normal requests in each phase (target: the attack phase's p99 within 2x of
the baseline's), the server's RSS (its process tree) at the end of the baseline and after
settling (target: within 5 %), and what each attack got back. ``mmfront bench --only soak_http``
runs it (``--quick``: 15 s per phase); ``python benchmarks/bench_soak_http.py`` takes the flags,
``--json`` prints the summary as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from _harness import Report, stop_process, wait_healthy
from mmfront.network import get_open_port
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.models import cached_model_dir

GROUP = "HTTP soak"
API_KEY = "soak-key"
MAX_TOKENS = 4
STARTUP_S = 300.0
REQUEST_TIMEOUT_S = 60.0
ATTACK_TIMEOUT_S = 30.0
"""How long one attack request waits for the server's answer before it counts as ``timeout``."""
IMAGE_SIZES = [(64, 64), (96, 48), (48, 128)]
QUESTIONS = ["What is in this image?", "Describe the colours.", "Count the shapes."]
TEXT_CHATS = ["Say hello.", "What is two plus two?", "Name a colour."]
P99_LIMIT = 2.0
RSS_LIMIT = 1.05


@dataclass
class SoakOptions:
    minutes: float = 10.0
    baseline_minutes: float = 2.0
    settle_s: float = 30.0
    clients: int = 4
    light_period_s: float = 2.0
    heavy_period_s: float = 30.0
    idle_connections: int = 1000
    big_bodies: int = 6
    big_body_mb: float = 60.0
    huge_header_mb: float = 64.0
    scale: float = 1.0
    attacks: str = "all"
    """Comma-separated attack names (slow-heads, slow-bodies, idle, big-bodies, messages, parts,
    deep-json, ints, huge-n, stops, huge-header, huge-request-id, drop-stream), or ``all``."""
    max_server_rss_gb: float = 8.0
    """The run stops (the server is killed) when the server tree's RSS passes this: a server an
    attack makes grow without bound must not take a shared machine down with it."""
    attacker_nice: int = 0
    """The attacker process's niceness (``os.nice``): on a small machine its own CPU (a thousand
    reconnecting connections, 360 MB of bodies to send) is taken from the server; a remote
    attacker's is not. The attacks sent are counted either way (``outcomes``)."""
    server_log: str = ""
    """Where to keep ``mmfront serve``'s output (default: a temporary file, removed)."""


@dataclass
class Phase:
    """What the normal requests of one phase got."""

    latencies: list[float] = field(default_factory=list)
    wrong: Counter[str] = field(default_factory=Counter)
    spans: list[tuple[float, float]] = field(default_factory=list)
    """Each request answered right: when it was sent and when its answer came (``time.monotonic``,
    one clock for every process on the machine, so attacks can be lined up with them)."""

    def summary(self) -> dict[str, Any]:
        return {"requests": len(self.latencies) + sum(self.wrong.values()), "answered_right": len(self.latencies),
                "wrong": dict(self.wrong), "p50_s": statistics.median(self.latencies) if self.latencies else float("nan"),
                "p99_s": percentile(self.latencies, 0.99)}


# --- the normal traffic -------------------------------------------------------------------------------


def normal_chats(model: str) -> list[dict[str, Any]]:
    """The distinct normal requests: image chats of several sizes and text chats."""
    chats: list[dict[str, Any]] = []
    for n, ((width, height), question) in enumerate(zip(IMAGE_SIZES, QUESTIONS)):
        content = [{"type": "image_url", "image_url": {"url": image_data_url(make_image(width, height, seed=n))}},
                   {"type": "text", "text": question}]
        chats.append({"role": "user", "content": content})
    chats += [{"role": "user", "content": text} for text in TEXT_CHATS]
    return [{"model": model, "messages": [chat], "max_tokens": MAX_TOKENS, "temperature": 0.0,
             "return_token_ids": True} for chat in chats]


async def ask(client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
    reply = await client.post("/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    if reply.status_code != 200:
        raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")
    return list(reply.json()["choices"][0]["token_ids"])


async def expected_answers(client: httpx.AsyncClient, chats: list[dict[str, Any]]) -> list[list[int]]:
    """Each chat's tokens before any attack, asked twice: they must agree."""
    answers = [await ask(client, chat) for chat in chats]
    again = [await ask(client, chat) for chat in chats]
    if answers != again:
        raise RuntimeError(f"the server answered the same greedy chats differently: {answers} then {again}")
    return answers


async def normal_traffic(client: httpx.AsyncClient, chats: list[dict[str, Any]], expected: list[list[int]],
                         seconds: float, clients: int, watch: Watch) -> Phase:
    phase = Phase()
    deadline = time.monotonic() + seconds

    async def one_client(index: int) -> None:
        k = index
        while time.monotonic() < deadline and watch.aborted is None:
            chat = k % len(chats)
            k += 1
            start = time.monotonic()
            try:
                tokens = await ask(client, chats[chat])
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as e:
                phase.wrong[f"error: {type(e).__name__}: {str(e)[:80]}"] += 1
                continue
            if tokens != expected[chat]:
                phase.wrong["other tokens"] += 1
            else:
                end = time.monotonic()
                phase.latencies.append(end - start)
                phase.spans.append((start, end))

    await asyncio.gather(*(one_client(i) for i in range(clients)))
    return phase


# --- the server -------------------------------------------------------------------------------------


def start_server(model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "mmfront.cli", "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--api-key", API_KEY]
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})


@dataclass
class Watch:
    """The server, sampled while the soak runs: its tree's peak RSS, and why the run stopped early
    (the server exited, or grew past ``--max-server-rss-gb`` and was killed)."""

    server: subprocess.Popen[bytes]
    limit_bytes: float
    peak_bytes: int = 0
    aborted: str | None = None
    done: bool = False

    async def run(self) -> None:
        while self.aborted is None and not self.done:
            if self.server.poll() is not None:
                self.aborted = f"mmfront serve exited with {self.server.returncode}"
                return
            rss = tree_rss_bytes(self.server.pid)
            self.peak_bytes = max(self.peak_bytes, rss)
            if rss > self.limit_bytes:
                self.aborted = (f"the server's RSS reached {rss / 2**30:.1f} GiB (over --max-server-rss-gb "
                                f"{self.limit_bytes / 2**30:g}): killed")
                stop_process(self.server)
                return
            await asyncio.sleep(0.5)


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def tree_rss_bytes(pid: int) -> int:
    """The resident set of ``pid`` and every process below it."""
    return sum(map(rss_bytes, tree_pids(pid)))


def rss_bytes(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time the processes ``pids`` have used so far (those still running)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


# --- the attacker (a process of its own) -----------------------------------------------------------------


class Attacker:
    """Runs every attack class against ``host:port`` until ``deadline``; counts what each got."""

    def __init__(self, host: str, port: int, model: str, options: SoakOptions, deadline: float) -> None:
        self.host, self.port, self.model = host, port, model
        self.options = options
        self.deadline = deadline
        self.outcomes: dict[str, Counter[str]] = {}
        self.held_s: dict[str, float] = {}
        """The longest the server kept a slow or idle connection open, per class."""
        self.windows: dict[str, list[tuple[float, float]]] = {}
        """When each class kept the server busy (``time.monotonic``): a request from its first byte
        to its answer, a held connection from the server's close to its reopening."""

    def count(self, attack: str, outcome: str) -> None:
        self.outcomes.setdefault(attack, Counter())[outcome] += 1

    def busy(self, attack: str, start: float) -> None:
        self.windows.setdefault(attack.split(" (", 1)[0], []).append((start, time.monotonic()))

    def scaled(self, n: float) -> int:
        return max(1, int(n * self.options.scale))

    def headers(self, extra: str = "", length: int | None = None) -> bytes:
        lines = [f"Host: {self.host}:{self.port}", f"Authorization: Bearer {API_KEY}", "Content-Type: application/json"]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n" + extra).encode()

    async def request(self, attack: str, head: bytes, body: bytes = b"", *, drop_after: int | None = None) -> None:
        """One raw HTTP request on a fresh connection; records the status (or how it failed).
        ``drop_after``: read that many bytes of the answer, then hang up."""
        writer = None
        start = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), ATTACK_TIMEOUT_S)
            writer.write(head + b"\r\n")
            writer.write(body)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), ATTACK_TIMEOUT_S)
            if drop_after is not None:
                await asyncio.wait_for(reader.read(drop_after), ATTACK_TIMEOUT_S)
            self.count(attack, status.split(b" ")[1].decode() if status.count(b" ") >= 2 else "closed")
        except asyncio.TimeoutError:
            self.count(attack, "timeout")
        except OSError as e:
            self.count(attack, type(e).__name__)
        finally:
            if writer is not None:
                writer.close()
            self.busy(attack, start)

    def post(self, body: bytes, extra: str = "") -> bytes:
        return b"POST /v1/chat/completions HTTP/1.1\r\n" + self.headers(extra, len(body))

    def chat(self, **fields: Any) -> bytes:
        """A chat the reference engine serves (greedy) but for ``fields``, the attack."""
        return json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                           "temperature": 0.0, **fields}).encode()

    async def paced(self, period: float, action: Callable[[], Awaitable[None]]) -> None:
        """``action`` every ``period`` seconds (a random start, so the classes do not line up)."""
        await asyncio.sleep(random.uniform(0, period))
        while time.monotonic() < self.deadline:
            started = time.monotonic()
            await action()
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    async def hold(self, attack: str, count: int, opening: bytes) -> None:
        """Keep ``count`` connections open that sent ``opening`` and then nothing; one the server
        closes is opened again, and how long it was held is noted."""

        async def one() -> None:
            closed: float | None = None
            while time.monotonic() < self.deadline:
                opened = time.monotonic()
                try:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                except OSError as e:
                    self.count(attack, f"connect: {type(e).__name__}")
                    await asyncio.sleep(1.0)
                    continue
                self.count(attack, "opened")
                try:
                    writer.write(opening)
                    if closed is not None:
                        self.busy(attack, closed)
                    left = self.deadline - time.monotonic()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(reader.read(), max(0.0, left))
                        self.count(attack, "closed by the server")
                except OSError:
                    self.count(attack, "reset by the server")
                finally:
                    closed = time.monotonic()
                    self.held_s[attack] = max(self.held_s.get(attack, 0.0), closed - opened)
                    writer.close()

        await asyncio.gather(*(one() for _ in range(count)))

    async def run(self) -> None:
        o = self.options
        light, heavy = o.light_period_s, o.heavy_period_s
        huge_string = b"a" * self.scaled(o.big_body_mb * 2**20)
        big = b'{"model": "' + self.model.encode() + b'", "temperature": 0.0, "messages": [{"role": "user", "content": "' + huge_string + b'"}]}'
        messages = json.dumps({"model": self.model, "max_tokens": 2, "temperature": 0.0, "messages": [
            {"role": "user", "content": "a"}] * self.scaled(1_000_000)}).encode()
        parts = json.dumps({"model": self.model, "max_tokens": 2, "temperature": 0.0, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}] * self.scaled(1_000_000)}]}).encode()
        deep = b"[" * 1000 + b"]" * 1000  # spliced in as bytes: json.dumps itself stops at ~1000 levels
        deep_bodies = [(where, body.replace(b'"DEEP"', deep)) for where, body in [
            ("body", self.chat(extra="DEEP")),
            ("content", self.chat(messages=[{"role": "user", "content": "DEEP"}])),
            ("part", self.chat(messages=[{"role": "user", "content": [{"type": "text", "text": "DEEP"}]}])),
            ("mm_processor_kwargs", self.chat(mm_processor_kwargs={"k": "DEEP"})),
            ("chat_template_kwargs", self.chat(chat_template_kwargs={"k": "DEEP"})),
        ]]
        ints = [self.chat(seed=2**64), self.chat(priority=-(2**63) - 1), self.chat(seed=2**64 - 1, n=2)]
        stops = self.chat(stop=[f"stop{k}" for k in range(self.scaled(100_000))])
        header_value = "a" * self.scaled(o.huge_header_mb * 2**20)
        request_id = "r" * self.scaled(2**20)
        stream = self.chat(stream=True, max_tokens=4)

        async def big_bodies() -> None:
            await asyncio.gather(*(self.request("big bodies", self.post(big), big) for _ in range(o.big_bodies)))

        async def deep_json() -> None:
            for where, body in deep_bodies:
                await self.request(f"deep JSON ({where})", self.post(body), body)

        async def out_of_range() -> None:
            for body in ints:
                await self.request("out-of-range ints", self.post(body), body)

        health = b"GET /health HTTP/1.1\r\n" + self.headers(f"X-Huge: {header_value}\r\n")
        huge_n = self.chat(n=10**9)
        attacks: dict[str, Callable[[], Awaitable[None]]] = {
            "slow-heads": lambda: self.hold("slow heads", self.scaled(50),
                                            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"),
            "slow-bodies": lambda: self.hold("slow bodies", self.scaled(50), self.post(b"x" * 1000) + b'\r\n{"mode'),
            "idle": lambda: self.hold("idle connections", max(1, int(o.idle_connections * o.scale)), b""),
            "big-bodies": lambda: self.paced(heavy, big_bodies),
            "messages": lambda: self.paced(heavy, lambda: self.request("1M messages", self.post(messages), messages)),
            "parts": lambda: self.paced(heavy, lambda: self.request("1M parts", self.post(parts), parts)),
            "deep-json": lambda: self.paced(light, deep_json),
            "ints": lambda: self.paced(light, out_of_range),
            "huge-n": lambda: self.paced(light, lambda: self.request("n=1e9", self.post(huge_n), huge_n)),
            "stops": lambda: self.paced(heavy, lambda: self.request("100k stop strings", self.post(stops), stops)),
            "huge-header": lambda: self.paced(heavy, lambda: self.request("huge header value", health)),
            "huge-request-id": lambda: self.paced(heavy, lambda: self.request(
                "huge X-Request-Id", self.post(stream, f"X-Request-Id: {request_id}\r\n"), stream, drop_after=2**16)),
            "drop-stream": lambda: self.paced(light, lambda: self.request(
                "drop mid-stream", self.post(stream), stream, drop_after=1)),
        }
        chosen = set(attacks) if o.attacks == "all" else set(o.attacks.split(","))
        unknown = chosen - set(attacks)
        if unknown:
            raise SystemExit(f"unknown attacks {sorted(unknown)}; known: {', '.join(attacks)}")
        await asyncio.gather(*(start() for name, start in attacks.items() if name in chosen))


def attacker_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def attack_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_soak_http.py attack")
    parser.add_argument("port", type=int)
    parser.add_argument("model")
    parser.add_argument("seconds", type=float)
    parser.add_argument("options")
    args = parser.parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's own connections
    options = SoakOptions(**json.loads(args.options))
    os.nice(options.attacker_nice)
    attacker = Attacker("127.0.0.1", args.port, args.model, options, time.monotonic() + args.seconds)
    asyncio.run(attacker.run())
    print(json.dumps({"outcomes": {k: dict(v) for k, v in sorted(attacker.outcomes.items())},
                      "held_s": attacker.held_s, "attacker_cpu_s_per_s": attacker_cpu() / args.seconds,
                      "windows": {k: merged(v) for k, v in sorted(attacker.windows.items())}}), flush=True)
    return 0


def start_attacker(port: int, model: str, seconds: float, options: SoakOptions) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "attack", str(port), model, str(seconds),
                             json.dumps(asdict(options))], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


# --- which attacks the slow normal requests overlapped ------------------------------------------------------


def merged(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``windows`` as their union: sorted, overlapping ones joined (a thousand idle connections
    closed together are one stretch of the server's time)."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def overlaps(windows: list[tuple[float, float]], start: float, end: float) -> bool:
    """Whether a request sent at ``start`` and answered at ``end`` overlapped any of the merged ``windows``."""
    k = bisect.bisect_left(windows, (end,))  # the windows that began before the answer came
    return k > 0 and windows[k - 1][1] > start


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def attribution(phase: Phase, windows: dict[str, list[tuple[float, float]]], slow_s: float) -> dict[str, Any]:
    """Per attack class, the normal requests of ``phase`` that overlapped it: how many, their p50
    and p99, how many were slow (over ``slow_s``, the attack-free p99) and how many of those
    overlapped that class alone. A class whose overlapped requests are slow, and slow alone, is
    what the server does badly; one that overlaps every request says nothing by itself."""
    classes = {name: [(start, end) for start, end in spans] for name, spans in windows.items()}
    hits = [[name for name, spans in classes.items() if overlaps(spans, start, end)] for start, end in phase.spans]
    table: dict[str, Any] = {}
    for name in [*classes, "none"]:
        chosen = [lat for lat, hit in zip(phase.latencies, hits) if (name in hit if name != "none" else not hit)]
        slow = [hit for lat, hit in zip(phase.latencies, hits) if lat > slow_s and (name in hit if name != "none"
                                                                                     else not hit)]
        busy = sum(end - start for start, end in classes.get(name, []))
        table[name] = {"busy_s": busy, "requests": len(chosen), "p50_s": percentile(chosen, 0.5),
                       "p99_s": percentile(chosen, 0.99), "slow": len(slow),
                       "slow_alone": sum(1 for hit in slow if len(hit) <= 1)}
    slowest = sorted(zip(phase.latencies, hits), reverse=True)[:10]
    return {"slow_threshold_s": slow_s, "slow_total": sum(1 for lat in phase.latencies if lat > slow_s),
            "classes": table, "slowest": [{"latency_s": lat, "overlapped": hit} for lat, hit in slowest]}


# --- the soak ----------------------------------------------------------------------------------------------


async def soak_phases(base: str, model: str, server: subprocess.Popen[bytes], port: int,
                      options: SoakOptions) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=options.clients, max_keepalive_connections=options.clients)
    watch = Watch(server, options.max_server_rss_gb * 2**30)
    watcher = asyncio.create_task(watch.run())
    outcomes: dict[str, Any] = {"outcomes": {}, "held_s": {}, "windows": {}, "attacker_cpu_s_per_s": None}
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits) as client:
        chats = normal_chats(model)
        expected = await expected_answers(client, chats)
        engines = [pid for pid in tree_pids(server.pid) if pid != server.pid]
        cpu = [(cpu_seconds([server.pid]), cpu_seconds(engines))]
        baseline = await normal_traffic(client, chats, expected, options.baseline_minutes * 60, options.clients, watch)
        cpu.append((cpu_seconds([server.pid]), cpu_seconds(engines)))
        rss_before = tree_rss_bytes(server.pid)
        api_rss_before = rss_bytes(server.pid)
        baseline_peak, watch.peak_bytes = watch.peak_bytes, 0
        seconds = options.minutes * 60
        attacker = start_attacker(port, model, seconds, options)
        attacked = await normal_traffic(client, chats, expected, seconds, options.clients, watch)
        cpu.append((cpu_seconds([server.pid]), cpu_seconds(engines)))
        if watch.aborted is not None:
            attacker.kill()
        out, _ = await asyncio.to_thread(attacker.communicate, timeout=ATTACK_TIMEOUT_S * 4)
        if out.strip():
            outcomes = json.loads(out.strip().splitlines()[-1])
    attack_peak = watch.peak_bytes
    if watch.aborted is None:
        await asyncio.sleep(options.settle_s)
    rss_after = tree_rss_bytes(server.pid) if watch.aborted is None else 0
    api_rss_after = rss_bytes(server.pid) if watch.aborted is None else 0
    watch.done = True
    await watcher
    base_p99 = baseline.summary()["p99_s"]
    windows = outcomes.pop("windows")
    return {"baseline": baseline.summary(), "attack": attacked.summary(),
            "attribution": attribution(attacked, windows, base_p99),
            "p99_ratio": attacked.summary()["p99_s"] / base_p99 if base_p99 == base_p99 and base_p99 > 0 else None,
            "wrong_answers": sum(baseline.wrong.values()) + sum(attacked.wrong.values()),
            "rss_before_mib": rss_before / 2**20, "rss_after_mib": rss_after / 2**20,
            "rss_ratio": rss_after / rss_before,
            "api_server_rss_mib": {"before": api_rss_before / 2**20, "after": api_rss_after / 2**20}, "baseline_peak_rss_mib": baseline_peak / 2**20,
            "attack_peak_rss_mib": attack_peak / 2**20, "aborted": watch.aborted,
            "attacker_exit": attacker.returncode,
            "cpu_s_per_s": {phase: {"api_server": (cpu[k + 1][0] - cpu[k][0]) / length,
                                    "engine": (cpu[k + 1][1] - cpu[k][1]) / length}
                            for k, (phase, length) in enumerate([("baseline", options.baseline_minutes * 60),
                                                                  ("attack", seconds)])},
            **outcomes}


def soak(options: SoakOptions) -> dict[str, Any]:
    model_dir = cached_model_dir("gemma3", with_weights=True)
    port = get_open_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="mmfront-soak-http-") as tmp:
        log = Path(options.server_log or Path(tmp) / "serve.log")
        server = start_server(model_dir, port, log)
        try:
            wait_healthy(base, [server], [log], STARTUP_S)
            return asyncio.run(soak_phases(base, str(model_dir), server, port, options))
        finally:
            stop_process(server, grace_s=10.0)


def report_soak(report: Report, result: dict[str, Any]) -> None:
    if result["aborted"]:
        report.add(GROUP, f"stopped early: {result['aborted']}", 1, "", target="0", ok=False)
    report.add(GROUP, "wrong answers to normal requests", result["wrong_answers"], "", target="0",
               ok=result["wrong_answers"] == 0)
    for phase in ("baseline", "attack"):
        summary = result[phase]
        report.add(GROUP, f"{phase}: normal requests answered right", summary["answered_right"], "")
        report.add(GROUP, f"{phase}: p50 latency", summary["p50_s"] * 1000, "ms")
        report.add(GROUP, f"{phase}: p99 latency", summary["p99_s"] * 1000, "ms")
    if result["p99_ratio"] is not None:
        report.ratio(GROUP, "p99 under attack / attack-free", result["p99_ratio"], at_most=P99_LIMIT)
    for phase, used in result["cpu_s_per_s"].items():
        report.add(GROUP, f"{phase}: CPU of the API server", used["api_server"], "s/s")
        report.add(GROUP, f"{phase}: CPU of the engine", used["engine"], "s/s")
    if result["attacker_cpu_s_per_s"] is not None:
        report.add(GROUP, "CPU of the attacker (same machine)", result["attacker_cpu_s_per_s"], "s/s")
    report.add(GROUP, "server RSS at the end of the baseline", result["rss_before_mib"], "MiB")
    report.add(GROUP, "server RSS after the attacks and settling", result["rss_after_mib"], "MiB")
    report.ratio(GROUP, "RSS after / before", result["rss_ratio"], at_most=RSS_LIMIT)
    report.add(GROUP, "the API server's own RSS before", result["api_server_rss_mib"]["before"], "MiB")
    report.add(GROUP, "the API server's own RSS after", result["api_server_rss_mib"]["after"], "MiB")
    report.add(GROUP, "server peak RSS, attack-free", result["baseline_peak_rss_mib"], "MiB")
    report.add(GROUP, "server peak RSS under attack", result["attack_peak_rss_mib"], "MiB")
    for attack, outcomes in result["outcomes"].items():
        print(f"  {GROUP:<22} {attack}: {outcomes}", flush=True)
    for attack, held in result["held_s"].items():
        print(f"  {GROUP:<22} {attack}: held open up to {held:.1f} s", flush=True)
    found = result["attribution"]
    print(f"  {GROUP:<22} normal requests under attack slower than the attack-free p99 "
          f"({found['slow_threshold_s'] * 1000:.1f} ms): {found['slow_total']}; per attack class they overlapped:",
          flush=True)
    for name, row in sorted(found["classes"].items(), key=lambda item: -item[1]["slow"]):
        print(f"  {GROUP:<22}   {name:<20} busy {row['busy_s']:6.1f} s  overlapped {row['requests']:5d}  "
              f"p50 {row['p50_s'] * 1000:7.1f} ms  p99 {row['p99_s'] * 1000:7.1f} ms  slow {row['slow']:4d} "
              f"(alone {row['slow_alone']})", flush=True)
    for slow in found["slowest"]:
        print(f"  {GROUP:<22}   {slow['latency_s'] * 1000:7.1f} ms: {', '.join(slow['overlapped']) or 'no attack'}",
              flush=True)


def run(report: Report, quick: bool) -> None:
    options = SoakOptions(minutes=0.25, baseline_minutes=0.25, settle_s=5.0, scale=0.1) if quick else SoakOptions()
    report_soak(report, soak(options))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["attack"]:
        return attack_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench_soak_http.py")
    defaults = SoakOptions()
    for name, value in asdict(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    result = soak(SoakOptions(**args))
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        report = Report()
        report_soak(report, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
