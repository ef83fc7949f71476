"""Images from encoded bytes: checked from the header, decoded lazily.

Loading reads only the header (format, size, mode, EXIF orientation), refuses what the limits
forbid, charges the request's decode budget with the decode's peak memory and returns a lazy
:class:`~mmfront.parse.MediaWithBytes`. Pillow is only allowed to try the plugins of
``allowed_image_formats``, so a format whose plugin decodes while opening (ICO) is never opened.
The pixels are decoded on first access to ``.media`` (or ``.pixels``), so a request whose items
all hit the processor cache never decodes. Decoding follows vLLM: EXIF transpose, ``load()``, then
conversion to ``image_mode`` with transparent images composited onto ``rgba_background_color``. A
plain JPEG whose result is RGB, asked for its ``.pixels`` first (by a processor that reads them),
is decoded by libjpeg-turbo straight into a numpy array instead (:mod:`mmfront.media.jpeg`: the
same pixels, bit for bit); a PIL image is made from that array only if ``.media`` is asked for.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from io import BytesIO
from typing import Any

import numpy as np
from PIL import Image, ImageMode, ImageOps, UnidentifiedImageError

from mmfront.config import MultiModalConfig
from mmfront.errors import (
    InputTypeError,
    MediaDecodeError,
    MediaFormatError,
    MediaTooLargeError,
    ValidationError,
    resource_error,
)
from mmfront.media._image_peak import decode_peak_bytes
from mmfront.media.base import EXIF_IMAGE_ID, MediaWithBytes
from mmfront.media.budget import DecodeBudget, check_media_size
from mmfront.media.jpeg import decode_jpeg_rgb
from mmfront.media.png_inflate import decode_png

_ORIENTATION = 0x0112
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_AXES = frozenset({5, 6, 7, 8})
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_IMAGE_OPTIONS = ("image_mode", "rgba_background_color")
_KEEPS_DECODER = frozenset({"WEBP", "AVIF"})
"""Formats whose opened image keeps its decoder (and the decoder's canvases) until it is freed."""


@dataclass(frozen=True)
class ImageIOOptions:
    """How images are converted after decoding (``media_io_kwargs["image"]`` in vLLM).

    ``image_mode=None`` keeps the decoded mode.
    """

    image_mode: str | None = "RGB"
    rgba_background_color: tuple[int, int, int] = (255, 255, 255)

    def io_config_for(self, source_mode: str) -> dict[str, Any] | None:
        """The ``io_config`` a source in ``source_mode`` gets: set only when conversion changes
        the image, so the same bytes hash alike whenever their decode is a plain decode."""
        if self.image_mode is None or source_mode == self.image_mode:
            return None
        return {"image_mode": self.image_mode, "rgba_background_color": self.rgba_background_color}


def resolve_image_options(
    config: MultiModalConfig, media_io_kwargs: Mapping[str, Any] | None = None
) -> ImageIOOptions:
    """Deployment defaults, then ``config.media_io_kwargs["image"]``, then the request's
    ``media_io_kwargs["image"]``: later ones win."""
    merged: dict[str, Any] = {"image_mode": config.image_mode, "rgba_background_color": config.rgba_background_color}
    for source, kwargs in (("config.media_io_kwargs", config.media_io_kwargs), ("media_io_kwargs", media_io_kwargs)):
        if kwargs is None:
            continue
        if not isinstance(kwargs, Mapping):
            raise InputTypeError(f"{source} must map a modality to options, e.g. {{'image': {{'image_mode': 'RGB'}}}}; "
                                 f"got {type(kwargs).__name__}", parameter="media_io_kwargs")
        options = kwargs.get("image")
        if options is None:
            continue
        if not isinstance(options, Mapping):
            raise InputTypeError(f"{source}['image'] must be a mapping of options, got {type(options).__name__}", parameter="media_io_kwargs")
        unknown = sorted(set(options) - set(_IMAGE_OPTIONS))
        if unknown:
            raise ValidationError(f"{source}['image'] has unknown options {unknown}; image loading accepts "
                                  f"{list(_IMAGE_OPTIONS)}", parameter="media_io_kwargs")
        merged.update(options)
    mode = merged["image_mode"]
    if mode is not None:
        try:
            ImageMode.getmode(mode)
        except (KeyError, TypeError):
            raise ValidationError(f"image_mode {mode!r} is not a Pillow image mode; use e.g. 'RGB', 'L' or 'RGBA', "
                                  "or None to keep the decoded mode", parameter="media_io_kwargs") from None
    color = merged["rgba_background_color"]
    if (
        not isinstance(color, (list, tuple))
        or len(color) != 3
        or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in color)
    ):
        raise ValidationError(f"rgba_background_color must be three integers in 0..255, e.g. [0, 0, 0]; got {color!r}",
                              parameter="media_io_kwargs")
    return ImageIOOptions(image_mode=mode, rgba_background_color=(color[0], color[1], color[2]))


def has_alpha(image: Image.Image) -> bool:
    """Whether ``image`` carries transparency: an alpha band, or a palette/colour key marked
    transparent (PNG ``tRNS``, GIF transparency index)."""
    return image.mode in _ALPHA_MODES or "transparency" in image.info


def convert_image_mode(
    image: Image.Image, mode: str | None, background: tuple[int, int, int] = (255, 255, 255)
) -> Image.Image:
    """``image`` in ``mode``; the same object when it already is (no copy).

    Transparent images become RGB by compositing onto ``background``: a plain ``convert("RGB")``
    would expose whatever colour hides under transparent pixels.
    """
    if mode is None or image.mode == mode:
        return image
    if mode == "RGB" and has_alpha(image):
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        out = Image.new("RGB", image.size, background)
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return image.convert(mode)


def normalize_pil_image(
    image: Image.Image, image_mode: str | None = "RGB", background: tuple[int, int, int] = (255, 255, 255)
) -> Image.Image:
    """What vLLM's parser makes of a user's PIL image (EXIF transpose, then mode conversion),
    pixel for pixel, without its copies when they are no-ops.

    vLLM's ``exif_transpose`` always returns a copy, and a copy drops an in-memory EXIF UUID
    ``ImageID``; such an image is copied here too, so it hashes by pixels exactly as in vLLM.
    Malformed EXIF is ignored.
    """
    try:
        exif = image.getexif()
    except Exception:
        exif = Image.Exif()
    if exif.get(_ORIENTATION) in _TRANSPOSE:
        image = ImageOps.exif_transpose(image)
    elif isinstance(exif.get(EXIF_IMAGE_ID), uuid.UUID):
        image = image.copy()
    return convert_image_mode(image, image_mode, background)


def load_image_bytes(
    data: bytes | bytearray | memoryview,
    *,
    config: MultiModalConfig,
    budget: DecodeBudget,
    media_io_kwargs: Mapping[str, Any] | None = None,
    lazy: bool = True,
) -> MediaWithBytes[Image.Image]:
    """An image from its encoded bytes, checked from the header and decoded on first use.

    ``info`` holds ``format``, ``width``/``height`` (after EXIF transpose, as ``.media`` will
    have them), ``mode`` (after conversion) and ``source_mode``. With ``lazy=False`` the image is
    decoded before returning, so decode errors surface here.
    """

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InputTypeError(f"image bytes must be bytes, bytearray or memoryview, got {type(data).__name__}", parameter="multi_modal_data")
    payload = bytes(data)
    check_media_size(len(payload), config, what="The image")
    options = resolve_image_options(config, media_io_kwargs)
    header = _open_header(payload, config)
    try:
        fmt = header.format or "unknown"
        if fmt not in config.allowed_image_formats and not (fmt == "MPO" and "JPEG" in config.allowed_image_formats):
            raise _format_error(fmt, config)
        width, height = header.size
        source_mode = header.mode
        orientation = _header_orientation(header, payload)
        peak = decode_peak_bytes(header, payload, transposed=orientation != 1, target_mode=options.image_mode,
                                 alpha=has_alpha(header))
    finally:
        header.close()
    if width <= 0 or height <= 0:
        raise MediaDecodeError(f"The {fmt} image has an empty size {width}x{height}; send an image with pixels.",
                               parameter="multi_modal_data")
    if width * height > config.image_pixel_limit:
        derived = "" if config.max_image_pixels is not None else ", derived from max_media_request_decode_bytes"
        raise MediaTooLargeError(
            f"The {fmt} image is {width}x{height} = {width * height} pixels, more than max_image_pixels="
            f"{config.image_pixel_limit}{derived}. Downscale it before sending, or raise max_image_pixels.",
            parameter="multi_modal_data",
        )
    budget.charge(peak, what=f"A {width}x{height} {fmt} image")
    if orientation in _SWAPS_AXES:
        width, height = height, width
    item: MediaWithBytes[Image.Image] = MediaWithBytes(
        original_bytes=payload,
        io_config=options.io_config_for(source_mode),
        decode=functools.partial(_decode, payload, fmt, orientation, options),
        decode_pixels=_pixels_decoder(payload, fmt, orientation, source_mode, options),
        info={"format": fmt, "width": width, "height": height, "mode": options.image_mode or source_mode,
              "source_mode": source_mode},
    )
    if not lazy:
        _ = item.media
    return item


def _open_header(payload: bytes, config: MultiModalConfig) -> Image.Image:
    allowed = config.allowed_image_formats
    plugins = (allowed - {"MPO"}) | ({"JPEG"} if "MPO" in allowed else set())
    try:
        return Image.open(BytesIO(payload), formats=sorted(plugins))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _pillow_bomb_error(exc, config) from exc
    except UnidentifiedImageError:
        refused = _sniff_format(payload[:16], plugins)
        if refused is not None:
            raise _format_error(refused, config) from None
        raise MediaDecodeError(
            f"The data ({len(payload)} bytes) is not an image in an allowed format "
            f"({', '.join(sorted(allowed))}). Send a valid image file (PNG or JPEG are safest).",
            parameter="multi_modal_data",
        ) from None
    except Exception as exc:
        raise resource_error(exc, doing="Reading the image header") or MediaDecodeError(
            f"The image header ({len(payload)} bytes) is corrupt: {exc}. Re-encode the image and send it again.",
            parameter="multi_modal_data",
        ) from exc


def _sniff_format(prefix: bytes, tried: frozenset[str] | set[str]) -> str | None:
    """The format a refused payload is in, from the header checks of the plugins Pillow was not
    allowed to try (they look at the first 16 bytes and never decode)."""
    Image.init()
    for name in Image.ID:
        accept = Image.OPEN[name][1] if name not in tried and name in Image.OPEN else None
        try:
            result = accept(prefix) if accept is not None else False
        except Exception:
            continue
        if result and not isinstance(result, str):
            return name
    return None


def _format_error(fmt: str, config: MultiModalConfig) -> MediaFormatError:
    return MediaFormatError(
        f"Image format {fmt} is not allowed. Allowed formats: {', '.join(sorted(config.allowed_image_formats))}. "
        "Convert the image to PNG or JPEG, or add the format to allowed_image_formats.",
        parameter="multi_modal_data",
    )


def _pillow_bomb_error(exc: Exception, config: MultiModalConfig) -> MediaTooLargeError:
    """Pillow's own decompression-bomb guard fired (its global ``Image.MAX_IMAGE_PIXELS``, or a
    warning that the process turned into an error). Either way the request gets a typed error."""
    return MediaTooLargeError(
        f"The image is too large: Pillow refused it as a possible decompression bomb ({exc}). mmfront's limit "
        f"is max_image_pixels={config.image_pixel_limit}; Pillow's limit is PIL.Image.MAX_IMAGE_PIXELS="
        f"{Image.MAX_IMAGE_PIXELS}. Downscale the image, or raise both limits.",
        parameter="multi_modal_data",
    )


def _header_orientation(header: Image.Image, payload: bytes) -> int:
    """EXIF orientation known without decoding pixels.

    The base ``Image.getexif`` reads only what the header parse found; PNG's override would
    decode the whole image to look for metadata after the pixel data, so a PNG ``eXIf`` chunk
    placed there is found by walking the chunk list instead.
    """
    try:
        orientation = Image.Image.getexif(header).get(_ORIENTATION)
        if orientation is None and header.format == "PNG":
            raw = _png_exif_chunk(payload)
            if raw is not None:
                exif = Image.Exif()
                exif.load(raw)
                orientation = exif.get(_ORIENTATION)
    except Exception:
        return 1
    return orientation if orientation in _TRANSPOSE else 1


def _png_exif_chunk(payload: bytes) -> bytes | None:
    pos, end = 8, len(payload)
    while pos + 8 <= end:
        length = int.from_bytes(payload[pos:pos + 4], "big")
        kind = payload[pos + 4:pos + 8]
        if kind == b"eXIf":
            return payload[pos + 8:pos + 8 + length]
        if kind == b"IEND":
            return None
        pos += 12 + length
    return None


def _pixels_decoder(
    payload: bytes, fmt: str, orientation: int, source_mode: str, options: ImageIOOptions
) -> Callable[[], np.ndarray | None] | None:
    """The decode straight into RGB pixels where ``.media`` would be a plain RGB decode of a JPEG
    (:mod:`mmfront.media.jpeg` checks the rest): upright, RGB kept or grayscale made RGB. A
    grayscale image kept as ``L``, or made anything but RGB, is Pillow's (its RGB to L formula is
    not libjpeg's)."""
    target = options.image_mode or source_mode
    if fmt != "JPEG" or orientation != 1 or target != "RGB" or source_mode not in ("RGB", "L"):
        return None
    return functools.partial(decode_jpeg_rgb, payload)


def _decode(payload: bytes, fmt: str, orientation: int, options: ImageIOOptions) -> Image.Image:
    """The full decode, applying the orientation read from the header so that ``.media`` always
    has the size ``info`` announced. PNGs inflate with ISA-L (:mod:`mmfront.media.png_inflate`),
    Pillow's pixels in about half the time."""
    image: Image.Image
    try:
        if fmt == "PNG":
            image = decode_png(payload)
        else:
            image = Image.open(BytesIO(payload), formats=("JPEG",) if fmt == "MPO" else (fmt,))
            image.load()
        if fmt in _KEEPS_DECODER:
            image = image.copy()  # a plain image, so the decoder's canvases are freed now
        method = _TRANSPOSE.get(orientation)
        if method is not None:
            image = image.transpose(method)
        return convert_image_mode(image, options.image_mode, options.rgba_background_color)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MediaTooLargeError(
            f"The image is too large to decode: Pillow refused it as a possible decompression bomb ({exc}). "
            f"Downscale it, or raise PIL.Image.MAX_IMAGE_PIXELS (currently {Image.MAX_IMAGE_PIXELS}).",
            parameter="multi_modal_data",
        ) from exc
    except Exception as exc:
        raise resource_error(exc, doing=f"Decoding the {fmt} image") or MediaDecodeError(
            f"Could not decode the {fmt} image ({len(payload)} bytes): {exc}. The file is truncated or corrupt; "
            "re-encode it and send it again.",
            parameter="multi_modal_data",
        ) from exc
