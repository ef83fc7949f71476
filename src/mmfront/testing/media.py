"""Deterministic sample media for tests, benchmarks and the demo.

Images, audio and video are seeded noise (no files shipped, nothing fetched); the encoders turn
them into what a client sends: a ``data:`` URL for an image part, WAV bytes for an audio part,
an encoded clip for a video part (:func:`make_video`, through PyAV: ``mmfront[video]``).
"""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
from PIL import Image

from mmfront.errors import InputTypeError, ValidationError

__all__ = ["encoded_audio", "image_data_url", "make_audio", "make_image", "make_raw_image", "make_video", "natural_image", "wav_bytes"]

_RAW_ONLY_MODES = frozenset({"LAB", "HSV", "RGBa", "La", "I;16", "I;16L", "I;16B", "I;16N"})
"""Modes Pillow does not convert RGB into: :func:`make_image` draws their bytes directly."""


def make_image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """An image of uniform noise; the same ``seed`` gives the same pixels on every platform.

    Other modes are the RGB noise converted by Pillow, so ``P`` gets a real palette and ``1`` is
    dithered (``PA`` goes through ``P``); the modes Pillow cannot convert RGB into (``LAB``,
    ``HSV``, ``RGBa``, ``La``, the ``I;16`` family) are :func:`make_raw_image`.
    """
    if mode in _RAW_ONLY_MODES:
        return make_raw_image(width, height, seed, mode)
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8), mode="RGB")
    if mode == "RGB":
        return image
    try:
        return image.convert("P").convert("PA") if mode == "PA" else image.convert(mode)
    except ValueError as exc:
        raise ValidationError(
            f"cannot make a {mode!r} image ({exc}): pass a Pillow mode such as 'L', 'RGBA' or 'P'",
            parameter="mode",
            value=mode,
        ) from None


def make_raw_image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """An image whose raw pixel buffer is seeded noise, alpha and padding bytes included.

    For code that reads Pillow's buffer (the pixel packer): converted noise would leave an alpha
    or ``X`` band constant. Draws four bytes per pixel and gives Pillow the prefix its mode needs,
    so a 3-byte mode's pixels are the first three quarters of the 4-byte mode's stream.
    """
    raw = np.random.default_rng(seed).integers(0, 256, width * height * 4, dtype=np.uint8)
    try:
        return Image.frombytes(mode, (width, height), raw.tobytes())
    except ValueError as exc:
        raise ValidationError(
            f"cannot make a raw {mode!r} image ({exc}): pass a Pillow mode such as 'RGBX' or 'CMYK'",
            parameter="mode",
            value=mode,
        ) from None


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


def wav_bytes(waveform: np.ndarray, sr: int, *, sample_width: int = 2) -> bytes:
    """A PCM WAV file of ``waveform`` at ``sr`` Hz with ``sample_width``-byte samples (stdlib
    ``wave``, no audio library).

    ``waveform`` is ``(frames,)`` mono or ``(frames, channels)``; no frames gives an empty WAV.
    Float samples are taken as [-1, 1], clipped and scaled to the width's full scale (32767 for
    16 bits). Integer samples are written as they are, so a test can put exact codes in a file:
    they must fit the width, which for 8 bits is unsigned (0..255, silence at 128) as WAV stores it.
    """
    samples = np.asarray(waveform)
    if samples.ndim not in (1, 2) or (samples.ndim == 2 and samples.shape[1] == 0):
        raise ValidationError(
            f"waveform has shape {samples.shape}: pass a (frames,) or (frames, channels) array",
            parameter="waveform",
        )
    if isinstance(sr, bool) or not isinstance(sr, int) or sr <= 0:
        raise ValidationError(
            f"sampling rate {sr!r} is not a positive integer: pass the rate in Hz, e.g. 16000", parameter="sr"
        )
    if sample_width not in (1, 2, 3, 4):
        raise ValidationError(f"sample_width {sample_width!r} is not 1, 2, 3 or 4 bytes", parameter="sample_width")
    bits = 8 * sample_width
    low, high = (0, 255) if sample_width == 1 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if np.issubdtype(samples.dtype, np.floating):
        full_scale = 127 if sample_width == 1 else high
        codes = np.round(np.clip(samples, -1.0, 1.0) * full_scale).astype(np.int64) + (128 if sample_width == 1 else 0)
    elif np.issubdtype(samples.dtype, np.integer):
        codes = samples.astype(np.int64)
        if codes.size and (codes.min() < low or codes.max() > high):
            raise ValidationError(
                f"integer samples span {codes.min()}..{codes.max()}, outside the {low}..{high} of "
                f"{bits}-bit PCM: pass a larger sample_width or scale the samples",
                parameter="waveform",
            )
    else:
        raise InputTypeError(
            f"waveform dtype {samples.dtype} is not supported: pass float samples in [-1, 1] or integer PCM codes",
            parameter="waveform",
        )
    little_endian = codes.reshape(-1).astype("<i8").view(np.uint8).reshape(-1, 8)
    channels = 1 if codes.ndim == 1 else codes.shape[1]
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(sample_width)
        out.setframerate(sr)
        out.writeframes(np.ascontiguousarray(little_endian[:, :sample_width]).tobytes())
    return buf.getvalue()



def encoded_audio(planes: np.ndarray, rate: int, *, container: str, codec: str) -> bytes:
    """``planes`` (channels x samples, float32 in [-1, 1]; one or two channels) encoded by PyAV's
    FFmpeg into ``container`` with ``codec`` (e.g. ``"mp4"``/``"aac"``, ``"webm"``/``"libopus"``), as a
    phone or a browser records audio libsndfile does not open. Needs PyAV (``mmfront[video]``)."""
    samples = np.asarray(planes, dtype=np.float32)
    if samples.ndim != 2 or samples.shape[0] not in (1, 2):
        raise ValidationError(f"planes have shape {samples.shape}: pass (1 or 2 channels, samples)", parameter="planes")
    import av

    layout = "mono" if samples.shape[0] == 1 else "stereo"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = layout
        for start in range(0, samples.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + 1024]), format="fltp",
                                               layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()

def make_video(
    seconds: float = 1.0,
    fps: int = 10,
    width: int = 64,
    height: int = 48,
    *,
    codec: str = "libx264",
    container: str = "mp4",
    seed: int = 0,
    options: dict[str, str] | None = None,
) -> bytes:
    """An encoded clip of ``round(seconds * fps)`` frames of moving seeded noise, at a constant rate.

    ``codec`` is an FFmpeg encoder (``libx264``, ``libvpx-vp9``, ``mpeg4``, ``mjpeg``...) and
    ``container`` an FFmpeg muxer (``mp4``, ``webm``, ``matroska``, ``avi``, ``mpegts``).
    ``options`` go to the muxer (``{"movflags": "faststart"}`` puts the MP4 index first).
    """
    import av

    count = round(seconds * fps)
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container, options=options or {}) as output:
        stream = output.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        for index in range(count):
            picture = np.roll(base, index * 2, axis=1)
            output.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        output.mux(stream.encode())
    return buffer.getvalue()
