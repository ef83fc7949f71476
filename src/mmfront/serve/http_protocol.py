"""The HTTP/1.1 connection ``mmfront serve`` runs under uvicorn: uvicorn's httptools protocol with
the bounds neither it nor httptools has (:class:`HttpLimits`), so a slow or hostile client holds
a bounded amount of time, memory and descriptors.

- A request head (request line and headers) must arrive whole within ``header_read_timeout_s``
  of the connection or of its first byte; a body may not stall longer than
  ``body_read_timeout_s`` between two reads (408, then the connection is closed).
- A head is at most ``max_head_bytes`` (431), ``max_header_count`` header lines (431) and a URL of
  ``max_url_bytes`` (414). httptools holds a header value in memory until its end, copying it as
  it grows; counting the bytes as they arrive refuses a 64 MiB value after ``max_head_bytes``.
- Past ``max_connections`` open connections a new one is answered 503 and closed at once, so the
  descriptor limit is never what turns normal clients away.

What the connection writes in one turn of the event loop goes out as one write
(:class:`~mmfront.serve.coalesced_writes.CoalescedWrites`), and a request body's pieces reach the
app without uvicorn's copies of them (:meth:`LimitedHttpToolsProtocol.on_body`).

Refusals are plain text, as uvicorn's own 400 for an unparsable request. The connection is then
half-closed and what the client still sends is read and dropped for :data:`LINGER_S` (a lingering
close, as nginx's): closing at once with unread bytes would reset the connection, and the client
would lose the answer.
"""

from __future__ import annotations

import asyncio
import http
import logging
import random
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HIGH_WATER_LIMIT, HttpToolsProtocol

from mmfront.serve.coalesced_writes import CoalescedWrites

logger = logging.getLogger(__name__)

FD_SOFT_LIMIT_TARGET = 65535
"""The open-file soft limit ``mmfront serve`` raises itself to at start (vLLM's ``set_ulimit``)."""
LINGER_S = 1.0
"""How long a refused connection's further bytes are read and dropped before it is closed."""
TIMEOUT_SPREAD = 0.2
"""A read timeout ends at a random point of its last fifth (5 s: between 4 and 5 s), so connections
opened together do not all time out in one turn of the event loop: a thousand idle connections
closed (and reopened by their client) at once held the loop ~0.2-0.4 s, every normal request
waiting; spread over a second they cost each turn a connection or two."""


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP connection may hold (``ServeSettings``' flags of the same names)."""

    header_read_timeout_s: float
    body_read_timeout_s: float
    max_head_bytes: int
    max_header_count: int
    max_url_bytes: int
    max_connections: int


class _HeadRefused(Exception):
    """Raised from an httptools callback: the head breaks a limit (its status and reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools connection under :class:`HttpLimits` (see the module's docstring)."""

    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.in_head = False
        self.in_body = False
        self.lingering = False
        self.head_bytes = 0
        self.header_count = 0
        self.refusal: _HeadRefused | None = None
        self.read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescedWrites(transport, self.loop))
        if len(self.connections) > self.limits.max_connections:
            self.logger.warning("Refused a connection: %d are open (--max-connections).", len(self.connections) - 1)
            self.refuse(503, "The server has too many open connections; retry later.", linger=False)
            return
        self.arm(self.limits.header_read_timeout_s)  # a connection that never sends a head is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering or self.transport.is_closing():
            return
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.in_head:
            self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_head_bytes:
                self.refuse(431, f"The request head is larger than the server's limit of "
                                 f"{self.limits.max_head_bytes} bytes (--h11-max-incomplete-event-size).")
        elif self.in_body:
            self.arm(self.limits.body_read_timeout_s)

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers a parser error 400; an error a callback raised for a limit keeps its status."""
        refusal, self.refusal = self.refusal, None
        if refusal is None:
            super().send_400_response(msg)
        else:
            self.refuse(refusal.status, str(refusal))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_head = True
        self.head_bytes = 0
        self.header_count = 0
        if self.read_timer is None:
            self.arm(self.limits.header_read_timeout_s)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_url_bytes:
            self.refuse_in_parser(414, f"The URL is longer than the server's limit of {self.limits.max_url_bytes} "
                                       "bytes (--max-url-length).")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        if self.header_count > self.limits.max_header_count:
            self.refuse_in_parser(431, f"The request has more than the server's limit of "
                                       f"{self.limits.max_header_count} headers (--h11-max-header-count).")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.in_body = True
        self.arm(self.limits.body_read_timeout_s)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """uvicorn's, without its two copies of each piece: uvicorn appends a piece to the
        request's ``bytearray``, and the app's ``receive`` copies that into ``bytes`` (on the
        event loop; ~1.3 MB per data URL of 630 KB). A piece that finds nothing waiting is held
        as it is, and ``receive`` hands it on as it is (``bytes`` of a ``bytes`` is the same
        object); pieces that pile up before the app reads are joined, in order, as uvicorn
        joins them."""
        cycle = self.cycle
        if cycle.body or cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            if isinstance(cycle.body, bytes):  # a piece held as it is, then another before the app read it
                cycle.body = bytearray(cycle.body)
            super().on_body(body)
            return
        cycle.body = body  # type: ignore[assignment]  # read by receive() as bytes(cycle.body) only
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        self.in_body = False
        self.disarm()
        super().on_message_complete()

    def refuse_in_parser(self, status: int, reason: str) -> None:
        """Stop httptools from a callback; its error comes back to :meth:`send_400_response`."""
        self.refusal = _HeadRefused(status, reason)
        raise self.refusal

    def refuse(self, status: int, reason: str, *, linger: bool = True) -> None:
        """Answer ``status`` with ``reason`` and close the connection: at once (past the connection
        cap, where the descriptor is what is short), else after a lingering close. An app waiting
        for the body learns at once that the client is gone."""
        self.disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        body = reason.encode("ascii")
        self.transport.write(b"".join([
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode("ascii"),
            *(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers),
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n", body]))
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.lingering = True
            self.read_timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def arm(self, seconds: float) -> None:
        self.disarm()
        self.read_timer = self.loop.call_later(seconds * (1 - TIMEOUT_SPREAD * random.random()), self.read_timed_out)

    def disarm(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def read_timed_out(self) -> None:
        """The head did not arrive whole in time, or the body stalled (not while the app, not the
        client, holds reading back)."""
        self.read_timer = None
        if self.transport.is_closing():
            return
        if self.in_body and self.flow.read_paused:
            self.arm(self.limits.body_read_timeout_s)
            return
        if self.in_body and self.cycle is not None and self.cycle.response_started:
            self.transport.close()
            return
        what = "body" if self.in_body else "head"
        seconds = self.limits.body_read_timeout_s if self.in_body else self.limits.header_read_timeout_s
        self.refuse(408, f"The request {what} did not arrive within {seconds:g} s "
                         f"(--{'body' if self.in_body else 'header'}-read-timeout).")


def raise_fd_soft_limit(target: int = FD_SOFT_LIMIT_TARGET) -> int:
    """Raise the open-file soft limit to ``target`` (or the hard limit, when lower), as vLLM's
    ``set_ulimit`` does at start: at the usual 1024 about a thousand idle connections use every
    descriptor. The soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as e:
            logger.warning("The open-file limit is %d and could not be raised (%s); raise it with ulimit -n.", soft, e)
    return soft


def connection_cap(wanted: int, fd_soft_limit: int) -> int:
    """``--max-connections``, kept under half the open-file soft limit: the other half is for the
    engines' links, media files and descriptors passed with requests."""
    cap = min(wanted, max(1, fd_soft_limit // 2))
    if cap < wanted:
        logger.warning("--max-connections %d lowered to %d: half of the open-file limit (%d); raise ulimit -n to "
                       "allow more.", wanted, cap, fd_soft_limit)
    return cap


__all__ = ["FD_SOFT_LIMIT_TARGET", "LINGER_S", "TIMEOUT_SPREAD", "HttpLimits", "LimitedHttpToolsProtocol", "connection_cap",
           "raise_fd_soft_limit"]
