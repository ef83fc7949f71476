"""Issue 34's hit path: what ``mmfront serve``'s HTTP connection writes in one turn of the event loop
goes out as one write, with the same bytes in the same order (:class:`CoalescedWrites`), and a
request body's pieces reach the app as they came, without uvicorn's copies
(:meth:`LimitedHttpToolsProtocol.on_body`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from uvicorn.server import ServerState

from mmfront.serve.coalesced_writes import HELD_BYTES, CoalescedWrites
from mmfront.serve.launcher import uvicorn_config
from mmfront.serve.settings import ServeSettings


class RecordingTransport(asyncio.Transport):
    """A transport that keeps each write and what was asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.events.append(f"close after {len(self.writes)} writes")
        self.closing = True

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def write_eof(self) -> None:
        self.events.append(f"eof after {len(self.writes)} writes")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        self.events.append("pause_reading")

    def resume_reading(self) -> None:
        pass


async def a_turn() -> None:
    await asyncio.sleep(0)


def test_writes_of_one_turn_go_out_as_one_in_order() -> None:
    async def run() -> list[list[bytes]]:
        inner = RecordingTransport()
        writes = CoalescedWrites(inner, asyncio.get_running_loop())
        seen = []
        writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
        writes.write(b"")
        writes.write(bytearray(b"2f\r\ndata: role\r\n"))
        seen.append(list(inner.writes))
        await a_turn()
        seen.append(list(inner.writes))
        writes.writelines([b"a", memoryview(b"b")])
        await a_turn()
        writes.write(b"c")
        await a_turn()
        seen.append(list(inner.writes))
        return seen

    before, after_one, after_three = asyncio.run(run())
    assert before == []
    assert after_one == [b"HTTP/1.1 200 OK\r\n\r\n2f\r\ndata: role\r\n"]
    assert after_three == [b"HTTP/1.1 200 OK\r\n\r\n2f\r\ndata: role\r\n", b"ab", b"c"]


def test_a_buffer_the_caller_changes_after_writing_goes_out_as_written() -> None:
    async def run() -> list[bytes]:
        inner = RecordingTransport()
        writes = CoalescedWrites(inner, asyncio.get_running_loop())
        buffer = bytearray(b"first")
        writes.write(buffer)
        buffer[:] = b"later"
        await a_turn()
        return inner.writes

    assert asyncio.run(run()) == [b"first"]


def test_closing_writes_what_is_held_first_and_aborting_drops_it() -> None:
    async def run() -> tuple[RecordingTransport, RecordingTransport, RecordingTransport]:
        loop = asyncio.get_running_loop()
        closed, ended, aborted = RecordingTransport(), RecordingTransport(), RecordingTransport()
        for inner in (closed, ended, aborted):
            writes = CoalescedWrites(inner, loop)
            writes.write(b"0\r\n\r\n")
            {id(closed): writes.close, id(ended): writes.write_eof, id(aborted): writes.abort}[id(inner)]()
        await a_turn()
        return closed, ended, aborted

    closed, ended, aborted = asyncio.run(run())
    assert (closed.writes, closed.events) == ([b"0\r\n\r\n"], ["close after 1 writes"])
    assert (ended.writes, ended.events) == ([b"0\r\n\r\n"], ["eof after 1 writes"])
    assert (aborted.writes, aborted.events) == ([], ["abort"])


def test_what_is_held_when_the_client_has_left_is_dropped() -> None:
    async def run() -> RecordingTransport:
        inner = RecordingTransport()
        writes = CoalescedWrites(inner, asyncio.get_running_loop())
        writes.write(b"a chunk")
        inner.closing = True  # the connection was lost in this turn
        await a_turn()
        return inner

    assert asyncio.run(run()).writes == []


def test_a_burst_past_the_held_bytes_is_written_at_once() -> None:
    """So the transport's flow control sees a large burst as it comes and can pause the app."""
    async def run() -> tuple[list[int], list[int]]:
        inner = RecordingTransport()
        writes = CoalescedWrites(inner, asyncio.get_running_loop())
        writes.write(b"a" * (HELD_BYTES - 1))
        before = [len(w) for w in inner.writes]
        writes.write(b"bb")
        writes.write(b"c")
        await a_turn()
        return before, [len(w) for w in inner.writes]

    assert asyncio.run(run()) == ([], [HELD_BYTES + 1, 1])


def test_the_write_buffer_counts_what_is_held() -> None:
    async def run() -> int:
        inner = RecordingTransport()
        inner.get_write_buffer_size = lambda: 7  # type: ignore[method-assign]
        writes = CoalescedWrites(inner, asyncio.get_running_loop())
        writes.write(b"12345")
        return writes.get_write_buffer_size()

    assert asyncio.run(run()) == 12


def connection(loop: asyncio.AbstractEventLoop) -> tuple[Any, RecordingTransport, list[Any]]:
    """``mmfront serve``'s HTTP connection over a recording transport, and the ASGI messages its
    app receives (the app reads the whole body, then answers 200)."""
    received: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            received.append(message)
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn_config(Starlette(), ServeSettings(Path("m"), host="127.0.0.1", port=0, uvicorn_log_level="warning"))
    config.app = app
    config.lifespan = "off"
    config.access_log = False
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    inner = RecordingTransport()
    protocol.connection_made(inner)
    return protocol, inner, received


def test_a_body_piece_reaches_the_app_as_it_came_and_pieces_that_pile_up_are_joined() -> None:
    async def run() -> tuple[list[Any], list[bytes], RecordingTransport]:
        protocol, inner, received = connection(asyncio.get_running_loop())
        first, second, third = b"x" * 300_000, b"y" * 5, b"z" * 7
        protocol.data_received(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 300012\r\n\r\n")
        protocol.data_received(first)
        for _ in range(3):
            await a_turn()
        protocol.data_received(second)  # two pieces before the app reads again
        protocol.data_received(third)
        for _ in range(6):
            await a_turn()
        return received, [first, second + third], inner

    received, expected, inner = asyncio.run(run())
    assert [m["body"] for m in received] == expected
    assert [m["more_body"] for m in received] == [True, False]
    assert "pause_reading" in inner.events  # a piece over uvicorn's high-water mark pauses reading, as in uvicorn
    # the head, the chunk and the last chunk, written in one turn, are one write
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"]


def test_a_single_body_piece_is_handed_on_without_a_copy() -> None:
    async def run() -> tuple[bytes, Any]:
        protocol, _, received = connection(asyncio.get_running_loop())
        protocol.data_received(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")
        piece = b"body"
        protocol.on_body(piece)
        protocol.on_message_complete()
        for _ in range(3):
            await a_turn()
        return piece, received[0]["body"]

    piece, body = asyncio.run(run())
    assert body is piece
