"""A PIL image's pixels as the bytes of ``np.asarray(image)``, in strips, without one big copy.

This is what content hashing feeds the hasher (vLLM hashes ``np.asarray(image)``), so the bytes
must match numpy's array exactly. Two ways produce them:

* The fast path, for modes Pillow stores in 4 bytes per pixel (RGB, YCbCr and HSV keep the
  first 3; RGBA, RGBX, RGBa and CMYK keep all 4): the optional C extension ``mmfront._pixels``
  reads Pillow's pixel memory through its zero-copy Arrow export and packs each strip with SIMD
  and without the GIL, into a scratch buffer reused by the thread. RGB packing then costs about a
  third of what the hash does, where Pillow's own packer costs as much as the hash.
* Pillow's raw encoder, for every other mode and whenever the fast path is unavailable: the
  extension was not built (no C compiler at install), Pillow predates its Arrow export (< 11.2),
  or the image is not one block of memory (Pillow splits images over 16 MiB into blocks).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator

from PIL import Image

from mmfront.errors import HashingTypeError

__all__ = ["fast_packing_kernel", "iter_pixel_strips"]

_STRIP_BYTES = 1 << 19
"""Pixel bytes per strip: big enough that per-strip overhead vanishes (on a 1024x1024 RGB image,
64 KiB strips cost ~20% more than 512 KiB with Pillow's packer), small enough that a packed strip
is still in the core's cache when the hasher reads it."""

_PACKED_CHANNELS = {"RGB": 3, "YCbCr": 3, "HSV": 3, "RGBA": 4, "RGBX": 4, "RGBa": 4, "CMYK": 4}
"""Modes stored in 4 bytes per pixel whose array holds the first 3 or all 4 of them. (Not LAB:
Pillow stores its a and b signed and packs them with the top bit flipped.)"""

_Pack = Callable[[object, object, int, int, int, bytearray], int]


def _load_extension() -> tuple[_Pack | None, Callable[[], str] | None]:
    try:
        from mmfront._pixels import kernel, pack
    except ImportError:  # installed without a C compiler: Pillow's packer does every mode
        return None, None
    return pack, kernel


_pack, _kernel = _load_extension()
_local = threading.local()


def fast_packing_kernel() -> str | None:
    """The loop the fast path packs RGB with on this machine (``"avx2"``, ``"ssse3"`` or
    ``"portable"``), or None when the C extension is not installed and Pillow packs instead."""
    return _kernel() if _kernel is not None and _pack is not None else None


def iter_pixel_strips(
    image: Image.Image, linesize: int, *, reuse_buffer: bool, stream_offset: int = 0
) -> Iterator[bytes | memoryview]:
    """The bytes of ``np.asarray(image)`` (``linesize`` bytes per row), in strips.

    With ``reuse_buffer`` a strip may live in a scratch buffer the next strip overwrites: the
    caller must be done with each strip (e.g. have hashed it) before asking for the next, and
    must not keep it. Without it every strip is a fresh object.

    ``stream_offset`` is where the pixels start in the caller's byte stream. The fast path cuts
    its strips anywhere, even inside a pixel, so that each ends on a multiple of the strip size in
    that stream: blake3 then hashes every strip in whole groups of 16 chunks on its widest SIMD
    path, where strips shifted by the ~200 header bytes hash about 3% slower. Pillow's path cuts
    whole rows."""
    channels = _PACKED_CHANNELS.get(image.mode)
    if channels is not None and _pack is not None:
        strips = _packed_strips(_pack, image, channels, reuse_buffer, stream_offset)
        if strips is not None:
            return strips
    return _encoded_strips(image, linesize)


def _packed_strips(
    pack: _Pack, image: Image.Image, channels: int, reuse_buffer: bool, stream_offset: int
) -> Iterator[memoryview] | None:
    """The fast path's strips, or None when this image cannot take it. The first strip is
    packed here, before anything is handed out, so a refusal falls back cleanly."""
    export = getattr(image, "__arrow_c_array__", None)
    if export is None:
        return None
    try:
        schema, array = export()
    except (ValueError, TypeError, NotImplementedError):  # several memory blocks, or a mode Pillow won't export
        return None
    width, height = image.size
    strips = _pack_strips(pack, (schema, array), channels, width * height * channels,
                          first=_STRIP_BYTES - stream_offset % _STRIP_BYTES, reuse_buffer=reuse_buffer)
    try:
        first = next(strips)
    except (ValueError, TypeError):  # the extension refused the export
        return None
    return itertools.chain((first,), strips)


def _pack_strips(
    pack: _Pack, export: tuple[object, object], channels: int, total: int, *, first: int, reuse_buffer: bool
) -> Iterator[memoryview]:
    # `export` holds the capsules: Pillow's pixel memory stays alive until the last strip is packed.
    schema, array = export
    scratch = _take_scratch(_STRIP_BYTES) if reuse_buffer else None
    try:
        start, stop = 0, min(first, total)
        while start < total:
            buffer = scratch if scratch is not None else bytearray(stop - start)
            packed = pack(schema, array, channels, start, stop, buffer)
            yield memoryview(buffer)[:packed]
            start, stop = stop, min(stop + _STRIP_BYTES, total)
    finally:
        if scratch is not None:
            _give_back_scratch(scratch)


def _take_scratch(nbytes: int) -> bytearray:
    """The thread's scratch buffer, removed from the thread while in use, so that a second
    strip iterator on the same thread gets a buffer of its own instead of sharing it."""
    buffer: bytearray | None = getattr(_local, "scratch", None)
    _local.scratch = None
    if buffer is None or len(buffer) < nbytes:
        buffer = bytearray(nbytes)
    return buffer


def _give_back_scratch(buffer: bytearray) -> None:
    _local.scratch = buffer


def _encoded_strips(image: Image.Image, linesize: int) -> Iterator[bytes]:
    # Mode "1" is the one mode whose array is not the raw packing: numpy sees one 0/255 byte per
    # pixel, which is Pillow's "L" raw packing of the same image.
    rawmode = "L" if image.mode == "1" else image.mode
    encoder = Image._getencoder(image.mode, "raw", rawmode)
    try:
        encoder.setimage(image.im, (0, 0, *image.size))
        bufsize = max(_STRIP_BYTES // linesize, 1) * linesize
        while True:
            _, status, data = encoder.encode(bufsize)
            if status < 0:
                raise HashingTypeError(
                    f"Pillow could not pack the pixels of a {image.mode!r} image (encoder status {status}); "
                    "convert the image to RGB first, or pass its encoded bytes in a MediaWithBytes."
                )
            yield data
            if status:
                return
    finally:
        encoder.cleanup()
