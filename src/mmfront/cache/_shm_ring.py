"""A single-writer ring buffer in POSIX shared memory, and the segment it lives in.

Segment layout: a 64-byte header (magic, data size, reader count, a random 32-byte secret the
object store signs handles with, the write frontier), then the data region. The writer allocates
chunks in FIFO order at *logical* addresses that grow without bound (physical offset = address
mod data size). Each chunk starts with ``[monotonic id: u64][chunk size: u64]``. Chunks start on
64-byte boundaries so the tensors stored in them can be viewed in place.

Freshness: the header's *write frontier* is the logical address just past the last chunk the
writer allocated, published before the chunk's bytes are written. A chunk at logical address
``a`` is intact exactly while ``frontier <= a + data size``: any later write to its bytes
belongs to a chunk of the next lap, which moves the frontier past that bound first. Readers
check this, not only the chunk header, because a stale address may fall *inside* a newer chunk,
where an item's payload can hold any bytes, a copy of the old header included. Since the bound
depends on nothing stored in the data region, a stale handle always fails, and a live one (the
writer never laps a live chunk) never does. The header checks that follow (id, size) only
catch corruption.

Cleanup: segments are named ``mmfront-shm-<writer pid>-<random>`` and are never registered with
``multiprocessing``'s resource tracker (which would unlink a segment when a *reader* exits, or
warn about "leaked" segments). The writer unlinks on :meth:`ShmSegment.close`, at interpreter exit,
and on SIGTERM when the process leaves SIGTERM at its default action (see
:func:`_install_sigterm_cleanup`); a writer killed before any of these (SIGKILL, the OOM killer)
is cleaned up by :func:`cleanup_stale_segments`, which the next writer runs on start.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import signal
import struct
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from mmfront.errors import CacheError, ShmHandleError, resource_error

try:
    import _posixshmem
except ImportError:  # pragma: no cover - Windows has no POSIX shared memory
    _posixshmem = None

logger = logging.getLogger(__name__)

SEGMENT_PREFIX = "mmfront-shm"
SHM_DIR = "/dev/shm"
ALIGN = 64
"""Chunk and frame alignment: a cache line, and enough for every tensor dtype."""

_MAGIC = b"MMFRSHM2"
_SEGMENT_HEADER = struct.Struct("<8sQI4x32s")
_FRONTIER = struct.Struct("@Q")
"""Native and 8-aligned, so one store writes it and a reader never sees half of an update."""
FRONTIER_OFFSET = _SEGMENT_HEADER.size
SEGMENT_HEADER_SIZE = 64
NAME_MAX = 255
SECRET_SIZE = 32
CHUNK_HEADER = struct.Struct("<QQ")
"""``[monotonic id][chunk size, header included]`` at the start of every chunk."""
ID_MODULUS = 1 << 32
"""Monotonic ids wrap here, so they fit the 4 bytes a vLLM-shaped handle signs."""


def align_up(n: int, alignment: int = ALIGN) -> int:
    return (n + alignment - 1) // alignment * alignment


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _segment_pid(name: str) -> int | None:
    parts = name.split("-")
    if not name.startswith(SEGMENT_PREFIX + "-") or len(parts) != 4 or not parts[2].isdigit():
        return None
    return int(parts[2])


def cleanup_stale_segments(directory: str = SHM_DIR) -> list[str]:
    """Unlink mmfront segments whose writer process is gone; returns the names removed.

    A writer killed by SIGKILL (or the OOM killer) cannot unlink its segment; its pid in the
    name tells the next writer that nobody will. A reused pid keeps a stale segment until that
    process exits too, which errs on the side of never unlinking a live segment.
    """
    if _posixshmem is None or not os.path.isdir(directory):
        return []
    removed = []
    for name in os.listdir(directory):
        pid = _segment_pid(name)
        if pid is None or _pid_alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + name)
            removed.append(name)
            logger.info("Removed shared-memory segment %s left by dead writer process %d", name, pid)
    return removed


_owned: dict[str, int] = {}
"""Names of the segments this process created and has not unlinked, with the creating pid (a
forked child inherits the dict but owns none of them)."""


def _unlink(name: str) -> None:
    _owned.pop(name, None)
    if _posixshmem is not None:
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + name)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Unlink this process's segments, then die of the signal as the default action would."""
    pid = os.getpid()
    for name, owner in list(_owned.items()):
        if owner == pid:
            _unlink(name)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(pid, signum)


def _install_sigterm_cleanup() -> None:
    """Unlink on SIGTERM, but only where SIGTERM would otherwise kill the process outright.

    A library must not take a signal away from its application: a handler the application set
    (or ``SIG_IGN``) is left alone, since that application decides whether and how it exits, and
    a normal exit runs the finalizers that unlink. Only the default action (death without any
    cleanup, the case that leaks) is replaced, by a handler that unlinks and then re-raises the
    signal with the default action restored, so the exit status stays "killed by SIGTERM". An
    application that installs its own handler later replaces this one. Python can only set
    handlers from the main thread; a writer created in another thread relies on the next
    writer's sweep, as for SIGKILL.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _close_mapping(mapping: mmap.mmap, view: memoryview) -> None:
    view.release()
    # Zero-copy tensors may still view the mapping; then it is unmapped when the last one is freed.
    with contextlib.suppress(BufferError):
        mapping.close()


def _finalize_segment(mapping: mmap.mmap, view: memoryview, name: str, owner_pid: int | None) -> None:
    _close_mapping(mapping, view)
    if owner_pid is not None and os.getpid() == owner_pid:
        _unlink(name)


def _is_segment_name(name: object) -> bool:
    # shm_open would cut a name at a NUL and open another segment, so this is checked first.
    if not isinstance(name, str):
        return False
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:
        return False
    return 0 < len(raw) <= NAME_MAX and b"/" not in raw and b"\0" not in raw


class ShmSegment:
    """A named POSIX shared-memory segment mapped into this process.

    The creating process owns it: closing (explicitly, by garbage collection, or at interpreter
    exit) unlinks it there, and only there, so a forked child that exits never removes its
    parent's segment.
    """

    def __init__(self, name: str, mapping: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.size = len(mapping)
        self.buf = memoryview(mapping)
        self._finalizer = weakref.finalize(
            self, _finalize_segment, mapping, self.buf, name, os.getpid() if owner else None
        )

    @classmethod
    def create(cls, size: int) -> ShmSegment:
        if _posixshmem is None:
            raise CacheError("The shm processor cache needs POSIX shared memory; use mm_processor_cache_type='lru'")
        cleanup_stale_segments()
        if os.path.isdir(SHM_DIR):
            free = os.statvfs(SHM_DIR)
            available = free.f_bavail * free.f_frsize
            if available < size:
                raise CacheError(
                    f"{SHM_DIR} has {available / 2**20:.1f} MiB free but the shm cache needs {size / 2**20:.1f} MiB "
                    "(writing past the limit would kill the process with SIGBUS). Lower mm_processor_cache_gb, or "
                    "give the container more shared memory (docker run --shm-size)."
                )
        _install_sigterm_cleanup()
        name = f"{SEGMENT_PREFIX}-{os.getpid()}-{secrets.token_hex(6)}"
        _owned[name] = os.getpid()  # before the segment exists, so a SIGTERM from here on unlinks it
        doing = f"Creating the shm cache's {size / 2**20:.1f} MiB segment in {SHM_DIR}"
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except OSError as exc:
            _owned.pop(name, None)
            found = resource_error(exc, doing=doing)
            if found is None:
                raise
            raise found from exc
        except BaseException:
            _owned.pop(name, None)
            raise
        try:
            os.ftruncate(fd, size)
            # Reserve every page now: a sparse segment that /dev/shm can no longer back (another
            # process filled it after the check above) would kill this process with SIGBUS on the
            # first write into such a page, in the middle of a request.
            os.posix_fallocate(fd, 0, size)
            mapping = mmap.mmap(fd, size)
        except OSError as exc:
            _unlink(name)
            found = resource_error(exc, doing=doing)
            if found is None:
                raise
            raise found from exc
        except BaseException:
            _unlink(name)
            raise
        finally:
            os.close(fd)
        return cls(name, mapping, owner=True)

    @classmethod
    def attach(cls, name: str) -> ShmSegment:
        if _posixshmem is None:
            raise CacheError("The shm processor cache needs POSIX shared memory; use mm_processor_cache_type='lru'")
        hint = "Pass the name the writer's cache reports (ShmObjectStoreSenderCache.shm_name)."
        if not _is_segment_name(name):
            raise CacheError(
                f"{name!r} is not a shared-memory segment name (a non-empty str of at most {NAME_MAX} bytes "
                f"without '/' or NUL). {hint}"
            )
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError as e:
            raise CacheError(
                f"Shared-memory segment {name!r} does not exist: the writer (P0) has not created it yet or "
                f"has exited. {hint}"
            ) from e
        except OSError as e:
            raise CacheError(
                f"Cannot open shared-memory segment {name!r} ({e.strerror}): check the name, and run the reader "
                f"as the writer's user in the same container (the same /dev/shm). {hint}"
            ) from e
        try:
            size = os.fstat(fd).st_size
            if size < SEGMENT_HEADER_SIZE:
                raise CacheError(f"Shared-memory segment {name!r} is too small to be an mmfront shm cache. {hint}")
            mapping = mmap.mmap(fd, size)
        except OSError as e:
            raise CacheError(f"Cannot map shared-memory segment {name!r} ({e.strerror}). {hint}") from e
        finally:
            os.close(fd)
        return cls(name, mapping, owner=False)

    def close(self) -> None:
        """Unmap (and, in the creating process, unlink) the segment; idempotent."""
        self._finalizer()


@dataclass(slots=True)
class RingChunk:
    address: int
    """Logical address of the chunk header (physical offset = address mod data size)."""
    monotonic_id: int
    size: int
    """Bytes, header included, a multiple of :data:`ALIGN`."""


def write_segment_header(buf: memoryview, data_size: int, n_readers: int, secret: bytes) -> None:
    _SEGMENT_HEADER.pack_into(buf, 0, _MAGIC, data_size, n_readers, secret)


def read_segment_header(segment: ShmSegment) -> tuple[int, int, bytes]:
    """``(data size, reader count, secret)`` of a segment, checked against its actual size."""
    magic, data_size, n_readers, secret = _SEGMENT_HEADER.unpack_from(segment.buf, 0)
    if magic != _MAGIC:
        raise CacheError(
            f"Shared-memory segment {segment.name!r} is not an mmfront shm cache of this version "
            "(bad magic); check the segment name the reader was given"
        )
    if not ALIGN <= data_size <= segment.size - SEGMENT_HEADER_SIZE or data_size % ALIGN:
        raise CacheError(
            f"Shared-memory segment {segment.name!r} has a corrupt header: data size {data_size} does not fit its "
            f"{segment.size} bytes. Restart the writer (P0) to get a fresh segment."
        )
    if not 0 < n_readers < data_size // 4:
        raise CacheError(
            f"Shared-memory segment {segment.name!r} has a corrupt header: {n_readers} readers cannot fit a "
            f"{data_size}-byte ring. Restart the writer (P0) to get a fresh segment."
        )
    return data_size, n_readers, secret


class SingleWriterShmRingBuffer:
    """FIFO allocator over the data region of a segment; only the creating process writes.

    Allocation state (start, end, the live chunks) lives in the writer's memory; the segment
    holds only the write frontier (``end``), which readers check handles against.
    """

    def __init__(self, data_size: int, n_readers: int) -> None:
        data_size = data_size // ALIGN * ALIGN
        if data_size < ALIGN:
            raise CacheError(f"The shm cache needs at least {ALIGN} bytes, got {data_size}")
        self.data_size = data_size
        self.segment = ShmSegment.create(SEGMENT_HEADER_SIZE + data_size)
        self.secret = secrets.token_bytes(SECRET_SIZE)
        write_segment_header(self.segment.buf, data_size, n_readers, self.secret)
        self._data = self.segment.buf[SEGMENT_HEADER_SIZE:]
        self._start = 0
        self._end = 0
        self._next_id = 0
        self._chunks: deque[RingChunk] = deque()

    @property
    def name(self) -> str:
        return self.segment.name

    def __len__(self) -> int:
        return len(self._chunks)

    def allocate(self, nbytes: int) -> RingChunk | None:
        """A chunk with room for ``nbytes`` after its header, or ``None`` while the ring is full.

        A chunk never wraps: when the tail of the region is too short, the chunk starts at the
        next lap and the tail stays unused until the chunks before it are freed.
        """
        size = align_up(CHUNK_HEADER.size + nbytes)
        if size > self.data_size:
            raise CacheError(f"A {nbytes}-byte object cannot fit a {self.data_size}-byte shm ring")
        address = self._end
        offset = address % self.data_size
        if offset + size > self.data_size:
            address += self.data_size - offset
            offset = 0
        if not self._chunks:
                self._start = address  # nothing is live: the whole region is free
        elif address + size - self._start > self.data_size:
            return None
        chunk = RingChunk(address, self._next_id, size)
        self._next_id = (self._next_id + 1) % ID_MODULUS
        self._end = address + size
        # Publish first: a reader that sees any byte of the new chunk then sees the frontier
        # that makes the chunks it overwrites stale (stores are ordered on x86-64; see the
        # store's note on weakly ordered CPUs).
        _FRONTIER.pack_into(self.segment.buf, FRONTIER_OFFSET, self._end)
        CHUNK_HEADER.pack_into(self._data, offset, chunk.monotonic_id, size)
        self._chunks.append(chunk)
        return chunk

    def view(self, chunk: RingChunk) -> memoryview:
        """The whole chunk (header included) as a writable byte view."""
        offset = chunk.address % self.data_size
        return self._data[offset:offset + chunk.size]

    def free_oldest(self, is_free: Callable[[RingChunk], bool], nbytes: int) -> list[RingChunk]:
        """Free chunks in FIFO order until ``nbytes`` are freed or the oldest is still in use.

        Stopping at the first busy chunk (head-of-line blocking) is what keeps the free space
        one contiguous arc of the ring.
        """
        freed: list[RingChunk] = []
        total = 0
        chunks = self._chunks
        while chunks and total < nbytes and is_free(chunks[0]):
            chunk = chunks.popleft()
            freed.append(chunk)
            total += chunk.size
        self._start = chunks[0].address if chunks else self._end
        return freed

    def clear(self) -> None:
        """Forget every chunk. Handles issued before still resolve until the frontier shows
        their memory reused, then fail: addresses keep increasing across a clear."""
        self._chunks.clear()
        self._start = self._end

    def close(self) -> None:
        self._data.release()
        self.segment.close()


class ShmRingReader:
    """Read-only access to a writer's chunks, by logical address and monotonic id."""

    def __init__(self, name: str) -> None:
        self.segment = ShmSegment.attach(name)
        try:
            self.data_size, self.n_readers, self.secret = read_segment_header(self.segment)
        except CacheError:
            self.segment.close()
            raise
        self.data = self.segment.buf[SEGMENT_HEADER_SIZE:SEGMENT_HEADER_SIZE + self.data_size]

    def _stale(self, address: int, monotonic_id: int) -> ShmHandleError:
        return ShmHandleError(
            f"Data for address:id '{address}:{monotonic_id}' has been modified or is invalid: the writer "
            "reused that memory (the cache was cleared or the item was evicted). Resend the request with its data."
        )

    def chunk(self, address: int, monotonic_id: int) -> memoryview:
        """The chunk a signed handle names, while its memory is intact; else :class:`ShmHandleError`."""
        offset = address % self.data_size
        if address % ALIGN:
            raise self._stale(address, monotonic_id)
        stored_id, size = CHUNK_HEADER.unpack_from(self.data, offset)
        (frontier,) = _FRONTIER.unpack_from(self.segment.buf, FRONTIER_OFFSET)  # after the header: see holds
        if frontier > address + self.data_size:
            raise self._stale(address, monotonic_id)
        if (stored_id != monotonic_id or size % ALIGN or not CHUNK_HEADER.size < size <= self.data_size - offset
                or address + size > frontier):
            raise ShmHandleError(
                f"Data for address:id '{address}:{monotonic_id}' has been modified or is invalid: its chunk header "
                f"(id {stored_id}, size {size}) does not match the handle, although the writer has not reused that "
                "memory, so something other than the writer wrote to the segment. Resend the request with its "
                "data; if this recurs, restart the writer (P0) to get a fresh segment."
            )
        return self.data[offset:offset + size]

    def holds(self, address: int, monotonic_id: int) -> bool:
        """Whether the chunk at ``address`` is still intact (re-checked after a copy).

        The frontier is read last: the writer publishes it before writing a chunk, so a reader that
        saw any byte of a newer chunk sees the newer frontier too."""
        stored_id = CHUNK_HEADER.unpack_from(self.data, address % self.data_size)[0]
        (frontier,) = _FRONTIER.unpack_from(self.segment.buf, FRONTIER_OFFSET)
        return bool(frontier <= address + self.data_size and stored_id == monotonic_id)

    def close(self) -> None:
        self.data.release()
        self.segment.close()
