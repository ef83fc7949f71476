"""An idle client's reader thread sleeps: on a transport that can wake it (ZMQ), it waits with no
timeout until a message, its bell (a stream abandoned, a rank rejoined, a process to watch, the
close) or a watched process's exit (a ``pidfd``), instead of waking every ``poll_interval_s``.
Each test checks that the reader was asleep (its last wait had no timeout) when the event came,
so the event alone can have woken it."""

from __future__ import annotations

import asyncio
import gc
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stock_like import Ranks, start_stock_like

from mmfront.engine.async_client import exit_fd
from mmfront.errors import EngineDeadError
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams

CHAT = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_url(make_image(24, 20))}},
                                     {"type": "text", "text": "Describe."}]}]


class RecvLog:
    """Every timeout the reader passed to the transport's ``recv``, in order."""

    def __init__(self, ranks: Ranks) -> None:
        self.timeouts: list[float | None] = []
        transport = ranks.client.transport
        recv = transport.recv

        def logged(timeout: float | None = None) -> Any:
            self.timeouts.append(timeout)
            return recv(timeout)

        transport.recv = logged  # type: ignore[method-assign]
        # the reader may be inside a recv begun before the log: an answer makes it call again
        assert asyncio.run(ranks.client.call_utility("is_sleeping")) == [0, "is_sleeping"]

    def asleep(self, within_s: float = 10.0) -> None:
        """Wait until the reader's last call waits with no timeout and no other call follows."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            count = len(self.timeouts)
            if count and self.timeouts[-1] is None:
                time.sleep(0.3)
                if len(self.timeouts) == count:
                    return
            time.sleep(0.02)
        raise AssertionError(f"the reader never slept: its last waits were {self.timeouts[-5:]}")


@pytest.fixture
def ranks(gemma3_dir: Path) -> Iterator[Ranks]:
    running = start_stock_like(gemma3_dir, 1, local=False)
    yield running
    for engine in running.engines:
        engine.close()
    running.client.close_blocking()


def test_an_idle_reader_waits_for_ever_and_wakes_for_each_message(ranks: Ranks) -> None:
    log = RecvLog(ranks)
    log.asleep()
    slept = len(log.timeouts)
    time.sleep(1.0)
    assert len(log.timeouts) == slept  # polling every 0.05 s would have called recv ~20 times

    async def one() -> list[int]:
        stream = await ranks.client.add_request("r1", CHAT, SamplingParams(max_tokens=2))
        return [t async for output in stream for t in output.new_token_ids]

    assert asyncio.run(asyncio.wait_for(one(), 20)) == [1010, 1011]
    log.asleep()


def test_a_stream_read_to_its_end_wakes_the_reader_no_more_when_it_is_dropped(ranks: Ranks) -> None:
    log = RecvLog(ranks)

    async def one() -> tuple[list[int], Any]:
        stream = await ranks.client.add_request("to-the-end", CHAT, SamplingParams(max_tokens=2))
        return [t async for output in stream for t in output.new_token_ids], stream

    tokens, held = asyncio.run(asyncio.wait_for(one(), 20))
    assert tokens == [1010, 1011]
    log.asleep()
    slept = len(log.timeouts)
    del held  # its finaliser aborted streams dropped before their end: an ended one rang the bell
    gc.collect()
    time.sleep(0.5)
    assert log.timeouts[slept:] == []


def test_a_stream_abandoned_while_the_reader_sleeps_is_aborted_at_once(ranks: Ranks) -> None:
    ranks.engines[0].stall_s = 30.0  # the engine says nothing: only the bell can wake the reader
    aborted = threading.Event()
    abort = ranks.client.client.abort_request

    def recorded(engine_id: str) -> Any:
        aborted.set()
        return abort(engine_id)

    ranks.client.client.abort_request = recorded  # type: ignore[method-assign]
    log = RecvLog(ranks)

    async def main() -> None:
        stream = await ranks.client.add_request("stalled", CHAT, SamplingParams(max_tokens=2))
        reading = asyncio.create_task(anext(stream))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(log.asleep)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        await stream.aclose()
        assert await asyncio.to_thread(aborted.wait, 10)

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def died_of_sigkill(ranks: Ranks) -> None:
    """Within 10 s the client is errored by the SIGKILLed process of rank 0."""
    deadline = time.monotonic() + 10
    while not ranks.client.errored and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(EngineDeadError, match=r"^Engine 0's process exited \(code -9\)"):
        asyncio.run(ranks.client.check_health())


def test_a_watched_process_that_exits_wakes_the_reader_through_its_pidfd(
        ranks: Ranks, sleeper: subprocess.Popen[bytes]) -> None:
    log = RecvLog(ranks)
    ranks.client.watch_process(0, sleeper)
    log.asleep()  # the process is watched by its pidfd, not by polling
    assert not ranks.client.errored
    sleeper.kill()
    died_of_sigkill(ranks)


def test_an_exit_is_noticed_when_another_thread_was_reaping_the_process(
        ranks: Ranks, sleeper: subprocess.Popen[bytes]) -> None:
    """``Popen.poll`` answers ``None`` while another thread's ``Popen.wait`` holds the process's
    reaping lock (subprocess's ``_waitpid_lock``, held here by hand): the reader, woken by the
    ``pidfd``, polls until the status comes instead of waking on the readable fd in a loop."""
    log = RecvLog(ranks)
    ranks.client.watch_process(0, sleeper)
    log.asleep()
    with sleeper._waitpid_lock:
        sleeper.kill()
        time.sleep(0.5)  # the reader wakes meanwhile, and cannot learn the status
        assert len(log.timeouts) < 30, log.timeouts[-5:]  # polling every 0.05 s, not spinning on the fd
        assert not ranks.client.errored
    died_of_sigkill(ranks)


def test_exit_fd_is_readable_once_the_process_ends_and_none_without_a_pid() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fd = exit_fd(process)
    assert fd is not None
    try:
        assert select.select([fd], [], [], 0)[0] == []
        process.kill()
        assert select.select([fd], [], [], 10)[0] == [fd]
    finally:
        process.wait()
        os.close(fd)

    class Pollable:
        def poll(self) -> int | None:
            return None

    assert exit_fd(Pollable()) is None


def test_no_ring_is_lost_when_many_streams_are_abandoned_in_bursts(ranks: Ranks) -> None:
    ranks.engines[0].stall_s = 30.0  # no output wakes the reader: each abort needs its ring
    aborted: list[str] = []
    abort = ranks.client.client.abort_request

    def recorded(engine_id: str) -> Any:
        aborted.append(engine_id)
        return abort(engine_id)

    ranks.client.client.abort_request = recorded  # type: ignore[method-assign]
    log = RecvLog(ranks)
    count = 48

    async def main() -> None:
        streams = [await ranks.client.add_request(f"s{n}", CHAT, SamplingParams(max_tokens=2)) for n in range(count)]
        readers = [asyncio.create_task(anext(stream)) for stream in streams]
        await asyncio.sleep(0.2)
        await asyncio.to_thread(log.asleep)
        for burst in range(0, count, 7):  # bursts of rings against the reader's drain and clear
            for task in readers[burst:burst + 7]:
                task.cancel()
            await asyncio.gather(*readers[burst:burst + 7], return_exceptions=True)
            for stream in streams[burst:burst + 7]:
                await stream.aclose()
            await asyncio.sleep(0.003 * (burst % 3))
        deadline = time.monotonic() + 10
        while len(aborted) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(a.rsplit("-", 1)[0] for a in aborted) == sorted(f"s{n}" for n in range(count))
    log.asleep()
