"""Image loading under attack: formats that decode while opening, and decode memory charged at its
real peak, before any pixel is decoded."""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import IcnsImagePlugin, IcoImagePlugin, Image, ImageFile, WebPImagePlugin

from local_services import measure_decode_peak, within_decode_charge
from mmfront import MultiModalConfig, create_processor
from mmfront.errors import ConfigError, MediaDecodeError, MediaFormatError, MediaTooLargeError
from mmfront.media import DecodeBudget, load_image_bytes


class DecodeStarted(BaseException):
    """Raised by the patched loaders: a BaseException, so no handler on the way can swallow it."""


@pytest.fixture
def forbid_decode(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it once the test's payloads are built: from then on, any pixel decode fails the test."""

    def refuse(self: Image.Image, *args: object, **kwargs: object) -> None:
        raise DecodeStarted(type(self).__name__)

    def forbid() -> None:
        Image.init()  # importing some plugins builds small images
        for cls in (Image.Image, ImageFile.ImageFile, IcoImagePlugin.IcoImageFile, IcnsImagePlugin.IcnsImageFile,
                    WebPImagePlugin.WebPImageFile):
            monkeypatch.setattr(cls, "load", refuse)

    return forbid


@pytest.fixture
def config() -> MultiModalConfig:
    return MultiModalConfig()


@pytest.fixture
def budget() -> DecodeBudget:
    return DecodeBudget(1 << 34)


def encode(image: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    bands = len(Image.new(mode, (1, 1)).getbands())
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, bands), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if bands == 1 else pixels).convert(mode)


def palette_png(width: int, height: int, *, transparent: bool) -> bytes:
    image = noise(width, height).quantize(256)
    return encode(image, transparency=0) if transparent else encode(image)


def ico_around(png: bytes) -> bytes:
    """An ICO whose one entry (declared 256x256, as every large icon is) is ``png``."""
    return struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 22) + png


def icns_around(png: bytes) -> bytes:
    """An ICNS whose ``ic10`` entry (declared 1024x1024) is ``png``."""
    body = b"ic10" + struct.pack(">I", 8 + len(png)) + png
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


# --- the format allowlist ---------------------------------------------------------------------


@pytest.mark.parametrize(("wrap", "fmt"), [(ico_around, "ICO"), (icns_around, "ICNS")])
def test_icons_are_refused_before_pillow_decodes_them(
    forbid_decode: Callable[[], None], config: MultiModalConfig, budget: DecodeBudget,
    wrap: Callable[[bytes], bytes], fmt: str,
) -> None:
    payload = wrap(encode(Image.new("RGBA", (2048, 2048), (10, 20, 30, 255))))
    forbid_decode()
    with pytest.raises(MediaFormatError, match=rf"^Image format {fmt} is not allowed\. Allowed formats: "
                                               r"BMP, GIF, JPEG, PNG, TIFF, WEBP\.") as caught:
        load_image_bytes(payload, config=config, budget=budget)
    assert caught.value.parameter == "multi_modal_data"
    assert budget.used_bytes == 0


@pytest.mark.parametrize("fmt", ["PPM", "PCX", "SGI", "QOI", "DDS", "JPEG2000"])
def test_formats_outside_the_default_allowlist_are_refused_by_name(
    forbid_decode: Callable[[], None], config: MultiModalConfig, budget: DecodeBudget, fmt: str,
) -> None:
    payload = encode(noise(16, 16), fmt)
    forbid_decode()
    with pytest.raises(MediaFormatError, match=rf"^Image format {fmt} is not allowed") as caught:
        load_image_bytes(payload, config=config, budget=budget)
    assert caught.value.parameter == "multi_modal_data"


def test_a_format_without_a_signature_is_not_an_image_in_an_allowed_format(
    config: MultiModalConfig, budget: DecodeBudget,
) -> None:
    with pytest.raises(MediaDecodeError, match=r"is not an image in an allowed format \(BMP, GIF, JPEG, PNG, TIFF, "
                                               r"WEBP\)") as caught:
        load_image_bytes(encode(noise(16, 16), "IM"), config=config, budget=budget)
    assert caught.value.parameter == "multi_modal_data"


def test_a_configured_allowlist_is_honoured(budget: DecodeBudget) -> None:
    source = noise(16, 8)
    config = MultiModalConfig(allowed_image_formats=["png", "tga"])
    assert config.allowed_image_formats == frozenset({"PNG", "TGA"})
    item = load_image_bytes(encode(source, "TGA"), config=config, budget=budget, lazy=False)
    assert item.info["format"] == "TGA"
    assert np.array_equal(np.asarray(item.media), np.asarray(source))
    with pytest.raises(MediaFormatError, match=r"^Image format JPEG is not allowed\. Allowed formats: PNG, TGA\."):
        load_image_bytes(encode(source, "JPEG"), config=config, budget=budget)


@pytest.mark.parametrize("fmt", ["ICO", "ICNS", "EPS", "WMF"])
def test_unsafe_formats_cannot_be_allowed(fmt: str) -> None:
    with pytest.raises(ConfigError, match=rf"^allowed_image_formats cannot include {fmt}: "):
        MultiModalConfig(allowed_image_formats={"PNG", fmt.lower()})


def test_a_format_pillow_does_not_know_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"allowed_image_formats has 'HEIC', which is not an image format Pillow "
                                          r"opens"):
        MultiModalConfig(allowed_image_formats={"PNG", "HEIC"})


def test_a_camera_mpo_loads_as_the_jpeg_it_is(config: MultiModalConfig, budget: DecodeBudget) -> None:
    first, second = Image.new("RGB", (24, 16), (200, 10, 10)), Image.new("RGB", (24, 16), (10, 10, 200))
    payload = encode(first, "MPO", save_all=True, append_images=[second])
    item = load_image_bytes(payload, config=config, budget=budget, lazy=False)
    assert item.info["format"] == "MPO"
    assert item.media.size == (24, 16)
    assert item.media.getpixel((12, 8))[0] > 150  # type: ignore[index]  # the first picture
    with pytest.raises(MediaFormatError, match="Image format JPEG is not allowed"):
        load_image_bytes(payload, config=MultiModalConfig(allowed_image_formats={"PNG"}), budget=budget)


# --- the decode budget charges the real peak ----------------------------------------------------


def test_a_palette_png_with_transparency_is_charged_every_stage(config: MultiModalConfig, budget: DecodeBudget) -> None:
    width, height = 300, 200
    item = load_image_bytes(palette_png(width, height, transparent=True), config=config, budget=budget)
    # decoded P (1 byte) + its RGBA copy (4) + the RGB result (4) + the alpha band (1), alive together
    stages = {"P": 1, "RGBA": 4, "RGB": 4, "A": 1}
    assert budget.used_bytes == width * height * sum(stages.values()) == 600_000
    image = item.media
    assert image.mode == "RGB" and image.size == (width, height)


@pytest.mark.parametrize(
    ("source", "media_io", "per_pixel"),
    [
        (lambda: encode(noise(30, 20)), {}, 4),  # RGB stays RGB: the decoded image only
        (lambda: encode(noise(30, 20, "RGBA")), {}, 4 + 4 + 1),  # RGBA: + RGB result + alpha band
        (lambda: encode(noise(30, 20, "LA")), {}, 4 + 4 + 4 + 1),  # LA: + RGBA copy + RGB + alpha
        (lambda: encode(noise(30, 20, "L")), {}, 1 + 4),
        (lambda: palette_png(30, 20, transparent=False), {}, 1 + 4),
        (lambda: encode(noise(30, 20)), {"image_mode": "L"}, 4 + 1),
        (lambda: encode(noise(30, 20)), {"image_mode": None}, 4),
        (lambda: encode(noise(30, 20), exif=_orientation_exif(6)), {}, 4 + 4),  # the transposed copy
    ],
)
def test_the_charge_is_the_largest_stage(
    config: MultiModalConfig, budget: DecodeBudget, source: object, media_io: dict[str, object], per_pixel: int,
) -> None:
    load_image_bytes(source(), config=config, budget=budget,  # type: ignore[operator]
                     media_io_kwargs={"image": media_io})
    assert budget.used_bytes == 30 * 20 * per_pixel


def _orientation_exif(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def test_webp_is_charged_the_canvases_of_its_decoder(config: MultiModalConfig, budget: DecodeBudget) -> None:
    payload = encode(noise(40, 30), "WEBP")
    load_image_bytes(payload, config=config, budget=budget)
    # the image (4) + libwebp's two RGBA canvases (8) + the frame Pillow copies out (4); two payload copies
    assert budget.used_bytes == 40 * 30 * 16 + 2 * len(payload)


def test_a_progressive_jpeg_is_charged_its_coefficient_buffer(config: MultiModalConfig) -> None:
    image = noise(64, 48)
    charges = []
    for progressive in (False, True):
        budget = DecodeBudget(1 << 30)
        load_image_bytes(encode(image, "JPEG", progressive=progressive, subsampling=0), config=config, budget=budget)
        charges.append(budget.used_bytes)
    rows = 64 * 64 * 4  # libjpeg's row buffers: 64 rows of the width
    # 4:4:4 sampling: 3 components of (64/8 + 1) x (48/8 + 1) blocks, 64 coefficients of 2 bytes
    assert charges == [64 * 48 * 4 + rows, 64 * 48 * 4 + rows + 3 * 9 * 7 * 64 * 2]


def test_the_budget_refuses_before_anything_is_decoded(
    forbid_decode: Callable[[], None], config: MultiModalConfig,
) -> None:
    payload = palette_png(64, 64, transparent=True)
    budget = DecodeBudget(64 * 64 * 4 * 2)  # room for two w*h*4 charges, not for one real peak
    forbid_decode()
    with pytest.raises(MediaTooLargeError, match=r"A 64x64 PNG image decodes to 40960 bytes, but this request has "
                                                 r"only 32768") as caught:
        load_image_bytes(payload, config=config, budget=budget)
    assert caught.value.parameter == "multi_modal_data"
    assert budget.used_bytes == 0




@pytest.fixture(scope="module")
def large_samples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    folder = tmp_path_factory.mktemp("large-images")
    width, height = 2400, 2000
    rgb = noise(width // 8, height // 8).resize((width, height), Image.Resampling.NEAREST)
    samples = {
        "palette-png": encode(rgb.quantize(256), transparency=0),
        "webp": encode(rgb, "WEBP", quality=80),
        "progressive-jpeg": encode(rgb, "JPEG", quality=90, progressive=True),
    }
    paths = {}
    for name, data in samples.items():
        paths[name] = folder / name
        paths[name].write_bytes(data)
    yield paths


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's resettable peak RSS")
@pytest.mark.parametrize("name", ["palette-png", "webp", "progressive-jpeg"])
def test_the_measured_decode_peak_stays_within_the_charge(large_samples: dict[str, Path], name: str) -> None:
    charged, measured = measure_decode_peak(large_samples[name])
    assert within_decode_charge(charged, measured), (charged, measured)
    assert measured >= charged * 0.7, (charged, measured)  # proportional: the charge is not a wild guess


# --- image_mode other than RGB through Gemma 3's HF fallback -------------------------------------


@pytest.mark.parametrize("mode", ["L", "RGBA"])
def test_gemma3_processes_images_converted_to_another_mode(gemma3_dir: Path, mode: str) -> None:
    processor = create_processor(gemma3_dir, MultiModalConfig(image_mode=mode))
    out = processor.apply("Look: <start_of_image>", {"image": [noise(40, 30)]})
    pixel_values = out["mm_kwargs"]["image"][0]["pixel_values"].data
    assert tuple(pixel_values.shape) == (1, 3, 32, 32)
