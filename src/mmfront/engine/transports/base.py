"""How frames move between P0 and P1: one interface, one implementation per medium.

A transport moves lists of frames (``bytes``-like buffers) in order between two peers and knows
nothing about what they mean: the envelope and its messages live in :mod:`mmfront.wire.messages`.
:class:`BaseTransport` is the interface the client and the receiver take (httpx's
``BaseTransport`` is the model); :class:`PipeTransport` runs over a ``multiprocessing.Pipe``
(tests, a P1 in a child process) and the ZMQ transport over vLLM's sockets. An engine process
(``mmfront worker``) takes an :class:`EngineTransportFactory` per frontend, so it never names
the medium.

Thread-safety: one sender thread and one receiver thread per end; the frames of two messages
must not interleave, so concurrent senders serialise through the caller's commit lane.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from multiprocessing.connection import Connection
from types import TracebackType
from typing import ClassVar, Protocol

from mmfront.errors import TransportError
from mmfront.wire import Frame
from mmfront.wire.pipe import recv_frames, send_frames


class BaseTransport(ABC):
    """One end of an ordered, message-framed link."""

    routes_to_engines: ClassVar[bool] = False
    """Whether :meth:`send_to` reaches more than engine 0 (what data-parallel ranks need)."""
    client_index: int = 0
    """Which of the engines' frontends (API servers) this end is: a stock engine sends a request's
    outputs to the frontend its ``client_index`` names."""

    @abstractmethod
    def send(self, frames: Sequence[Frame]) -> None:
        """Send one message; raises :class:`~mmfront.errors.TransportError` when the peer is gone."""

    def try_send(self, frames: Sequence[Frame]) -> bool:
        """Send one message without waiting for room: ``False`` when the peer's queue is full
        (the message was not sent). How an engine sends, so that a peer that stops reading never
        holds its loop. A transport with no bounded queue sends as :meth:`send` does."""
        self.send(frames)
        return True

    @abstractmethod
    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        """The next message's frames, or ``None`` if none arrived within ``timeout`` seconds
        (``None`` waits for ever). Raises ``EOFError`` when the peer closed its end."""

    def wake_on(self, fd: int) -> bool:
        """Make :meth:`recv` return ``None`` early while ``fd`` is readable: how the receiving
        thread hears of work that is not a message (another thread's, an engine process's exit)
        without waking on a timer. ``False`` where this transport cannot; its receiver polls.
        Called from the receiving thread only."""
        return False

    def stop_waking_on(self, fd: int) -> None:
        """Undo :meth:`wake_on` (before ``fd`` is closed). Called from the receiving thread only."""
        return None  # a transport that cannot wake registered nothing

    @abstractmethod
    def close(self) -> None:
        """Release the link; idempotent."""

    def send_to(self, engine_index: int, frames: Sequence[Frame]) -> None:
        """Send one message to engine ``engine_index``; a link to one engine reaches only engine 0."""
        if engine_index != 0:
            raise TransportError(f"This {type(self).__name__} reaches one engine; engine {engine_index} needs a "
                                 "transport that routes (ZmqFrontendTransport).")
        self.send(frames)

    def __enter__(self) -> BaseTransport:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self.close()


class PipeTransport(BaseTransport):
    """Moves frame lists over one end of a ``multiprocessing.Pipe``.

    The framing is :mod:`mmfront.wire.pipe`'s: frames arrive in writable buffers, so decoded
    tensors can view them without a copy.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, frames: Sequence[Frame]) -> None:
        send_frames(self.conn, frames)

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        return recv_frames(self.conn, timeout)

    def close(self) -> None:
        self.conn.close()


class EngineTransportFactory(Protocol):
    """Connects engine ``engine_index``'s end of the link to one frontend."""

    def __call__(self, engine_index: int) -> BaseTransport: ...


__all__ = ["BaseTransport", "EngineTransportFactory", "PipeTransport"]
