"""Message framing over one end of a ``multiprocessing`` pipe: the one home of the byte layout
that :class:`~mmfront.engine.transports.PipeTransport` and the processing lanes' worker pipes share.

A message is a header (frame count and lengths) followed by one pipe message per non-empty
frame; frames arrive in writable buffers, so decoded tensors can view them without a copy.
Nothing is pickled: the pipe carries only the codec's frames.

A frame is read straight from the pipe into its buffer. ``Connection.recv_bytes_into`` would
read it in chunks, allocating a buffer of the whole remaining size for each, then copy the
chunks twice, several times the receiver's CPU of one read.
The frame keeps ``Connection``'s own message layout (a ``!i`` length, or ``-1`` and a ``!Q``
length), so either end may still be a plain ``send_bytes``.

Between two processes of one machine on a Unix socket that talk in strict request/reply (the
processing lanes), the frames can travel in the sender's shared buffer instead (``out``/``into``,
:mod:`mmfront.wire.shared_buffer`): the message is then its header alone, the buffer's memfd
passed with it when it is new, and the receiver copies the frames out. Their lengths carry
:data:`_SHARED` in the header, and their offsets in the buffer follow the lengths.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Sequence
from multiprocessing.connection import Connection

from mmfront.errors import DecodeError, ResourceError, TransportError, resource_error
from mmfront.wire._tensors import Frame, frame_view
from mmfront.wire.shared_buffer import InBuffer, OutBuffer

MAX_FRAMES = 1 << 16
"""Most frames one message may announce."""
_MAX_HEADER = 4 + 16 * MAX_FRAMES
"""A frame count, each frame's length and, for a shared one, its offset."""
_DISCARD_CHUNK = 1 << 20
"""How much of a frame that does not match its header is read (and dropped) at a time."""
_SHARED = 1 << 63
"""Set in a frame's announced length when the frame travels in the sender's shared buffer."""


def send_frames(conn: Connection, frames: Sequence[Frame], *, out: OutBuffer | None = None) -> None:
    """Send one message; raises :class:`~mmfront.errors.TransportError` when the peer is gone.

    With ``out``, the frames travel in that shared buffer (the peer must be a process of this
    machine reading with ``into``, ``conn`` a Unix socket, and the peer must have answered the
    previous message sent through ``out``: this one overwrites it)."""
    views = [frame_view(f, i) for i, f in enumerate(frames)]
    shared = [out is not None and v.nbytes > 0 for v in views]
    try:
        offsets, fd = ([], None) if out is None else out.place([v for v, s in zip(views, shared) if s])
        header = struct.pack(f"<I{len(views)}Q{len(offsets)}Q", len(views),
                             *(v.nbytes | (_SHARED if s else 0) for v, s in zip(views, shared)), *offsets)
        if fd is not None:
            _send_with_fd(conn, header, fd)
        else:
            conn.send_bytes(header)
        for view, in_buffer in zip(views, shared):
            if view.nbytes and not in_buffer:
                conn.send_bytes(view)
    except BaseException as e:
        if out is not None:
            out.close()  # the peer may not have its buffer: the next message makes and sends a new one
        if isinstance(e, ResourceError) or not isinstance(e, (OSError, ValueError)):
            raise
        raise resource_error(e, doing="Sending a message") or TransportError(
            f"The peer is gone ({e}); reconnect and resend what was in flight.") from e


def recv_frames(conn: Connection, timeout: float | None = None, *, into: InBuffer | None = None) -> list[Frame] | None:
    """The next message's frames, or ``None`` if none arrived within ``timeout`` seconds (``None``
    waits for ever). Raises ``EOFError`` when the peer closed its end. ``into`` takes frames sent
    with ``out`` (``conn`` must then be a Unix socket): it maps the peer's buffer when the message
    brings one, and the frames are copied out of it before this returns."""
    try:
        if timeout is not None and not conn.poll(timeout):
            return None
        header, fd = _recv_header_and_fd(conn) if into is not None else (conn.recv_bytes(), None)
        try:
            if len(header) < 4:
                raise DecodeError(f"A message header has at least 4 bytes, got {len(header)}.")
            (count,) = struct.unpack_from("<I", header)
            if count > MAX_FRAMES or len(header) < 4 + 8 * count:
                raise DecodeError(f"Malformed message header ({len(header)} bytes for {count} frames).")
            sizes = struct.unpack_from(f"<{count}Q", header, 4)
            shared = sum(1 for s in sizes if s & _SHARED)
            if len(header) != 4 + 8 * (count + shared):
                raise DecodeError(f"Malformed message header ({len(header)} bytes for {count} frames, {shared} shared).")
            offsets = struct.unpack_from(f"<{shared}Q", header, 4 + 8 * count)
            if fd is not None:
                assert into is not None
                into.adopt(fd)
        finally:
            if fd is not None:
                os.close(fd)
        shared_sizes = [s & ~_SHARED for s in sizes if s & _SHARED]
        if shared_sizes and into is None:
            raise DecodeError("A message announced shared frames but came without their memory.")
        mapped = iter(into.copy_out(shared_sizes, offsets) if into is not None and shared_sizes else [])
        frames: list[Frame] = []
        for size in sizes:
            if size & _SHARED:
                frames.append(next(mapped))
                continue
            buf = bytearray(size)
            if size:
                _recv_frame_into(conn.fileno(), buf)
            frames.append(buf)
        return frames
    except ResourceError:
        raise
    except OSError as e:
        raise resource_error(e, doing="Receiving a message") or TransportError(f"The peer is gone ({e}).") from e


def _send_with_fd(conn: Connection, header: bytes, fd: int) -> None:
    data = memoryview(struct.pack("!i", len(header)) + header)
    with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sent = socket.send_fds(sock, [data], [fd])
        if sent < len(data):  # an empty send to a peer that has read it all and closed is EPIPE
            sock.sendall(data[sent:])


def _recv_header_and_fd(conn: Connection) -> tuple[bytes, int | None]:
    """A header message read with ``recvmsg``, so the buffer's memfd sent with it is received too."""
    fds: list[int] = []
    try:
        with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            first, fds, flags, _addr = socket.recv_fds(sock, 4, 1)
        if flags & socket.MSG_CTRUNC:  # the kernel dropped the memfd: no descriptor was free for it
            raise ResourceError(
                "Receiving a message's shared frames failed: the process is out of open files (the memfd sent "
                "with it was dropped). Raise the process's open-file limit (ulimit -n, RLIMIT_NOFILE).",
                resource="open files", setting="the process's open-file limit (ulimit -n, RLIMIT_NOFILE)")
        if not first:
            raise EOFError
        prefix = bytearray(4)
        prefix[:len(first)] = first
        _read_into(conn.fileno(), memoryview(prefix)[len(first):])
        (size,) = struct.unpack("!i", prefix)
        if not 0 <= size <= _MAX_HEADER:
            raise DecodeError(f"A message header cannot be {size} bytes (at most {_MAX_HEADER}).")
        header = bytearray(size)
        _read_into(conn.fileno(), memoryview(header))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for extra in fds[1:]:
        os.close(extra)
    return bytes(header), fds[0] if fds else None


def _recv_frame_into(fd: int, buf: bytearray) -> None:
    """Read one ``Connection`` message into ``buf``, which has the size its header announced;
    a message of another size is read to its end (so the next one starts in step) and refused."""
    size = _read_length(fd)
    if size != len(buf):
        _discard(fd, size)
        which = "shorter" if size < len(buf) else "longer"
        raise DecodeError(f"A frame arrived {which} than its header announced ({size} bytes, not {len(buf)}).")
    _read_into(fd, memoryview(buf))


def _read_length(fd: int) -> int:
    prefix = bytearray(4)
    _read_into(fd, memoryview(prefix))
    (size,) = struct.unpack("!i", prefix)
    if size != -1:
        return int(size)
    long_prefix = bytearray(8)
    _read_into(fd, memoryview(long_prefix))
    return int(struct.unpack("!Q", long_prefix)[0])


def _discard(fd: int, size: int) -> None:
    scratch = memoryview(bytearray(min(size, _DISCARD_CHUNK)))
    while size:
        chunk = scratch[:min(size, len(scratch))]
        _read_into(fd, chunk)
        size -= len(chunk)


def _read_into(fd: int, view: memoryview) -> None:
    """Fill ``view`` from ``fd``; an end of file before it is full means the peer is gone."""
    while view.nbytes:
        n = os.readv(fd, [view])
        if n == 0:
            raise OSError("got end of file during message")
        view = view[n:]


__all__ = ["MAX_FRAMES", "recv_frames", "send_frames"]
