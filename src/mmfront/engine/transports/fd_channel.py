"""The side channel of the ZMQ transports over ``ipc://``: large frames in a sealed memfd.

Over ``ipc://`` both ends are on one machine, yet ZMQ still pushes every byte through a Unix
socket: a copy into the kernel on P0, a zero-filled buffer and a copy out of it on the engine,
most of a large request's hop (docs/benchmarks.md). Beside its ROUTER's socket file P0 listens on a second one
(``<input socket>.fds``, SOCK_SEQPACKET, in the same private 0700 directory). An mmfront engine
connects to it before its DEALER, sends its 2-byte identity, and from then on each request with
aux frames of at least ``min_bytes`` travels as:

1. on the side channel, one datagram (:func:`side_message`: a token and the index and size of
   each large frame) carrying one sealed memfd that holds those frames;
2. on ZMQ, the request's frames with those frames left empty, then a marker frame after the stamp
   (:func:`side_marker`) naming the token.

The datagram is queued in the engine's socket before the ZMQ message leaves P0, so the engine
finds it at once. Anything that goes wrong on P0's side (no channel for that engine, a full or
broken channel, no descriptor left for a memfd) sends the request as plain frames instead; a
stock vLLM engine never connects and only ever gets plain frames.

The channel is authenticated: a connection counts only if its peer runs as P0's user
(``SO_PEERCRED``) and its hello, ``identity + secret``, carries the listener's secret (which P0
gives in process through :class:`~mmfront.engine.transports.zmq.ZmqAddresses`) or one P0
authorized for that engine (:meth:`FdChannelListener.authorize`: the secret an engine announced
in vLLM's handshake). A live engine's connection is never replaced; a dead one's is. At most
``_MAX_PENDING`` connections wait to be read, and anything else is closed at once. A datagram whose ZMQ message was lost (an engine restart) is
dropped by the engine when it reads past it. Descriptors in flight die with their socket.

Thread-safety: as the transports': :class:`FdChannelListener` is used by P0's sending thread,
:class:`FdChannelConnection` by the engine's receiving thread.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import secrets
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Sequence
from typing import Final

from mmfront.errors import DecodeError, ResourceError, TransportError
from mmfront.wire import Frame, frame_view
from mmfront.wire.memfd import map_sealed, write_sealed

logger = logging.getLogger(__name__)

SUFFIX: Final = ".fds"
"""The side channel's socket file is the ROUTER's ``ipc://`` path with this suffix."""
SIDE_MAGIC: Final = b"\xc1mfd"
"""Starts the marker frame of a message whose large frames are in the side channel."""
_MARKER = struct.Struct("<4sQ")
_SIDE_HEADER = struct.Struct("<QI")
_SIDE_ENTRY = struct.Struct("<IQ")
MAX_SIDE_FRAMES: Final = 4096
"""Most frames one side message may carry (it is one datagram)."""
SIDE_MESSAGE_MAX: Final = _SIDE_HEADER.size + MAX_SIDE_FRAMES * _SIDE_ENTRY.size
_MAX_PENDING = 64
"""Connections that have not sent their hello yet; older ones beyond this are closed."""
SECRET_BYTES: Final = 16
"""Length of the secret an engine presents after its 2-byte identity."""
_HELLO_BYTES = 2 + SECRET_BYTES
_MAX_ENGINES = 256
"""Engines one listener serves at most: an engine beyond it gets plain frames."""
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC})
_ARRIVAL_S = 0.5
"""How long a message waits for the datagram it announced (queued before it, so normally there at
once); the engine serves its other frontends meanwhile."""


def side_marker(token: int) -> bytes:
    """The frame appended (after the stamp) to a request whose large frames went to the side channel."""
    return _MARKER.pack(SIDE_MAGIC, token)


def split_side_marker(frames: Sequence[Frame]) -> tuple[list[Frame], int | None]:
    """``frames`` without a trailing side marker, and the marker's token (``None``: none)."""
    last = frame_view(frames[-1], len(frames) - 1) if frames else memoryview(b"")
    if last.nbytes != _MARKER.size or bytes(last[:4]) != SIDE_MAGIC:
        return list(frames), None
    return list(frames[:-1]), _MARKER.unpack(last)[1]


def side_message(token: int, placed: Sequence[tuple[int, int]]) -> bytes:
    """The side channel's datagram: the token, then (frame index, size) of each frame in its memfd."""
    if len(placed) > MAX_SIDE_FRAMES:
        raise DecodeError(f"A side message carries at most {MAX_SIDE_FRAMES} frames, not {len(placed)}.")
    return _SIDE_HEADER.pack(token, len(placed)) + b"".join(_SIDE_ENTRY.pack(i, n) for i, n in placed)


def parse_side_message(data: bytes) -> tuple[int, list[tuple[int, int]]]:
    """:func:`side_message` read back; :class:`~mmfront.errors.DecodeError` if malformed."""
    if len(data) < _SIDE_HEADER.size:
        raise DecodeError(f"A side message has at least {_SIDE_HEADER.size} bytes, got {len(data)}.")
    token, count = _SIDE_HEADER.unpack_from(data)
    if count > MAX_SIDE_FRAMES or len(data) != _SIDE_HEADER.size + count * _SIDE_ENTRY.size:
        raise DecodeError(f"Malformed side message ({len(data)} bytes for {count} frames).")
    return token, [_SIDE_ENTRY.unpack_from(data, _SIDE_HEADER.size + k * _SIDE_ENTRY.size) for k in range(count)]


def side_path(ipc_endpoint: str) -> str | None:
    """The side channel's socket file for the ROUTER endpoint ``ipc_endpoint`` (``None`` for tcp)."""
    if not ipc_endpoint.startswith("ipc://"):
        return None
    return ipc_endpoint[len("ipc://"):] + SUFFIX


class FdChannelListener:
    """P0's end: accepts engines' connections and moves large frames onto them."""

    def __init__(self, path: str, min_bytes: int) -> None:
        self.min_bytes = max(1, min_bytes)
        self.secret = secrets.token_bytes(SECRET_BYTES)
        """What an engine of this process presents (handed over in ``ZmqAddresses``)."""
        self._authorized: dict[bytes, bytes] = {}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.bind(path)
            self._sock.listen(_MAX_PENDING)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        self._pending: deque[socket.socket] = deque()
        self._engines: dict[bytes, socket.socket] = {}
        self._tokens = iter(range(1, 1 << 64))
        self.messages = 0
        """Messages whose large frames went on the side channel."""

    def offload(self, identity: bytes, frames: Sequence[Frame]) -> list[Frame]:
        """``frames`` (``[type, body, *aux, stamp]``) to send to ``identity``: with the large aux
        frames in the side channel when that engine has one, as they are otherwise."""
        views = {i: frame_view(frames[i], i) for i in range(2, len(frames) - 1)}
        large = [i for i, view in views.items() if view.nbytes >= self.min_bytes]
        if not large:
            return list(frames)
        self._accept()
        conn = self._engines.get(identity)
        if conn is None:
            return list(frames)
        token = next(self._tokens)
        try:
            fd = write_sealed([views[i] for i in large])
        except OSError as e:  # no descriptor or memory for a memfd: plain frames need neither
            if not isinstance(e, ResourceError) and e.errno not in _RESOURCE_ERRNOS:
                raise
            logger.warning("Side channel: no memfd for a request to engine %s (%s); sending plain frames.",
                           int.from_bytes(identity, "little"), e)
            return list(frames)
        try:
            socket.send_fds(conn, [side_message(token, [(i, views[i].nbytes) for i in large])], [fd],
                            socket.MSG_DONTWAIT)
        except BlockingIOError:
            return list(frames)  # the engine is behind on the channel: plain frames still work
        except OSError:
            del self._engines[identity]
            conn.close()
            return list(frames)
        finally:
            os.close(fd)
        out = list(frames)
        for i in large:
            out[i] = b""
        out.append(side_marker(token))
        self.messages += 1
        return out

    def authorize(self, identity: bytes, secret: bytes) -> None:
        """Let the engine ``identity`` connect with ``secret`` (the one it announced in vLLM's
        handshake), besides this listener's own."""
        self._authorized[identity] = secret

    def _accept(self) -> None:
        """Take new connections, and the hello of those that sent it; a valid one of an identity
        whose connection is dead (a restarted engine) replaces it, never a live one."""
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                if e.errno in _RESOURCE_ERRNOS:
                    logger.warning("Side channel: cannot accept an engine's connection (%s); it is tried again "
                                   "with the next large request. Raise the descriptor limit (ulimit -n).", e)
                break
            conn.setblocking(False)
            self._pending.append(conn)
            if len(self._pending) > _MAX_PENDING:
                self._pending.popleft().close()
        waiting: deque[socket.socket] = deque()
        for conn in self._pending:
            try:
                hello = conn.recv(64)
            except BlockingIOError:
                waiting.append(conn)
                continue
            except OSError:
                conn.close()
                continue
            identity = self._admitted(conn, hello)
            if identity is None:
                conn.close()
                continue
            self._engines[identity] = conn
        self._pending = waiting

    def _admitted(self, conn: socket.socket, hello: bytes) -> bytes | None:
        """The identity ``conn`` may serve, or ``None``: a peer of another user, a hello without
        a valid secret, a live engine's identity, or one engine too many."""
        if len(hello) != _HELLO_BYTES or not _same_user(conn):
            return None
        identity, secret = hello[:2], hello[2:]
        authorized = self._authorized.get(identity)
        if not (hmac.compare_digest(secret, self.secret)
                or (authorized is not None and hmac.compare_digest(secret, authorized))):
            return None
        old = self._engines.get(identity)
        if old is not None:
            if _alive(old):
                logger.warning("Side channel: a second connection for engine %d while its first lives; refused.",
                               int.from_bytes(identity, "little"))
                return None
            del self._engines[identity]
            old.close()
        if len(self._engines) >= _MAX_ENGINES:
            return None
        return identity

    def close(self) -> None:
        for conn in [*self._pending, *self._engines.values()]:
            conn.close()
        self._pending.clear()
        self._engines.clear()
        self._sock.close()


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` runs as this process's user (``SO_PEERCRED``)."""
    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return False
    return uid == os.geteuid()


def _alive(conn: socket.socket) -> bool:
    """Whether the engine behind ``conn`` is still connected (an engine never sends after its
    hello, so anything readable is its end closing)."""
    try:
        return not select.select([conn], [], [], 0)[0] or bool(conn.recv(1, socket.MSG_PEEK))
    except OSError:
        return False


class FdChannelConnection:
    """An engine's end: puts the frames a message left in the side channel back in place.
    ``secret`` is what P0 accepts from it (see :class:`FdChannelListener`)."""

    def __init__(self, path: str, identity: bytes, max_frame_bytes: int = -1, *, secret: bytes) -> None:
        if len(secret) != SECRET_BYTES:
            raise TransportError(f"A side-channel secret has {SECRET_BYTES} bytes, got {len(secret)}.")
        self._max_frame_bytes = max_frame_bytes
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.setblocking(False)  # a backlog filled by others fails at once: plain frames
            self._sock.connect(path)
            self._sock.send(identity + secret)
            self._sock.setblocking(True)
        except OSError:
            self._sock.close()
            raise
        self._ahead: tuple[int, list[tuple[int, int]], int] | None = None
        """A datagram read past the message being restored (whose own datagram was lost)."""
        self._held: tuple[list[Frame], int, float] | None = None
        """A message whose datagram has not come yet: its frames, its token, when it is due."""

    @property
    def holding(self) -> bool:
        """Whether a message waits for its datagram (:meth:`resume` takes it up again)."""
        return self._held is not None

    def restore(self, frames: Sequence[Frame], timeout: float | None = None) -> list[Frame] | None:
        """``frames`` as received, with a marker's frames back in place and the marker removed.

        A datagram not there yet is waited for at most ``timeout`` seconds (``None``: until it is
        due); then the message is held and ``None`` returned, and :meth:`resume` tries again, so a
        caller serving other peers never blocks on this one. Half a second after its first try,
        it is a :class:`~mmfront.errors.DecodeError`."""
        frames, token = split_side_marker(frames)
        if token is None:
            return frames
        self._held = (frames, token, time.monotonic() + _ARRIVAL_S)
        return self.resume(timeout)

    def resume(self, timeout: float | None = None) -> list[Frame] | None:
        """The held message restored, or ``None`` while its datagram is not there (see :meth:`restore`)."""
        assert self._held is not None
        frames, token, due = self._held
        until = due if timeout is None else min(due, time.monotonic() + timeout)
        while True:
            try:
                datagram = self._next_datagram(until)
            except ResourceError:
                self._held = None
                raise
            if datagram is None:
                if time.monotonic() < due:
                    return None
                self._held = None
                raise DecodeError("A message announced frames on the side channel that never came; it was dropped.")
            got, placed, fd = datagram
            if got < token:
                os.close(fd)  # its message never arrived
                continue
            self._held = None
            if got > token:
                self._ahead = (got, placed, fd)
                raise DecodeError(f"The side channel holds no frames for message {token}; it was dropped.")
            try:
                return self._place(frames, placed, fd)
            finally:
                os.close(fd)

    def _next_datagram(self, until: float) -> tuple[int, list[tuple[int, int]], int] | None:
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            return ahead
        while True:
            if not select.select([self._sock], [], [], max(0.0, until - time.monotonic()))[0]:
                return None
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, SIDE_MESSAGE_MAX, 1)
            except OSError as e:
                raise TransportError(f"The side channel to P0 failed ({e}); reconnect the engine.") from e
            if not data:
                raise TransportError("P0 closed the side channel; reconnect the engine.")
            if flags & socket.MSG_CTRUNC and not fds and len(data) >= _SIDE_HEADER.size:
                raise ResourceError(
                    "The engine could not receive a side-channel memfd: it is out of file descriptors. Raise its "
                    "limit (ulimit -n, RLIMIT_NOFILE); the message was dropped.")
            if len(fds) != 1 or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                for fd in fds:
                    os.close(fd)
                continue  # not a datagram P0 sends: skip it
            try:
                token, placed = parse_side_message(data)
            except DecodeError:
                os.close(fds[0])
                continue
            return token, placed, fds[0]

    def _place(self, frames: list[Frame], placed: list[tuple[int, int]], fd: int) -> list[Frame]:
        indices = [i for i, _ in placed]
        if len(set(indices)) != len(indices) or any(not 2 <= i < len(frames) - 1 for i in indices):
            raise DecodeError(f"The side channel placed frames at {indices} in a {len(frames)}-frame message.")
        if any(frame_view(frames[i], i).nbytes for i in indices):
            raise DecodeError("A frame sent on the side channel was not left empty in its message.")
        too_big = [n for _, n in placed if self._max_frame_bytes != -1 and n > self._max_frame_bytes]
        if too_big:
            raise DecodeError(f"A side-channel frame of {too_big[0]} bytes is above max_frame_bytes "
                              f"({self._max_frame_bytes}); it was dropped.")
        for i, view in zip(indices, map_sealed(fd, [n for _, n in placed])):
            frames[i] = view
        return frames

    def close(self) -> None:
        self._held = None
        if self._ahead is not None:
            os.close(self._ahead[2])
            self._ahead = None
        self._sock.close()


__all__ = [
    "MAX_SIDE_FRAMES",
    "SECRET_BYTES",
    "SIDE_MAGIC",
    "SIDE_MESSAGE_MAX",
    "SUFFIX",
    "FdChannelConnection",
    "FdChannelListener",
    "parse_side_message",
    "side_marker",
    "side_message",
    "side_path",
    "split_side_marker",
]
