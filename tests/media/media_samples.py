"""Encoders for media test inputs: real files built in memory, plus hand-made broken ones.

Seeded images and PCM WAVs come from :mod:`mmfront.testing.media`."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

from mmfront.testing.media import make_image, wav_bytes


def encode(image: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR announces ``width`` x ``height`` but whose data is a stub: enough for a
    header read, never decodable."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(b"\x00" * 16))


def png_with_late_exif(image: Image.Image, orientation: int) -> bytes:
    """``image`` as PNG with an ``eXIf`` chunk after the pixel data (just before IEND)."""
    data = encode(image, "PNG")
    iend = data.rindex(b"IEND") - 4
    return data[:iend] + png_chunk(b"eXIf", exif_bytes(orientation)) + data[iend:]


def float_wav_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    """A WAV with IEEE-float samples (format tag 3), which the ``wave`` module does not read."""
    data = np.asarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


PNG_32 = encode(make_image(32, 32), "PNG")
WAV_1S = wav_bytes(np.arange(16000, dtype=np.int16) % 200 - 100, 16000)
SLOW_SECONDS = 1.0
"""How long the test server's slow route waits before answering."""
