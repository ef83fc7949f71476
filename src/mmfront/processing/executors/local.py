"""Lanes as local processes: each forked from one lane parent that built the processor once, fed
over its own socket.

A fresh interpreter spends ~4.4 s of CPU importing torch and transformers and building the
processor; a fork of one that did costs milliseconds. So the executor starts one such interpreter,
the lane parent (:mod:`mmfront.processing.executors.lane_parent`), and asks it for each lane: at
start, and again whenever a lane dies. The second lane and every replacement are then ready at once,
and the lanes share the built processor's pages copy-on-write. The parent is started with
``python -c``, not ``multiprocessing``: a spawned process would import the caller's ``__main__``
again (a script without a ``__main__`` guard would run twice), and a fork of the caller would
inherit its threads and locks; the parent itself runs one thread when it forks (it checks).

A lane that dies fails the item it held with :class:`~mmfront.errors.LaneError` and is restarted
for the next one; nothing waits on a dead lane. A lane that dies while idle (killed, OOM) held
nothing: it is found dead before it is given the next item and replaced, so no item fails. A
parent that dies leaves its lanes serving; the next lane to start starts a new parent first (a
warning says so). Closing the executor closes every lane's socket, then the parent's: each ends
when its socket closes, so none outlives the caller, even one killed outright.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection

from mmfront.errors import DecodeError, LaneError, MMFrontError, ResourceError, TransportError
from mmfront.processing.executors.jobs import LaneReply, LaneSpec
from mmfront.processing.executors.lane_parent import EXIT_WAIT_S, PARENT_ENV, LaneGiven, LaneRequest
from mmfront.processing.executors.lanes import BaseLaneExecutor
from mmfront.wire import Frame, MsgpackDecoder, MsgpackEncoder
from mmfront.wire.pipe import recv_frames, send_frames
from mmfront.wire.shared_buffer import InBuffer, OutBuffer

logger = logging.getLogger(__name__)

_POLL_S = 0.5
"""How often a caller waiting on a lane (or on the lane parent) checks that its process is still alive."""
_STOP_S = 5.0
"""How long a closing lane (or lane parent) may take to exit before it is killed."""
_START_S = 600.0
"""How long the lane parent may take to import and build its processor (minutes on a loaded
machine), and to fork a lane."""


class _Parent:
    """The lane parent (:mod:`mmfront.processing.executors.lane_parent`) and the executor's end
    of its socket: started as a fresh interpreter, it builds the processor once, then forks the
    lanes. Not thread-safe: the executor asks it one thing at a time (its ``_parent_lock``)."""

    def __init__(self, spec_frames: list[Frame], name: str) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c",
                 f"from mmfront.processing.executors.lane_parent import parent_main; parent_main({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                env={**os.environ, **PARENT_ENV})
        self.conn = Connection(ours.detach())  # reaches EOF when the process dies
        self._decoder = MsgpackDecoder(LaneGiven)
        self._encoder = MsgpackEncoder()
        try:
            send_frames(self.conn, spec_frames)
            frames = self._recv(time.monotonic() + _START_S)
            if frames is None:
                raise LaneError(f"Processing lane {name} did not build its processor within {_START_S:g} s.")
            reply: LaneReply = MsgpackDecoder(LaneReply).decode(frames)
        except LaneError:
            self.stop()
            raise
        except (EOFError, TransportError, DecodeError) as exc:
            self.stop()
            raise LaneError(f"Processing lane {name} failed to start: {self._gone(exc)}") from exc
        if reply.failure is not None:
            self.stop()
            raise LaneError(f"A processing lane could not build the processor: {reply.failure.message}")

    def fork(self, name: str, exit_code: Callable[[int], int | None]) -> _Worker:
        """A new lane; raises ``TransportError`` when the parent is gone (or stuck: a new one
        replaces it), ``LaneError`` when it could not fork."""
        fds: list[int] = []
        try:
            send_frames(self.conn, self._encoder.encode(LaneRequest()))
            if not self._answered(time.monotonic() + _START_S):
                raise TransportError(f"The lane parent did not fork lane {name} within {_START_S:g} s.")
            with socket.fromfd(self.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                marker, fds, _flags, _addr = socket.recv_fds(sock, 1, 2)
            if not marker:
                raise TransportError("The lane parent closed its socket.")
            given: LaneGiven = self._decoder.decode(recv_frames(self.conn) or [b""])
        except (EOFError, OSError, TransportError, DecodeError) as exc:
            for fd in fds:
                os.close(fd)
            raise TransportError(self._gone(exc)) from exc
        if given.failure is not None or given.pid is None or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise LaneError(f"Could not start processing lane {name}: {given.failure}")
        for fd in fds:  # as the socket pair's own ends: a command this process runs does not inherit them
            os.set_inheritable(fd, False)
        return _Worker(given.pid, fds[0], fds[1], name, exit_code)

    def exit_code(self, pid: int) -> int | None:
        """How lane ``pid`` ended (``None``: unknown, or the parent is gone)."""
        try:
            send_frames(self.conn, self._encoder.encode(LaneRequest(exit_of=pid)))
            frames = self._recv(time.monotonic() + 2 * EXIT_WAIT_S)
        except (EOFError, OSError, MMFrontError):  # gone: the code is unknown
            return None
        return None if frames is None else self._decoder.decode(frames).code

    def _recv(self, deadline: float) -> list[Frame] | None:
        """The parent's next message, ``None`` past ``deadline``; ``TransportError`` when it is gone."""
        return recv_frames(self.conn) if self._answered(deadline) else None

    def _answered(self, deadline: float) -> bool:
        """Whether the parent's socket is readable (an answer, or its end closing) by ``deadline``;
        ``TransportError`` once its process has exited."""
        while not self.conn.poll(_POLL_S):
            if self.process.poll() is not None:
                raise TransportError(f"The lane parent exited with code {self.process.returncode}.")
            if time.monotonic() > deadline:
                return False
        return True

    def _gone(self, exc: BaseException) -> str:
        try:
            code: int | None = self.process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            code = None
        return f"the lane parent (pid {self.process.pid}) exited with code {code}" if code is not None else str(exc)

    def stop(self) -> None:
        self.conn.close()
        try:
            self.process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Worker:
    """One lane process (forked by the lane parent) and the caller's end of its socket; ``pidfd``
    watches it (readable once it has exited) and kills it without racing the reuse of its pid."""

    def __init__(self, pid: int, fd: int, pidfd: int, name: str, exit_code: Callable[[int], int | None]) -> None:
        self.pid = pid
        self.name = name
        self.conn = Connection(fd)  # reaches EOF when the process dies
        self._pidfd = pidfd
        self._exit_code = exit_code
        self._jobs, self._replies = OutBuffer(), InBuffer()

    def exited(self, timeout: float = 0) -> bool:
        exited = select.poll()
        exited.register(self._pidfd, select.POLLIN)
        return bool(exited.poll(timeout * 1000))

    def idle_alive(self) -> bool:
        """Whether this idle lane can take an item: its process runs and its socket has nothing to
        read (an idle lane says nothing; a readable socket is its end closing)."""
        return not self.exited() and not self.conn.poll(0)

    def call(self, frames: list[Frame]) -> list[Frame]:
        try:
            send_frames(self.conn, frames, out=self._jobs)
        except TransportError:
            raise self._died() from None
        try:
            while not self.conn.poll(_POLL_S):
                if self.exited():
                    raise self._died()
            frames_in = recv_frames(self.conn, into=self._replies)
        except (EOFError, TransportError):
            raise self._died() from None
        assert frames_in is not None
        return frames_in

    def _died(self) -> LaneError:
        return LaneError(f"Processing lane {self.name} (pid {self.pid}) exited with code {self.exit_code()} while "
                         "it held an item; the lane restarts, send the request again.")

    def exit_code(self) -> int | None:
        """The code this lane ended with, as its parent reaped it (``None``: unknown)."""
        return self._exit_code(self.pid)

    def stop(self) -> None:
        self.conn.close()
        if not self.exited(_STOP_S):
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            self.exited(_STOP_S)
        os.close(self._pidfd)
        self._jobs.close()
        self._replies.close()


class LocalProcessExecutor(BaseLaneExecutor):
    """``size`` lane processes forked from one lane parent that built the processor once, fed over
    sockets (the default lanes, ``mm_lane_executor="process"``).

    One thread per lane takes the next job from a shared queue, so a free lane always takes the
    next item. The lane parent and the lanes start in the background at construction (warm-up);
    jobs submitted before a lane is up wait for it.
    """

    def __init__(self, spec: LaneSpec, size: int) -> None:
        super().__init__(spec, size)
        self._spec_frames = self._encoder.encode(spec)
        self._jobs: queue.SimpleQueue[tuple[list[Frame], Future[list[Frame]]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._parent_lock = threading.Lock()  # the parent answers one request at a time
        self._parent: _Parent | None = None
        self._workers: list[_Worker | None] = [None] * size
        self._threads = [threading.Thread(target=self._run_lane, args=(i,), name=f"mmfront-lane-{i}", daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def pids(self) -> list[int | None]:
        """The lanes' process ids (``None`` for a lane not running now)."""
        return [None if w is None else w.pid for w in self._workers]

    def parent_pid(self) -> int | None:
        """The lane parent's process id (``None`` before it has started or once closed)."""
        parent = self._parent
        return None if parent is None else parent.process.pid

    def _submit(self, frames: list[Frame]) -> Future[list[Frame]]:
        future: Future[list[Frame]] = Future()
        with self._lock:
            if self.closed:
                raise LaneError("The processing lanes are closed; create the preprocessor again.")
            self._jobs.put((frames, future))
        return future

    def _start(self, index: int) -> _Worker:
        name = f"mmfront-lane-{index}"
        with self._parent_lock:
            try:
                if self._parent is None:
                    self._parent = _Parent(self._spec_frames, name)
                try:
                    worker = self._parent.fork(name, self._exit_code)
                except TransportError as gone:
                    logger.warning("The processing lanes' parent (pid %d) is gone (%s); starting a new one.",
                                   self._parent.process.pid, gone)
                    self._parent.stop()
                    self._parent = None
                    self._parent = _Parent(self._spec_frames, name)
                    worker = self._parent.fork(name, self._exit_code)
            except TransportError as exc:
                raise LaneError(f"Processing lane {name} failed to start: {exc}") from exc
            except OSError as exc:  # no process could be started (limits, memory)
                raise LaneError(f"Could not start processing lane {index}: {exc}") from exc
        self._workers[index] = worker
        return worker

    def _exit_code(self, pid: int) -> int | None:
        with self._parent_lock:
            return None if self._parent is None else self._parent.exit_code(pid)

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
                                   index, worker.pid, worker.exit_code())
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
        with self._parent_lock:  # after the lanes: it ends when its socket closes, they with theirs
            if self._parent is not None:
                self._parent.stop()
                self._parent = None


__all__ = ["LocalProcessExecutor"]
