"""Deterministic sample media for tests, benchmarks and the demo.

Images and audio are seeded noise (no files shipped, nothing fetched); the encoders turn them
into what a client sends: a ``data:`` URL for an image part, WAV bytes for an audio part.
"""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
from PIL import Image

from mmfront.errors import InputTypeError, ValidationError

__all__ = ["image_data_url", "make_audio", "make_image", "natural_image", "wav_bytes"]


def make_image(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB image of uniform noise; the same ``seed`` gives the same pixels on every platform."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8), mode="RGB")


def natural_image(width: int = 1024, height: int = 1024, seed: int = 0, tag: int = 0) -> Image.Image:
    """A photo-like RGB image (smooth gradients plus mild noise), so PNG and JPEG sizes are
    realistic where pure noise would make a PNG as large as the raw pixels. ``tag`` changes a few
    pixels to make distinct images cheaply. Identical to the vLLM peer benchmark's images."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 127 + 100 * np.sin(x / 97.0) * np.cos(y / 131.0)
    g = 127 + 100 * np.sin((x + y) / 173.0)
    b = 127 + 100 * np.cos(np.hypot(x - width / 2, y - height / 2) / 61.0)
    pixels = np.clip(np.stack([r, g, b], -1) + rng.normal(0, 6, (height, width, 3)), 0, 255).astype(np.uint8)
    if tag:
        pixels[0, :8, 0] = np.frombuffer(int(tag).to_bytes(8, "little"), np.uint8)
    return Image.fromarray(pixels, "RGB")


def make_audio(seconds: float, sampling_rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A float32 mono waveform of Gaussian noise at amplitude ~0.1 (well inside [-1, 1])."""
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(seconds * sampling_rate))).astype(np.float32)


def image_data_url(img: Image.Image, format: str = "PNG") -> str:
    """``img`` encoded as ``format`` in a base64 ``data:`` URL, the form OpenAI-style image parts carry.

    PNG (the default) is lossless, so a decoded copy has exactly ``img``'s pixels.
    """
    fmt = format.upper()
    Image.init()  # registers every plugin; MIME and SAVE are partial until then
    mime = Image.MIME.get(fmt) if fmt in Image.SAVE else None
    if mime is None:
        raise ValidationError(
            f"unknown image format {format!r}: pass one PIL can write, e.g. 'PNG', 'JPEG' or 'WEBP'",
            parameter="format",
            value=format,
        )
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def wav_bytes(waveform: np.ndarray, sr: int) -> bytes:
    """A 16-bit PCM WAV file of ``waveform`` at ``sr`` Hz (stdlib ``wave``, no audio library).

    ``waveform`` is ``(frames,)`` mono or ``(frames, channels)``. Float samples are taken as
    [-1, 1] (clipped, scaled by 32767); int16 samples are written as they are.
    """
    samples = np.asarray(waveform)
    if samples.ndim not in (1, 2) or samples.size == 0:
        raise ValidationError(
            f"waveform has shape {samples.shape}: pass a non-empty (frames,) or (frames, channels) array",
            parameter="waveform",
        )
    if sr <= 0:
        raise ValidationError(f"sampling rate {sr} is not positive: pass the rate in Hz, e.g. 16000", parameter="sr")
    if np.issubdtype(samples.dtype, np.floating):
        pcm = np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")
    elif samples.dtype == np.int16:
        pcm = samples.astype("<i2")
    else:
        raise InputTypeError(
            f"waveform dtype {samples.dtype} is not supported: pass float samples in [-1, 1] or int16 PCM"
        )
    channels = 1 if pcm.ndim == 1 else pcm.shape[1]
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(sr)
        out.writeframes(np.ascontiguousarray(pcm).tobytes())
    return buf.getvalue()
