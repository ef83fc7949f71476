"""A test engine built only on ``EngineCoreReceiver`` and the ZMQ transport: it checksums the
tensors each request brings and answers with them as token ids.

Run as a process: ``python echo_engine.py INPUT OUTPUT --cache lru|shm|none [--capacity-bytes N]
[--shm-name NAME] [--steps K] [--engine-index I] [--step-delay S] [--abort-log PATH]``. It serves
until killed (SIGTERM: clean). Beyond two steps, the outputs are zeros; ``--abort-log`` gets one
line per aborted request, ``ID OUTPUTS_SENT``. It answers the utility calls of :data:`UTILITIES`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports.zmq import ZmqAddresses, ZmqEngineTransport
from mmfront.wire import EngineCoreRequest
from mmfront.wire.structs import EngineCoreOutput, FinishReason


def request_checksum(request: EngineCoreRequest) -> int:
    """A digest of every tensor of every feature, in offset order (31 bits: a token id)."""
    digest = hashlib.blake2b(digest_size=8)
    for feature in request.mm_features or []:
        assert feature.data is not None, f"{feature.identifier} reached the engine without data"
        for key in sorted(feature.data):
            tensor = feature.data[key].data
            assert isinstance(tensor, torch.Tensor)
            digest.update(key.encode())
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF


class EchoUtilities:
    """The echo engine's utility methods: vLLM's names, a sleeping flag and nothing to reset."""

    def __init__(self) -> None:
        self.sleeping = False

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if mode not in ("abort", "keep", "wait"):
            raise ValueError(f"Invalid pause mode: {mode}")
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.sleeping = False
        return True

    def methods(self) -> dict[str, Callable[..., Any]]:
        return {"get_supported_tasks": lambda: ("generate",), "is_sleeping": lambda: self.sleeping,
                "sleep": self.sleep, "wake_up": self.wake_up, "reset_prefix_cache": lambda *_: True,
                "reset_encoder_cache": lambda: None}


def serve(receiver: EngineCoreReceiver, steps: int, stop: list[bool], *, step_delay: float = 0.0,
          abort_log: Path | None = None) -> None:
    """The engine loop: each request gets ``steps`` outputs, the checksum then the prompt length
    (then zeros)."""
    running: dict[str, list[int]] = {}
    sent: dict[str, int] = {}
    while not stop:
        for request in receiver.poll(0.02 if not running else 0.0):
            tokens = [request_checksum(request), len(request.prompt_token_ids or [])]
            running[request.request_id] = (tokens + [0] * max(0, steps - 2))[:steps]
            sent[request.request_id] = 0
        for request_id in receiver.take_aborted():
            if running.pop(request_id, None) is not None and abort_log is not None:
                with abort_log.open("a") as log:
                    log.write(f"{request_id} {sent[request_id]}\n")
        if running and step_delay:
            time.sleep(step_delay)
        outputs = []
        for request_id, tokens in list(running.items()):
            token = tokens.pop(0)
            done = not tokens
            outputs.append(EngineCoreOutput(request_id, [token], finish_reason=FinishReason.LENGTH if done else None))
            sent[request_id] += 1
            if done:
                del running[request_id]
        if outputs:
            receiver.send(outputs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--cache", choices=["lru", "shm", "none"], default="lru")
    parser.add_argument("--capacity-bytes", type=int, default=1 << 30)
    parser.add_argument("--shm-name")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--abort-log", type=Path)
    args = parser.parse_args(argv)
    if args.cache == "lru":
        cache: MirroredReceiverCache | ShmObjectStoreReceiverCache | None = MirroredReceiverCache(args.capacity_bytes)
    elif args.cache == "shm":
        cache = ShmObjectStoreReceiverCache(args.shm_name)
    else:
        cache = None
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    side_secret = bytes.fromhex(os.environ.get("ECHO_SIDE_SECRET", ""))  # P0's side-channel key, if it gave one
    transport = ZmqEngineTransport(ZmqAddresses(args.input, args.output, side_secret), args.engine_index)
    with EngineCoreReceiver(transport, cache, engine_index=args.engine_index, heartbeat_s=0.2,
                            utilities=EchoUtilities().methods()) as receiver:
        serve(receiver, args.steps, stop, step_delay=args.step_delay, abort_log=args.abort_log)
    time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
