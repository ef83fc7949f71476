"""An HTTP connection's writes of one turn of the event loop sent as one (:class:`CoalescedWrites`).

uvicorn writes every ASGI message at once: a streamed answer's head, each SSE event's HTTP chunk,
and the empty last chunk each cost a ``send`` system call, and on a loopback or LAN link a wake-up
of the client per call. Most come in bursts from one task without a pause: the head and the
role chunk, then the last delta, the usage event, ``[DONE]`` and the last chunk. Held until the
callbacks ready in this turn have run, a burst is one call. The bytes and their order are the
same (only how the stream is cut into segments changes, as it does whenever a socket's buffer
is full); nothing waits longer than the rest of the turn it was written in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

HELD_BYTES = 1 << 16
"""What a turn may hold before it is written at once: a burst larger than this gains nothing from
one call, and the transport's flow control (which pauses the app's writes past its high-water
mark) sees it as it comes."""


class CoalescedWrites(asyncio.Transport):
    """``transport`` whose writes are held until the end of the current turn of ``loop`` (or until
    :data:`HELD_BYTES` are held), then written as one. Closing it (or ending its writes) writes
    what is held first; aborting it drops it, as an abort drops the transport's own buffer; what
    is held when the connection is already closing (the client left) is dropped, as the
    transport would refuse it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.transport = transport
        self.loop = loop
        self.held: list[bytes] = []
        self.held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not isinstance(data, bytes):  # a caller may reuse its buffer once write returns, as a transport copies it
            data = bytes(data)
        if not self.held:
            self.loop.call_soon(self.flush)
        self.held.append(data)
        self.held_bytes += len(data)
        if self.held_bytes >= HELD_BYTES:
            self.flush()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write what is held now, as one write."""
        held, self.held, self.held_bytes = self.held, [], 0
        if held and not self.transport.is_closing():
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self.held, self.held_bytes = [], 0
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.transport.get_protocol()

    def is_reading(self) -> bool:
        return self.transport.is_reading()

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + self.held_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.transport.get_write_buffer_limits()


__all__ = ["HELD_BYTES", "CoalescedWrites"]
