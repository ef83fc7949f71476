from __future__ import annotations

import io
import uuid
import warnings

import numpy as np
import pytest
from media_samples import encode, exif_bytes, png_header_only, png_with_late_exif
from PIL import Image, ImageOps

from mmfront.config import MultiModalConfig
from mmfront.errors import (
    ConfigError,
    InputTypeError,
    MediaDecodeError,
    MediaFormatError,
    MediaTooLargeError,
    ValidationError,
)
from mmfront.media import (
    DecodeBudget,
    ImageIOOptions,
    convert_image_mode,
    load_image_bytes,
    normalize_pil_image,
    resolve_image_options,
)
from mmfront.testing.media import make_image


def _rgba_sample() -> Image.Image:
    """2x1 RGBA: a fully transparent red pixel, then a half-transparent orange one."""
    image = Image.new("RGBA", (2, 1))
    image.putpixel((0, 0), (255, 0, 0, 0))
    image.putpixel((1, 0), (200, 100, 50, 128))
    return image


# --- lazy loading -----------------------------------------------------------------------------


def test_rgb_png_loads_lazily_from_the_header(config: MultiModalConfig, budget: DecodeBudget) -> None:
    source = make_image(32, 24)
    data = encode(source)
    item = load_image_bytes(data, config=config, budget=budget)
    assert item.decode_count == 0
    assert not item.is_decoded
    assert item.info == {"format": "PNG", "width": 32, "height": 24, "mode": "RGB", "source_mode": "RGB"}
    assert item.io_config is None
    assert item.original_bytes == data
    assert budget.used_bytes == 32 * 24 * 4

    image = item.media
    assert item.decode_count == 1
    assert image.size == (32, 24) and image.mode == "RGB"
    assert np.array_equal(np.asarray(image), np.asarray(source))
    assert item.media is image
    assert item.decode_count == 1


def test_eager_load_decodes_once_and_gives_the_same_pixels(config: MultiModalConfig, budget: DecodeBudget) -> None:
    data = encode(make_image(16, 16, seed=3))
    eager = load_image_bytes(data, config=config, budget=budget, lazy=False)
    assert eager.decode_count == 1 and eager.is_decoded
    lazy = load_image_bytes(data, config=config, budget=budget)
    assert np.array_equal(np.asarray(eager.media), np.asarray(lazy.media))
    assert eager.info == lazy.info


def test_bytearray_and_memoryview_are_accepted(config: MultiModalConfig, budget: DecodeBudget) -> None:
    data = encode(make_image(8, 8))
    for wrapped in (bytearray(data), memoryview(data)):
        item = load_image_bytes(wrapped, config=config, budget=budget)
        assert item.original_bytes == data and isinstance(item.original_bytes, bytes)


# --- io_config and mode conversion ------------------------------------------------------------


def test_rgba_png_records_io_config_and_composites_on_white(config: MultiModalConfig, budget: DecodeBudget) -> None:
    item = load_image_bytes(encode(_rgba_sample()), config=config, budget=budget)
    assert item.io_config == {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}
    assert item.info["mode"] == "RGB" and item.info["source_mode"] == "RGBA"
    assert item.decode_count == 0
    assert list(item.media.getdata()) == [(255, 255, 255), (227, 177, 152)]


def test_black_background_gives_other_pixels_and_io_config(config: MultiModalConfig, budget: DecodeBudget) -> None:
    data = encode(_rgba_sample())
    white = load_image_bytes(data, config=config, budget=budget)
    black = load_image_bytes(data, config=config, budget=budget,
                             media_io_kwargs={"image": {"rgba_background_color": [0, 0, 0]}})
    assert black.io_config == {"image_mode": "RGB", "rgba_background_color": (0, 0, 0)}
    assert list(black.media.getdata()) == [(0, 0, 0), (100, 50, 25)]
    assert not np.array_equal(np.asarray(white.media), np.asarray(black.media))


def test_config_media_io_kwargs_apply_and_request_overrides_them(budget: DecodeBudget) -> None:
    config = MultiModalConfig(media_io_kwargs={"image": {"rgba_background_color": [0, 0, 255]}})
    data = encode(_rgba_sample())
    assert load_image_bytes(data, config=config, budget=budget).media.getpixel((0, 0)) == (0, 0, 255)
    item = load_image_bytes(data, config=config, budget=budget,
                            media_io_kwargs={"image": {"rgba_background_color": (0, 255, 0)}})
    assert item.media.getpixel((0, 0)) == (0, 255, 0)


def test_image_mode_none_keeps_the_decoded_mode(config: MultiModalConfig, budget: DecodeBudget) -> None:
    item = load_image_bytes(encode(_rgba_sample()), config=config, budget=budget,
                            media_io_kwargs={"image": {"image_mode": None}})
    assert item.io_config is None
    assert item.info["mode"] == "RGBA"
    assert item.media.mode == "RGBA"


def test_grayscale_png_converts_to_rgb_with_io_config(config: MultiModalConfig, budget: DecodeBudget) -> None:
    gray = Image.new("L", (4, 4), 77)
    item = load_image_bytes(encode(gray), config=config, budget=budget)
    assert item.io_config == {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}
    assert item.media.mode == "RGB" and item.media.getpixel((0, 0)) == (77, 77, 77)


def test_palette_transparency_is_composited(config: MultiModalConfig, budget: DecodeBudget) -> None:
    palette_image = Image.new("P", (2, 1))
    palette_image.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    palette_image.putpixel((0, 0), 0)
    palette_image.putpixel((1, 0), 1)
    data = encode(palette_image, transparency=0)
    item = load_image_bytes(data, config=config, budget=budget,
                            media_io_kwargs={"image": {"rgba_background_color": [10, 20, 30]}})
    assert list(item.media.getdata()) == [(10, 20, 30), (0, 255, 0)]


def test_la_image_is_composited(budget: DecodeBudget, config: MultiModalConfig) -> None:
    image = Image.new("LA", (1, 1), (90, 0))
    item = load_image_bytes(encode(image), config=config, budget=budget)
    assert item.media.getpixel((0, 0)) == (255, 255, 255)


def test_convert_image_mode_returns_the_same_object_when_nothing_changes() -> None:
    image = make_image(4, 4)
    assert convert_image_mode(image, "RGB") is image
    assert convert_image_mode(image, None) is image
    assert convert_image_mode(image, "L").mode == "L"
    assert convert_image_mode(Image.new("RGBA", (1, 1), (9, 9, 9, 0)), "L").getpixel((0, 0)) == 9


def test_io_options_for() -> None:
    options = ImageIOOptions("RGB", (1, 2, 3))
    assert options.io_config_for("RGB") is None
    assert options.io_config_for("P") == {"image_mode": "RGB", "rgba_background_color": (1, 2, 3)}
    assert ImageIOOptions(None).io_config_for("RGBA") is None


# --- EXIF orientation -------------------------------------------------------------------------


@pytest.mark.parametrize(("orientation", "size"), [(1, (32, 16)), (3, (32, 16)), (6, (16, 32)), (8, (16, 32))])
def test_exif_rotated_jpeg_reports_the_transposed_size_without_decoding(
    config: MultiModalConfig, budget: DecodeBudget, orientation: int, size: tuple[int, int]
) -> None:
    data = encode(make_image(32, 16), "JPEG", exif=exif_bytes(orientation), quality=95)
    item = load_image_bytes(data, config=config, budget=budget)
    assert (item.info["width"], item.info["height"]) == size
    assert item.decode_count == 0
    assert item.media.size == size
    expected = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    assert np.array_equal(np.asarray(item.media), np.asarray(expected))


def test_png_exif_chunk_after_the_pixels_is_found_without_decoding(
    config: MultiModalConfig, budget: DecodeBudget
) -> None:
    source = make_image(20, 10)
    item = load_image_bytes(png_with_late_exif(source, 6), config=config, budget=budget)
    assert (item.info["width"], item.info["height"]) == (10, 20)
    assert item.decode_count == 0
    assert np.array_equal(np.asarray(item.media), np.asarray(source.transpose(Image.Transpose.ROTATE_270)))


# --- bad input --------------------------------------------------------------------------------


def test_truncated_png_fails_at_decode_time_when_lazy(config: MultiModalConfig, budget: DecodeBudget) -> None:
    data = encode(make_image(64, 64))
    truncated = data[: len(data) // 2]
    item = load_image_bytes(truncated, config=config, budget=budget)
    assert item.info["width"] == 64
    with pytest.raises(MediaDecodeError, match=r"Could not decode the PNG image .* truncated or corrupt"):
        _ = item.media


def test_truncated_png_fails_at_load_time_when_eager(config: MultiModalConfig, budget: DecodeBudget) -> None:
    data = encode(make_image(64, 64))
    with pytest.raises(MediaDecodeError, match="truncated or corrupt"):
        load_image_bytes(data[: len(data) // 2], config=config, budget=budget, lazy=False)


def test_bytes_that_are_no_image_are_refused(config: MultiModalConfig, budget: DecodeBudget) -> None:
    with pytest.raises(MediaDecodeError, match=r"The data \(15 bytes\) is not an image"):
        load_image_bytes(b"hello not a png", config=config, budget=budget)


def test_corrupt_png_header_is_refused_at_load(config: MultiModalConfig, budget: DecodeBudget) -> None:
    data = bytearray(encode(make_image(8, 8)))
    data[16:24] = b"\xff" * 8  # width and height of IHDR, and the CRC no longer matches
    with pytest.raises(MediaDecodeError):
        load_image_bytes(bytes(data), config=config, budget=budget)
    assert budget.used_bytes == 0


def test_format_outside_the_allowlist_is_refused(budget: DecodeBudget) -> None:
    config = MultiModalConfig(allowed_image_formats=frozenset({"PNG"}))
    with pytest.raises(MediaFormatError, match=r"Image format JPEG is not allowed\. Allowed formats: PNG\."):
        load_image_bytes(encode(make_image(8, 8), "JPEG"), config=config, budget=budget)


def test_eps_is_refused_by_the_default_allowlist(config: MultiModalConfig, budget: DecodeBudget) -> None:
    with pytest.raises(MediaFormatError, match="Image format EPS is not allowed"):
        load_image_bytes(encode(make_image(8, 8), "EPS"), config=config, budget=budget)


def test_too_many_pixels_are_refused_before_decoding(budget: DecodeBudget) -> None:
    config = MultiModalConfig(max_image_pixels=1000)
    with pytest.raises(MediaTooLargeError, match=r"32x32 = 1024 pixels, more than max_image_pixels=1000"):
        load_image_bytes(encode(make_image(32, 32)), config=config, budget=budget)
    assert budget.used_bytes == 0


def test_header_claiming_huge_size_is_refused_without_decoding(budget: DecodeBudget) -> None:
    config = MultiModalConfig(max_image_pixels=50_000_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with pytest.raises(MediaTooLargeError, match="10000x10000 = 100000000 pixels"):
            load_image_bytes(png_header_only(10_000, 10_000), config=config, budget=budget)


def test_pillow_decompression_bomb_error_becomes_typed(config: MultiModalConfig, budget: DecodeBudget) -> None:
    with pytest.raises(MediaTooLargeError, match="decompression bomb"):
        load_image_bytes(png_header_only(20_000, 20_000), config=config, budget=budget)


def test_pillow_bomb_warning_raised_as_error_becomes_typed(config: MultiModalConfig, budget: DecodeBudget) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(MediaTooLargeError, match=r"PIL\.Image\.MAX_IMAGE_PIXELS"):
            load_image_bytes(png_header_only(10_000, 10_000), config=config, budget=budget)


def test_decode_budget_refuses_the_item_that_overruns_it(config: MultiModalConfig) -> None:
    budget = DecodeBudget(32 * 32 * 4 * 2)
    data = encode(make_image(32, 32))
    load_image_bytes(data, config=config, budget=budget)
    load_image_bytes(data, config=config, budget=budget)
    with pytest.raises(MediaTooLargeError, match=r"decodes to 4096 bytes, but this request has only 0 of its 8192"):
        load_image_bytes(data, config=config, budget=budget)
    assert budget.used_bytes == 8192 and budget.remaining_bytes == 0


def test_payload_over_max_media_bytes_is_refused(budget: DecodeBudget) -> None:
    config = MultiModalConfig(max_media_bytes=100)
    data = encode(make_image(32, 32))
    with pytest.raises(MediaTooLargeError, match=rf"The image is {len(data)} bytes, more than max_media_bytes=100"):
        load_image_bytes(data, config=config, budget=budget)


def test_wrong_python_type_is_refused(config: MultiModalConfig, budget: DecodeBudget) -> None:
    with pytest.raises(InputTypeError, match="image bytes must be bytes, bytearray or memoryview, got str"):
        load_image_bytes("iVBORw0KGgo=", config=config, budget=budget)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"image": {"background": [0, 0, 0]}}, ValidationError, r"unknown options \['background'\]"),
        ({"image": {"rgba_background_color": [0, 0]}}, ValidationError, "three integers in 0..255"),
        ({"image": {"rgba_background_color": [0, 0, 256]}}, ValidationError, "three integers in 0..255"),
        ({"image": {"rgba_background_color": [True, 0, 0]}}, ValidationError, "three integers in 0..255"),
        ({"image": {"image_mode": "RGBX2"}}, ValidationError, "'RGBX2' is not a Pillow image mode"),
        ({"image": "RGB"}, InputTypeError, r"media_io_kwargs\['image'\] must be a mapping"),
        (["image"], InputTypeError, "media_io_kwargs must map a modality to options"),
    ],
)
def test_bad_media_io_kwargs_are_refused(
    config: MultiModalConfig, kwargs: object, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        resolve_image_options(config, kwargs)  # type: ignore[arg-type]


def test_decode_budget_rejects_a_bad_limit() -> None:
    with pytest.raises(ConfigError, match="limit_bytes must be an integer >= 0"):
        DecodeBudget(-1)
    assert DecodeBudget.from_config(MultiModalConfig(max_media_request_decode_bytes=123)).limit_bytes == 123


# --- the parser's normalisation of plain PIL images ---------------------------------------------


def test_normalize_skips_no_op_copies() -> None:
    image = make_image(8, 8)
    assert normalize_pil_image(image) is image


def test_normalize_transposes_by_exif_and_converts() -> None:
    data = encode(make_image(12, 6), "JPEG", exif=exif_bytes(6), quality=95)
    opened = Image.open(io.BytesIO(data))
    result = normalize_pil_image(opened)
    expected = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    assert result.size == (6, 12)
    assert np.array_equal(np.asarray(result), np.asarray(expected))


def test_normalize_copies_an_image_with_a_uuid_image_id_as_vllm_does() -> None:
    image = make_image(4, 4)
    image.getexif()[0x800D] = uuid.uuid4()
    result = normalize_pil_image(image)
    assert result is not image
    assert result.getexif().get(0x800D) is None
    assert np.array_equal(np.asarray(result), np.asarray(image))


def test_normalize_composites_rgba_like_vllm() -> None:
    result = normalize_pil_image(_rgba_sample(), "RGB", (0, 0, 0))
    assert list(result.getdata()) == [(0, 0, 0), (100, 50, 25)]
