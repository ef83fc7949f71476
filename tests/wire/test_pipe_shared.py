"""Frames in shared buffers between the processing lanes and their caller (mmfront.wire.pipe,
mmfront.wire.shared_buffer): a message's frames travel in the sender's reused memfd, arrive as
writable copies the sender cannot change, open no descriptor per message, and a message whose
buffer is missing, unsealed or short is refused."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import warnings
from multiprocessing.connection import Connection

import pytest
import torch

from mmfront.errors import DecodeError
from mmfront.wire.pipe import recv_frames, send_frames
from mmfront.wire.shared_buffer import KEEP_BYTES, InBuffer, OutBuffer

SHARED = 1 << 63


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum("mmfront-frames" in line for line in maps)


def _send_header_with_fd(conn: Connection, header: bytes, fd: int) -> None:
    with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        socket.send_fds(sock, [struct.pack("!i", len(header)) + header], [fd])


def test_frames_arrive_as_writable_copies_the_sender_cannot_change(ends: tuple[Connection, Connection]) -> None:
    left, right = ends
    out, into = OutBuffer(), InBuffer()
    tensor = torch.arange(300_000, dtype=torch.float32)
    body, odd = bytearray(b"body"), bytes(range(256)) * 41  # 10,496 bytes: not a multiple of the alignment
    send_frames(left, [body, tensor.numpy().data, b"", odd], out=out)
    got = recv_frames(right, into=into)
    assert got is not None
    assert [bytes(f) for f in got] == [b"body", tensor.numpy().tobytes(), b"", odd]
    assert isinstance(got[2], bytearray)  # an empty frame has nothing to share
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it views a read-only buffer
        view = torch.frombuffer(got[1], dtype=torch.float32)
    view[7] = -1.0
    assert bytes(got[1][28:32]) == struct.pack("<f", -1.0)
    send_frames(left, [b"next", torch.zeros(300_000).numpy().data], out=out)  # overwrites the sender's buffer
    assert bytes(got[0]) == b"body" and view[8] == 8.0  # the first message's frames are the receiver's own
    again = recv_frames(right, into=into)
    assert again is not None and bytes(again[0]) == b"next" and not any(bytes(again[1]))
    out.close()
    into.close()


def test_many_messages_open_no_descriptor_or_mapping_and_a_larger_one_replaces_the_buffer(
    ends: tuple[Connection, Connection]
) -> None:
    left, right = ends
    out, into = OutBuffer(), InBuffer()
    send_frames(left, [b"first"], out=out)
    assert recv_frames(right, into=into) == [memoryview(b"first")]
    fds, mappings = _open_fds(), _mappings()
    assert mappings == 2  # the sender's and the receiver's view of one buffer
    for size in (1000, 3 << 20, 10, KEEP_BYTES + 1, 100, 1 << 16):  # grows, outgrows the kept size, shrinks back
        payload = bytes([size % 251]) * size
        for _ in range(3 if size > KEEP_BYTES else 20):  # past the first, a 64 MB copy shows nothing new
            send_frames(left, [b"h", payload], out=out)
            got = recv_frames(right, into=into)
            assert got is not None and bytes(got[1]) == payload
        assert (_open_fds(), _mappings()) == (fds, mappings), size
    out.close()
    into.close()
    assert (_open_fds(), _mappings()) == (fds - 3, 0)  # the memfd, and the copy each mapping keeps of it


def test_plain_messages_still_pass_and_a_receiver_without_a_buffer_refuses_shared_frames(
    ends: tuple[Connection, Connection]
) -> None:
    left, right = ends
    send_frames(left, [b"b" * 100])
    assert recv_frames(right, into=InBuffer()) == [bytearray(b"b" * 100)]
    out = OutBuffer()
    send_frames(left, [b"c" * 2048], out=out)
    with pytest.raises(DecodeError, match="announced shared frames but came without their memory"):
        recv_frames(right)
    out.close()
    left.close()
    with pytest.raises(EOFError):
        recv_frames(right, into=InBuffer())


@pytest.mark.parametrize("case", ["no fd", "unsealed", "too short", "not a memfd"])
def test_a_forged_shared_buffer_is_refused(ends: tuple[Connection, Connection], case: str, tmp_path: object) -> None:
    left, right = ends
    header = struct.pack("<IQQ", 1, 4096 | SHARED, 0)
    fd = os.memfd_create("forged", os.MFD_ALLOW_SEALING)
    if case == "not a memfd":
        os.close(fd)
        fd = os.open(os.devnull, os.O_RDONLY)
    try:
        os.ftruncate(fd, 4096 if case == "unsealed" else 1024) if case != "not a memfd" else None
        if case == "too short":
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        if case == "no fd":
            left.send_bytes(header)
        else:
            _send_header_with_fd(left, header, fd)
    finally:
        os.close(fd)
    into = InBuffer()
    before = _open_fds()
    match = {"no fd": "announced shared frames up to byte 4096; its shared buffer holds 0",
             "too short": "announced shared frames up to byte 4096; its shared buffer holds 1024"}.get(
        case, "not a sealed memfd of 1 to")
    with pytest.raises(DecodeError, match=match):
        recv_frames(right, into=into)
    assert _open_fds() == before + (case == "too short")  # the adopted (sealed) buffer stays mapped
    into.close()
    assert _open_fds() == before
    send_frames(left, [b"next"])
    assert recv_frames(right, into=into) == [bytearray(b"next")]


def test_a_header_too_long_to_be_one_is_refused(ends: tuple[Connection, Connection]) -> None:
    left, right = ends
    os.write(left.fileno(), struct.pack("!i", 4 + 16 * (1 << 16) + 1))  # refused before its body is read
    with pytest.raises(DecodeError, match="cannot be 1048581 bytes"):
        recv_frames(right, into=InBuffer())
