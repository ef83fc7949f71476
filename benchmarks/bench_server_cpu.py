"""``mmfront serve``'s own CPU per request, thread by thread, on a cache hit (issue 34's hit path).

The setup of ``bench_frontends.py``: ``mmfront serve`` in front of a fresh STOCK vLLM engine core
(``../shared/peer/stock_engine.py`` with the stub executor) on its Qwen2.5-VL folder at the
standard limits (``--config qwen2.5-vl-small``: the small pixel limit), with its flags. Requests go one
at a time over one kept-alive connection: a
streamed chat completion with one 1024x768 random-pixel JPEG data URL (~630 KB of body),
``OUTPUT_TOKENS`` output tokens, usage included. The first pass sends the same image every time
(a processor cache hit: the data URL is still decoded and hashed, the processor's output comes
from the cache); with ``--misses`` a second pass sends a new image every time.

Per pass: the CPU (user + system) of each of the server's threads from
``/proc/PID/task/*/stat``, before and after, per request. The server runs with a
``sitecustomize`` that names each Python thread's OS thread after it (the main thread, which runs
the event loop, ``event-loop``), so the kernel's figures come by thread name; threads sharing a
15-byte name are summed. The process group's total covers the processing lanes too.

``python benchmarks/bench_server_cpu.py --src A --src B --rounds 4`` alternates servers importing
mmfront from each ``src`` folder (before/after a change), one fresh server per round and side,
and prints each side's medians; ``mmfront bench --only server_cpu`` runs one round of this tree.
Needs the vLLM peer venv and ``../shared/peer``; without them it is skipped and says why.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from _harness import Report, stop_process
from bench_frontends import (
    CONFIGS,
    PEER_DIR,
    SERVED_NAME,
    TICKS_PER_S,
    group_cpu_s,
    launch_side,
    stock_engine_python,
    wait_healthy,
    warm_up,
)
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

GROUP = "server-cpu"
OUTPUT_TOKENS = 8
IMAGE_SIZE = (1024, 768)
WARM_REQUESTS = 20
"""Hits sent before the first pass is measured (the first ones fill caches and lazy imports)."""
GROUP_TOTAL = "the server's process group"
THREAD_NAMES = '''
import ctypes
import threading

_prctl = ctypes.CDLL(None).prctl
_bootstrap_inner = threading.Thread._bootstrap_inner


def _named(self):
    _prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    _bootstrap_inner(self)


threading.Thread._bootstrap_inner = _named
_prctl(15, b"event-loop", 0, 0, 0)
'''
"""The server's ``sitecustomize``: every thread's OS name is its Python name."""


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of ``pid``: its name and its user + system CPU seconds."""
    found = {}
    for entry in os.scandir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            text = Path(entry.path, "stat").read_text()
            fields = text[text.rindex(")") + 2:].split()
            found[int(entry.name)] = (text[text.index("(") + 1:text.rindex(")")],
                                      (int(fields[11]) + int(fields[12])) / TICKS_PER_S)
    return found


def chat_body(image_url: str) -> bytes:
    return json.dumps({
        "model": SERVED_NAME, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                  {"type": "text", "text": "What is in this picture?"}]}],
    }).encode()


def stream_chat(connection: http.client.HTTPConnection, body: bytes) -> None:
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    reply = connection.getresponse()
    text = reply.read()
    if reply.status != 200 or not text.endswith(b"data: [DONE]\n\n"):
        raise RuntimeError(f"the server answered {reply.status}: {text[:300]!r}")


def measure_pass(base: str, pid: int, bodies: Sequence[bytes]) -> dict[str, float]:
    """CPU ms per request of each thread name (and the group's) over ``bodies`` sent one at a time."""
    host, _, port = base.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        before, group_before = thread_cpu_s(pid), group_cpu_s(pid)
        for body in bodies:
            stream_chat(connection, body)
        after, group_after = thread_cpu_s(pid), group_cpu_s(pid)
    finally:
        connection.close()
    per_name: dict[str, float] = defaultdict(float)
    for tid, (name, cpu) in after.items():
        per_name[name] += cpu - before.get(tid, (name, 0.0))[1]
    per_name[GROUP_TOTAL] = group_after - group_before
    return {name: cpu * 1e3 / len(bodies) for name, cpu in per_name.items()}


def serve_round(python: Path, model: Path, src: str, requests: int, misses: bool, folder: Path,
                tag: str, config_key: str) -> list[dict[str, float]]:
    """A fresh engine and server importing mmfront from ``src``: its hit pass (and miss pass)."""
    config = next(c for c in CONFIGS if c.key == config_key)
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(THREAD_NAMES)
    logs = (folder / f"{tag}-engine.log", folder / f"{tag}-server.log")
    with logs[0].open("wb") as elog, logs[1].open("wb") as slog:
        base, server, engine = launch_side("mmfront", python, model, config, (elog, slog),
                                           pythonpath=f"{site}{os.pathsep}{src}")
        try:
            wait_healthy(base, server, engine, (logs[1], logs[0]))
            warm_up(base)
            hit = chat_body(image_data_url(make_image(*IMAGE_SIZE, seed=1), "JPEG"))
            measure_pass(base, server.pid, [hit] * WARM_REQUESTS)
            passes = [measure_pass(base, server.pid, [hit] * requests)]
            if misses:
                passes.append(measure_pass(base, server.pid, [
                    chat_body(image_data_url(make_image(*IMAGE_SIZE, seed=100 + n), "JPEG"))
                    for n in range(requests)]))
            return passes
        finally:
            stop_process(server, grace_s=10)
            stop_process(engine)


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({name for r in rounds for name in r}, key=lambda n: (n == GROUP_TOTAL, n))
    return {name: statistics.median(r.get(name, 0.0) for r in rounds) for name in names}


def compare(sources: Sequence[str], rounds: int, requests: int, misses: bool,
            config_key: str = "qwen2.5-vl") -> dict[str, list[list[dict[str, float]]]]:
    """Every source per round, the order reversed every other round; each side's passes per round."""
    python = vllm_peer_python()
    if python is None or not (PEER_DIR / "stock_engine.py").is_file():
        raise SystemExit(f"{SKIP_REASON} (and ../shared/peer/stock_engine.py)")
    config = next(c for c in CONFIGS if c.key == config_key)
    found: dict[str, list[list[dict[str, float]]]] = {src: [] for src in sources}
    with tempfile.TemporaryDirectory(prefix="mmfront-server-cpu-") as name:
        folder = Path(name)
        model = config.folder(python, folder)
        for round_ in range(rounds):
            order = list(sources) if round_ % 2 == 0 else list(reversed(sources))
            for src in order:
                passes = serve_round(python, model, src, requests, misses, folder, f"{round_}-{sources.index(src)}",
                                     config_key)
                found[src].append(passes)
                print(f"round {round_}, {src}: " + "; ".join(
                    f"{k} {v:.2f}" for k, v in medians([passes[0]]).items()), file=sys.stderr, flush=True)
    return found


def run(report: Report, quick: bool) -> None:
    if stock_engine_python(report, GROUP) is None:
        return
    requests = 50 if quick else 200
    src = str(Path(__file__).resolve().parents[1] / "src")
    passes = compare([src], 1, requests, misses=False)[src]
    for name, ms in medians([p[0] for p in passes]).items():
        report.add(GROUP, f"hit, CPU per request: {name}", ms, "ms")
    report.add(GROUP, f"({requests} requests one at a time, Qwen2.5-VL standard limits, 1024x768 JPEG)", 0.0, "")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, help="a folder mmfront is imported from")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--misses", action="store_true", help="a pass of new images after the hits")
    parser.add_argument("--config", default="qwen2.5-vl", choices=[c.key for c in CONFIGS if c.key.startswith("qwen")],
                        help="the model folder of bench_frontends.py's table")
    args = parser.parse_args(argv)
    started = time.monotonic()
    found = compare(args.src, args.rounds, args.requests, args.misses, args.config)
    for n, what in enumerate(["hit"] + (["miss"] if args.misses else [])):
        print(f"\n{what}: CPU ms per request, medians of {args.rounds} rounds")
        table = {src: medians([passes[n] for passes in found[src]]) for src in args.src}
        names = sorted({name for t in table.values() for name in t}, key=lambda k: (k == GROUP_TOTAL, k))
        for name in names:
            print(f"  {name:28s} " + "  ".join(f"{table[src].get(name, 0.0):7.2f}" for src in args.src))
    print(f"({time.monotonic() - started:.0f} s; columns: {', '.join(args.src)})")


if __name__ == "__main__":
    main()
