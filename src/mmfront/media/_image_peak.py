"""The peak memory of decoding an image, known from its header before any pixel is decoded.

The decode budget is charged with this peak, so the memory a request can make a process spend is
what ``max_media_request_decode_bytes`` allows, whatever the format or the mode conversion. A
decode goes through three stages and the charge is the largest of them:

1. decoding: the decoded image plus what the decoder stages beside it;
2. the EXIF transposition, if any: two images of the decoded mode;
3. the mode conversion: the source image plus every image the conversion creates.

Pillow keeps a 1-band image at 1, 2 or 4 bytes a pixel (``L``/``P``/``1``, ``I;16``, ``I``/``F``)
and every multi-band mode at 4 (``RGB`` included). What decoders stage was measured with Pillow 13
as the peak RSS of decoding one 12-megapixel image per case (the table is in docs/media.md).
"""

from __future__ import annotations

import math

from PIL import Image, ImageMode

_STAGING_PER_PIXEL = {"PNG": 0, "GIF": 0, "TGA": 0, "PPM": 0, "WEBP": 12, "AVIF": 6}
"""Bytes a pixel decoders hold beside the image. PNG, GIF, TGA and PPM decode into the image row
by row; libwebp holds two RGBA canvases and Pillow copies the frame out of them; libavif holds
its YUV planes."""

_STAGING_PER_ENCODED_BYTE = {"WEBP": 2, "AVIF": 2}
"""Copies of the encoded payload a decoder makes (Pillow reads it into bytes, the library keeps
its own)."""

_JPEG_ROW_BUFFERS = 64
"""Rows of the image's width (4 bytes a pixel) libjpeg's and Pillow's row buffers add up to."""

_BMP_RLE_STAGING = 3
"""Pillow's RLE decoder (Python) grows a bytearray of one byte a pixel, then copies it."""

_OTHER_STAGING = 20
"""Formats outside the measured ones (only ever allowed by configuration): a bound above the
worst measured, JPEG 2000's four-byte planes (16 bytes a pixel for RGB)."""

_BMP_RLE = frozenset({1, 2})
_JPEG_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})
_TIFF_COMPRESSION, _TIFF_BITS, _TIFF_SAMPLES, _TIFF_ROWS_PER_STRIP = 259, 258, 277, 278
_TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH = 322, 323


def pixel_bytes(mode: str) -> int:
    """Bytes a pixel of ``mode`` takes in a Pillow image."""
    try:
        described = ImageMode.getmode(mode)
    except KeyError:
        return 4
    if len(described.bands) > 1:
        return 4
    return int(described.typestr[-1])


def conversion_bytes_per_pixel(source_mode: str, target_mode: str | None, alpha: bool) -> int:
    """Bytes a pixel of the images :func:`~mmfront.media.image.convert_image_mode` creates:
    compositing onto a background makes an RGBA copy (unless the source is one), the RGB result
    and the alpha band; any other conversion makes its result only."""
    if target_mode is None or target_mode == source_mode:
        return 0
    if target_mode == "RGB" and alpha:
        return (0 if source_mode == "RGBA" else pixel_bytes("RGBA")) + pixel_bytes("RGB") + 1
    return pixel_bytes(target_mode)


def decode_peak_bytes(header: Image.Image, payload: bytes, *, transposed: bool, target_mode: str | None,
                      alpha: bool) -> int:
    """The most bytes decoding ``header``'s image holds at once (see the module docstring)."""
    width, height = header.size
    pixels = width * height
    decoded = pixels * pixel_bytes(header.mode)
    stages = [
        decoded + decoder_staging_bytes(header, payload),
        2 * decoded if transposed else 0,
        decoded + pixels * conversion_bytes_per_pixel(header.mode, target_mode, alpha),
    ]
    if header.format in ("JPEG", "MPO"):
        # libjpeg's row buffers: freed after the decode, but the allocator keeps them for later stages.
        return max(stages) + _JPEG_ROW_BUFFERS * (math.ceil(width / 16) * 16) * 4
    return max(stages)


def decoder_staging_bytes(header: Image.Image, payload: bytes) -> int:
    """Bytes the decoder of ``header``'s format holds beside the decoded image at its peak."""
    width, height = header.size
    fmt = header.format or ""
    if fmt in _STAGING_PER_PIXEL:
        return _STAGING_PER_PIXEL[fmt] * width * height + _STAGING_PER_ENCODED_BYTE.get(fmt, 0) * len(payload)
    if fmt in ("JPEG", "MPO"):
        return _jpeg_coefficient_bytes(header) if _jpeg_buffers_coefficients(payload) else 0
    if fmt == "BMP":
        return _BMP_RLE_STAGING * width * height if header.info.get("compression") in _BMP_RLE else 0
    if fmt == "TIFF":
        return _tiff_staging_bytes(header)
    return _OTHER_STAGING * width * height


def _jpeg_coefficient_bytes(header: Image.Image) -> int:
    """libjpeg's whole-image coefficient buffer: 2 bytes for each DCT coefficient of each
    component at its sampling, in whole 8x8 blocks."""
    width, height = header.size
    layers = getattr(header, "layer", None) or [("", 1, 1, 0)] * len(header.getbands())
    h_max = max(layer[1] for layer in layers) or 1
    v_max = max(layer[2] for layer in layers) or 1
    total = 0
    for _, h, v, _ in layers:
        blocks_w = math.ceil(math.ceil(width * h / h_max) / 8) + h_max
        blocks_h = math.ceil(math.ceil(height * v / v_max) / 8) + v_max
        total += blocks_w * blocks_h * 64 * 2
    return total


def _jpeg_buffers_coefficients(payload: bytes) -> bool:
    """Whether libjpeg must buffer the whole image's coefficients: a progressive file, or a
    sequential one whose first scan does not hold every component (so more scans follow).
    Walks the marker segments up to the first scan; an unreadable header counts as buffering."""
    pos, end, components = 2, len(payload), 0
    while pos + 4 <= end:
        if payload[pos] != 0xFF:
            return True
        marker = payload[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in _JPEG_STANDALONE:
            pos += 2
            continue
        if marker in _JPEG_PROGRESSIVE_SOF:
            return True
        if marker in _JPEG_SOF and pos + 10 <= end:
            components = payload[pos + 9]
        if marker == 0xDA:
            return pos + 5 > end or payload[pos + 4] < components
        pos += 2 + int.from_bytes(payload[pos + 2:pos + 4], "big")
    return True


def _tiff_staging_bytes(header: Image.Image) -> int:
    """libtiff decodes a compressed TIFF a strip or a tile at a time into a buffer of that
    strip's or tile's raw size (at least 4 bytes a pixel: YCbCr is unpacked to RGBA), and a tile
    may be larger than the image. Uncompressed TIFFs are read in small blocks."""
    tags = getattr(header, "tag_v2", {})
    if tags.get(_TIFF_COMPRESSION, 1) == 1:
        return 0
    width, height = header.size
    bits = tags.get(_TIFF_BITS, (8,))
    bits_per_sample = max(bits) if isinstance(bits, tuple) and bits else int(bits or 8)
    samples = int(tags.get(_TIFF_SAMPLES, 1) or 1)
    raw_pixel = max(4, samples * math.ceil(bits_per_sample / 8))
    if _TIFF_TILE_WIDTH in tags and _TIFF_TILE_LENGTH in tags:
        return int(tags[_TIFF_TILE_WIDTH]) * int(tags[_TIFF_TILE_LENGTH]) * raw_pixel
    rows = min(int(tags.get(_TIFF_ROWS_PER_STRIP, height) or height), height)
    return rows * width * raw_pixel
