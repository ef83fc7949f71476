"""The transport over vLLM 0.33's ZMQ sockets, one class per end.

The layout is vLLM's: P0 binds a ROUTER for requests and a PULL for outputs; each engine connects
a DEALER whose identity is ``engine_index.to_bytes(2, "little")`` and a PUSH. Both ends speak
mmfront's envelopes to their callers (as :class:`~mmfront.engine.transports.PipeTransport`
does) and lay them out on the sockets as vLLM's frames
(:mod:`mmfront.engine.transports.zmq_frames`), so a stock vLLM engine can take mmfront's
requests and a stock frontend can read mmfront's engine outputs.

``ipc`` (the default) binds socket files in a private 0700 directory, removed on close; ``tcp``
binds the loopback address unless ``host`` says otherwise, for engines on other hosts. How an
engine learns these addresses is vLLM's start-up handshake (:mod:`mmfront.engine.handshake`);
the first message an engine's DEALER sends is its ready response, which
:meth:`ZmqFrontendTransport.recv_first` hands to it. Over
``ipc`` an mmfront engine also opens a side channel (:mod:`mmfront.engine.transports.fd_channel`)
that takes request frames of ``side_channel_min_bytes`` or more off the socket: they travel in a
sealed memfd the engine maps, where ZMQ would copy them through the kernel twice. A bad
message raises :class:`~mmfront.errors.DecodeError` from ``recv`` and is dropped; the next
``recv`` reads the next message. A stock engine that dies of an error pushes
``ENGINE_CORE_DEAD``, which ``recv`` raises as :class:`~mmfront.errors.EngineDeadError`; one that
vanishes is seen only by the socket monitor, which ``watch_disconnects`` turns on (for engines
that send no heartbeat).

Thread-safety: the P0 end sends on the ROUTER and receives on the PULL, the engine end receives on
the DEALER and sends on the PUSH, so one sender thread and one receiver thread may share an end.
"""

from __future__ import annotations

import errno
import itertools
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import zmq
from zmq.utils.monitor import recv_monitor_message

from mmfront.engine.transports.base import BaseTransport, EngineTransportFactory
from mmfront.engine.transports.fd_channel import FdChannelConnection, FdChannelListener, side_path
from mmfront.engine.transports.zmq_frames import (
    envelope_from_output_frames,
    envelope_from_request_frames,
    output_frames,
    request_frames,
)
from mmfront.errors import ConfigError, EngineDeadError, TransportError
from mmfront.wire import Frame
from mmfront.wire.handshake import ENGINE_CORE_DEAD

DEFAULT_OUTPUT_HWM = 10_000
"""Messages an engine queues for a frontend that does not read them (its PUSH socket's SNDHWM)
when neither ``output_hwm`` nor ``hwm`` is given: past it the engine drops what it would send
(:meth:`ZmqEngineTransport.try_send`) rather than wait or grow without bound."""
SIDE_CHANNEL_MIN_BYTES = 1 << 20
"""Request frames from this size go on the ``ipc`` side channel (smaller ones cost more to map
than to copy)."""


@dataclass(frozen=True)
class ZmqAddresses:
    """Where an engine connects: its DEALER to ``input``, its PUSH to ``output``. Over ``ipc``,
    ``side_secret`` is what the side channel asks of an engine (empty: the engine must bring its
    own, announced in vLLM's handshake); it is never printed."""

    input: str
    output: str
    side_secret: bytes = field(default=b"", repr=False, compare=False)


def engine_identity(engine_index: int) -> bytes:
    """The DEALER identity of engine ``engine_index`` (vLLM's: 2 bytes, little-endian)."""
    if not 0 <= engine_index < 1 << 16:
        raise ConfigError(f"engine_index must be in [0, 65535] (it travels as 2 bytes), got {engine_index}.")
    return engine_index.to_bytes(2, "little")


def _configure(sock: zmq.Socket, hwm: int, max_frame_bytes: int, send_timeout_s: float | None) -> None:
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.SNDTIMEO, -1 if send_timeout_s is None else max(0, round(send_timeout_s * 1000)))
    sock.setsockopt(zmq.LINGER, 0)


def _check_limits(hwm: int, max_frame_bytes: int, send_timeout_s: float | None) -> None:
    if hwm < 0:
        raise ConfigError(f"hwm must be 0 (no limit) or a positive number of messages, got {hwm}.")
    if max_frame_bytes < -1 or max_frame_bytes == 0:
        raise ConfigError(f"max_frame_bytes must be -1 (no limit) or positive, got {max_frame_bytes}.")
    if send_timeout_s is not None and send_timeout_s < 0:
        raise ConfigError(f"send_timeout_s must be None (wait) or >= 0, got {send_timeout_s}.")


def _send(sock: zmq.Socket, frames: Sequence[Frame], who: str, flags: int = 0) -> None:
    try:
        sock.send_multipart(frames, flags, copy=False)
    except zmq.Again as e:
        raise TransportError(f"{who} did not take the message within send_timeout_s (its queue is full); "
                             "retry later or raise hwm.") from e
    except zmq.ZMQError as e:
        if e.errno == errno.EHOSTUNREACH:
            raise TransportError(f"{who} is not connected; start it and call wait_for_engines first.") from e
        raise TransportError(f"Sending to {who} failed: {e}.") from e


def _recv(sock: zmq.Socket, timeout: float | None) -> list[memoryview] | None:
    try:
        if timeout is not None and not sock.poll(max(0, round(timeout * 1000))):
            return None
        return [frame.buffer for frame in sock.recv_multipart(copy=False)]
    except zmq.ZMQError as e:
        raise TransportError(f"Receiving failed: {e}.") from e


class ZmqFrontendTransport(BaseTransport):
    """P0's end: binds the ROUTER (requests) and the PULL (outputs) and routes to engines.

    ``send`` goes to ``engine_index``; ``send_to`` picks the engine. ``hwm`` bounds each socket's
    queue in messages (0: unbounded, as vLLM); with it, ``send_timeout_s`` bounds how long a send
    waits for room. A peer that sends a frame above ``max_frame_bytes`` is disconnected and its
    message dropped (-1: no limit). Over ``ipc``, request frames of ``side_channel_min_bytes`` or
    more go on the side channel to engines that opened it (``None``: never)."""

    routes_to_engines = True

    def __init__(
        self,
        scheme: Literal["ipc", "tcp"] = "ipc",
        *,
        host: str = "127.0.0.1",
        ports: tuple[int, int] = (0, 0),
        engine_index: int = 0,
        client_index: int = 0,
        hwm: int = 0,
        send_timeout_s: float | None = None,
        max_frame_bytes: int = -1,
        side_channel_min_bytes: int | None = SIDE_CHANNEL_MIN_BYTES,
    ) -> None:
        if scheme not in ("ipc", "tcp"):
            raise ConfigError(f"scheme must be 'ipc' or 'tcp', got {scheme!r}.")
        _check_limits(hwm, max_frame_bytes, send_timeout_s)
        self.engine_index = engine_index
        self.client_index = client_index
        self.engines: set[int] = set()
        """Engines that said hello (see :meth:`wait_for_engines`)."""
        self._identity = engine_identity(engine_index)
        self._call_ids = itertools.count()
        self._dir: Path | None = None
        self._side: FdChannelListener | None = None
        self._monitor: zmq.Socket | None = None
        self._poller: zmq.Poller | None = None
        """The output socket, the monitor once :meth:`watch_disconnects` made it, and the
        descriptors of :meth:`wake_on`; ``None`` while there is only the output socket."""
        self._wake_fds: set[int] = set()
        self._ctx = zmq.Context()
        self._closed = False
        try:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._pull = self._ctx.socket(zmq.PULL)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted engine takes its identity back
            for sock in (self._router, self._pull):
                _configure(sock, hwm, max_frame_bytes, send_timeout_s)
            if scheme == "ipc":
                self._dir = Path(tempfile.mkdtemp(prefix="mmfront-zmq-"))
                endpoints = [f"ipc://{self._dir}/{name}" for name in ("input", "output")]
            else:
                endpoints = [f"tcp://{host}:{port or '*'}" for port in ports]
            for sock, endpoint in zip((self._router, self._pull), endpoints):
                sock.bind(endpoint)
            input_address = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
            output_address = self._pull.getsockopt_string(zmq.LAST_ENDPOINT)
            path = side_path(input_address)
            if path is not None and side_channel_min_bytes is not None:
                self._side = FdChannelListener(path, side_channel_min_bytes)
            self.addresses = ZmqAddresses(input_address, output_address,
                                          b"" if self._side is None else self._side.secret)
        except (zmq.ZMQError, OSError) as e:
            self.close()
            raise TransportError(f"Cannot bind the {scheme} sockets ({e}); pick other ports or another host.") from e

    def recv_first(self, timeout: float) -> tuple[int, bytes] | None:
        """The next start-up message an engine sent on the ROUTER, with its engine index, or
        ``None`` after ``timeout`` seconds; call it before sending (from the sending thread)."""
        while True:
            if not self._router.poll(max(0, round(timeout * 1000))):
                return None
            identity, *payload = self._router.recv_multipart()
            if len(identity) == 2:
                index = int.from_bytes(identity, "little")
                self.engines.add(index)
                return index, payload[0] if payload else b""

    def wait_for_engines(self, engine_indices: Iterable[int], timeout: float) -> None:
        """Block until every engine in ``engine_indices`` has connected (any first message); call
        it before sending (from the sending thread: it reads the ROUTER)."""
        wanted = set(engine_indices)
        deadline = time.monotonic() + timeout
        while not wanted <= self.engines:
            left = deadline - time.monotonic()
            if left <= 0 or self.recv_first(left) is None:
                missing = sorted(wanted - self.engines)
                raise TransportError(f"Engines {missing} did not connect within {timeout} s; check their addresses.")

    def watch_disconnects(self) -> None:
        """From now on ``recv`` raises :class:`~mmfront.errors.EngineDeadError` when an engine's
        input connection drops (ZMQ's socket monitor): how P0 sees a stock engine vanish, as it
        sends no heartbeat. Call it once the engines connected, before a receiving thread starts."""
        if self._monitor is None:
            self._monitor = self._router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._polled().register(self._monitor, zmq.POLLIN)

    def _polled(self) -> zmq.Poller:
        if self._poller is None:
            self._poller = zmq.Poller()
            self._poller.register(self._pull, zmq.POLLIN)
        return self._poller

    def wake_on(self, fd: int) -> bool:
        self._polled().register(fd, zmq.POLLIN)
        self._wake_fds.add(fd)
        return True

    def stop_waking_on(self, fd: int) -> None:
        if fd in self._wake_fds and self._poller is not None:
            self._wake_fds.discard(fd)
            self._poller.unregister(fd)

    def authorize_side_channel(self, engine_index: int, secret: bytes) -> None:
        """Let engine ``engine_index`` open the ``ipc`` side channel with ``secret`` (the one it
        announced in vLLM's handshake); nothing without a side channel."""
        if self._side is not None:
            self._side.authorize(engine_identity(engine_index), secret)

    @property
    def side_channel_messages(self) -> int:
        """Requests whose large frames went on the ``ipc`` side channel so far."""
        return 0 if self._side is None else self._side.messages

    def send(self, frames: Sequence[Frame]) -> None:
        self.send_to(self.engine_index, frames)

    def send_to(self, engine_index: int, frames: Sequence[Frame]) -> None:
        """Send one envelope to engine ``engine_index``; tensors go zero-copy, so leave them
        unchanged until the engine has answered."""
        identity = self._identity if engine_index == self.engine_index else engine_identity(engine_index)
        out = request_frames(frames, call_ids=self._call_ids, client_index=self.client_index)
        if self._side is not None:
            out = self._side.offload(identity, out)
        _send(self._router, [identity, *out], f"Engine {engine_index}")

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        if self._poller is not None:
            if timeout is not None and timeout <= 0:
                self._check_monitor()
            else:
                # one poll per message: it reports a pending disconnect or wake-up as well as the output
                ready = dict(self._poller.poll(None if timeout is None else round(timeout * 1000)))
                if self._monitor in ready:
                    self._check_monitor()
                if self._pull not in ready:
                    return None
                timeout = None  # a whole message is waiting, and only this thread reads the socket
        frames = _recv(self._pull, timeout)
        if frames is None:
            return None
        if len(frames) == 1 and frames[0] == ENGINE_CORE_DEAD:
            raise EngineDeadError("The engine core reported ENGINE_CORE_DEAD (a fatal error in the engine); "
                                  "its log says why. Restart it, then send the requests again.")
        return envelope_from_output_frames(frames)

    def _check_monitor(self) -> None:
        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                raise EngineDeadError(f"An engine's connection to {self.addresses.input} dropped (socket monitor): "
                                      "the engine process is gone. Restart it, then send the requests again.")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._side is not None:
            self._side.close()
        if self._monitor is not None:
            self._router.disable_monitor()
            self._monitor.close(0)
        self._ctx.destroy(linger=0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class ZmqEngineTransport(BaseTransport):
    """An engine's end: connects a DEALER (identity from ``engine_index``) and a PUSH to P0, and
    over ``ipc`` the side channel first, unless ``side_channel`` is false (or P0 has none).
    ``ready`` is the DEALER's first message: the engine's encoded ready response after vLLM's
    handshake (empty without one; P0 accepts any payload as "connected"). The side channel
    takes ``side_secret`` (the one this engine announced in the handshake), else
    ``addresses.side_secret``; with neither, the engine gets plain frames. ``output_hwm``
    bounds the messages queued for P0 (``None``: ``hwm``, else :data:`DEFAULT_OUTPUT_HWM`; the
    queue is never unbounded): :meth:`try_send`, how the engine sends, refuses past it."""

    def __init__(
        self,
        addresses: ZmqAddresses,
        engine_index: int,
        *,
        hwm: int = 0,
        send_timeout_s: float | None = None,
        max_frame_bytes: int = -1,
        side_channel: bool = True,
        ready: bytes = b"",
        side_secret: bytes | None = None,
        output_hwm: int | None = None,
    ) -> None:
        _check_limits(hwm, max_frame_bytes, send_timeout_s)
        if output_hwm is not None and output_hwm < 1:
            raise ConfigError(f"output_hwm must be a positive number of messages (or None), got {output_hwm}.")
        self.engine_index = engine_index
        identity = engine_identity(engine_index)
        self._side: FdChannelConnection | None = None
        secret = side_secret or addresses.side_secret
        path = side_path(addresses.input) if side_channel and secret else None
        if path is not None and Path(path).exists():
            try:
                self._side = FdChannelConnection(path, identity, max_frame_bytes, secret=secret)
            except OSError:
                self._side = None  # P0 without the channel (or gone): plain frames
        self._ctx = zmq.Context()
        self._closed = False
        try:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._push = self._ctx.socket(zmq.PUSH)
            self._dealer.setsockopt(zmq.IDENTITY, identity)
            for sock in (self._dealer, self._push):
                _configure(sock, hwm, max_frame_bytes, send_timeout_s)
            self._push.setsockopt(zmq.SNDHWM, output_hwm or hwm or DEFAULT_OUTPUT_HWM)
            self._dealer.connect(addresses.input)
            self._push.connect(addresses.output)
            self._dealer.send(ready)
        except zmq.ZMQError as e:
            self.close()
            raise TransportError(f"Cannot connect to {addresses} ({e}).") from e

    @property
    def side_channel(self) -> bool:
        """Whether this engine opened the ``ipc`` side channel (an extra it announces)."""
        return self._side is not None

    def send(self, frames: Sequence[Frame]) -> None:
        _send(self._push, output_frames(frames, engine_index=self.engine_index), "P0")

    def try_send(self, frames: Sequence[Frame]) -> bool:
        try:
            _send(self._push, output_frames(frames, engine_index=self.engine_index), "P0", zmq.NOBLOCK)
        except TransportError as e:
            if isinstance(e.__cause__, zmq.Again):
                return False
            raise
        return True

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        """The next message, or ``None`` after ``timeout`` seconds. A message whose side-channel
        datagram has not come yet is held (``None``, later messages stay queued behind it): the
        caller never waits past ``timeout`` for it, and it is a :class:`DecodeError` once due."""
        side = self._side
        if side is not None and side.holding:
            restored = side.resume(timeout)
            return None if restored is None else envelope_from_request_frames(restored)
        deadline = None if timeout is None else time.monotonic() + timeout
        received = _recv(self._dealer, timeout)
        if received is None:
            return None
        if side is None:
            return envelope_from_request_frames(list(received))
        restored = side.restore(received, None if deadline is None else max(0.0, deadline - time.monotonic()))
        return None if restored is None else envelope_from_request_frames(restored)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._side is not None:
            self._side.close()
        self._ctx.destroy(linger=0)


def zmq_engine_factory(input_address: str, output_address: str) -> EngineTransportFactory:
    """How an engine connects to the frontend whose sockets are bound at these addresses."""
    addresses = ZmqAddresses(input_address, output_address)
    return lambda engine_index: ZmqEngineTransport(addresses, engine_index)


__all__ = [
    "DEFAULT_OUTPUT_HWM",
    "SIDE_CHANNEL_MIN_BYTES",
    "ZmqAddresses",
    "ZmqEngineTransport",
    "ZmqFrontendTransport",
    "engine_identity",
    "zmq_engine_factory",
]
