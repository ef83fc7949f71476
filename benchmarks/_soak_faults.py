"""The soak's faults (``benchmarks/soak.py``): the link that drops and reorders what P0 sends,
the rogue second frontend that feeds the engine malformed frames and floods, the impostors on
the ``ipc`` side channel, and lane kills."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
import zmq

from mmfront.engine.transports import BaseTransport
from mmfront.engine.transports.fd_channel import SECRET_BYTES
from mmfront.engine.transports.zmq import ZmqAddresses, ZmqFrontendTransport, engine_identity
from mmfront.engine.transports.zmq_frames import request_frames
from mmfront.errors import DecodeError, TransportError
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.processing.executors import LocalProcessExecutor
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
                    n = int(output.request_id.split("-")[1])  # "soak-{n}-{engine suffix}"
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
    replies (a peer that never reads would grow the engine's queue, which is not the fault here).
    Every ``flood_every`` requests of A it floods: ``flood_size`` messages at once, without
    reading in between: mutated ones, oversize ones (a ``OVERSIZE_BYTES`` body of noise) and its
    valid request over and over (the engine refuses an id already running)."""

    OVERSIZE_BYTES = 4 << 20

    def __init__(self, transport: ZmqFrontendTransport, progress: Callable[[], int], ratio: float, seed: int,
                 flood_every: int = 0, flood_size: int = 0) -> None:
        super().__init__(name="soak-malformed-peer", daemon=True)
        self.transport = transport
        self.progress = progress
        self.ratio = ratio
        self.rng = random.Random(seed)
        self.bases = peer_messages()
        self.oversize = [self.bases[0][0], self.rng.randbytes(self.OVERSIZE_BYTES), *self.bases[0][2:]]
        self.flood_every = flood_every
        self.flood_size = flood_size
        self.sent = 0
        self.unreachable = 0
        self.refusals = 0
        self.floods = 0
        self.flooded = 0
        self.answers = 0
        self.stop = threading.Event()

    def run(self) -> None:
        next_flood = self.flood_every or None
        while not self.stop.is_set():
            if next_flood is not None and self.progress() >= next_flood:
                self._flood()
                next_flood += self.flood_every
            elif self.sent < self.progress() * self.ratio:
                self._send(mutate(self.rng, self.bases[self.sent % len(self.bases)]))
                self.sent += 1
            else:
                time.sleep(0.005)
            self._drain()

    def _flood(self) -> None:
        self.floods += 1
        for k in range(self.flood_size):
            draw = self.rng.random()
            if draw < 0.05:
                frames = self.oversize
            elif draw < 0.35:
                frames = self.bases[0]  # valid: admitted once, refused while running
            else:
                frames = mutate(self.rng, self.bases[k % len(self.bases)])
            self._send(frames)
            self.flooded += 1

    def _send(self, frames: list[bytes]) -> None:
        try:
            self.transport._router.send_multipart([engine_identity(0), *frames])  # a forged P0: raw frames
        except zmq.ZMQError:
            self.unreachable += 1  # the engine is restarting

    def _drain(self) -> None:
        while (frames := self.transport.recv(0)) is not None:
            if bytes(frame_view(frames[0], 0)) != ENGINE_OUTPUTS:
                continue
            body = decode_message(frames, Direction.TO_FRONTEND).body
            failure = body.utility_output
            if failure is not None and failure.failure_message:
                self.refusals += 1
            self.answers += len(body.outputs)


# --- impostors on the side channel -------------------------------------------------------------------


class Impostors(threading.Thread):
    """Local processes' view of P0's side channel (``input.fds``): connections that name engine
    0 with no secret, a forged one or a wrong length, name other engines, or say nothing at all.
    ``ratio`` connections per request A has finished, plus :meth:`burst` (while an engine
    restarts: its old connection is dead, the moment an impostor would take its place). The
    last ``hold`` stay open (more than the listener's pending cap); each is checked for a
    descriptor before it is closed: one received is a leak (a memfd of another's request)."""

    def __init__(self, path: str, progress: Callable[[], int], ratio: float, seed: int, hold: int = 96) -> None:
        super().__init__(name="soak-side-impostors", daemon=True)
        self.path = path
        self.progress = progress
        self.ratio = ratio
        self.rng = random.Random(seed)
        self.hold = hold
        self.open: deque[socket.socket] = deque()
        self.connected = 0
        self.turned_away = 0
        self.leaks = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def hello(self) -> bytes | None:
        rng = self.rng
        return rng.choice([
            None,  # connects and never says who it is
            engine_identity(0),
            engine_identity(0) + rng.randbytes(SECRET_BYTES),
            engine_identity(0) + rng.randbytes(rng.choice([SECRET_BYTES - 1, SECRET_BYTES + 1, 40])),
            engine_identity(rng.randrange(1, 1 << 15)) + rng.randbytes(SECRET_BYTES),
            rng.randbytes(rng.randrange(1, 64)),
        ])

    def connect_one(self) -> None:
        with self._lock:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.setblocking(False)
            try:
                sock.connect(self.path)
                hello = self.hello()
                if hello is not None:
                    sock.send(hello)
            except OSError:
                sock.close()
                self.turned_away += 1  # the backlog is full or the listener closed it: nothing to take
                return
            self.connected += 1
            self.open.append(sock)
            while len(self.open) > self.hold:
                self._close(self.open.popleft())

    def burst(self, count: int) -> None:
        for _ in range(count):
            self.connect_one()

    def _close(self, sock: socket.socket) -> None:
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(sock, 1 << 16, 16)
            except OSError:
                break
            for fd in fds:
                os.close(fd)
            self.leaks += len(fds)
            if not fds:
                break
        sock.close()

    def run(self) -> None:
        while not self.stop.wait(0.005):
            if self.connected + self.turned_away < self.progress() * self.ratio:
                self.connect_one()

    def close_all(self) -> None:
        with self._lock:
            while self.open:
                self._close(self.open.popleft())


def kill_a_lane(executor: object, rng: random.Random) -> int | None:
    """SIGKILL one running processing lane (idle or busy); its pid, or ``None`` with no lane up."""
    if not isinstance(executor, LocalProcessExecutor):
        return None
    pids = [pid for pid in executor.pids() if pid is not None]
    if not pids:
        return None
    pid = rng.choice(pids)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return pid


# --- the rogue process: frontend B and the impostors -------------------------------------------------


@dataclass(frozen=True)
class RogueSettings:
    side_path: str
    malformed_ratio: float
    flood_every: int
    flood_size: int
    impostor_ratio: float
    impostor_burst: int
    seed: int


def _rogue_main(conn: Connection, progress: Any, bursts: Any, settings: RogueSettings) -> None:
    """The rogue process: bind frontend B, tell the soak its addresses, attack until told to stop,
    then answer with what it counted."""
    b = ZmqFrontendTransport("ipc")
    conn.send(b.addresses)
    peer = MalformedPeer(b, lambda: progress.value, settings.malformed_ratio, settings.seed,
                         settings.flood_every, settings.flood_size)
    impostors = Impostors(settings.side_path, lambda: progress.value, settings.impostor_ratio, settings.seed + 1)
    peer.start()
    impostors.start()
    burst = 0
    while not conn.poll(0.01):
        if bursts.value > burst:
            burst = bursts.value
            impostors.burst(settings.impostor_burst)
    for thread in (peer, impostors):
        thread.stop.set()
        thread.join(10)
    impostors.close_all()
    b.close()
    conn.send({"malformed_messages": peer.sent, "malformed_unreachable": peer.unreachable,
               "rogue_floods": peer.floods, "rogue_flood_messages": peer.flooded, "rogue_refusals": peer.refusals,
               "rogue_outputs": peer.answers, "impostor_connections": impostors.connected,
               "impostors_turned_away": impostors.turned_away, "impostor_descriptors_received": impostors.leaks})


class Rogue:
    """Frontend B and the side channel's impostors, in a process of their own: what they hold is
    not counted as the frontend's memory or descriptors. :attr:`progress` paces them (requests A
    has finished); :meth:`burst` sends a burst of impostors (an engine was just killed)."""

    def __init__(self, settings: RogueSettings) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.progress = ctx.Value("q", 0, lock=False)
        self._bursts = ctx.Value("q", 0, lock=False)
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_rogue_main, args=(child, self.progress, self._bursts, settings),
                                   name="soak-rogue", daemon=True)
        self.process.start()
        child.close()
        if not self._conn.poll(300):
            raise TimeoutError("the rogue process did not start")
        self.addresses: ZmqAddresses = self._conn.recv()

    def burst(self) -> None:
        self._bursts.value += 1

    def stop(self) -> dict[str, int]:
        """Stop attacking; what the rogue counted (empty if it died)."""
        try:
            self._conn.send("stop")
            counts: dict[str, int] = self._conn.recv() if self._conn.poll(60) else {}
        except (OSError, EOFError):
            counts = {}
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        return counts
