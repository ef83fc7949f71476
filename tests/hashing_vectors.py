"""Hash test vectors: inputs whose digests tests/test_hashing.py pins to values vLLM 0.33.0 computed.

This module imports only numpy, torch and Pillow, so the same inputs can be rebuilt inside the
vLLM peer environment (benchmarks/peer/vllm_hash_vectors.py) with vLLM's own ``MediaWithBytes``.
Encoded media are embedded as base64 so no encoder version can change them.
"""

from __future__ import annotations

import base64
import io
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

RGB_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAYAAAAECAIAAAAiZtkUAAAAV0lEQVR4nAFMALP/AItK5fGpQQaglWomr7zNr+Vi+QAKlF9Wk8ZCJ2rVqy2n"
    "OUVRNw4AmbLXTDQn+kjXMqHfcKyh6SYRAFkB3Qbyf48GPNJeGaYh+b0MzFtXIv3llTFEAAAAAElFTkSuQmCC"
)
"""A 6x4 RGB PNG (144 bytes)."""

RGBA_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAMAAAADCAYAAABWKLW/AAAAMklEQVR4nAEnANj/ACE5fB7Hlcp3SNwD0QF6iJNNC8rgCh2U0/AA8D4vuB8i"
    "P0GSxY79RLsRWOPS/sIAAAAASUVORK5CYII="
)
"""A 3x3 RGBA PNG (107 bytes)."""

GIF = base64.b64decode("R0lGODdhBgAEAIEAAIq5kHF4nr8kiFQlbywAAAAABgAEAAAIFgADAAgwAICAAAQNFhxwUCEAhgIEBAQAOw==")
"""A 6x4 four-colour GIF (61 bytes): a palette image that loads lazily from a file."""

IMAGE_UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")

MODEL_ID = "google/gemma-3-4b-it"

MediaWithBytesFactory = Callable[..., Any]
"""``MediaWithBytes(media, original_bytes, io_config)`` of the implementation under test."""


def pixels(height: int, width: int, channels: int | None, seed: int) -> np.ndarray:
    shape = (height, width) if channels is None else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def rgb_image() -> Image.Image:
    return Image.fromarray(pixels(4, 6, 3, seed=1), "RGB")


def palette_image() -> Image.Image:
    image = Image.fromarray(pixels(3, 5, None, seed=2) % 4, "L").convert("P")
    image.putpalette(bytes([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]))
    return image


def bilevel_image() -> Image.Image:
    return Image.fromarray(pixels(5, 9, None, seed=3), "L").convert("1")


def uuid_image() -> Image.Image:
    image = rgb_image()
    image.getexif()[Image.ExifTags.Base.ImageID] = IMAGE_UUID
    return image


def float_array() -> np.ndarray:
    return np.arange(12, dtype=np.float32).reshape(3, 4) / 8


def vectors(media_with_bytes: MediaWithBytesFactory) -> dict[str, tuple[str, dict[str, Any]]]:
    """Name -> (algorithm, kwargs for ``hash_kwargs``). Built fresh on every call."""
    rgb_media = Image.open(io.BytesIO(RGB_PNG)).convert("RGB")
    rgba_media = Image.open(io.BytesIO(RGBA_PNG)).convert("RGB")
    frames = np.stack([pixels(2, 2, 3, seed=s) for s in (4, 5)])
    kwargs_case = {
        "model_id": MODEL_ID,
        "image": media_with_bytes(rgb_media, RGB_PNG, None),
        "media_io_kwargs": {"image": {"rgba_background_color": [0, 0, 0]}},
        "mm_processor_kwargs": {"do_pan_and_scan": True, "images_kwargs": {"size": {"shortest_edge": 224}}},
    }
    return {
        "str": ("blake3", {"value": "test"}),
        "str_unicode": ("blake3", {"value": "ünïcødé ✓"}),
        "bytes": ("blake3", {"value": b"\x00\x01binary\xff"}),
        "int": ("blake3", {"value": 42}),
        "int_negative": ("blake3", {"value": -7}),
        "int_uint64_range": ("blake3", {"value": 2**63 + 5}),
        "float": ("blake3", {"value": 3.25}),
        "bool": ("blake3", {"value": True}),
        "none": ("blake3", {"value": None}),
        "nested": ("blake3", {"value": {"b": [1, 2.5, None, {"c": "d"}], "a": (True, b"x", [])}}),
        "two_keys": ("blake3", {"y": "second", "x": "first"}),
        "pil_rgb": ("blake3", {"image": rgb_image()}),
        "pil_palette": ("blake3", {"image": palette_image()}),
        "pil_palette_list": ("blake3", {"image": _list_palette_image()}),
        "pil_gif_file": ("blake3", {"image": Image.open(io.BytesIO(GIF))}),
        "pil_mode_1": ("blake3", {"image": bilevel_image()}),
        "pil_mode_L": ("blake3", {"image": rgb_image().convert("L")}),
        "pil_mode_RGBA": ("blake3", {"image": rgb_image().convert("RGBA")}),
        "pil_mode_CMYK": ("blake3", {"image": rgb_image().convert("CMYK")}),
        "pil_mode_I;16B": ("blake3", {"image": _i16b_image()}),
        "pil_mode_F": ("blake3", {"image": rgb_image().convert("F")}),
        "pil_exif_uuid": ("blake3", {"image": uuid_image()}),
        "media_png": ("blake3", {"image": media_with_bytes(rgb_media, RGB_PNG, None)}),
        "media_png_io_config": ("blake3", {"image": media_with_bytes(
            rgba_media, RGBA_PNG, {"image_mode": "RGB", "rgba_background_color": [0, 0, 0]})}),
        "media_video_frames": ("blake3", {"video": media_with_bytes(frames, b"\x00" * 100, None)}),
        "media_video_bytes": ("blake3", {"video": media_with_bytes(frames, b"\x01" * 8, None)}),
        "ndarray": ("blake3", {"data": float_array()}),
        "ndarray_non_contiguous": ("blake3", {"data": float_array().T}),
        "ndarray_0d": ("blake3", {"data": np.array(7, dtype=np.int16)}),
        "ndarray_big_endian": ("blake3", {"data": np.arange(5, dtype=">u2")}),
        "ndarray_bool": ("blake3", {"data": np.array([True, False, True])}),
        "ndarray_str": ("blake3", {"data": np.array(["ab", "c"])}),
        "tensor_float32": ("blake3", {"data": torch.from_numpy(float_array())}),
        "tensor_0d": ("blake3", {"data": torch.tensor(1.5)}),
        "tensor_int64_non_contiguous": ("blake3", {"data": torch.arange(12).reshape(3, 4).T}),
        "tensor_bfloat16": ("blake3", {"data": torch.tensor([[1.0, -2.5, 3.0], [0.5, 1e-3, -0.0]],
                                                             dtype=torch.bfloat16)}),
        "full_blake3": ("blake3", kwargs_case),
        "full_sha256": ("sha256", kwargs_case),
        "full_sha512": ("sha512", kwargs_case),
        "uuid_with_factors": ("blake3", {"model_id": MODEL_ID, "image": "my-image-uuid",
                                         "mm_processor_kwargs": {"do_pan_and_scan": True}}),
    }


def mm_hash_cases(media_with_bytes: MediaWithBytesFactory) -> dict[str, tuple[dict[str, list[Any]], dict[str, Any]]]:
    """Name -> (items per modality, keyword arguments of ``get_mm_hashes`` besides model and algorithm).

    vLLM computes these through ``ProcessorInputs.get_mm_hashes`` after its own parser, which
    leaves every item here unchanged (RGB images, a 1-D waveform, media with bytes)."""
    media = media_with_bytes(Image.open(io.BytesIO(RGB_PNG)).convert("RGB"), RGB_PNG, None)
    audio = np.linspace(-1, 1, 50, dtype=np.float32)
    scoped_kwargs = {
        "truncation": True,
        "images_kwargs": {"size": {"shortest_edge": 224}},
        "audio_kwargs": {"padding": "max_length"},
        "videos_kwargs": {"fps": 2},
    }
    return {
        "plain": ({"image": [rgb_image(), media], "audio": [audio]}, {}),
        "partial_uuid": ({"image": [rgb_image(), media]}, {"mm_uuids": {"image": ["uuid-1", None]}}),
        "scoped": ({"image": [rgb_image()], "audio": [audio]}, {
            "hf_processor_mm_kwargs": scoped_kwargs,
            "media_io_kwargs": {"image": {"rgba_background_color": [0, 0, 0]}, "audio": {}, "video": {"n": 2}},
        }),
        "uuid_with_factors_sha256": ({"image": [rgb_image()]}, {
            "mm_uuids": {"image": ["uuid-1"]}, "hf_processor_mm_kwargs": {"images_kwargs": {"do_resize": False}},
        }),
        "uuid_unrelated_factors": ({"image": [rgb_image()]}, {
            "mm_uuids": {"image": ["uuid-1"]}, "hf_processor_mm_kwargs": {"videos_kwargs": {"fps": 2}},
            "media_io_kwargs": {"video": {"n": 2}},
        }),
    }


def _list_palette_image() -> Image.Image:
    """A palette set from a list of ints stays a list in Pillow, so it hashes as a sequence."""
    image = Image.fromarray(pixels(2, 3, None, seed=6) % 2, "P")
    image.putpalette([0, 0, 0, 255, 255, 255])
    return image


def _i16b_image() -> Image.Image:
    """A big-endian 16-bit image: numpy sees dtype ``>u2``."""
    return Image.frombytes("I;16B", (3, 2), bytes(range(12)))
