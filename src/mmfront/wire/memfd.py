"""Frames in a sealed memfd: the one home of how large frames go from one process of this
machine to another without a socket copying them.

The ZMQ transports' side channel over ``ipc://`` (:mod:`mmfront.engine.transports.fd_channel`) uses
it; the processing lanes reuse a buffer instead (:mod:`mmfront.wire.shared_buffer`, which shares
:func:`layout`). The sender writes the frames
once into the kernel and passes the descriptor (``SCM_RIGHTS``); the receiver maps those pages,
where a socket would have it zero-fill fresh memory and copy into it. The memfd has no name, so
nothing is left behind when either process dies, and it is sealed, so it cannot shrink under the
receiver's mapping (which would SIGBUS it).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence

import torch

from mmfront.errors import DecodeError, ResourceError, resource_error

ALIGN = 64
"""Alignment of each frame in the memfd, so any dtype can view it."""
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Where each frame starts in the memfd, and the memfd's size."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // ALIGN) * ALIGN
    return offsets, end


def write_sealed(views: Sequence[memoryview]) -> int:
    """A new sealed memfd holding ``views`` laid out by :func:`layout`; the caller closes it.
    :class:`~mmfront.errors.ResourceError` when the process is out of descriptors or memory."""
    offsets, total = layout([v.nbytes for v in views])
    try:
        fd = os.memfd_create("mmfront-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        found = resource_error(exc, doing="Creating a memfd for a message's frames")
        if found is None:
            raise
        raise found from exc
    try:
        os.ftruncate(fd, total)
        for view, offset in zip(views, offsets):
            while view.nbytes:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError as exc:
        os.close(fd)
        found = resource_error(exc, doing=f"Writing {total} bytes of frames into a memfd")
        if found is None:
            raise
        raise found from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_sealed(fd: int, sizes: Sequence[int]) -> list[memoryview]:
    """Writable views of the frames of sizes ``sizes`` in the sealed memfd ``fd`` (which stays the
    caller's to close); :class:`~mmfront.errors.DecodeError` when ``fd`` is not such a memfd.

    torch maps it (``from_file`` on ``/proc/self/fd``) and closes its own descriptor, so a held
    tensor does not hold a file descriptor; Python's ``mmap`` would keep one open per message."""
    offsets, total = layout(sizes)
    try:
        sealed = fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS == _SEALS
    except OSError:
        sealed = False
    if not sealed or os.fstat(fd).st_size < total:
        raise DecodeError(f"The memory of a message's shared frames is not a sealed memfd of {total} bytes.")
    if total == 0:
        return [memoryview(bytearray()) for _ in sizes]
    try:
        whole = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=total, dtype=torch.uint8).numpy().data
    except RuntimeError as exc:  # the memfd is sealed and large enough: only memory or descriptors can fail
        raise ResourceError(
            f"Mapping {total} bytes of a message's frames failed ({exc}): the process is out of memory or "
            "open files. The message is not at fault: retry it, or raise the memory the process may use (its "
            "container's limit) and the process's open-file limit (ulimit -n).",
            resource="memory", setting="the memory the process may use (its container's limit), and ulimit -n",
        ) from exc
    return [whole[offset:offset + size] for offset, size in zip(offsets, sizes)]


__all__ = ["ALIGN", "layout", "map_sealed", "write_sealed"]
