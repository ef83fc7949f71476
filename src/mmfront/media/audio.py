"""Audio from encoded bytes: PCM WAV through the stdlib ``wave`` module, decoded lazily.

Only WAV is decoded, so mmfront needs no audio library (vLLM pulls in librosa and soundfile).
Clients with other formats can convert, or send the samples as a float array. The header is
read at load time (format, rate, channels, length), the decode budget is charged from it, and
the samples are decoded on first access to ``.media``, like images.
"""

from __future__ import annotations

import functools
import wave
from io import BytesIO

import numpy as np

from mmfront.config import MultiModalConfig
from mmfront.errors import InputTypeError, MediaDecodeError, MediaFormatError
from mmfront.media.base import MediaWithBytes
from mmfront.media.budget import DecodeBudget, check_media_size

AudioWithRate = tuple[np.ndarray, int]
"""A mono float32 waveform in [-1, 1] and its sampling rate in Hz."""

_MAGIC = ((b"ID3", "MP3"), (b"\xff\xfb", "MP3"), (b"\xff\xf3", "MP3"), (b"\xff\xf2", "MP3"), (b"fLaC", "FLAC"),
          (b"OggS", "Ogg"), (b"\x1aE\xdf\xa3", "WebM/Matroska"))


def load_audio_bytes(
    data: bytes | bytearray | memoryview,
    *,
    config: MultiModalConfig,
    budget: DecodeBudget,
    lazy: bool = True,
) -> MediaWithBytes[AudioWithRate]:
    """A WAV file as a lazy ``MediaWithBytes`` whose media is ``(waveform, sample_rate)``.

    8/16/24/32-bit PCM is accepted; several channels are averaged down to mono. ``info`` holds
    ``format``, ``sample_rate``, ``channels``, ``sample_width`` (bytes) and ``num_frames``.
    """

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InputTypeError(f"audio bytes must be bytes, bytearray or memoryview, got {type(data).__name__}")
    payload = bytes(data)
    check_media_size(len(payload), config, what="The audio")
    if payload[:4] != b"RIFF" or payload[8:12] != b"WAVE":
        detected = next((name for magic, name in _MAGIC if payload.startswith(magic)), None)
        found = f"this looks like {detected}" if detected else "this is not a WAV (RIFF/WAVE) file"
        raise MediaFormatError(
            f"Only WAV audio is supported, and {found}. Convert it to 16-bit PCM WAV, or send the samples as a "
            "float array with their sampling rate.",
            parameter="multi_modal_data",
        )
    try:
        with wave.open(BytesIO(payload), "rb") as reader:
            channels, width = reader.getnchannels(), reader.getsampwidth()
            rate, frames = reader.getframerate(), reader.getnframes()
    except (wave.Error, EOFError) as exc:
        message = str(exc)
        if message.startswith("unknown format"):
            raise MediaFormatError(
                f"This WAV file is not plain integer PCM ({message}). Convert it to 16-bit PCM WAV, or send the "
                "samples as a float array with their sampling rate.",
                parameter="multi_modal_data",
            ) from exc
        raise MediaDecodeError(f"The WAV header is corrupt or truncated: {message or type(exc).__name__}. Send the "
                               "complete file.", parameter="multi_modal_data") from exc
    if width not in (1, 2, 3, 4):
        raise MediaFormatError(f"WAV samples of {width * 8} bits are not supported; use 8, 16, 24 or 32-bit PCM.",
                               parameter="multi_modal_data")
    if channels < 1 or rate < 1:
        raise MediaDecodeError(f"The WAV header is invalid ({channels} channels at {rate} Hz); send a valid file.",
                               parameter="multi_modal_data")
    if frames == 0:
        raise MediaDecodeError("The WAV file holds no audio frames; send a recording that is not empty.",
                               parameter="multi_modal_data")
    budget.charge(frames * 4, what=f"A {frames / rate:.2f} s WAV audio")
    item: MediaWithBytes[AudioWithRate] = MediaWithBytes(
        original_bytes=payload,
        decode=functools.partial(_decode, payload),
        info={"format": "WAV", "sample_rate": rate, "channels": channels, "sample_width": width,
              "num_frames": frames},
    )
    if not lazy:
        _ = item.media
    return item


def pcm_to_float(raw: bytes, sample_width: int, channels: int) -> np.ndarray:
    """Interleaved little-endian PCM (unsigned 8-bit, signed 16/24/32-bit) as float32 in [-1, 1),
    averaged over channels."""
    if sample_width == 1:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif sample_width == 3:
        triples = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        values = triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)
        values = np.where(values >= 1 << 23, values - (1 << 24), values)
        samples = values.astype(np.float32) / float(1 << 23)
    else:
        dtype = np.dtype("<i2") if sample_width == 2 else np.dtype("<i4")
        samples = (np.frombuffer(raw, dtype=dtype).astype(np.float64) / float(1 << (8 * sample_width - 1))).astype(
            np.float32)
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1, dtype=np.float32)
    return samples


def _decode(payload: bytes) -> AudioWithRate:
    try:
        with wave.open(BytesIO(payload), "rb") as reader:
            channels, width = reader.getnchannels(), reader.getsampwidth()
            rate, frames = reader.getframerate(), reader.getnframes()
            raw = reader.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise MediaDecodeError(f"Could not decode the WAV audio: {exc}. Send the complete file.",
                               parameter="multi_modal_data") from exc
    expected = frames * channels * width
    if len(raw) != expected:
        raise MediaDecodeError(
            f"The WAV file is truncated: its header announces {frames} frames ({expected} bytes) but only "
            f"{len(raw)} bytes of samples follow. Send the complete file.",
            parameter="multi_modal_data",
        )
    return pcm_to_float(raw, width, channels), rate
