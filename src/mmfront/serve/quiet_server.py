"""uvicorn's server without its tick. ``uvicorn.Server`` wakes its event loop ten times a second
to read ``should_exit`` and refresh the ``date`` header (2 ms of CPU a second on an idle
``mmfront serve``, measured; `vllm serve` pays the same). :class:`QuietServer` refreshes the
header once a second, on the second, and is woken at once by whatever sets ``should_exit``:
uvicorn's SIGINT and SIGTERM handler, the engine watchdog's thread, a test. The answers are the
same: the same headers, the same graceful shutdown, started as soon as before or sooner."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import ClassVar

import uvicorn

PAST_THE_SECOND_S = 0.01
"""How far past a whole second the date is refreshed (timers may fire early by the loop's clock
resolution: ~1 ms was seen)."""


class QuietServer(uvicorn.Server):
    """``uvicorn.Server`` whose main loop sleeps until the next whole second or an exit request.
    ``should_exit`` may be set from any thread."""

    DATE_RESOLUTION_S: ClassVar[float] = 1.0
    """How often the ``date`` header is refreshed: HTTP dates count whole seconds."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._exit_requested

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_requested = value
        loop, wake = self._loop, self._wake
        if value and loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits any more
                loop.call_soon_threadsafe(wake.set)

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        # uvicorn's on_tick with a counter of 0: refresh the date header, then say whether to exit
        while not await self.on_tick(0):
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._until_the_next_second())

    def _until_the_next_second(self) -> float:
        """Until just past the next whole second: a loop's timer may fire a little early, and
        woken just before the second turns the loop would wake again a moment later."""
        resolution = self.DATE_RESOLUTION_S
        return resolution - time.time() % resolution + PAST_THE_SECOND_S


__all__ = ["PAST_THE_SECOND_S", "QuietServer"]
