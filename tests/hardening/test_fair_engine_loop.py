"""Issue 22, class 5: a fair engine loop. The receiver serves its frontends in turn, each with a
budget of messages per round, so one frontend's flood of garbage cannot hold back another's
requests; and a side-channel marker whose datagram has not come yet waits on its own frontend
only: the loop serves the others meanwhile, and refuses the marker once its time is up."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest
import torch

from local_services import Inbox
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports import BaseTransport, fd_channel
from mmfront.engine.transports.zmq import ZmqEngineTransport, ZmqFrontendTransport
from mmfront.wire import Frame
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.messages import ENGINE_OUTPUTS, REQUEST, Direction, decode_message, encode_envelope
from mmfront.wire.structs import EngineCoreRequest

ENC = MsgpackEncoder()
TIMEOUT = 30.0


def request(request_id: str, embeds: torch.Tensor | None = None) -> list[Frame]:
    body = EngineCoreRequest(request_id, [1, 2, 3], None, None, None, 0.0, None, None, None, prompt_embeds=embeds)
    return encode_envelope(REQUEST, ENC.encode(body))


class Flood(BaseTransport):
    """A frontend that sends garbage as fast as the engine reads it (``limit`` messages, so a
    loop that drains it first still ends)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.received = 0
        self.refusals = 0

    def send(self, frames: Sequence[Frame]) -> None:
        self.refusals += 1

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        if self.received >= self.limit:
            return None
        self.received += 1
        return [b"?", b"", b"garbage"]

    def close(self) -> None:
        pass


def test_a_flooding_frontend_does_not_hold_back_another_frontends_request() -> None:
    flood = Flood(limit=20_000)
    honest = Inbox(request("honest"))
    with EngineCoreReceiver(flood, None, heartbeat_s=60) as receiver:
        receiver.add_frontend(honest, None)
        ready = receiver.poll(timeout=TIMEOUT)
        assert [r.request_id for r in ready] == ["honest"]
        assert flood.received <= 2 * receiver.round_budget  # the flood got its turn, no more
        assert flood.refusals == 1 + flood.received  # its hello, then a refusal per garbage message
        while flood.received < flood.limit:
            assert receiver.poll(timeout=0) == []
        assert flood.refusals == 1 + flood.limit


@pytest.fixture
def links() -> Iterator[tuple[ZmqFrontendTransport, ZmqEngineTransport]]:
    p0 = ZmqFrontendTransport(side_channel_min_bytes=1024)
    engine = ZmqEngineTransport(p0.addresses, 0)
    try:
        p0.wait_for_engines([0], TIMEOUT)
        assert engine.side_channel
        yield p0, engine
    finally:
        engine.close()
        p0.close()


def _refusals(p0: ZmqFrontendTransport) -> list[str]:
    """The failure messages P0 has received so far."""
    out: list[str] = []
    while (frames := p0.recv(0)) is not None:
        message = decode_message(frames, Direction.TO_FRONTEND)
        if message.kind == ENGINE_OUTPUTS and message.body.utility_output is not None:
            out.append(message.body.utility_output.failure_message)
    return out


def test_a_marker_without_its_datagram_stalls_only_its_own_frontend(
        links: tuple[ZmqFrontendTransport, ZmqEngineTransport], monkeypatch: pytest.MonkeyPatch) -> None:
    p0, engine = links
    embeds = torch.ones(64, 64)  # 16 KiB: goes on the side channel
    with monkeypatch.context() as lost:
        lost.setattr(fd_channel.socket, "send_fds", lambda *args: None)  # the datagrams never come
        for k in range(3):
            p0.send(request(f"lost-{k}", embeds))
    assert p0.side_channel_messages == 3
    time.sleep(0.3)  # the three markers are at the engine
    honest = Inbox(request("honest"))
    with EngineCoreReceiver(engine, None, heartbeat_s=60) as receiver:
        receiver.add_frontend(honest, None)
        start = time.monotonic()
        ready = receiver.poll(timeout=TIMEOUT)
        assert [r.request_id for r in ready] == ["honest"]
        assert time.monotonic() - start < 0.25  # not 0.5 s per lost datagram
        refused: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while len(refused) < 3 and time.monotonic() < deadline:
            assert receiver.poll(timeout=0.05) == []
            refused += _refusals(p0)
        assert len(refused) == 3 and all("never came" in m for m in refused)
        p0.send(request("after", embeds))  # the channel and the frontend still work
        later = receiver.poll(timeout=TIMEOUT)
        assert [r.request_id for r in later] == ["after"] and torch.equal(later[0].prompt_embeds, embeds)
