"""Issue 36, Build 6: no peer can hold the engine loop by not reading what the engine sends.

A rogue frontend sent 100,000 garbage messages and never read the refusals (its sockets with
``hwm=1000``, as a careful P0 sets them): after ~2,500 refusals the engine loop blocked in the ZMQ
send of a refusal, a legit request 3 s later failed with ``EngineDeadError`` and stopping the
engine gave up after 5 s. The engine now never sends waiting for room: refusals past a full queue
are dropped and counted; a frontend whose outputs cannot be queued is dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports import ZmqEngineTransport, ZmqFrontendTransport
from mmfront.engine.transports.zmq import DEFAULT_OUTPUT_HWM
from mmfront.errors import ConfigError, TransportError
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.messages import ENGINE_OUTPUTS, REQUEST, encode_envelope
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason

ENC = MsgpackEncoder()
OUTPUTS = MsgpackDecoder(EngineCoreOutputs)
GARBAGE = [REQUEST, b"", b"\xc1 not msgpack"]
ROGUE_HWM = 1000
"""The rogue's queues, as in the attack: small, so the engine's queue to it fills fast."""


def request(request_id: str) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], None, None, None, 0.0, None, None, None)


class Engine:
    """An engine loop on a thread: every request it admits finishes at once with one token."""

    def __init__(self, receiver: EngineCoreReceiver) -> None:
        self.receiver = receiver
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="test-engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            ready = self.receiver.poll(0.01)
            self.receiver.take_aborted()
            if ready:
                self.receiver.send([EngineCoreOutput(r.request_id, [7], finish_reason=FinishReason.LENGTH)
                                    for r in ready])

    def stopped_within(self, seconds: float) -> bool:
        self.stop.set()
        self.thread.join(seconds)
        return not self.thread.is_alive()


@contextmanager
def engine_with(*frontends: ZmqFrontendTransport, hwm: int = 0, output_hwm: int | None = None) -> Iterator[Engine]:
    links = [ZmqEngineTransport(f.addresses, 0, side_channel=False, hwm=hwm, output_hwm=output_hwm)
             for f in frontends]
    for frontend in frontends:
        frontend.wait_for_engines([0], 10.0)
    receiver = EngineCoreReceiver(links[0])
    for link in links[1:]:
        receiver.add_frontend(link)
    engine = Engine(receiver)
    try:
        yield engine
    finally:
        if engine.stopped_within(10.0):  # else it is stuck in a send: leave it (a daemon) and fail
            receiver.close()


def answered_within(client: ZmqFrontendTransport, request_id: str, seconds: float) -> bool:
    """Send ``request_id`` and read until its output comes (heartbeats and admissions pass by)."""
    client.send(encode_envelope(REQUEST, ENC.encode(request(request_id))))
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        frames = client.recv(left)
        if frames is None or bytes(frames[0]) != ENGINE_OUTPUTS:
            continue
        outputs = OUTPUTS.decode(frames[2:]).outputs
        if any(o.request_id == request_id and o.new_token_ids == [7] for o in outputs):
            return True
    return False


def flood(rogue: ZmqFrontendTransport, messages: int) -> int:
    """Send garbage as fast as the engine takes it; the rogue never reads. Messages sent."""
    sent = 0
    for _ in range(messages):
        try:
            rogue.send(GARBAGE)
            sent += 1
        except TransportError:
            time.sleep(0.001)  # the engine's input queue is full for a moment: it reads on
    return sent


@pytest.mark.parametrize(("hwm", "output_bound"), [(0, DEFAULT_OUTPUT_HWM), (1000, 1000)],
                         ids=["default", "the-attacks-hwm"])
def test_a_rogue_that_floods_and_never_reads_cannot_stop_the_engine(hwm: int, output_bound: int) -> None:
    rogue, client = ZmqFrontendTransport(hwm=ROGUE_HWM, send_timeout_s=1.0), ZmqFrontendTransport()
    with rogue, client, engine_with(client, rogue, hwm=hwm) as engine:
        assert answered_within(client, "before", 10.0)
        messages = 3 * (output_bound + 2 * ROGUE_HWM)  # the engine's queue to it fills three times over
        flooder = threading.Thread(target=flood, args=(rogue, messages), daemon=True)
        flooder.start()
        answered = [answered_within(client, f"during-{k}", 10.0) for k in range(5)]
        flooder.join(60.0)
        assert not flooder.is_alive()
        deadline = time.monotonic() + 30.0
        while engine.receiver.decode_errors < messages and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answered == [True] * 5
        assert answered_within(client, "after", 10.0)
        refused = engine.receiver.decode_errors
        assert refused == messages
        dropped = engine.receiver.messages_dropped
        # what did not fit the engine's queue (and the rogue's) was dropped, never waited for
        assert messages - dropped <= output_bound + 3 * ROGUE_HWM
        assert engine.receiver.frontends_served == 2  # dropping refusals costs the rogue nothing more
        assert engine.stopped_within(2.0)


def test_a_rogue_whose_outputs_cannot_be_queued_is_dropped_and_the_others_served() -> None:
    requests = 20_000  # far more admissions than the queues and the socket buffers hold
    rogue, client = ZmqFrontendTransport(hwm=ROGUE_HWM, send_timeout_s=1.0), ZmqFrontendTransport()
    with rogue, client, engine_with(client, rogue, output_hwm=100) as engine:
        for k in range(requests):  # valid requests; admissions and outputs pile up unread
            try:
                rogue.send(encode_envelope(REQUEST, ENC.encode(request(f"rogue-{k}"))))
            except TransportError:  # the engine dropped it already
                break
        deadline = time.monotonic() + 30.0
        while engine.receiver.frontends_served == 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.receiver.frontends_served == 1
        assert answered_within(client, "legit", 10.0)
        assert engine.stopped_within(2.0)


@pytest.mark.parametrize("output_hwm", [0, -1])
def test_output_hwm_must_be_positive(output_hwm: int) -> None:
    p0 = ZmqFrontendTransport()
    with p0, pytest.raises(ConfigError, match="output_hwm must be a positive number"):
        ZmqEngineTransport(p0.addresses, 0, output_hwm=output_hwm)
