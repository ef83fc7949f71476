"""Issue 22, class 6: an authenticated, bounded side channel. A local process that connects to
``input.fds`` and names an engine is never handed a memfd: a connection must come from this
user (SO_PEERCRED) and present the secret P0 gave its engines (through ``addresses`` in
process, through vLLM's handshake otherwise). A live engine's connection is never replaced; a
flood of connections costs a bounded number of descriptors; running out of descriptors is a
typed resource error, never a format error."""

from __future__ import annotations

import os
import resource
import secrets
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
import torch

from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake, engine_handshake
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports import BaseTransport
from mmfront.engine.transports.fd_channel import (
    FdChannelConnection,
    FdChannelListener,
    side_marker,
    side_message,
    side_path,
)
from mmfront.engine.transports.zmq import ZmqEngineTransport, ZmqFrontendTransport, engine_identity
from mmfront.errors import ResourceError
from mmfront.wire import Frame
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.handshake import EXTRA_SIDE_CHANNEL, EngineCoreReadyResponse
from mmfront.wire.memfd import write_sealed
from mmfront.wire.messages import REQUEST, Direction, decode_message, encode_envelope
from mmfront.wire.structs import EngineCoreRequest

ENC = MsgpackEncoder()
TIMEOUT = 10.0
EMBEDS = torch.arange(512 * 1024, dtype=torch.float32).reshape(512, 1024)  # 2 MiB: on the side channel


def _send(p0: ZmqFrontendTransport, request_id: str) -> None:
    body = EngineCoreRequest(request_id, [1], None, None, None, 0.0, None, None, None, prompt_embeds=EMBEDS)
    p0.send(encode_envelope(REQUEST, ENC.encode(body)))


def _received_whole(engine: ZmqEngineTransport, request_id: str) -> None:
    frames = engine.recv(TIMEOUT)
    assert frames is not None
    request = decode_message(frames, Direction.TO_ENGINE).body
    assert request.request_id == request_id and torch.equal(request.prompt_embeds, EMBEDS)


def _got_nothing(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        _, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
    except BlockingIOError:
        return True
    for fd in fds:
        os.close(fd)
    return not fds


def _impostor(path: str, hello: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    sock.send(hello)
    return sock


@pytest.mark.parametrize("hello", [engine_identity(0), engine_identity(0) + secrets.token_bytes(16)],
                         ids=["identity-only", "forged-secret"])
def test_an_impostor_naming_engine_0_gets_no_memfd_and_displaces_nothing(hello: bytes) -> None:
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0) as engine:
        p0.wait_for_engines([0], TIMEOUT)
        _send(p0, "before")
        _received_whole(engine, "before")
        path = side_path(p0.addresses.input)
        assert path is not None
        impostor = _impostor(path, hello)
        try:
            before = p0.side_channel_messages
            for k in range(3):
                _send(p0, f"after-{k}")
                _received_whole(engine, f"after-{k}")
            assert p0.side_channel_messages == before + 3  # still the real engine's channel
            assert _got_nothing(impostor)
        finally:
            impostor.close()


def test_a_second_connection_never_replaces_a_live_one() -> None:
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0) as engine:
        p0.wait_for_engines([0], TIMEOUT)
        path = side_path(p0.addresses.input)
        assert path is not None
        _send(p0, "first")
        _received_whole(engine, "first")
        second = FdChannelConnection(path, engine_identity(0), secret=p0.addresses.side_secret)
        try:
            _send(p0, "second")
            _received_whole(engine, "second")  # the live engine keeps its channel
            assert _got_nothing(second._sock)
        finally:
            second.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_flood_of_connections_naming_unknown_engines_costs_bounded_descriptors() -> None:
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0) as engine:
        p0.wait_for_engines([0], TIMEOUT)
        path = side_path(p0.addresses.input)
        assert path is not None
        start = _open_fds()
        flood: list[socket.socket] = []
        try:
            for batch in range(6):  # each batch fits the backlog; each large request makes P0 accept it
                flood += [_impostor(path, engine_identity(1 + len(flood) + k)) for k in range(50)]
                _send(p0, f"r{batch}")
                _received_whole(engine, f"r{batch}")
            held_by_p0 = _open_fds() - start - len(flood)
            assert held_by_p0 <= 64 + 2  # at most the pending cap (it held all 300 before)
        finally:
            for sock in flood:
                sock.close()


def test_the_handshake_gives_the_engine_its_secret() -> None:
    ready = EngineCoreReadyResponse(max_model_len=64, num_gpu_blocks=8, block_size=16)
    with ZmqFrontendTransport() as p0, FrontendHandshake(p0, DataParallelConfig()) as handshake:
        engines: list[ZmqEngineTransport] = []
        side = threading.Thread(target=lambda: engines.append(engine_handshake(handshake.address, 0, ready,
                                                                               local=True)))
        side.start()
        [info] = handshake.wait(timeout=30)
        side.join()
        engine = engines[0]
        try:
            assert EXTRA_SIDE_CHANNEL in info.extras
            _send(p0, "r")
            _received_whole(engine, "r")
            assert p0.side_channel_messages == 1
        finally:
            engine.close()


@contextmanager
def _no_descriptors_left() -> Iterator[None]:
    """No new descriptor can be opened: the limit is the lowest free descriptor number."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_engine_out_of_descriptors_gets_a_resource_error(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "input.fds")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(1)
    engine = FdChannelConnection(path, engine_identity(0), secret=b"\x01" * 16)
    conn, _ = listener.accept()
    try:
        fd = write_sealed([memoryview(b"abc")])
        socket.send_fds(conn, [side_message(1, [(2, 3)])], [fd])
        os.close(fd)
        frames = [b"\x00", b"body", b"", b""]
        with _no_descriptors_left(), pytest.raises(ResourceError, match="file descriptors"):
            engine.restore([*frames[:4], side_marker(1)])
    finally:
        engine.close()
        conn.close()
        listener.close()


def test_p0_out_of_descriptors_sends_plain_frames(tmp_path: os.PathLike[str]) -> None:
    listener = FdChannelListener(os.path.join(tmp_path, "input.fds"), 1)
    try:
        engine = FdChannelConnection(os.path.join(tmp_path, "input.fds"), engine_identity(0), secret=listener.secret)
        frames = [b"\x00", b"body", b"x" * 64, b""]
        assert listener.offload(engine_identity(0), frames)[-1] != frames[-1]  # the channel works
        with _no_descriptors_left():
            assert listener.offload(engine_identity(0), frames) == frames  # no memfd: plain frames
        engine.close()
    finally:
        listener.close()


class _OutOfDescriptors(BaseTransport):
    """An engine's link whose next message could not be received for want of descriptors."""

    def __init__(self) -> None:
        self.calls = 0
        self.sent: list[list[Frame]] = []

    def send(self, frames: Sequence[Frame]) -> None:
        self.sent.append(list(frames))

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        self.calls += 1
        if self.calls == 1:
            raise ResourceError("injected: out of file descriptors")
        if self.calls == 2:
            return encode_envelope(REQUEST, ENC.encode(EngineCoreRequest("next", [1], None, None, None, 0.0, None,
                                                                         None, None)))
        return None

    def close(self) -> None:
        pass


def test_the_engine_loop_refuses_a_message_it_had_no_descriptor_for_and_goes_on() -> None:
    link = _OutOfDescriptors()
    with EngineCoreReceiver(link, None, heartbeat_s=60) as receiver:
        assert [r.request_id for r in receiver.poll(timeout=5)] == ["next"]
    replies = [decode_message(f, Direction.TO_FRONTEND).body for f in link.sent]
    failures = [r.utility_output.failure_message for r in replies if getattr(r, "utility_output", None)]
    assert failures == ["ResourceError: injected: out of file descriptors"]
