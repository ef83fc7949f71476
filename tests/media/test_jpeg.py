"""JPEGs decoded by libjpeg-turbo straight into numpy (:mod:`mmfront.media.jpeg`): Pillow's pixels
bit for bit on every JPEG the header scan admits, Pillow's decode (and its errors) for every other,
and the item's hash and pixels unchanged either way. The JPEGs are written by Pillow here."""

from __future__ import annotations

import io
import struct
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from media_samples import encode, exif_bytes
from PIL import Image

from mmfront.config import MultiModalConfig
from mmfront.errors import InputTypeError, MediaDecodeError
from mmfront.hashing import MultiModalHasher
from mmfront.media import DecodeBudget, load_image_bytes
from mmfront.media import image as image_module
from mmfront.media.base import MediaWithBytes
from mmfront.media.jpeg import decode_jpeg_rgb


def _picture(width: int, height: int, seed: int, channels: int = 3) -> Image.Image:
    """Gradients with noise: edges and flat parts for every block size, and a file Pillow's
    encoder buffers at any size (pure noise at quality 95 overflows its progressive buffer)."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    planes = [(ys * (3 + c) + xs * (2 + 2 * c) + 40 * c) % 256 for c in range(channels)]
    pixels = np.stack(planes, axis=-1) + rng.integers(0, 60, (height, width, channels))
    array = pixels.clip(0, 255).astype(np.uint8)
    return Image.fromarray(array[..., 0] if channels == 1 else array)


def _pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


SIZES = [(1, 1), (17, 9), (9, 17), (64, 48), (1023, 767)]
CORPUS = [
    pytest.param((w, h), params, id=f"{w}x{h}-{name}")
    for (w, h) in SIZES
    for name, params in [
        ("444-q95", {"subsampling": 0, "quality": 95}),
        ("422-q50", {"subsampling": 1, "quality": 50}),
        ("420-q75", {"subsampling": 2, "quality": 75}),
        ("420-progressive", {"subsampling": 2, "quality": 90, "progressive": True}),
        ("444-progressive-q50", {"subsampling": 0, "quality": 50, "progressive": True}),
    ]
]


@pytest.mark.parametrize(("size", "params"), CORPUS)
def test_colour_jpegs_decode_to_pillows_pixels(size: tuple[int, int], params: dict[str, Any]) -> None:
    data = encode(_picture(*size, seed=size[0]), "JPEG", **params)
    pixels = decode_jpeg_rgb(data)
    assert pixels is not None, "the scan must admit a plain Pillow-written JPEG"
    assert pixels.dtype == np.uint8 and pixels.shape == (size[1], size[0], 3)
    assert np.array_equal(pixels, _pillow_rgb(data))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("quality", [50, 95])
def test_grayscale_jpegs_decode_to_pillows_rgb_pixels(size: tuple[int, int], quality: int) -> None:
    data = encode(_picture(*size, seed=7, channels=1), "JPEG", quality=quality)
    pixels = decode_jpeg_rgb(data)
    assert pixels is not None and pixels.shape == (size[1], size[0], 3)
    assert np.array_equal(pixels, _pillow_rgb(data))


@pytest.mark.parametrize("params", [{"restart_marker_blocks": 1}, {"restart_marker_rows": 2, "progressive": True},
                                   {"icc_profile": b"\0" * 128}, {"exif": exif_bytes(1)},
                                   {"comment": "a COM segment", "dpi": (300, 300)}],
                         ids=["restarts", "restarts-progressive", "icc", "exif-upright", "com-dpi"])
def test_segments_that_leave_pixels_alone_are_admitted(params: dict[str, Any]) -> None:
    data = encode(_picture(130, 100, seed=3), "JPEG", quality=90, **params)
    pixels = decode_jpeg_rgb(data)
    assert pixels is not None
    assert np.array_equal(pixels, _pillow_rgb(data))


def _with_segment(data: bytes, marker: int, body: bytes) -> bytes:
    """``data`` with one more segment right after SOI."""
    return data[:2] + bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body + data[2:]


def _sof_components(data: bytes) -> int:
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC1, 0xC2):
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return data[pos + 9]


ADOBE_YCBCR = b"Adobe" + struct.pack(">HHHB", 100, 0, 0, 1)


@pytest.mark.parametrize("data", [
    pytest.param(encode(Image.new("CMYK", (16, 16), (10, 20, 30, 40)), "JPEG"), id="cmyk"),
    pytest.param(_with_segment(encode(_picture(16, 16, seed=1), "JPEG"), 0xEE, ADOBE_YCBCR), id="adobe-app14"),
    pytest.param(encode(_picture(16, 16, seed=1), "PNG"), id="png"),
    pytest.param(b"\xff\xd8\xff", id="three-bytes"),
    pytest.param(encode(_picture(16, 16, seed=1), "JPEG")[:20], id="no-frame"),
])
def test_what_the_scan_cannot_vouch_for_is_left_to_pillow(data: bytes) -> None:
    assert decode_jpeg_rgb(data) is None


MUTATED = [encode(_picture(56, 40, seed=11), "JPEG", quality=90),
           encode(_picture(56, 40, seed=12), "JPEG", quality=60, progressive=True),
           encode(_picture(56, 40, seed=13), "JPEG", quality=80, subsampling=0, restart_marker_blocks=2)]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MUTATED), st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                                          min_size=1, max_size=3))
def test_damaged_jpegs_decode_to_pillows_pixels_or_are_left_to_pillow(data: bytes,
                                                                      damage: list[tuple[float, int]]) -> None:
    damaged = bytearray(data)
    for where, value in damage:
        damaged[int(where * len(damaged))] = value
    pixels = decode_jpeg_rgb(bytes(damaged))
    if pixels is not None:  # then Pillow decodes the same bytes, to the same pixels
        assert np.array_equal(pixels, _pillow_rgb(bytes(damaged)))


def test_a_frame_that_is_not_ycbcr_by_its_ids_is_left_to_pillow() -> None:
    data = bytearray(encode(_picture(16, 16, seed=1), "JPEG"))
    assert _sof_components(bytes(data)) == 3
    sof = bytes(data).index(b"\xff\xc0")
    data[sof + 10] = ord("R")  # the first component's id: libjpeg may then take the frame for RGB
    assert decode_jpeg_rgb(bytes(data)) is None


# --- through the loader ------------------------------------------------------------------------


def _load(data: bytes, config: MultiModalConfig, **kwargs: Any) -> MediaWithBytes[Image.Image]:
    return load_image_bytes(data, config=config, budget=DecodeBudget(1 << 30), **kwargs)


def _pillow_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_module, "decode_jpeg_rgb", lambda payload: None)


def test_a_large_decode_lands_in_a_warm_block_and_gives_pillows_pixels() -> None:
    """A 1024x768 image's 2.4 MB of pixels are a view of a block of the process's warm memory
    (:func:`mmfront.wire.warm.warm_memory`), taken back once dropped; a small one's are its own."""
    data = encode(_picture(1024, 768, seed=7), "JPEG", quality=90)
    pixels = decode_jpeg_rgb(data)
    assert pixels is not None and pixels.shape == (768, 1024, 3)
    assert isinstance(_backing(pixels), memoryview)  # a block's memory
    assert np.array_equal(pixels, _pillow_rgb(data))
    small = decode_jpeg_rgb(encode(_picture(40, 30, seed=7), "JPEG", quality=90))
    assert small is not None and _backing(small) is None  # an array of its own


def _backing(array: np.ndarray) -> object:
    """What holds an array's memory at the end of its chain of bases (None: the array itself)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base


def _digest(item: object) -> str:
    return MultiModalHasher.hash_kwargs("blake3", model_id="m", image=item)


def test_a_plain_jpeg_item_holds_pixels_and_makes_its_pil_image_once(config: MultiModalConfig) -> None:
    data = encode(_picture(40, 30, seed=5), "JPEG", quality=85)
    item = _load(data, config)
    assert not item.is_decoded and item.pixels is not None
    assert item.is_decoded and item.decode_count == 1 and repr(item).startswith("MediaWithBytes(pixels,")
    assert np.array_equal(np.asarray(item), item.pixels)  # no PIL image needed for the array
    assert repr(item).startswith("MediaWithBytes(pixels,")
    image = item.media
    assert image.mode == "RGB" and image.size == (40, 30) and item.media is image
    assert np.array_equal(np.asarray(image), _pillow_rgb(data))
    assert item.decode_count == 1 and item.exif_image_uuid() is None


@pytest.mark.parametrize(("image", "params", "options"), [
    pytest.param(_picture(40, 30, seed=2), {"quality": 90}, None, id="rgb"),
    pytest.param(_picture(40, 30, seed=2, channels=1), {"quality": 90}, None, id="grayscale-to-rgb"),
    pytest.param(_picture(40, 30, seed=2), {"exif": Image.Exif().tobytes()}, {"image_mode": None}, id="rgb-kept"),
])
def test_hashes_and_pixels_are_those_of_pillows_decode(monkeypatch: pytest.MonkeyPatch, config: MultiModalConfig,
                                                       image: Image.Image, params: dict[str, Any],
                                                       options: dict[str, Any] | None) -> None:
    data = encode(image, "JPEG", **params)
    kwargs = {"media_io_kwargs": {"image": options}} if options else {}
    fast = _load(data, config, **kwargs)
    before_decode = _digest(fast)
    assert fast.pixels is not None
    with monkeypatch.context() as patch:
        _pillow_only(patch)
        slow = _load(data, config, **kwargs)
        assert slow.pixels is None
    assert fast.io_config == slow.io_config and fast.info == slow.info
    assert _digest(fast) == before_decode == _digest(slow)
    assert np.array_equal(np.asarray(fast.media), np.asarray(slow.media)) and fast.media.mode == slow.media.mode


def _exif_image_id() -> bytes:
    exif = Image.Exif()
    exif[0x800D] = str(uuid.UUID(int=7))  # EXIF read from bytes is text: never vLLM's in-memory UUID rule
    return exif.tobytes()


@pytest.mark.parametrize(("data", "options", "fast"), [
    pytest.param(encode(_picture(30, 20, seed=4), "JPEG", exif=exif_bytes(6)), None, False, id="exif-orientation"),
    pytest.param(encode(_picture(30, 20, seed=4), "JPEG", exif=_exif_image_id()), None, True, id="exif-image-id"),
    pytest.param(encode(Image.new("CMYK", (30, 20), (10, 200, 30, 40)), "JPEG"), None, False, id="cmyk"),
    pytest.param(_with_segment(encode(_picture(30, 20, seed=4), "JPEG"), 0xEE, ADOBE_YCBCR), None, False,
                 id="adobe-app14"),
    pytest.param(encode(_picture(30, 20, seed=4, channels=1), "JPEG"), {"image_mode": "L"}, False, id="gray-kept"),
    pytest.param(encode(_picture(30, 20, seed=4, channels=1), "JPEG"), {"image_mode": None}, False,
                 id="gray-mode-none"),
    pytest.param(encode(_picture(30, 20, seed=4), "JPEG"), {"image_mode": "L"}, False, id="rgb-to-l"),
])
def test_each_fallback_gives_pillows_item(monkeypatch: pytest.MonkeyPatch, config: MultiModalConfig, data: bytes,
                                          options: dict[str, Any] | None, fast: bool) -> None:
    kwargs = {"media_io_kwargs": {"image": options}} if options else {}
    item = _load(data, config, **kwargs)
    assert (item.pixels is not None) is fast
    with monkeypatch.context() as patch:
        _pillow_only(patch)
        slow = _load(data, config, **kwargs)
    assert _digest(item) == _digest(slow) and item.info == slow.info
    assert np.array_equal(np.asarray(item.media), np.asarray(slow.media)) and item.media.mode == slow.media.mode
    assert item.exif_image_uuid() is None


def test_an_mpo_is_decoded_by_pillow(config: MultiModalConfig) -> None:
    buffer = io.BytesIO()
    _picture(30, 20, seed=1).save(buffer, format="MPO", save_all=True, append_images=[_picture(30, 20, seed=2)])
    item = _load(buffer.getvalue(), config)
    assert item.info["format"] == "MPO" and item.pixels is None
    with Image.open(io.BytesIO(buffer.getvalue())) as first:
        assert np.array_equal(np.asarray(item.media), np.asarray(first.convert("RGB")))


def _error_of(data: bytes, config: MultiModalConfig) -> tuple[type[Exception], str]:
    with pytest.raises(MediaDecodeError) as caught:
        _load(data, config, lazy=False)
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_bytes_raise_pillows_error(monkeypatch: pytest.MonkeyPatch, config: MultiModalConfig,
                                             cut: float) -> None:
    data = encode(_picture(64, 48, seed=9), "JPEG", quality=90)
    truncated = data[:int(len(data) * cut)]
    assert decode_jpeg_rgb(truncated) is None  # libjpeg-turbo's warning, raised (strict): Pillow decides
    got = _error_of(truncated, config)
    with monkeypatch.context() as patch:
        _pillow_only(patch)
        assert got == _error_of(truncated, config)
    assert "truncated or corrupt" in got[1]


def test_corrupt_scan_data_gives_what_pillow_gives(monkeypatch: pytest.MonkeyPatch, config: MultiModalConfig) -> None:
    data = bytearray(encode(_picture(64, 48, seed=9), "JPEG", quality=90))
    sos = bytes(data).index(b"\xff\xda")
    for offset in range(sos + 40, len(data) - 40, 97):
        data[offset] = 0xFF  # markers where entropy-coded data should be
    item = _load(bytes(data), config)
    with monkeypatch.context() as patch:
        _pillow_only(patch)
        slow = _load(bytes(data), config)
    try:
        want = np.asarray(slow.media)
    except MediaDecodeError as exc:
        with pytest.raises(MediaDecodeError, match="truncated or corrupt") as caught:
            _ = item.media
        assert str(caught.value) == str(exc)
    else:
        assert np.array_equal(np.asarray(item.media), want)


def test_decode_pixels_needs_a_decode_to_fall_back_on() -> None:
    with pytest.raises(InputTypeError, match="decode_pixels"):
        MediaWithBytes(Image.new("RGB", (1, 1)), b"x", decode_pixels=lambda: None)
