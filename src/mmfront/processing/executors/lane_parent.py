"""The lane parent: one process per :class:`~mmfront.processing.executors.LocalProcessExecutor`
that imports torch and transformers and builds the processor once, then forks every lane from
itself.

A fresh interpreter spends ~4.4 s of CPU importing torch and transformers and building an HF
processor (docs/testing.md); a fork of one that already did costs a few milliseconds. So the
second lane of an executor, and every lane that replaces a dead one, is ready at once, and the
lanes share the built processor's pages copy-on-write (``gc.freeze`` keeps the lanes' collector
off the parent's objects).

Forking is only safe from a process that runs one thread: a child inherits every lock, but only
the thread that forked. The parent is a fresh ``python -c`` interpreter started for this (never
the caller, which runs threads), runs no jobs, sets torch to one thread before it builds (no
intra-op pool is started), and is started with :data:`PARENT_ENV`. Before each fork it counts
its threads (``/proc/self/task``) and refuses the fork, typed, when something left one running.

The executor talks to it over a socket pair: the spec, answered with an empty
:class:`~mmfront.processing.executors.jobs.LaneReply` once the processor is built (or the build's
failure); then :class:`LaneRequest` messages, one at a time, each answered with a
:class:`LaneGiven`. A new lane comes as its pid with two descriptors sent alongside: the caller's
end of the lane's own socket pair and a pidfd of the lane (so the caller can watch and kill it
without racing the reuse of its pid). The parent reaps its lanes and answers how one ended (the
code a dead lane's ``LaneError`` names). It ends when the executor closes its end; a lane ends
when the caller closes the lane's socket, so neither outlives a killed caller.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import traceback
from multiprocessing.connection import Connection

import msgspec

from mmfront.errors import TransportError
from mmfront.process_end import end_the_process
from mmfront.processing.executors.jobs import LaneFailure, LaneReply, LaneRunner, LaneSpec
from mmfront.wire import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.pipe import recv_frames, send_frames
from mmfront.wire.shared_buffer import InBuffer, OutBuffer, send_replies_through

PARENT_ENV = {"OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""What the parent's environment sets so that it runs one thread: importing numpy starts OpenBLAS's
pool (one thread per core but one), and building the Qwen2.5-VL fixture's processor started two
tokenizers (Rust) threads; with these, the parent of every fixture family runs one. A lane is one
runnable thread of the thread budget anyway (docs/processing.md, "Thread budget")."""
EXIT_WAIT_S = 5.0
"""How long the parent waits for a lane whose socket closed to finish exiting, to name its code."""


class LaneRequest(msgspec.Struct):
    """A new lane (``exit_of`` ``None``), or how lane ``exit_of`` ended."""

    exit_of: int | None = None


class LaneGiven(msgspec.Struct):
    """The answer: the new lane's ``pid`` (its socket and pidfd are sent with the message), or the
    ``failure`` that kept it from starting; or the ``code`` lane ``exit_of`` ended with, as
    ``Popen.returncode`` gives it (``None``: unknown, it had not exited)."""

    pid: int | None = None
    failure: str | None = None
    code: int | None = None


def parent_main(fd: int) -> None:
    """The lane parent (``python -c``, started by the executor with its end of a socket pair as
    ``fd``): build the processor from the spec it is sent, then fork lanes until the executor
    closes its end, and end the process there."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the caller, which closes the lanes
    conn = Connection(fd)
    encoder = MsgpackEncoder()
    try:
        spec: LaneSpec = MsgpackDecoder(LaneSpec).decode(recv_frames(conn) or [b""])
        sys.path.extend(p for p in spec.sys_path if p not in sys.path)  # where the caller imports its classes from
        lane = LaneRunner(spec)
    except Exception as exc:  # the caller gets the reason instead of a dead pipe
        send_frames(conn, encoder.encode(LaneReply(failure=LaneFailure.of(exc))))
        end_the_process(1)
    gc.freeze()  # what the build made is the lanes' shared pages: their collector leaves it alone
    send_frames(conn, encoder.encode(LaneReply()))
    _Forks(conn, lane).serve()
    # nothing is left to release (end_the_process: the teardown of an interpreter holding the
    # processor's modules took 2-5 s of every server stop)
    end_the_process(0)


class _Forks:
    """The parent's loop: requests from the executor in, lanes and their exit codes out."""

    def __init__(self, conn: Connection, lane: LaneRunner) -> None:
        self.conn = conn
        self.lane = lane
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(LaneRequest)
        self.running: dict[int, int] = {}  # pidfd -> pid of each lane not reaped yet
        self.ended: dict[int, int] = {}  # pid -> code of each reaped lane whose code was not asked for
        self.poller = select.poll()
        self.poller.register(conn.fileno(), select.POLLIN)

    def serve(self) -> None:
        while True:
            for fd, _ in self.poller.poll():
                if fd != self.conn.fileno():
                    if fd in self.running:  # not when a request before it in this batch reaped it
                        self._reap(fd)
                    continue
                try:
                    self._answer_one()
                except (EOFError, OSError, TransportError):  # the executor closed (or died): the lanes end with their sockets
                    return

    def _answer_one(self) -> None:
        frames = recv_frames(self.conn)
        assert frames is not None
        request: LaneRequest = self.decoder.decode(frames)
        if request.exit_of is None:
            self._fork()
        else:
            send_frames(self.conn, self.encoder.encode(LaneGiven(code=self._code(request.exit_of))))

    def _reap(self, pidfd: int) -> None:
        """Reap the lane of ``pidfd`` if it has exited (an event may be stale: its number reused)."""
        pid = self.running[pidfd]
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            return
        del self.running[pidfd]
        self.poller.unregister(pidfd)
        os.close(pidfd)
        self.ended[pid] = os.waitstatus_to_exitcode(status)

    def _code(self, pid: int) -> int | None:
        pidfd = next((fd for fd, p in self.running.items() if p == pid), None)
        if pidfd is not None:
            exited = select.poll()
            exited.register(pidfd, select.POLLIN)
            if exited.poll(EXIT_WAIT_S * 1000):
                self._reap(pidfd)
        return self.ended.pop(pid, None)

    def _fork(self) -> None:
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            self._refuse(f"the lane parent runs {threads} threads (a forked lane would inherit their locks, not "
                         "them); the processor's build started them")
            return
        ours, theirs = socket.socketpair()
        sys.stdout.flush()  # what is buffered would be written twice
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:  # no process could be started (limits, memory)
            ours.close()
            theirs.close()
            self._refuse(str(exc))
            return
        if pid == 0:
            self._become_lane(ours, theirs)
        theirs.close()
        with ours:
            pidfd = os.pidfd_open(pid)
            self.running[pidfd] = pid
            self.poller.register(pidfd, select.POLLIN)
            self._answer(LaneGiven(pid=pid), [ours.fileno(), pidfd])

    def _become_lane(self, ours: socket.socket, theirs: socket.socket) -> None:
        """The forked child: drop what is the parent's, serve jobs, end (never back in the loop)."""
        try:
            ours.close()
            for fd in (self.conn.fileno(), *self.running):  # the lane holds nothing of the parent's
                os.close(fd)
            serve_lane(Connection(theirs.detach()), self.lane)
        except BaseException:
            traceback.print_exc()
            end_the_process(1)
        end_the_process(0)

    def _refuse(self, reason: str) -> None:
        self._answer(LaneGiven(failure=reason), [])

    def _answer(self, given: LaneGiven, fds: list[int]) -> None:
        """A one-byte message carrying ``fds`` (none for a refusal), then ``given``."""
        with socket.fromfd(self.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            socket.send_fds(sock, [b"L"], fds)
        send_frames(self.conn, self.encoder.encode(given))


def serve_lane(conn: Connection, lane: LaneRunner) -> None:
    """A lane: answer the jobs that come over ``conn`` until the caller closes its end."""
    jobs, replies = InBuffer(), OutBuffer()  # jobs and replies travel in shared buffers, see mmfront.wire.pipe
    send_replies_through(replies)  # large outputs (patch rows) are made in the reply's buffer: no copy at the send
    while True:
        try:
            frames = recv_frames(conn, into=jobs)
        except (EOFError, TransportError):
            return
        if frames is not None:
            send_frames(conn, lane.run(frames), out=replies)


__all__ = ["EXIT_WAIT_S", "PARENT_ENV", "LaneGiven", "LaneRequest", "parent_main", "serve_lane"]
