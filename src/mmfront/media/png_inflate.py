"""PNG decoding with ISA-L's inflate: Pillow's pixels, faster than Pillow decodes them.

Decoding a photo-like PNG is mostly zlib inflate, and Pillow inflates with the zlib the system
has, several times slower than ISA-L's (docs/benchmarks.md, "The PNG miss, profiled"). So
:func:`decode_png` hands Pillow the same file with its image data inflated by ISA-L and framed
again as *stored* (uncompressed) deflate blocks: Pillow's inflate becomes a copy, and Pillow
still does everything else (unfiltering, bit depths, palettes, transparency, metadata). The
inflated bytes are the same whichever inflater produces them, so the pixels are Pillow's by
construction, not by tolerance.

The stand-in file is made while Pillow reads it, one stored block (64 KiB) at a time, framed
here rather than by ``zlib.compressobj(0)``, which would copy every byte once more and hold a
deflate state of ~300 KiB. So a decode holds only ISA-L's inflate state and one block beside the
image, and the decode budget's PNG peak (:mod:`mmfront.media._image_peak`) holds unchanged
(the tests check it against the measured RSS peak). Files outside the plain case (interlaced,
animated, image data chunks not contiguous, a zlib stream that is not exactly the image's size,
anything Pillow refuses) are decoded by Pillow from the original bytes, so their pixels and
errors are Pillow's too.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, cast

from PIL import Image

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
"""Samples per pixel of each PNG colour type (grey, RGB, palette, grey + alpha, RGBA)."""
_BLOCK = 0xFFFF
"""Bytes of a stored deflate block, the most its 16-bit length allows; one per IDAT chunk."""
_ZLIB_HEADER = b"\x78\x01"
"""A zlib stream header: deflate with a 32 KiB window, no dictionary, check bits set."""
_LAST_BLOCK = b"\x01\x00\x00\xff\xff"
"""An empty stored block marked final: it closes the stream after the last data block."""
_IDAT_CRC = zlib.crc32(b"IDAT")
_FALLBACK_ERRORS = (OSError, ValueError, EOFError, SyntaxError, struct.error, zlib.error)


@functools.cache
def _isal_zlib() -> Any:
    """ISA-L's zlib, imported with the first PNG: importing mmfront does not load it."""
    from isal import isal_zlib

    return isal_zlib


class _SizeMismatch(ValueError):
    """The image data does not inflate to exactly the size the header gives."""


def decode_png(payload: bytes) -> Image.Image:
    """The decoded (loaded) image of ``payload``, a PNG file, exactly as
    ``Image.open(BytesIO(payload)).load()`` makes it."""
    stream = _ReinflatedPng.of(payload)
    if stream is not None:
        try:
            image: Image.Image = Image.open(cast(IO[bytes], stream), formats=("PNG",))
            image.load()
            return image
        except (*_FALLBACK_ERRORS, cast("type[Exception]", _isal_zlib().error)):
            pass  # Pillow's own decode below gives this file's pixels or its error
    image = Image.open(io.BytesIO(payload), formats=("PNG",))
    image.load()
    return image


class _ReinflatedPng(io.RawIOBase):
    """``payload`` with its IDAT chunks replaced by chunks of stored deflate blocks, read
    forward only: Pillow opens a file by reading it in order and seeks only to where it is."""

    def __init__(self, payload: bytes, first: int, end: int, inflated_size: int) -> None:
        super().__init__()
        self._payload = memoryview(payload)
        self._idat = (first, end)
        self._inflated_size = inflated_size
        self._pieces = self._generate()
        self._piece = self._payload[:first]
        self._start = 0
        self._pos = 0

    @classmethod
    def of(cls, payload: bytes) -> _ReinflatedPng | None:
        """The stand-in for ``payload``, or None when it is not a plain PNG this covers."""
        if payload[:8] != _SIGNATURE or payload[12:16] != b"IHDR" or len(payload) < 33:
            return None
        width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", payload[16:29])
        if interlace or colour not in _CHANNELS:
            return None
        first = end = -1
        pos = 8
        while pos + 8 <= len(payload):
            length = int.from_bytes(payload[pos:pos + 4], "big")
            kind = payload[pos + 4:pos + 8]
            if kind == b"acTL":
                return None  # animated: Pillow reads frames in its own way
            if kind == b"IEND":
                break
            if kind == b"IDAT":
                if first < 0:
                    first = pos
                elif end != pos:
                    return None
                end = pos + 12 + length
            pos += 12 + length
        if first < 0 or end > len(payload):
            return None
        return cls(payload, first, end, height * (1 + (width * _CHANNELS[colour] * depth + 7) // 8))

    def _generate(self) -> Iterator[bytes | memoryview]:
        """The file after the chunks that precede the image data: the new IDAT chunks (one stored
        block each, its bytes yielded apart from the framing, so nothing is copied to join them),
        then the rest."""
        inflater = _isal_zlib().decompressobj()
        produced = 0
        adler = 1
        yield from _idat_chunk(_ZLIB_HEADER)
        first, end = self._idat
        pos = first
        while pos < end and not inflater.eof:
            length = int.from_bytes(self._payload[pos:pos + 4], "big")
            data: bytes | memoryview = self._payload[pos + 8:pos + 8 + length]
            pos += 12 + length
            while data and not inflater.eof:
                out = inflater.decompress(data, min(_BLOCK, self._inflated_size - produced + 1))
                if not out and len(inflater.unconsumed_tail) == len(data):
                    raise _SizeMismatch("the image data stopped inflating")
                data = inflater.unconsumed_tail
                produced += len(out)
                if produced > self._inflated_size:
                    raise _SizeMismatch(f"the image data inflates to more than {self._inflated_size} bytes")
                if out:
                    adler = _isal_zlib().adler32(out, adler)
                    yield from _idat_chunk(struct.pack("<BHH", 0, len(out), len(out) ^ 0xFFFF), out)
        if produced != self._inflated_size or not inflater.eof:
            raise _SizeMismatch(f"the image data inflates to {produced} of {self._inflated_size} bytes")
        yield from _idat_chunk(_LAST_BLOCK + adler.to_bytes(4, "big"))
        yield self._payload[end:]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._pos + offset if whence == io.SEEK_CUR else -1
        if not self._start <= target <= self._start + len(self._piece):
            raise io.UnsupportedOperation("a re-inflated PNG is read forward only")
        self._pos = target
        return target

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            at = self._pos - self._start
            if at == len(self._piece):
                piece = next(self._pieces, None)
                if piece is None:
                    break
                self._piece, self._start = memoryview(piece), self._pos
                continue
            n = min(len(view) - filled, len(self._piece) - at)
            view[filled:filled + n] = self._piece[at:at + n]
            filled += n
            self._pos += n
        return filled


def _idat_chunk(*parts: bytes) -> Iterator[bytes]:
    """An IDAT chunk holding ``parts``: its length and type, the parts, its CRC."""
    yield sum(map(len, parts)).to_bytes(4, "big") + b"IDAT"
    crc = _IDAT_CRC
    for part in parts:
        crc = _isal_zlib().crc32(part, crc)
        yield part
    yield crc.to_bytes(4, "big")
