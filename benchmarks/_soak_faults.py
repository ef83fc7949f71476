"""The soak's faults (``benchmarks/soak.py``): the link that drops and reorders what P0 sends,
and the second frontend that feeds the engine malformed frames."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import zmq

from mmfront.engine.transports import BaseTransport
from mmfront.engine.transports.zmq import ZmqFrontendTransport, engine_identity
from mmfront.engine.transports.zmq_frames import request_frames
from mmfront.errors import DecodeError, TransportError
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.wire import EngineCoreRequest, Frame, MsgpackEncoder, SamplingParams, frame_view
from mmfront.wire.messages import (
    ABORT,
    DIGEST_SIZE,
    ENGINE_HELLO,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    REQUEST,
    RESET_CACHE,
    Direction,
    MirrorOnly,
    MirrorOp,
    MirrorStamp,
    decode_message,
    encode_envelope,
)

# --- the link between the client and ZMQ --------------------------------------------------------


class FaultyLink(BaseTransport):
    """P0's ZMQ end with faults: it reorders (holds a message back until the next one, or at most
    ``hold_s``), drops half of what is sent while ``lossy`` (an engine is down), and counts on the
    way in how often each request id finishes (twice would be an answer given twice)."""

    def __init__(self, inner: ZmqFrontendTransport, rng: random.Random, reorder_p: float, hold_s: float = 0.02) -> None:
        self.inner = inner
        self.rng = rng
        self.reorder_p = reorder_p
        self.hold_s = hold_s
        self.lossy = False
        self.counts: Counter[str] = Counter()
        self.finished = bytearray()
        """Per request number, how often it finished on the wire (a byte each: the soak's own
        bookkeeping must not be what grows)."""
        self._held: tuple[float, Sequence[Frame]] | None = None
        self._lock = threading.Lock()

    def send(self, frames: Sequence[Frame]) -> None:
        with self._lock:
            if self.lossy and self.rng.random() < 0.5:
                self.counts["dropped"] += 1
                return
            if self._held is None and self.rng.random() < self.reorder_p:
                self._held = (time.monotonic(), list(frames))
                return
            try:
                self.inner.send(frames)
            finally:
                self._flush()

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held[1], None
            self.counts["reordered"] += 1
            try:
                self.inner.send(held)
            except TransportError:
                self.counts["lost_on_flush"] += 1  # the engine went away: as if lost in transit

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        with self._lock:
            if self._held is not None and time.monotonic() - self._held[0] > self.hold_s:
                self._flush()
        frames = self.inner.recv(timeout)
        kind = None if frames is None else bytes(frame_view(frames[0], 0))
        if kind == ENGINE_HELLO:
            self.lossy = False  # an engine is back: from now on, what is sent arrives
        if frames is not None and kind == ENGINE_OUTPUTS:
            try:
                outputs = decode_message(frames, Direction.TO_FRONTEND).body
            except DecodeError:
                return frames  # the client logs and drops it
            for output in outputs.outputs:
                if output.finish_reason is not None:
                    n = int(output.request_id.rsplit("-", 1)[1])
                    self.finished[n] = min(255, self.finished[n] + 1)
        return frames

    def close(self) -> None:
        self.inner.close()


# --- the malformed peer ------------------------------------------------------------------------


def peer_messages() -> list[list[bytes]]:
    """What a second frontend sends, before mutation: a request with data, an abort of A's ids, a
    cache reset, a mirror-only message."""
    encoder = MsgpackEncoder()
    pixels = torch.arange(3 * 16 * 16, dtype=torch.float32).reshape(1, 3, 16, 16)
    item = MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(pixels, MultiModalBatchedField())})
    feature = MultiModalFeatureSpec(item, "image", "h-peer", PlaceholderRange(1, 4), "h-peer")
    request = EngineCoreRequest("peer-request", [7, 1, 1, 1, 1, 8], [feature], SamplingParams(max_tokens=1), None,
                                0.0, None, None, None)
    stamp = MirrorStamp(7, 1, b"\x01" * DIGEST_SIZE)
    envelopes = [
        encode_envelope(REQUEST, encoder.encode(request), stamp),
        encode_envelope(ABORT, encoder.encode(["soak-1", "soak-2", "peer-request"])),
        encode_envelope(RESET_CACHE, encoder.encode(None)),
        encode_envelope(MIRROR_ONLY, encoder.encode(MirrorOnly([MirrorOp("N", "h-peer", 3072)])), stamp),
    ]
    call_ids = itertools.count()
    return [[bytes(frame_view(f, i)) for i, f in enumerate(request_frames(e, call_ids=call_ids))] for e in envelopes]


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """Flipped, cut or inserted bytes; a wrong type byte; too few or too many frames; a length
    header promising gigabytes."""
    frames = list(frames)
    op = rng.randrange(6)
    index = rng.randrange(len(frames))
    body = bytearray(frames[index])
    if op == 0 and body:
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
    elif op == 1:
        del body[rng.randrange(len(body) + 1):]
    elif op == 2:
        position = rng.randrange(len(body) + 1)
        body[position:position] = rng.randbytes(rng.randint(1, 8))
    elif op == 3:
        frames[0] = rng.choice([b"\x02", b"\xff", b"", rng.randbytes(3)])
        return frames
    elif op == 4:
        return frames[: rng.randrange(1, 3)] if rng.random() < 0.5 else frames + [rng.randbytes(16)] * rng.randint(1, 30)
    else:
        body = bytearray(rng.choice([b"\xc6\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff"]))
    frames[index] = bytes(body)
    return frames


class MalformedPeer(threading.Thread):
    """Frontend B: sends ``ratio`` mutated messages per request A has finished, and reads B's
    replies (a peer that never reads would grow the engine's queue, which is not the fault here)."""

    def __init__(self, transport: ZmqFrontendTransport, progress: Any, ratio: float, seed: int) -> None:
        super().__init__(name="soak-malformed-peer", daemon=True)
        self.transport = transport
        self.progress = progress
        self.ratio = ratio
        self.rng = random.Random(seed)
        self.bases = peer_messages()
        self.sent = 0
        self.unreachable = 0
        self.refusals = 0
        self.stop = threading.Event()

    def run(self) -> None:
        identity = engine_identity(0)
        while not self.stop.is_set():
            if self.sent < self.progress() * self.ratio:
                frames = mutate(self.rng, self.bases[self.sent % len(self.bases)])
                try:
                    self.transport._router.send_multipart([identity, *frames])  # a forged P0: raw frames
                except zmq.ZMQError:
                    self.unreachable += 1  # the engine is restarting
                self.sent += 1
            else:
                time.sleep(0.005)
            self._drain()

    def _drain(self) -> None:
        while (frames := self.transport.recv(0)) is not None:
            if bytes(frame_view(frames[0], 0)) != ENGINE_OUTPUTS:
                continue
            failure = decode_message(frames, Direction.TO_FRONTEND).body.utility_output
            if failure is not None and failure.failure_message:
                self.refusals += 1
