"""The ZMQ transports' ``ipc://`` side channel: large request frames in a sealed memfd, the ZMQ
message carrying only their empty places and a marker; plain frames for anyone who did not
open the channel; hostile peers on the channel never break service."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import zmq
from hypothesis import given
from hypothesis import strategies as st
from tests.engine.transports.test_zmq import image_request

from mmfront.engine.transports.fd_channel import (
    SIDE_MAGIC,
    FdChannelConnection,
    parse_side_message,
    side_marker,
    side_message,
    side_path,
    split_side_marker,
)
from mmfront.engine.transports.zmq import (
    SIDE_CHANNEL_MIN_BYTES,
    ZmqEngineTransport,
    ZmqFrontendTransport,
    engine_identity,
)
from mmfront.errors import DecodeError
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.memfd import write_sealed
from mmfront.wire.messages import REQUEST, Direction, MirrorStamp, decode_message, encode_envelope
from mmfront.wire.structs import EngineCoreRequest

ENCODER = MsgpackEncoder()
DECODE = MsgpackDecoder(EngineCoreRequest).decode
TIMEOUT = 10.0
SECRET = b"\x07" * 16
BIG = (2, 3, 256, 256)  # 1.5 MiB of float32: above SIDE_CHANNEL_MIN_BYTES
SMALL = (1, 3, 64, 64)


def _pixels(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def _send(p0: ZmqFrontendTransport, request_id: str, pixels: torch.Tensor, stamp: MirrorStamp | None = None) -> None:
    p0.send(encode_envelope(REQUEST, ENCODER.encode(image_request(request_id, pixels)), stamp))


def _received(p1: ZmqEngineTransport) -> tuple[EngineCoreRequest, list[memoryview]]:
    frames = p1.recv(TIMEOUT)
    assert frames is not None
    return decode_message(frames, Direction.TO_ENGINE).body, [memoryview(f) for f in frames[2:]]


def _pixels_of(request: EngineCoreRequest) -> torch.Tensor:
    features = request.mm_features
    assert features is not None and features[0].data is not None
    data = features[0].data["pixel_values"].data
    assert isinstance(data, torch.Tensor)
    return data


def test_large_frames_arrive_mapped_from_a_sealed_memfd() -> None:
    assert torch.empty(BIG).nbytes >= SIDE_CHANNEL_MIN_BYTES > torch.empty(SMALL).nbytes
    with ZmqFrontendTransport() as p0, ZmqEngineTransport(p0.addresses, 0) as p1:
        p0.wait_for_engines([0], TIMEOUT)
        big, small = _pixels(BIG, 1), _pixels(SMALL, 2)
        stamp = MirrorStamp(1, 4, b"\x05" * 16, ("gone",))
        _send(p0, "big", big, stamp)
        _send(p0, "small", small)
        request, [_, aux] = _received(p1)
        assert request.request_id == "big" and torch.equal(_pixels_of(request), big)
        assert aux.nbytes == big.nbytes and _in_memfd(aux)
        request, [_, aux] = _received(p1)
        assert request.request_id == "small" and torch.equal(_pixels_of(request), small)
        assert not _in_memfd(aux)  # below the threshold: the ZMQ frame itself


def _in_memfd(view: memoryview) -> bool:
    """Whether ``view`` lies in a mapping of one of the side channel's memfds (``/proc/self/maps``)."""
    address = np.frombuffer(view, np.uint8).ctypes.data
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return len(fields) > 5 and fields[5] == "/memfd:mmfront-frames"
    return False


@contextmanager
def _stock_dealer(p0: ZmqFrontendTransport) -> Iterator[zmq.Socket]:
    """Engine 0's DEALER alone, as vLLM's engine core connects it (no side channel)."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.IDENTITY, engine_identity(0))
        dealer.connect(p0.addresses.input)
        dealer.send(b"")
        p0.wait_for_engines([0], TIMEOUT)
        yield dealer
    finally:
        dealer.close(linger=0)


def _recv_raw(dealer: zmq.Socket) -> list[bytes]:
    assert dealer.poll(int(TIMEOUT * 1000))
    return dealer.recv_multipart()


def test_the_stamp_and_the_zmq_frames_with_the_channel() -> None:
    """What crosses ZMQ: the large frame left empty, the stamp, then the 12-byte marker."""
    with ZmqFrontendTransport() as p0:
        path = side_path(p0.addresses.input)
        assert path is not None
        side = FdChannelConnection(path, engine_identity(0), secret=p0.addresses.side_secret)
        try:
            with _stock_dealer(p0) as dealer:
                stamp = MirrorStamp(1, 4, b"\x05" * 16)
                _send(p0, "r", _pixels(BIG), stamp)
                frames = _recv_raw(dealer)
            stamp_bytes = bytes(encode_envelope(REQUEST, ENCODER.encode(None), stamp)[1])
            assert [len(f) for f in frames[2:]] == [0, len(stamp_bytes), 12] and frames[-1][:4] == SIDE_MAGIC
            restored = side.restore(frames)
            assert memoryview(restored[2]).nbytes == torch.empty(BIG).nbytes
            message = decode_message([REQUEST, restored[-1], restored[1], *restored[2:-1]], Direction.TO_ENGINE)
            assert message.stamp == stamp and torch.equal(_pixels_of(message.body), _pixels(BIG))
        finally:
            side.close()


def test_a_stock_engine_without_the_channel_gets_plain_frames() -> None:
    """A DEALER alone (vLLM's engine core) never sees a marker or an emptied frame."""
    with ZmqFrontendTransport() as p0, _stock_dealer(p0) as dealer:
        _send(p0, "r", _pixels(BIG))
        frames = _recv_raw(dealer)
    assert [len(f) for f in frames] == [1, len(frames[1]), torch.empty(BIG).nbytes, 0]
    assert torch.equal(_pixels_of(DECODE([bytearray(f) for f in frames[1:-1]])), _pixels(BIG))


@pytest.mark.parametrize("where", ["p0", "engine", "tcp"])
def test_the_channel_can_be_turned_off(where: str) -> None:
    p0 = ZmqFrontendTransport("tcp" if where == "tcp" else "ipc",
                              side_channel_min_bytes=None if where == "p0" else SIDE_CHANNEL_MIN_BYTES)
    p1 = ZmqEngineTransport(p0.addresses, 0, side_channel=where != "engine")
    try:
        p0.wait_for_engines([0], TIMEOUT)
        _send(p0, "r", _pixels(BIG))
        request, [_, aux] = _received(p1)
        assert torch.equal(_pixels_of(request), _pixels(BIG)) and not _in_memfd(aux)
    finally:
        p1.close()
        p0.close()


def test_a_restarted_engine_takes_the_channel_over() -> None:
    with ZmqFrontendTransport() as p0:
        first = ZmqEngineTransport(p0.addresses, 0)
        p0.wait_for_engines([0], TIMEOUT)
        _send(p0, "before", _pixels(BIG, 1))
        assert _received(first)[0].request_id == "before"
        first.close()
        with ZmqEngineTransport(p0.addresses, 0) as second:
            # The restarted engine's hello says its connection is up; sending before it races.
            assert p0.recv_first(TIMEOUT) == (0, b"")
            for k in range(3):
                _send(p0, f"after-{k}", _pixels(BIG, k))
                request, [_, aux] = _received(second)
                assert request.request_id == f"after-{k}" and torch.equal(_pixels_of(request), _pixels(BIG, k))
                assert _in_memfd(aux)


def test_hostile_connections_on_the_channel_do_not_stop_service() -> None:
    """Peers that never say who they are, say it wrong, or claim engine 0 and vanish: engine 0's
    requests still arrive whole, on the channel once engine 0 connects last."""
    with ZmqFrontendTransport() as p0:
        path = side_path(p0.addresses.input)
        assert path is not None
        silent = [socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(40)]
        for sock in silent:
            sock.connect(path)
        wrong = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        wrong.connect(path)
        wrong.send(b"\x00\x00\x00")
        impostor = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        impostor.connect(path)
        impostor.send(engine_identity(0))
        impostor.close()
        try:
            with ZmqEngineTransport(p0.addresses, 0) as p1:
                p0.wait_for_engines([0], TIMEOUT)
                for k in range(3):
                    _send(p0, f"r{k}", _pixels(BIG, k))
                    request, [_, aux] = _received(p1)
                    assert torch.equal(_pixels_of(request), _pixels(BIG, k)) and _in_memfd(aux)
        finally:
            for sock in [*silent, wrong]:
                sock.close()


def test_a_full_backlog_leaves_the_engine_on_plain_frames() -> None:
    """Connections nobody accepts fill the channel's backlog: the engine does not wait on it."""
    with ZmqFrontendTransport() as p0:
        path = side_path(p0.addresses.input)
        assert path is not None
        flood = []
        try:
            while len(flood) < 1000:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                sock.setblocking(False)
                flood.append(sock)
                try:
                    sock.connect(path)
                except BlockingIOError:
                    break
            with ZmqEngineTransport(p0.addresses, 0) as p1:
                p0.wait_for_engines([0], TIMEOUT)
                _send(p0, "r", _pixels(BIG))
                request, [_, aux] = _received(p1)
                assert torch.equal(_pixels_of(request), _pixels(BIG)) and not _in_memfd(aux)
        finally:
            for sock in flood:
                sock.close()


class _FakeP0:
    """P0's listening end driven by hand, to send the engine what P0 never would."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(1)

    def accept(self) -> socket.socket:
        conn, _ = self.listener.accept()
        assert conn.recv(64) == engine_identity(0) + SECRET
        return conn


@pytest.fixture
def fake_p0(tmp_path: os.PathLike[str]) -> Iterator[tuple[socket.socket, FdChannelConnection]]:
    path = os.path.join(tmp_path, "input.fds")
    fake = _FakeP0(path)
    engine = FdChannelConnection(path, engine_identity(0), max_frame_bytes=1 << 20, secret=SECRET)
    conn = fake.accept()
    yield conn, engine
    engine.close()
    conn.close()
    fake.listener.close()


def _frames(*aux_sizes: int, token: int) -> list[bytes]:
    return [b"\x00", b"body", *(b"" for _ in aux_sizes), b"", side_marker(token)]


def _memfd(data: bytes, seal: bool = True) -> int:
    if seal:
        return write_sealed([memoryview(data)])
    fd = os.memfd_create("unsealed")
    os.write(fd, data)
    return fd


def _pass(conn: socket.socket, message: bytes, fd: int) -> None:
    socket.send_fds(conn, [message], [fd])
    os.close(fd)


def test_stale_datagrams_are_skipped_and_a_missing_one_is_a_decode_error(
        fake_p0: tuple[socket.socket, FdChannelConnection]) -> None:
    conn, engine = fake_p0
    _pass(conn, side_message(1, [(2, 3)]), _memfd(b"old"))  # its message was lost
    _pass(conn, side_message(2, [(2, 3)]), _memfd(b"new"))
    assert bytes(engine.restore(_frames(3, token=2))[2]) == b"new"
    _pass(conn, side_message(5, [(2, 4)]), _memfd(b"late"))
    with pytest.raises(DecodeError, match="no frames for message 4"):
        engine.restore(_frames(4, token=4))
    assert bytes(engine.restore(_frames(4, token=5))[2]) == b"late"  # kept for its own message
    with pytest.raises(DecodeError, match="never came"):
        engine.restore(_frames(4, token=6))
    assert split_side_marker([b"\x00", b"body", b""]) == ([b"\x00", b"body", b""], None)


@pytest.mark.parametrize(("message", "frames", "data", "seal", "error"), [
    (side_message(1, [(1, 3)]), _frames(3, token=1), b"abc", True, "placed frames at \\[1\\]"),
    (side_message(1, [(2, 3), (2, 3)]), _frames(3, 3, token=1), b"abc", True, "placed frames at \\[2, 2\\]"),
    (side_message(1, [(4, 3)]), _frames(3, token=1), b"abc", True, "placed frames at \\[4\\]"),
    (side_message(1, [(2, 2 << 20)]), _frames(1, token=1), b"abc", True, "above max_frame_bytes"),
    (side_message(1, [(2, 3)]), _frames(3, token=1), b"abc", False, "not a sealed memfd"),
    (side_message(1, [(2, 65)]), _frames(3, token=1), b"abc", True, "not a sealed memfd of 128 bytes"),
])
def test_bad_placements_are_decode_errors(fake_p0: tuple[socket.socket, FdChannelConnection], message: bytes,
                                          frames: list[bytes], data: bytes, seal: bool, error: str) -> None:
    conn, engine = fake_p0
    _pass(conn, message, _memfd(data, seal))
    with pytest.raises(DecodeError, match=error):
        engine.restore(frames)
    _pass(conn, side_message(2, [(2, 2)]), _memfd(b"ok"))
    assert bytes(engine.restore(_frames(2, token=2))[2]) == b"ok"  # the channel still works


def test_a_frame_not_left_empty_is_refused(fake_p0: tuple[socket.socket, FdChannelConnection]) -> None:
    conn, engine = fake_p0
    _pass(conn, side_message(1, [(2, 3)]), _memfd(b"abc"))
    frames = _frames(3, token=1)
    frames[2] = b"xyz"
    with pytest.raises(DecodeError, match="not left empty"):
        engine.restore(frames)


def test_datagrams_p0_never_sends_are_skipped(fake_p0: tuple[socket.socket, FdChannelConnection]) -> None:
    conn, engine = fake_p0
    conn.send(side_message(1, [(2, 3)]))  # no descriptor
    _pass(conn, b"\x01\x02", _memfd(b"abc"))  # malformed
    _pass(conn, side_message(2, [(2, 3)]), _memfd(b"abc"))
    assert bytes(engine.restore(_frames(3, token=2))[2]) == b"abc"


@given(st.integers(0, (1 << 64) - 1), st.lists(st.tuples(st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 64) - 1)),
                                              max_size=50))
def test_side_messages_round_trip(token: int, placed: list[tuple[int, int]]) -> None:
    assert parse_side_message(side_message(token, placed)) == (token, placed)
    assert split_side_marker([b"x", side_marker(token)]) == ([b"x"], token)


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_decode_error(data: bytes) -> None:
    try:
        token, placed = parse_side_message(data)
    except DecodeError:
        return
    assert len(data) == 12 + 12 * len(placed) and struct.unpack_from("<Q", data)[0] == token
