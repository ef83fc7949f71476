"""vLLM 0.33's engine start-up handshake, both sides, so mmfront has one protocol whether the
engine is vLLM's or mmfront's.

P0 (:class:`FrontendHandshake`) binds the handshake ROUTER next to the transport's sockets: an
``ipc`` path when every engine is local (``data_parallel_size_local == data_parallel_size``),
``tcp://data_parallel_address:data_parallel_rpc_port`` otherwise, as vLLM's frontend does. Each
engine says ``HELLO`` (its rank is its DEALER identity), P0 checks the rank and local/headless
and answers where the data sockets are; the engine's first message on the input socket is its
ready response (``max_model_len``, ``num_gpu_blocks``, ``block_size``, ...), then it says
``READY``. A peer that breaks the protocol, or a rank that never comes within the wait, is a
:class:`~mmfront.errors.HandshakeError` naming it.

The engine side (:func:`engine_handshake`) is what ``mmfront worker`` runs; it announces
mmfront's extras (:data:`~mmfront.wire.handshake.MMFRONT_EXTRAS`) in its greeting, and P0 uses
an extra only with an engine that announced it (:class:`EngineInfo`).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq

from mmfront.config import DataParallelConfig
from mmfront.engine.transports import ZmqAddresses, ZmqEngineTransport, ZmqFrontendTransport
from mmfront.engine.transports.fd_channel import SECRET_BYTES
from mmfront.engine.transports.zmq import engine_identity
from mmfront.errors import HandshakeError
from mmfront.wire.handshake import (
    EXTRA_ADMITTED,
    EXTRA_HEARTBEAT,
    EXTRA_MIRROR,
    EXTRA_SIDE_CHANNEL,
    EngineCoreReadyResponse,
    EngineHandshakeMetadata,
    HandshakeAddresses,
    HandshakeStatus,
)

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 300.0
"""How long an engine waits for P0's answer to its ``HELLO`` (vLLM's ``HANDSHAKE_TIMEOUT_MINS``)."""
_POLL_S = 0.01

_encode = msgspec.msgpack.Encoder().encode
_decode_status = msgspec.msgpack.Decoder(HandshakeStatus).decode
_decode_ready = msgspec.msgpack.Decoder(EngineCoreReadyResponse).decode
_decode_metadata = msgspec.msgpack.Decoder(EngineHandshakeMetadata).decode


@dataclass(frozen=True)
class EngineInfo:
    """What one engine said at start-up: its limits and the mmfront extras it speaks (none for a
    stock vLLM engine)."""

    engine_index: int
    ready: EngineCoreReadyResponse
    extras: frozenset[str]
    local: bool
    side_secret: bytes | None = field(default=None, repr=False)
    """What the engine presents on the ``ipc`` side channel (:func:`wait_for_ready_responses`
    lets it in on the other API servers)."""

    @property
    def max_model_len(self) -> int:
        return self.ready.max_model_len

    @property
    def num_gpu_blocks(self) -> int:
        return self.ready.num_gpu_blocks

    @property
    def block_size(self) -> int:
        return self.ready.block_size


@dataclass
class _Rank:
    hello: HandshakeStatus | None = None
    ready: EngineCoreReadyResponse | None = None
    ready_said: HandshakeStatus | None = None


class FrontendHandshake:
    """P0's half: binds the handshake socket (``address``) for ``transport``'s engines; start
    the engines, then :meth:`wait`, which meets every rank of ``data_parallel_size``; give its
    answer to the client (``engines=``). It names no ``DPCoordinator``: vLLM's non-MoE ranks are
    independent and then start without waiting for one."""

    def __init__(
        self, transport: ZmqFrontendTransport, parallel: DataParallelConfig | None = None, *,
        other_frontends: Sequence[ZmqAddresses] = (),
    ) -> None:
        self.parallel = parallel or DataParallelConfig()
        self.transport = transport
        self.frontends = [transport.addresses, *other_frontends]
        """Every API server the engines connect to (vLLM's ``api_server_count``): this one first,
        then the others, whose own processes read the engines' ready responses
        (:func:`wait_for_ready_responses`)."""
        self._dir: Path | None = None
        self._ctx = zmq.Context()
        self.router = self._ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        try:
            if self.parallel.all_local:
                self._dir = Path(tempfile.mkdtemp(prefix="mmfront-handshake-"))
                self.router.bind(f"ipc://{self._dir}/handshake")
            else:
                port = self.parallel.data_parallel_rpc_port or "*"
                self.router.bind(f"tcp://{self.parallel.data_parallel_address}:{port}")
        except zmq.ZMQError as e:
            self.close()
            raise HandshakeError(f"Cannot bind the handshake socket ({e}); pick another data_parallel_rpc_port.") from e
        self.address: str = self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    def wait(self, timeout: float = 600.0) -> list[EngineInfo]:
        """Run the handshake with every rank; their start-up answers, by rank. Engines that
        send no heartbeat get the transport's socket monitor instead (``watch_disconnects``)."""
        ranks = {i: _Rank() for i in range(self.parallel.data_parallel_size)}
        deadline = time.monotonic() + timeout
        while not all(r.ready is not None and r.ready_said is not None for r in ranks.values()):
            if time.monotonic() > deadline:
                raise HandshakeError(self._missing(ranks, timeout))
            if self.router.poll(round(_POLL_S * 1000)):
                self.on_greeting(ranks, *self.router.recv_multipart())
            first = self.transport.recv_first(0.0 if any(r.hello for r in ranks.values()) else _POLL_S)
            if first is not None:
                self._on_ready(ranks, *first)
        infos = [self._info(index, rank) for index, rank in sorted(ranks.items())]
        if any(EXTRA_HEARTBEAT not in info.extras for info in infos):
            self.transport.watch_disconnects()
        return infos

    def close(self) -> None:
        self._ctx.destroy(linger=0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> FrontendHandshake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_greeting(self, ranks: dict[int, _Rank], identity: bytes, *payload: bytes) -> None:
        """One handshake message of an engine, checked against the ranks awaited (``ranks``): a
        HELLO is answered with the data sockets' addresses, a READY recorded."""
        index = int.from_bytes(identity, "little") if len(identity) == 2 else None
        rank = None if index is None else ranks.get(index)
        if index is None or rank is None:
            raise HandshakeError(f"A peer with identity {identity.hex() or '(none)'} spoke on {self.address}; "
                                 f"expected engine ranks 0..{self.parallel.data_parallel_size - 1}.")
        try:
            status = _decode_status(payload[0] if payload else b"")
        except (msgspec.DecodeError, RecursionError) as e:  # a nesting bomb is malformed too
            raise HandshakeError(f"Engine rank {index} sent a malformed handshake message: {e}.") from e
        expect_local = index < self.parallel.local_ranks
        if status.local != expect_local or (not status.local and not status.headless):
            raise HandshakeError(
                f"Engine rank {index} says local={status.local}, headless={status.headless}; expected "
                f"{'a local engine' if expect_local else 'a remote one started with --headless'} "
                f"(data_parallel_size_local={self.parallel.local_ranks}).")
        if status.status == "HELLO":
            rank.hello = status
            secret = _side_secret(status)
            if secret is not None:
                self.transport.authorize_side_channel(index, secret)
            addresses = HandshakeAddresses([f.input for f in self.frontends], [f.output for f in self.frontends])
            self.router.send_multipart([identity, _encode(EngineHandshakeMetadata(addresses))])
        elif rank.hello is None:
            raise HandshakeError(f"Engine rank {index} said READY before HELLO.")
        else:
            rank.ready_said = status

    def _on_ready(self, ranks: dict[int, _Rank], index: int, payload: bytes) -> None:
        rank = ranks.get(index)
        if rank is None or rank.hello is None:
            raise HandshakeError(f"Engine rank {index} connected to the input socket without a handshake "
                                 f"(it must greet {self.address} first).")
        try:
            rank.ready = _decode_ready(payload)
        except (msgspec.DecodeError, RecursionError) as e:  # a nesting bomb is malformed too
            raise HandshakeError(f"Engine rank {index}'s first message is not a ready response: {e}.") from e

    def _missing(self, ranks: dict[int, _Rank], timeout: float) -> str:
        for what, missing in (("said HELLO", [i for i, r in ranks.items() if r.hello is None]),
                              ("sent its ready response", [i for i, r in ranks.items() if r.ready is None]),
                              ("said READY", [i for i, r in ranks.items() if r.ready_said is None])):
            if missing:
                return (f"Engine rank(s) {missing} never {what} within {timeout} s on {self.address}; "
                        "check that they run and point at this address.")
        return "The handshake did not finish."

    def _info(self, index: int, rank: _Rank) -> EngineInfo:
        assert rank.hello is not None and rank.ready is not None and rank.ready_said is not None
        extras = {*(rank.hello.mmfront_extras or ()), *(rank.ready_said.mmfront_extras or ())}
        return EngineInfo(index, rank.ready, frozenset(extras), rank.hello.local, _side_secret(rank.hello))


class RejoinListener:
    """The handshake socket kept open after start-up, so that a headless engine restarted as one of
    ``ranks`` (vLLM's ``vllm serve --headless`` or ``mmfront worker``) greets it as at start-up:
    HELLO, answered with the same API servers' addresses; its data sockets; READY, after which
    ``on_rejoin(rank)`` is called (from this listener's thread). A greeting that breaks the
    protocol, names another rank, or announces other mmfront extras than the rank had at start-up
    is logged and goes unanswered (the engine's own wait times out); vLLM's API server closes this
    socket after start-up, so its restarted engines never rejoin. :meth:`close` ends the thread
    and closes ``handshake``."""

    POLL_S = 0.1

    def __init__(self, handshake: FrontendHandshake, engines: Sequence[EngineInfo], ranks: Iterable[int],
                 on_rejoin: Callable[[int], None]) -> None:
        self.handshake = handshake
        self.on_rejoin = on_rejoin
        self.extras = {info.engine_index: info.extras for info in engines}
        self.ranks = frozenset(ranks)
        self._greeting: dict[int, _Rank] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mmfront-handshake-rejoin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        router = self.handshake.router
        try:
            while not self._stop.is_set():
                if router.poll(round(self.POLL_S * 1000)):
                    self._on_message(*router.recv_multipart())
        finally:
            self.handshake.close()

    def _on_message(self, identity: bytes, *payload: bytes) -> None:
        index = int.from_bytes(identity, "little") if len(identity) == 2 else None
        if index in self.ranks and (index not in self._greeting or self._greeting[index].ready_said is not None):
            self._greeting[index] = _Rank()
        try:
            self.handshake.on_greeting(self._greeting, identity, *payload)
        except HandshakeError as e:
            logger.error("A restarted engine was not let in: %s", e)
            return
        assert index is not None
        rank = self._greeting[index]
        if rank.ready_said is None:
            logger.info("Engine rank %d greets the handshake again at %s (HELLO): it is rejoining.", index,
                        self.handshake.address)
            return
        assert rank.hello is not None
        extras = {*(rank.hello.mmfront_extras or ()), *(rank.ready_said.mmfront_extras or ())}
        if extras != self.extras.get(index):
            logger.error("Engine rank %d rejoined announcing the mmfront extras %s, where it had %s at start-up: "
                         "another kind of engine; restart this server to serve it.", index, sorted(extras),
                         sorted(self.extras.get(index) or ()))
            return
        logger.info("Engine rank %d rejoined through %s.", index, self.handshake.address)
        self.on_rejoin(index)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _side_secret(hello: HandshakeStatus) -> bytes | None:
    try:
        return bytes.fromhex(hello.mmfront_side_secret) if hello.mmfront_side_secret else None
    except ValueError:
        return None  # not an mmfront secret: the engine gets plain frames


def wait_for_ready_responses(
    transport: ZmqFrontendTransport, engines: Sequence[EngineInfo], timeout: float = 600.0,
) -> list[EngineInfo]:
    """For an API server other than the one that ran the handshake (``other_frontends``): read
    each engine's ready response from this server's own input socket. ``engines`` is what the
    handshake's :meth:`FrontendHandshake.wait` returned; the answer is the same, with this
    server's ready responses (an engine writes one to every API server)."""
    wanted = {info.engine_index: info for info in engines}
    for info in engines:
        if info.side_secret is not None:
            transport.authorize_side_channel(info.engine_index, info.side_secret)
    got: dict[int, EngineInfo] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(wanted):
        left = deadline - time.monotonic()
        first = transport.recv_first(left) if left > 0 else None
        if first is None:
            missing = sorted(set(wanted) - set(got))
            raise HandshakeError(f"Engine rank(s) {missing} never connected to {transport.addresses.input} within "
                                 f"{timeout} s; the handshake must list this API server's addresses.")
        index, payload = first
        if index not in wanted:
            raise HandshakeError(f"Engine rank {index} connected to {transport.addresses.input}; expected ranks "
                                 f"{sorted(wanted)}.")
        try:
            ready = _decode_ready(payload)
        except (msgspec.DecodeError, RecursionError) as e:  # a nesting bomb is malformed too
            raise HandshakeError(f"Engine rank {index}'s first message is not a ready response: {e}.") from e
        got[index] = dataclasses.replace(wanted[index], ready=ready)
    infos = [got[i] for i in sorted(got)]
    if any(EXTRA_HEARTBEAT not in info.extras for info in infos):
        transport.watch_disconnects()
    return infos


def engine_handshake(
    handshake_address: str, engine_index: int, ready: EngineCoreReadyResponse, *, local: bool = False,
    extras: Collection[str] = (EXTRA_MIRROR, EXTRA_ADMITTED, EXTRA_HEARTBEAT),
    timeout: float = HANDSHAKE_TIMEOUT_S, side_channel: bool = True,
) -> ZmqEngineTransport:
    """The engine's half, for a frontend with one API server: :func:`engine_handshake_all`'s one
    transport (a :class:`~mmfront.errors.HandshakeError` if the frontend lists several)."""
    transports = engine_handshake_all(handshake_address, engine_index, ready, local=local, extras=extras,
                                      timeout=timeout, side_channel=side_channel)
    if len(transports) != 1:
        for transport in transports:
            transport.close()
        raise HandshakeError(f"The frontend at {handshake_address} has {len(transports)} API servers; connect to "
                             "each (engine_handshake_all).")
    return transports[0]


def engine_handshake_all(
    handshake_address: str, engine_index: int, ready: EngineCoreReadyResponse, *, local: bool = False,
    extras: Collection[str] = (EXTRA_MIRROR, EXTRA_ADMITTED, EXTRA_HEARTBEAT),
    timeout: float = HANDSHAKE_TIMEOUT_S, side_channel: bool = True,
) -> list[ZmqEngineTransport]:
    """The engine's half: greet P0 at ``handshake_address`` as rank ``engine_index`` (announcing
    ``extras``), connect the data sockets of every API server it names with ``ready`` as the
    first message on each, say READY (adding ``side_channel`` when the transports opened it: over
    ``ipc``, unless ``side_channel`` is false), and return one transport per API server."""
    ctx = zmq.Context()
    transports: list[ZmqEngineTransport] = []
    linger_ms = 0  # a failed or interrupted handshake waits for no frontend to read its HELLO
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, engine_identity(engine_index))
        dealer.setsockopt(zmq.LINGER, 5000)
        dealer.connect(handshake_address)
        secret = secrets.token_bytes(SECRET_BYTES) if side_channel else None
        dealer.send(_encode(HandshakeStatus("HELLO", local, not local, mmfront_extras=sorted(extras),
                                            mmfront_side_secret=None if secret is None else secret.hex())))
        if not dealer.poll(round(timeout * 1000)):
            raise HandshakeError(f"No frontend answered engine rank {engine_index}'s HELLO on {handshake_address} "
                                 f"within {timeout} s.")
        try:
            metadata = _decode_metadata(dealer.recv())
        except (msgspec.DecodeError, RecursionError) as e:  # a nesting bomb is malformed too
            raise HandshakeError(f"The frontend at {handshake_address} answered with no handshake metadata: {e}.") from e
        pairs = list(zip(metadata.addresses.inputs, metadata.addresses.outputs))
        if not pairs or len(metadata.addresses.inputs) != len(metadata.addresses.outputs):
            raise HandshakeError(f"The frontend at {handshake_address} named {len(metadata.addresses.inputs)} input "
                                 f"and {len(metadata.addresses.outputs)} output addresses; one of each per API server.")
        ready = msgspec.structs.replace(ready, data_parallel_rank=engine_index)
        for input_address, output_address in pairs:
            transports.append(ZmqEngineTransport(ZmqAddresses(input_address, output_address), engine_index,
                                                 ready=_encode(ready), side_channel=side_channel,
                                                 side_secret=secret))
        said = [EXTRA_SIDE_CHANNEL] if all(t.side_channel for t in transports) else None
        dealer.send(_encode(HandshakeStatus("READY", local, not local, mmfront_extras=said)))
        linger_ms = 5000  # READY must reach the frontend
    except BaseException:
        for transport in transports:
            transport.close()
        raise
    finally:
        ctx.destroy(linger=linger_ms)
    return transports


__all__ = [
    "DataParallelConfig",
    "EngineInfo",
    "FrontendHandshake",
    "RejoinListener",
    "engine_handshake",
    "engine_handshake_all",
    "wait_for_ready_responses",
]
