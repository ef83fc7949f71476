"""Request bodies as ``mmfront serve`` reads them: each into one buffer (a declared length is
allocated once and filled, never joined from parts), within the per-request ``--max-body-bytes``
(413) and within the bytes all requests hold together, ``--max-body-bytes-in-flight`` (503: the
server is busy, the request is not at fault). Both are checked on the declared length before a
byte is read, and on a chunked body as it arrives."""

from __future__ import annotations

import mmap
from dataclasses import dataclass

from starlette.requests import Request

from mmfront.errors import BodyTooLargeError, ResourceError
from mmfront.wire.allocator import LARGE_BUFFER_BYTES


@dataclass
class BodyBudget:
    """Bytes of request bodies held at once, across requests (the event loop's, so no lock)."""

    limit: int
    held: int = 0

    def take(self, size: int) -> None:
        if self.held + size > self.limit:
            raise ResourceError(
                f"The server holds {self.held} bytes of request bodies and this one needs {size} more; the limit is "
                f"{self.limit} bytes (--max-body-bytes-in-flight). The request is not at fault: retry it.",
                resource="request body memory", setting="--max-body-bytes-in-flight")
        self.held += size

    def give(self, size: int) -> None:
        self.held -= size


class HeldBody:
    """One request's share of a :class:`BodyBudget`, given back whole by :meth:`release`."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0

    def grow(self, size: int) -> None:
        self.budget.take(size)
        self.size += size

    def release(self) -> None:
        self.budget.give(self.size)
        self.size = 0


async def read_body(request: Request, limit: int, held: HeldBody) -> bytearray | mmap.mmap:
    """The body in one buffer, refused as soon as it passes ``limit`` (413) or the budget (503).
    A declared body of :data:`~mmfront.wire.allocator.LARGE_BUFFER_BYTES` or more is read into an anonymous mapping,
    whose pages the kernel zeroes as the bytes arrive: ``bytearray(size)`` zeroes all of them
    at once, on the event loop (a 60 MB body held it ~15-25 ms before a byte was read, and four
    arriving together four times that), and makes the server's memory grow by the declared size
    rather than by the bytes received."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        size = int(declared)
        if size > limit:
            raise BodyTooLargeError(f"The request body ({size} bytes) is larger than the server's limit of {limit} "
                                    "bytes.")
        held.grow(size)
        body: bytearray | mmap.mmap = mmap.mmap(-1, size) if size >= LARGE_BUFFER_BYTES else bytearray(size)
        view = memoryview(body)
        filled = 0
        async for part in request.stream():
            view[filled:filled + len(part)] = part
            filled += len(part)
        view.release()
        return body
    chunked = bytearray()
    async for part in request.stream():
        if len(chunked) + len(part) > limit:
            raise BodyTooLargeError(f"The request body is larger than the server's limit of {limit} bytes.")
        held.grow(len(part))
        chunked += part
    return chunked


__all__ = ["BodyBudget", "HeldBody", "read_body"]
