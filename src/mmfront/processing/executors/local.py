"""Lanes as local processes: each a fresh interpreter with its own processor, fed over a socket.

A lane that dies fails the item it held with :class:`~mmfront.errors.LaneError` and is restarted
for the next one; nothing waits on a dead lane. A lane that dies while idle (killed, OOM) held
nothing: it is found dead before it is given the next item and replaced, so no item fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection

from mmfront.errors import DecodeError, LaneError, ResourceError, TransportError
from mmfront.processing.executors.jobs import LaneFailure, LaneReply, LaneRunner, LaneSpec
from mmfront.processing.executors.lanes import BaseLaneExecutor
from mmfront.wire import Frame, MsgpackDecoder, MsgpackEncoder
from mmfront.wire.pipe import recv_frames, send_frames
from mmfront.wire.shared_buffer import InBuffer, OutBuffer, send_replies_through

logger = logging.getLogger(__name__)

_POLL_S = 0.5
"""How often a caller waiting on a lane checks that the lane's process is still alive."""
_STOP_S = 5.0
"""How long a closing lane may take to exit before it is killed."""
_START_S = 600.0
"""How long a lane may take to import and build its processor (minutes on a loaded machine)."""


def worker_main(fd: int) -> None:
    """A lane process (``python -c``, started by :class:`LocalProcessExecutor` with its end of a
    socket pair as ``fd``): build the processor from the spec it is sent, then answer jobs until
    the caller closes its end, and end the process there."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the caller, which closes the lanes
    conn = Connection(fd)
    encoder = MsgpackEncoder()
    try:
        spec: LaneSpec = MsgpackDecoder(LaneSpec).decode(recv_frames(conn) or [b""])
        sys.path.extend(p for p in spec.sys_path if p not in sys.path)  # where the caller imports its classes from
        lane = LaneRunner(spec)
    except Exception as exc:  # the caller gets the reason instead of a dead pipe
        send_frames(conn, encoder.encode(LaneReply(failure=LaneFailure.of(exc))))
        return
    send_frames(conn, encoder.encode(LaneReply()))
    jobs, replies = InBuffer(), OutBuffer()  # jobs and replies travel in shared buffers, see mmfront.wire.pipe
    send_replies_through(replies)  # large outputs (patch rows) are made in the reply's buffer: no copy at the send
    while True:
        try:
            frames = recv_frames(conn, into=jobs)
        except (EOFError, TransportError):
            break
        if frames is not None:
            send_frames(conn, lane.run(frames), out=replies)
    # the caller closed its end: nothing is left to release (the buffers go with the process), and the
    # teardown of an interpreter holding the processor's modules took 2-5 s of every server stop
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _Worker:
    """One lane process and the caller's end of its socket.

    Started with ``python -c``, not ``multiprocessing``: a spawned process would import the
    caller's ``__main__`` again (a script without a ``__main__`` guard would run twice), and a
    forked one would inherit the caller's threads and locks.
    """

    def __init__(self, spec_frames: list[Frame], name: str) -> None:
        self.name = name
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c",
                 f"from mmfront.processing.executors.local import worker_main; worker_main({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        self.conn = Connection(ours.detach())  # reaches EOF when the process dies
        self._jobs, self._replies = OutBuffer(), InBuffer()
        try:
            send_frames(self.conn, spec_frames)
            reply: LaneReply = MsgpackDecoder(LaneReply).decode(self._recv(deadline=time.monotonic() + _START_S))
        except LaneError:
            self.stop()
            raise
        except (TransportError, DecodeError) as exc:
            self.stop()
            raise LaneError(f"Processing lane {name} failed to start: {exc}") from exc
        if reply.failure is not None:
            self.stop()
            raise LaneError(f"A processing lane could not build the processor: {reply.failure.message}")

    def idle_alive(self) -> bool:
        """Whether this idle lane can take an item: its process runs and its socket has nothing to
        read (an idle lane says nothing; a readable socket is its end closing)."""
        return self.process.poll() is None and not self.conn.poll(0)

    def call(self, frames: list[Frame]) -> list[Frame]:
        try:
            send_frames(self.conn, frames, out=self._jobs)
        except TransportError:
            raise self._died() from None
        return self._recv()

    def _recv(self, deadline: float | None = None) -> list[Frame]:
        try:
            while not self.conn.poll(_POLL_S):
                if self.process.poll() is not None:
                    raise self._died()
                if deadline is not None and time.monotonic() > deadline:
                    raise LaneError(f"Processing lane {self.name} did not build its processor within {_START_S:g} s.")
            frames = recv_frames(self.conn, into=self._replies)
        except (EOFError, TransportError):
            raise self._died() from None
        assert frames is not None
        return frames

    def _died(self) -> LaneError:
        try:
            code: int | None = self.process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            code = None
        return LaneError(f"Processing lane {self.name} (pid {self.process.pid}) exited with code {code} while it "
                         "held an item; the lane restarts, send the request again.")

    def stop(self) -> None:
        self.conn.close()
        try:
            self.process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._jobs.close()
        self._replies.close()


class LocalProcessExecutor(BaseLaneExecutor):
    """``size`` spawned processes, each with its own processor, fed over pipes (the default lanes,
    ``mm_lane_executor="process"``).

    One thread per lane takes the next job from a shared queue, so a free lane always takes the
    next item. The processes start in the background at construction (warm-up); jobs submitted
    before a lane is up wait for it.
    """

    def __init__(self, spec: LaneSpec, size: int) -> None:
        super().__init__(spec, size)
        self._spec_frames = self._encoder.encode(spec)
        self._jobs: queue.SimpleQueue[tuple[list[Frame], Future[list[Frame]]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[_Worker | None] = [None] * size
        self._threads = [threading.Thread(target=self._run_lane, args=(i,), name=f"mmfront-lane-{i}", daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def pids(self) -> list[int | None]:
        """The lanes' process ids (``None`` for a lane not running now)."""
        return [None if w is None else w.process.pid for w in self._workers]

    def _submit(self, frames: list[Frame]) -> Future[list[Frame]]:
        future: Future[list[Frame]] = Future()
        with self._lock:
            if self.closed:
                raise LaneError("The processing lanes are closed; create the preprocessor again.")
            self._jobs.put((frames, future))
        return future

    def _start(self, index: int) -> _Worker:
        try:
            worker = _Worker(self._spec_frames, name=f"mmfront-lane-{index}")
        except OSError as exc:  # no process could be started (limits, memory)
            raise LaneError(f"Could not start processing lane {index}: {exc}") from exc
        self._workers[index] = worker
        return worker

    def _run_lane(self, index: int) -> None:
        worker: _Worker | None = None
        with contextlib.suppress(LaneError):  # the first job on this lane starts it again and reports why not
            worker = self._start(index)
        while (job := self._jobs.get()) is not None:
            frames, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if worker is not None and not worker.idle_alive():
                    logger.warning("Processing lane %d (pid %d) died while idle (code %s); starting a new one.",
                                   index, worker.process.pid, worker.process.poll())
                    worker.stop()
                    worker = self._workers[index] = None
                if worker is None:
                    worker = self._start(index)
                future.set_result(worker.call(frames))
            except Exception as exc:  # the lane thread must survive whatever a lane does
                if worker is not None:  # released before the item fails: its caller may count what is left
                    worker.stop()
                worker = self._workers[index] = None
                future.set_exception(exc if isinstance(exc, (LaneError, ResourceError)) else LaneError(f"Processing lane {index} failed: {exc}"))
        if worker is not None:
            worker.stop()
        self._workers[index] = None

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for _ in self._threads:
                self._jobs.put(None)
        for thread in self._threads:
            thread.join()


__all__ = ["LocalProcessExecutor", "worker_main"]
