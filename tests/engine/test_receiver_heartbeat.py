"""The receiver's heartbeat thread and its frontends' broken links, with no model and no sockets.

Heartbeats come from a thread the receiver owns, so they keep coming while the engine loop is in
a long step (it calls nothing); they share each transport's sending side with the loop under a
lock, stop on ``close`` and never keep a receiver or a process alive. A frontend whose link
breaks (a send raises ``TransportError``, a pipe is closed) is dropped with its requests, and the
others are served on.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import threading
import time
from collections import deque
from collections.abc import Sequence

import pytest

from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports import BaseTransport, PipeTransport
from mmfront.errors import ConfigError, TransportError
from mmfront.wire import Frame
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.messages import ENGINE_HELLO, ENGINE_OUTPUTS, REQUEST, Direction, decode_message, encode_envelope
from mmfront.wire.structs import EngineCoreOutput, EngineCoreRequest, FinishReason

ENC = MsgpackEncoder()


def request_envelope(request_id: str) -> list[Frame]:
    return encode_envelope(REQUEST, ENC.encode(EngineCoreRequest(request_id, [1, 2, 3], [], None, None, 0.0, None,
                                                                 None, None)))


class Frontend(BaseTransport):
    """One frontend's link as the engine sees it: what arrives is queued by the test, what is
    sent is recorded. Once ``gone``, sends raise as a vanished peer's do; a send that starts
    while another is under way is counted in ``overlaps``."""

    def __init__(self, *arrivals: list[Frame]) -> None:
        self.inbox = deque(arrivals)
        self.sent: list[list[Frame]] = []
        self.gone = False
        self.closed = False
        self.overlaps = 0
        self._sending = False

    def send(self, frames: Sequence[Frame]) -> None:
        if self.gone:
            raise TransportError("injected: the frontend is gone")
        if self._sending:
            self.overlaps += 1
        self._sending = True
        time.sleep(0.0002)  # widens the window two unserialised senders would meet in
        self.sent.append(list(frames))
        self._sending = False

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        return self.inbox.popleft() if self.inbox else None

    def close(self) -> None:
        self.closed = True

    def kinds(self) -> list[bytes]:
        return [decode_message(frames, Direction.TO_FRONTEND).kind for frames in list(self.sent)]

    def hellos(self) -> int:
        return self.kinds().count(ENGINE_HELLO)

    def outputs(self) -> list[str]:
        return [o.request_id for frames in list(self.sent)
                if (m := decode_message(frames, Direction.TO_FRONTEND)).kind == ENGINE_OUTPUTS
                for o in m.body.outputs]


def heartbeat_threads(engine_index: int) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"mmfront-heartbeat-{engine_index}"]


def test_heartbeats_keep_coming_while_the_loop_calls_nothing() -> None:
    frontend = Frontend()
    receiver = EngineCoreReceiver(frontend, heartbeat_s=0.05, engine_index=11)
    [thread] = heartbeat_threads(11)
    assert thread.daemon  # it never keeps the process alive
    time.sleep(0.6)  # the engine loop is in a long step: no poll, no send
    assert frontend.hellos() >= 5
    receiver.close()
    assert not thread.is_alive() and frontend.closed
    stopped = frontend.hellos()
    time.sleep(0.2)
    assert frontend.hellos() == stopped


def test_a_receiver_nobody_closed_takes_its_heartbeat_thread_along() -> None:
    frontend = Frontend()
    receiver = EngineCoreReceiver(frontend, heartbeat_s=0.02, engine_index=12)
    [thread] = heartbeat_threads(12)
    del receiver
    gc.collect()
    thread.join(2)
    assert not thread.is_alive()


def test_heartbeat_s_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="heartbeat_s must be positive"):
        EngineCoreReceiver(Frontend(), heartbeat_s=0)


def test_the_loop_and_the_heartbeat_thread_never_send_at_once() -> None:
    frontend = Frontend(request_envelope("r"))
    sends = 0
    with EngineCoreReceiver(frontend, heartbeat_s=0.001) as receiver:
        assert [r.request_id for r in receiver.poll()] == ["r"]
        # Sends go on until the heartbeat thread has met them 20 times, however slowly a loaded
        # machine schedules it; the deadline only stops a heartbeat thread that never runs.
        before, deadline = frontend.hellos(), time.monotonic() + 30
        while sends < 300 or (frontend.hellos() - before < 25 and time.monotonic() < deadline):
            receiver.send([EngineCoreOutput("r", [7])])
            sends += 1
    assert frontend.outputs() == ["r"] * sends
    kinds = frontend.kinds()
    first, last = kinds.index(ENGINE_OUTPUTS), len(kinds) - 1 - kinds[::-1].index(ENGINE_OUTPUTS)
    assert kinds[first:last].count(ENGINE_HELLO) >= 20  # they met while the loop was sending
    assert frontend.overlaps == 0


def test_a_failed_heartbeat_is_logged_once_and_costs_only_its_frontend(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mmfront.engine.receiver")
    a, b = Frontend(request_envelope("a1")), Frontend(request_envelope("b1"))
    with EngineCoreReceiver(a, heartbeat_s=0.02) as receiver:
        assert receiver.add_frontend(b) == 1
        assert sorted(r.request_id for r in receiver.poll()) == ["a1", "b1"]
        b.gone = True
        before = a.hellos()
        time.sleep(0.3)  # a long step: heartbeats to b fail meanwhile, to a they go on
        assert a.hellos() > before
        a.inbox.append(request_envelope("a2"))
        assert [r.request_id for r in receiver.poll()] == ["a2"]
        assert receiver.take_aborted() == ["b1"]  # the engine stops generating for the frontend that left
        receiver.send([EngineCoreOutput("a1", [1], finish_reason=FinishReason.LENGTH),
                       EngineCoreOutput("b1", [1], finish_reason=FinishReason.LENGTH)])
        assert a.outputs() == ["a1"] and b.outputs() == []
        assert receiver.frontends_served == 1 and b.closed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "the link to frontend 1 broke (injected: the frontend is gone); dropped it and its 1 requests" in warnings[0]


def test_a_send_that_fails_drops_only_that_frontend() -> None:
    a, b = Frontend(request_envelope("a1")), Frontend(request_envelope("b1"), request_envelope("b2"))
    with EngineCoreReceiver(a) as receiver:
        receiver.add_frontend(b)
        assert sorted(r.request_id for r in receiver.poll()) == ["a1", "b1", "b2"]
        b.gone = True
        receiver.send([EngineCoreOutput("a1", [1]), EngineCoreOutput("b1", [1]), EngineCoreOutput("b2", [1])])
        assert a.outputs() == ["a1"]
        assert sorted(receiver.take_aborted()) == ["b1", "b2"] and receiver.frontends_served == 1
        a.inbox.append(request_envelope("a2"))
        assert [r.request_id for r in receiver.poll()] == ["a2"]
        receiver.send([EngineCoreOutput("a2", [2]), EngineCoreOutput("b1", [2])])
        assert a.outputs() == ["a1", "a2"]


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_frontend_that_closes_its_pipe_is_dropped(frontends: int) -> None:
    ends = [multiprocessing.Pipe() for _ in range(frontends)]
    p0 = [PipeTransport(p0_end) for p0_end, _ in ends]
    receiver = EngineCoreReceiver(PipeTransport(ends[0][1]), heartbeat_s=0.05)
    for _, p1_end in ends[1:]:
        receiver.add_frontend(PipeTransport(p1_end))
    with receiver:
        for index, transport in enumerate(p0):
            transport.send(request_envelope(f"r{index}"))
        deadline = time.monotonic() + 5
        admitted: list[str] = []
        while len(admitted) < frontends and time.monotonic() < deadline:
            admitted += [r.request_id for r in receiver.poll(0.1)]
        assert sorted(admitted) == [f"r{i}" for i in range(frontends)]
        p0[-1].close()  # the last frontend's process went away
        assert receiver.poll(0.3) == []  # no EOFError: the engine loop goes on
        assert receiver.take_aborted() == [f"r{frontends - 1}"]
        assert receiver.frontends_served == frontends - 1
        if frontends == 2:
            receiver.send([EngineCoreOutput("r0", [5], finish_reason=FinishReason.LENGTH)])
            kinds = []
            while (frames := p0[0].recv(0.5)) is not None:
                message = decode_message(frames, Direction.TO_FRONTEND)
                kinds.append(message.kind)
                if message.kind == ENGINE_OUTPUTS:
                    assert [o.request_id for o in message.body.outputs] == ["r0"]
                    break
            assert ENGINE_OUTPUTS in kinds
    for transport in p0:
        transport.close()
