"""PNGs inflated by ISA-L: the decoded image must be Pillow's own, pixel for pixel, for every colour
type, bit depth and row filter; files outside the plain case go to Pillow and keep its results and
errors; the decode holds no more memory than the budget charges."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path
from typing import IO, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from local_services import measure_decode_peak, within_decode_charge
from mmfront.config import MultiModalConfig
from mmfront.errors import MediaDecodeError
from mmfront.media import DecodeBudget, load_image_bytes
from mmfront.media.png_inflate import _ReinflatedPng, decode_png
from mmfront.testing.media import natural_image

_COMBOS = [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 2), (3, 4), (3, 8),
           (4, 8), (4, 16), (6, 8), (6, 16)]
"""Every (colour type, bit depth) the PNG standard allows."""
_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(width: int, height: int, colour: int, depth: int, scanlines: bytes, *, interlace: int = 0,
         idat_size: int = 1 << 16, before_idat: bytes = b"", between_idat: bytes = b"") -> bytes:
    """A PNG file around ``scanlines`` (each row: its filter byte, then its bytes), image data
    split into IDAT chunks of ``idat_size`` bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    plte = _chunk(b"PLTE", bytes(range(256)) * 3) if colour == 3 else b""
    stream = zlib.compress(scanlines)
    idats = [_chunk(b"IDAT", stream[i:i + idat_size]) for i in range(0, len(stream), idat_size)]
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + plte + before_idat + idats[0] + between_idat
            + b"".join(idats[1:]) + _chunk(b"IEND", b""))


def _random_scanlines(width: int, height: int, colour: int, depth: int, seed: int) -> bytes:
    """Rows of random bytes behind random filter types (0-4): every unfiltering path."""
    rng = np.random.default_rng(seed)
    row_bytes = (width * _SAMPLES[colour] * depth + 7) // 8
    rows = rng.integers(0, 256, (height, 1 + row_bytes), dtype=np.uint8)
    rows[:, 0] = rng.integers(0, 5, height)
    return rows.tobytes()


def _pillow(payload: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(payload), formats=("PNG",))
    image.load()
    return image


def _reinflated(payload: bytes) -> Image.Image:
    """The fast path alone, without the fallback to Pillow's decode that hides its failures."""
    stream = _ReinflatedPng.of(payload)
    assert stream is not None
    image = Image.open(cast(IO[bytes], stream), formats=("PNG",))
    image.load()
    return image


def _assert_same(image: Image.Image, expected: Image.Image) -> None:
    assert (image.mode, image.size) == (expected.mode, expected.size)
    assert image.tobytes() == expected.tobytes()
    assert image.info.get("transparency") == expected.info.get("transparency")
    if expected.mode == "P":
        assert image.getpalette() == expected.getpalette()


# --- Pillow's pixels, exactly ------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(combo=st.sampled_from(_COMBOS), width=st.integers(1, 40), height=st.integers(1, 12),
       seed=st.integers(0, 2**32 - 1), idat_size=st.sampled_from([1, 7, 1000, 1 << 16]))
def test_every_colour_type_depth_and_filter_decodes_to_pillows_pixels(
    combo: tuple[int, int], width: int, height: int, seed: int, idat_size: int,
) -> None:
    colour, depth = combo
    payload = _png(width, height, colour, depth, _random_scanlines(width, height, colour, depth, seed),
                   idat_size=idat_size)
    _assert_same(_reinflated(payload), _pillow(payload))


_MODES = ["RGB", "RGBA", "L", "LA", "1", "I;16", "P", "P-transparent", "P-4bit"]


@settings(max_examples=80, deadline=None)
@given(mode=st.sampled_from(_MODES), width=st.integers(1, 64), height=st.integers(1, 48),
       seed=st.integers(0, 2**32 - 1), level=st.integers(0, 9))
def test_images_pillow_writes_decode_to_its_own_pixels(mode: str, width: int, height: int, seed: int,
                                                        level: int) -> None:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    params: dict[str, object] = {"compress_level": level}
    if mode.startswith("P"):
        image = Image.fromarray(pixels[..., :3]).quantize(16 if mode == "P-4bit" else 256)
        params.update({"transparency": 3} if mode == "P-transparent" else {"bits": 4} if mode == "P-4bit" else {})
    elif mode == "I;16":
        image = Image.fromarray(pixels[..., 0].astype(np.uint16) * 257)
    elif mode == "1":
        image = Image.fromarray(pixels[..., 0]).convert("1")
    else:
        channels = len(Image.new(mode, (1, 1)).getbands())
        image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels[..., :channels], mode)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **params)
    payload = buffer.getvalue()
    _assert_same(_reinflated(payload), _pillow(payload))


def test_a_photo_like_1024px_png_decodes_to_pillows_pixels() -> None:
    buffer = io.BytesIO()
    natural_image(tag=7).save(buffer, format="PNG")
    payload = buffer.getvalue()
    assert _ReinflatedPng.of(payload) is not None
    _assert_same(decode_png(payload), _pillow(payload))


def test_chunks_after_the_image_data_are_read_as_pillow_reads_them() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    payload = _png(5, 4, 2, 8, _random_scanlines(5, 4, 2, 8, seed=1))
    payload = payload[:-12] + _chunk(b"eXIf", exif.tobytes()) + _chunk(b"tEXt", b"Comment\x00hi") + payload[-12:]
    image, expected = _reinflated(payload), _pillow(payload)
    _assert_same(image, expected)
    assert image.info["Comment"] == "hi" and image.getexif()[0x0112] == 6


def test_load_image_bytes_gives_pillows_pixels_through_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = _png(33, 17, 6, 16, _random_scanlines(33, 17, 6, 16, seed=2))
    opened: list[bool] = []
    real_of = _ReinflatedPng.of

    def counting_of(data: bytes) -> _ReinflatedPng | None:
        stream = real_of(data)
        opened.append(stream is not None)
        return stream

    monkeypatch.setattr(_ReinflatedPng, "of", staticmethod(counting_of))
    item = load_image_bytes(payload, config=MultiModalConfig(), budget=DecodeBudget(1 << 30),
                            media_io_kwargs={"image": {"image_mode": None}})
    assert item.media.tobytes() == _pillow(payload).tobytes()
    assert opened == [True]


def test_the_stand_in_file_reads_forward_only() -> None:
    stream = _ReinflatedPng.of(_png(4, 4, 0, 8, _random_scanlines(4, 4, 0, 8, seed=3)))
    assert stream is not None
    assert stream.read(8) == b"\x89PNG\r\n\x1a\n"
    assert stream.seek(0) == 0  # still inside the piece being read
    stream.read(1000)
    with pytest.raises(io.UnsupportedOperation, match="forward only"):
        stream.seek(0)


# --- outside the plain case: Pillow decodes the original bytes ---------------------------------------


def _interlaced() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (1, 1), 77).save(buffer, format="PNG")
    plain = buffer.getvalue()
    ihdr = bytearray(plain[16:29])
    ihdr[12] = 1  # Adam7: a 1x1 image is its first pass alone, so the data stays valid
    return plain[:8] + _chunk(b"IHDR", bytes(ihdr)) + plain[33:]


def _animated() -> bytes:
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (6, 5), colour) for colour in ("red", "blue")]
    frames[0].save(buffer, format="PNG", save_all=True, append_images=frames[1:])
    return buffer.getvalue()


@pytest.mark.parametrize("payload", [
    pytest.param(_interlaced(), id="interlaced"),
    pytest.param(_animated(), id="animated"),
    pytest.param(_png(9, 30, 2, 8, _random_scanlines(9, 30, 2, 8, seed=4), idat_size=100,
                      between_idat=_chunk(b"tEXt", b"a\x00b")), id="image-data-not-contiguous"),
    pytest.param(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 5, 0, 0, 0)),
                 id="colour-type-5"),
    pytest.param(_png(8, 8, 0, 8, _random_scanlines(8, 8, 0, 8, seed=8))[:-20], id="truncated-in-image-data"),
])
def test_files_outside_the_plain_case_are_left_to_pillow(payload: bytes) -> None:
    assert _ReinflatedPng.of(payload) is None
    try:
        expected = _pillow(payload)
    except Exception as exc:
        with pytest.raises(type(exc)):
            decode_png(payload)
    else:
        _assert_same(decode_png(payload), expected)


def test_image_data_longer_than_the_image_gives_pillows_image() -> None:
    rows = _random_scanlines(7, 5, 2, 8, seed=5)
    payload = _png(7, 5, 2, 8, rows + bytes(22))  # one row too many
    assert _ReinflatedPng.of(payload) is not None
    _assert_same(decode_png(payload), _pillow(payload))


def test_image_data_shorter_than_the_image_gives_pillows_result() -> None:
    rows = _random_scanlines(7, 5, 2, 8, seed=6)
    payload = _png(7, 5, 2, 8, rows[:-22])  # one row short: Pillow leaves that row black
    with pytest.raises(ValueError, match="inflates to 88 of 110 bytes"):
        _reinflated(payload)
    _assert_same(decode_png(payload), _pillow(payload))


def test_a_truncated_file_fails_as_in_pillow() -> None:
    whole = _png(30, 30, 2, 8, _random_scanlines(30, 30, 2, 8, seed=9), idat_size=500)
    payload = whole[:33 + 2 * 512]  # signature and IHDR, then two whole IDAT chunks of five
    assert _ReinflatedPng.of(payload) is not None
    with pytest.raises(OSError, match="truncated") as expected:
        _pillow(payload)
    with pytest.raises(OSError) as caught:
        decode_png(payload)
    assert str(caught.value) == str(expected.value)


def test_corrupt_image_data_is_a_typed_decode_error() -> None:
    stream = bytearray(zlib.compress(_random_scanlines(40, 40, 2, 8, seed=7)))
    stream[10:30] = bytes(range(200, 220))
    ihdr = struct.pack(">IIBBBBB", 40, 40, 8, 2, 0, 0, 0)
    payload = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", bytes(stream)) + _chunk(b"IEND", b"")
    assert _ReinflatedPng.of(payload) is not None
    item = load_image_bytes(payload, config=MultiModalConfig(), budget=DecodeBudget(1 << 30))
    with pytest.raises(MediaDecodeError, match="Could not decode the PNG image") as caught:
        _ = item.media
    assert caught.value.parameter == "multi_modal_data"


# --- memory -------------------------------------------------------------------------------------------




@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's resettable peak RSS")
def test_the_measured_peak_of_an_rgb_png_stays_within_its_charge(tmp_path: Path) -> None:
    path = tmp_path / "photo.png"
    natural_image(2400, 2000).save(path, format="PNG")
    assert _ReinflatedPng.of(path.read_bytes()) is not None
    charged, measured = measure_decode_peak(path)
    assert charged == 2400 * 2000 * 4
    assert within_decode_charge(charged, measured), (charged, measured)
