"""Audio from encoded bytes: WAV, MP3, FLAC and Ogg through libsndfile (``soundfile``), decoded lazily.

vLLM loads audio with ``librosa.load``, which reads through soundfile as float32 and averages the
channels; mmfront reads the same way, so the samples match vLLM's (and, for PCM WAV, those of the
stdlib ``wave`` reader mmfront used before). soundfile's wheels bundle libsndfile with its MP3,
FLAC and Vorbis/Opus decoders, so no system library or ffmpeg is needed. The header is read at
load time (container, rate, channels, length), the decode budget is charged from it, and the
samples are decoded on first access to ``.media``, like images.
"""

from __future__ import annotations

import functools
from io import BytesIO

import numpy as np

from mmfront.config import MultiModalConfig
from mmfront.errors import InputTypeError, MediaDecodeError, MediaFormatError
from mmfront.media.base import MediaWithBytes
from mmfront.media.budget import DecodeBudget, check_media_size

AudioWithRate = tuple[np.ndarray, int]
"""A mono float32 waveform in [-1, 1] and its sampling rate in Hz."""

_CONTAINERS = frozenset({"WAV", "WAVEX", "MP3", "FLAC", "OGG"})
"""libsndfile containers that are decoded. libsndfile opens two dozen more (AIFF, CAF, PAF,
SD2, MAT5...); those are refused, so rarely used parsers never see request bytes."""
_UNDECODABLE = ((b"\x1aE\xdf\xa3", 0, "WebM/Matroska"), (b"ftyp", 4, "MP4/M4A"), (b"#!AMR", 0, "AMR"),
                (b"\xff\xf1", 0, "AAC"), (b"\xff\xf9", 0, "AAC"))
"""Signatures of common formats libsndfile does not decode, to name them in the error."""
_CONVERT = "Send WAV, MP3, FLAC or Ogg audio, or the samples as a float array with their sampling rate."


def load_audio_bytes(
    data: bytes | bytearray | memoryview,
    *,
    config: MultiModalConfig,
    budget: DecodeBudget,
    lazy: bool = True,
) -> MediaWithBytes[AudioWithRate]:
    """An audio file as a lazy ``MediaWithBytes`` whose media is ``(waveform, sample_rate)``.

    The container is recognised from the bytes, as libsndfile (and so vLLM) does. Several
    channels are averaged down to mono. ``info`` holds ``format`` and ``subtype`` (libsndfile's
    names, e.g. ``WAV``/``PCM_16``, ``MP3``/``MPEG_LAYER_III``), ``sample_rate``, ``channels`` and
    ``num_frames``. The decode's peak (the interleaved float32 frames, plus the mono mix when there
    are several channels) is charged to ``budget`` now; the item carries ``budget`` so that
    resampling charges the same request.
    """

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InputTypeError(f"audio bytes must be bytes, bytearray or memoryview, got {type(data).__name__}", parameter="multi_modal_data")
    payload = bytes(data)
    check_media_size(len(payload), config, what="The audio")
    import soundfile  # imported on first use: processes that never see audio never load libsndfile

    try:
        with soundfile.SoundFile(BytesIO(payload)) as reader:
            container, subtype = reader.format, reader.subtype
            rate, channels, frames = reader.samplerate, reader.channels, reader.frames
    except (soundfile.SoundFileError, RuntimeError) as exc:
        raise _open_error(payload, exc) from exc
    if container not in _CONTAINERS:
        raise MediaFormatError(f"{container} audio ({soundfile.available_formats().get(container, container)}) is "
                               f"not accepted. {_CONVERT}", parameter="multi_modal_data")
    if channels < 1 or rate < 1:
        raise MediaDecodeError(f"The audio header is invalid ({channels} channels at {rate} Hz); send a valid file.",
                               parameter="multi_modal_data")
    if frames <= 0:
        raise MediaDecodeError("The audio file holds no frames; send a recording that is not empty.",
                               parameter="multi_modal_data")
    budget.charge(frames * 4 * (channels + (channels > 1)), what=f"A {frames / rate:.2f} s {container} audio")
    item: MediaWithBytes[AudioWithRate] = MediaWithBytes(
        original_bytes=payload,
        decode=functools.partial(_decode, payload, frames),
        info={"format": container, "subtype": subtype, "sample_rate": rate, "channels": channels,
              "num_frames": frames},
        budget=budget,
    )
    if not lazy:
        _ = item.media
    return item


def _open_error(payload: bytes, exc: Exception) -> MediaFormatError | MediaDecodeError:
    """A format libsndfile lacks is named; anything else it cannot open is corrupt."""
    detected = next((name for magic, at, name in _UNDECODABLE if payload[at:at + len(magic)] == magic), None)
    if detected is not None:
        return MediaFormatError(f"This looks like {detected} audio, which mmfront does not decode. {_CONVERT}",
                                parameter="multi_modal_data")
    reason = getattr(exc, "error_string", None) or str(exc)
    return MediaDecodeError(f"The audio could not be read ({reason}): it is corrupt, truncated, or not an audio "
                            f"file. {_CONVERT}", parameter="multi_modal_data")


def _decode(payload: bytes, frames: int) -> AudioWithRate:
    """At most the ``frames`` the header announced (what the budget was charged for)."""
    import soundfile

    try:
        with soundfile.SoundFile(BytesIO(payload)) as reader:
            rate, channels = reader.samplerate, reader.channels
            interleaved = reader.read(frames=frames, dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, RuntimeError) as exc:
        reason = getattr(exc, "error_string", None) or str(exc)
        raise MediaDecodeError(f"Could not decode the audio ({reason}). Send the complete, uncorrupted file.",
                               parameter="multi_modal_data") from exc
    if len(interleaved) != frames:
        raise MediaDecodeError(
            f"The audio is truncated: its header announces {frames} frames but only {len(interleaved)} decode. "
            "Send the complete file.",
            parameter="multi_modal_data",
        )
    if channels == 1:
        return interleaved.reshape(-1), rate
    return interleaved.mean(axis=1, dtype=np.float32), rate
