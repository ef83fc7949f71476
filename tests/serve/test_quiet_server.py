"""``QuietServer``: uvicorn's server without its tenth-of-a-second tick. It answers with the
``date`` header of the current second, stops as soon as ``should_exit`` is set (from any thread,
or by SIGINT as ``uvicorn.Server`` does), and its main loop wakes once a second, not ten times."""

from __future__ import annotations

import email.utils
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from mmfront.network import get_open_port
from mmfront.serve.quiet_server import QuietServer
from mmfront.testing.servers import start_in_thread


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def config(port: int = 0) -> uvicorn.Config:
    return uvicorn.Config(Starlette(routes=[Route("/", hello)]), host="127.0.0.1", port=port, log_level="warning",
                          lifespan="off")


def date_of_get(port: int) -> tuple[float, float, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        before = time.time()
        conn.request("GET", "/")
        reply = conn.getresponse()
        assert reply.status == 200 and reply.read() == b"hello"
        return before, time.time(), reply.headers["date"]
    finally:
        conn.close()


def test_the_date_header_is_the_current_second() -> None:
    server = QuietServer(config())
    thread = start_in_thread(server)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        for _ in range(3):
            before, after, date = date_of_get(port)
            stamp = email.utils.parsedate_to_datetime(date).timestamp()
            assert date.endswith(" GMT")
            # the header is at most one refresh behind the request, as uvicorn's own
            assert int(before) - 1 <= stamp <= after, (before, date, after)
            time.sleep(0.6)
        dates = {date_of_get(port)[2]}
        time.sleep(1.2)
        dates.add(date_of_get(port)[2])
        assert len(dates) == 2
    finally:
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()


def test_should_exit_from_another_thread_wakes_the_main_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # an hour between refreshes: the server can only stop in time if setting should_exit woke it
    monkeypatch.setattr(QuietServer, "DATE_RESOLUTION_S", 3600.0)
    server = QuietServer(config())
    thread = start_in_thread(server)
    time.sleep(0.3)
    threading.Thread(target=setattr, args=(server, "should_exit", True)).start()
    thread.join(20)
    assert not thread.is_alive()


def test_the_main_loop_wakes_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks: list[float] = []
    on_tick = QuietServer.on_tick

    async def counted(self: QuietServer, counter: int) -> bool:
        ticks.append(time.monotonic())
        return await on_tick(self, counter)

    monkeypatch.setattr(QuietServer, "on_tick", counted)
    server = QuietServer(config())
    thread = start_in_thread(server)
    time.sleep(2.5)
    server.should_exit = True
    thread.join(20)
    assert 2 <= len(ticks) <= 5, ticks  # uvicorn's loop: ~25 in 2.5 s


SERVE = """
import sys
from mmfront.serve.quiet_server import QuietServer
sys.path.insert(0, {tests!r})
from test_quiet_server import config
QuietServer.DATE_RESOLUTION_S = 3600.0
try:
    QuietServer(config({port})).run()
except KeyboardInterrupt:  # uvicorn raises the signal again once it has shut down
    print("stopped", flush=True)
"""


def test_sigint_stops_it_at_once(tmp_path: Path) -> None:
    port = get_open_port()
    script = tmp_path / "serve.py"
    script.write_text(SERVE.format(tests=str(Path(__file__).parent), port=port))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                date_of_get(port)
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, process.stdout.read() if process.stdout else ""
                time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=20)
        assert b"stopped" in out, out
    finally:
        process.kill()
        process.wait()

