"""The soak's engine side (``benchmarks/soak.py``): the echo engine it runs as a separate
process (``soak.py engine ...``), and the starting, killing and RSS sampling of that process."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from mmfront import MultiModalConfig
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports.zmq import ZmqAddresses, ZmqEngineTransport
from mmfront.errors import TransportError
from mmfront.testing.models import cached_model_dir
from mmfront.wire import EngineCoreRequest
from mmfront.wire.structs import EngineCoreOutput, FinishReason

SOAK_SCRIPT = Path(__file__).with_name("soak.py")
FLOOD_SETTLE = 100
"""Requests after an engine's first flood before its RSS baseline (the flood has been read)."""

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


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


# --- the engine processes --------------------------------------------------------------------------


class Engines:
    """Starts, kills and restarts the engine process; samples each one's RSS."""

    def __init__(self, args: argparse.Namespace, a: ZmqAddresses, b: ZmqAddresses, config: MultiModalConfig,
                 shm_name: str | None) -> None:
        self.args = args
        self.a, self.b = a, b
        self.config = config
        self.shm_name = shm_name
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0
        self.early_kib: int | None = None
        self.warm_kib: int | None = None
        self.lives: list[tuple[int, int, int]] = []
        """Per engine killed or stopped after its warm-up, in KiB: RSS after ``--engine-warmup``
        requests, after its first flood too (the baseline), and at the end."""
        self.reaped: list[int | None] = []

    def command(self) -> list[str]:
        if self.args.engine == "worker":
            return [sys.executable, "-m", "mmfront.cli", "worker", str(cached_model_dir("gemma3", with_weights=True)),
                    "--input", self.a.input, "--input", self.b.input, "--output", self.a.output,
                    "--output", self.b.output, "--cache", "lru", "--cache-gb", str(self.config.mm_processor_cache_gb)]
        command = [sys.executable, str(SOAK_SCRIPT), "engine", self.a.input, self.a.output, self.b.input, self.b.output,
                   "--cache", self.args.cache, "--capacity-bytes", str(self.config.mm_processor_cache_bytes)]
        return command + (["--shm-name", self.shm_name] if self.shm_name else [])

    def start(self, done: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "SOAK_SIDE_SECRET": self.a.side_secret.hex()}  # not in argv
        self.process = subprocess.Popen(self.command(), env=env)
        self.started_at, self.early_kib, self.warm_kib = done, None, None

    def sample(self, done: int) -> None:
        """The baseline comes after ``--engine-warmup`` requests and the engine's first flood: a
        flood arrives at once (``hwm`` 0: ZMQ queues all of it), and the allocator keeps that
        peak for the next flood. The step is reported, not counted as growth."""
        if self.process is None or self.warm_kib is not None or done - self.started_at < self.args.engine_warmup:
            return
        if self.early_kib is None:
            self.early_kib = rss_kib(self.process.pid)
        every = self.args.flood_every
        if not every or done >= (self.started_at // every + 1) * every + FLOOD_SETTLE:
            self.warm_kib = rss_kib(self.process.pid)

    def end(self, sig: int) -> None:
        """Sample, then end the engine with ``sig``."""
        process, self.process = self.process, None
        if process is None:
            return
        if self.early_kib is not None and self.warm_kib is not None:
            self.lives.append((self.early_kib, self.warm_kib, rss_kib(process.pid)))
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


