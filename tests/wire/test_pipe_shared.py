"""Frames in shared memory between the processing lanes and their caller (mmfront.wire.pipe):
large frames travel in a sealed memfd, arrive as writable views of it, leave no descriptor
open, and a message whose shared memory is missing, unsealed or short is refused."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import warnings
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
import torch

from mmfront.errors import DecodeError
from mmfront.wire.pipe import recv_frames, send_frames

SHARED = 1 << 63


@pytest.fixture
def ends() -> Iterator[tuple[Connection, Connection]]:
    a, b = socket.socketpair()
    left, right = Connection(a.detach()), Connection(b.detach())
    yield left, right
    left.close()
    right.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _send_header_with_fd(conn: Connection, header: bytes, fd: int) -> None:
    with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        socket.send_fds(sock, [struct.pack("!i", len(header)) + header], [fd])


def test_large_frames_arrive_as_writable_views_of_shared_memory(ends: tuple[Connection, Connection]) -> None:
    left, right = ends
    tensor = torch.arange(300_000, dtype=torch.float32)
    body, odd = bytearray(b"body"), bytes(range(256)) * 41  # 10,496 bytes: not a multiple of the alignment
    before = _open_fds()
    send_frames(left, [body, tensor.numpy().data, b"", odd], share_from=10_000)
    got = recv_frames(right, accept_shared=True)
    assert got is not None
    assert [bytes(f) for f in got] == [b"body", tensor.numpy().tobytes(), b"", odd]
    assert isinstance(got[0], bytearray) and isinstance(got[2], bytearray)
    assert isinstance(got[1], memoryview) and isinstance(got[3], memoryview)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it views a read-only buffer
        view = torch.frombuffer(got[1], dtype=torch.float32)
    view[7] = -1.0
    assert bytes(got[1][28:32]) == struct.pack("<f", -1.0)
    assert _open_fds() == before  # the mapping holds no descriptor


def test_small_frames_and_plain_receivers_use_the_socket(ends: tuple[Connection, Connection]) -> None:
    left, right = ends
    send_frames(left, [b"a" * 100], share_from=1 << 20)
    assert recv_frames(right, accept_shared=True) == [bytearray(b"a" * 100)]
    send_frames(left, [b"b" * 100])
    assert recv_frames(right, accept_shared=True) == [bytearray(b"b" * 100)]
    send_frames(left, [b"c" * 2048], share_from=1024)
    with pytest.raises(DecodeError, match="announced shared frames but came without their memory"):
        recv_frames(right)  # a receiver that does not accept shared frames refuses them
    left.close()
    with pytest.raises(EOFError):
        recv_frames(right, accept_shared=True)


@pytest.mark.parametrize("case", ["no fd", "unsealed", "too short"])
def test_forged_shared_memory_is_refused(ends: tuple[Connection, Connection], case: str) -> None:
    left, right = ends
    header = struct.pack("<IQ", 1, 4096 | SHARED)
    fd = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 4096 if case == "unsealed" else 1024)
        if case != "unsealed":
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        if case == "no fd":
            left.send_bytes(header)
        else:
            _send_header_with_fd(left, header, fd)
    finally:
        os.close(fd)
    before = _open_fds()
    match = "without their memory" if case == "no fd" else "not a sealed memfd of 4096 bytes"
    with pytest.raises(DecodeError, match=match):
        recv_frames(right, accept_shared=True)
    assert _open_fds() == before
    send_frames(left, [b"next"])
    assert recv_frames(right, accept_shared=True) == [bytearray(b"next")]


def test_a_header_too_long_to_be_one_is_refused(ends: tuple[Connection, Connection]) -> None:
    left, right = ends
    os.write(left.fileno(), struct.pack("!i", 4 + 8 * (1 << 16) + 1))  # refused before its body is read
    with pytest.raises(DecodeError, match="cannot be 524293 bytes"):
        recv_frames(right, accept_shared=True)
