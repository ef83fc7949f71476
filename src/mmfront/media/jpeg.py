"""JPEG pixels straight from libjpeg-turbo into numpy (simplejpeg), where that gives Pillow's pixels.

Pillow decodes a JPEG into its own 4-bytes-per-pixel memory, and ``np.asarray`` then packs it to
RGB: about 1.3x the CPU of simplejpeg, which decodes into a uint8 HWC array directly with the same
IDCT (islow) and upsampling (fancy). The pixels are Pillow's bit for bit only for the JPEGs both
libraries decode alike, so a marker scan of the header (a few microseconds) admits exactly those:

* 8-bit baseline, extended or progressive Huffman (SOF0, SOF1, SOF2); restart markers are fine;
* one component (grayscale), or three with the ids 1, 2, 3 that mark YCbCr, subsampled 4:4:4,
  4:2:2 or 4:2:0 (the layouts ``tests/media/test_jpeg.py`` proves against Pillow);
* no Adobe APP14 segment (it can switch the colour transform off, or mark CMYK/YCCK).

EXIF orientation is the loader's business (it admits only upright images here); an ICC profile
is carried by neither library into the pixels. Anything else, and any error or warning
libjpeg-turbo reports (``strict``), returns None: the caller decodes with Pillow, so corrupt
bytes keep Pillow's errors.
"""

from __future__ import annotations

import numpy as np
import simplejpeg

from mmfront.wire.warm import warm_memory

__all__ = ["decode_jpeg_rgb"]

_SOF_DECODED = frozenset({0xC0, 0xC1, 0xC2})
"""Baseline, extended sequential and progressive Huffman frames."""
_SOF_OTHER = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
"""Lossless, hierarchical and arithmetic-coded frames: left to Pillow."""
_APP14 = 0xEE
_SOS = 0xDA
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
_YCBCR_IDS = (1, 2, 3)
_LUMA_SAMPLING = frozenset({(1, 1), (2, 1), (2, 2)})
"""4:4:4, 4:2:2 and 4:2:0, with both chroma components sampled 1x1."""


def decode_jpeg_rgb(payload: bytes) -> np.ndarray | None:
    """``payload``'s pixels as a uint8 (height, width, 3) RGB array equal to
    ``np.asarray(Image.open(payload).convert("RGB"))``, or None where they might not be (then
    Pillow decodes it). Decoded into warm memory (:func:`~mmfront.wire.warm.warm_memory`): a miss's
    pixels are dropped once resized, and fresh pages for them cost more than the decode's copy."""
    if not _decodes_like_pillow(payload):
        return None
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(payload)
        return simplejpeg.decode_jpeg(payload, colorspace="RGB", fastdct=False, fastupsample=False, strict=True,
                                      buffer=warm_memory(height * width * 3))
    except Exception:  # any error, or a warning raised as one: Pillow decodes, and reports it as it always has
        return None


def _decodes_like_pillow(payload: bytes) -> bool:
    """Whether the segments before the first scan describe a JPEG admitted above."""
    if payload[:2] != b"\xff\xd8":
        return False
    pos, end = 2, len(payload)
    frame_ok = False
    while pos + 4 <= end:
        if payload[pos] != 0xFF:
            return False
        marker = payload[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        length = int.from_bytes(payload[pos + 2:pos + 4], "big")
        if length < 2 or pos + 2 + length > end:
            return False
        if marker == _APP14 or marker in _SOF_OTHER:
            return False
        if marker in _SOF_DECODED:
            if frame_ok:
                return False
            frame_ok = _frame_decodes_like_pillow(payload[pos + 4:pos + 2 + length])
            if not frame_ok:
                return False
        elif marker == _SOS:
            return frame_ok
        pos += 2 + length
    return False


def _frame_decodes_like_pillow(frame: bytes) -> bool:
    """An SOF segment's body: precision, height, width, then (id, sampling, table) per component."""
    if len(frame) < 6 or frame[0] != 8:
        return False
    count = frame[5]
    if len(frame) != 6 + 3 * count:
        return False
    if count == 1:
        return True
    if count != 3:
        return False
    ids = tuple(frame[6 + 3 * i] for i in range(3))
    sampling = [(frame[7 + 3 * i] >> 4, frame[7 + 3 * i] & 0x0F) for i in range(3)]
    return ids == _YCBCR_IDS and sampling[0] in _LUMA_SAMPLING and sampling[1] == sampling[2] == (1, 1)
