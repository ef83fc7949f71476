"""Audio from encoded bytes, decoded lazily: WAV, MP3, FLAC and Ogg through libsndfile
(``soundfile``); AAC and Opus in MP4/M4A, WebM/Matroska or ADTS through PyAV.

vLLM 0.33 reads audio with soundfile where it can (torchcodec first, where installed): float32,
the channels averaged; mmfront reads the same way, so the samples match vLLM's (and, for PCM WAV,
those of the stdlib ``wave`` reader mmfront used before). soundfile's wheels bundle libsndfile
with its MP3, FLAC and Vorbis/Opus decoders, so no system library or ffmpeg is needed. The header
is read at load time (container, rate, channels, length), the decode budget is charged from it,
and the samples are decoded on first access to ``.media``, like images.

Where libsndfile cannot open the bytes, vLLM falls back to PyAV (its ``audio`` extra): the first
audio stream decoded at its own rate, each frame's ``to_ndarray()`` joined, the channels averaged.
mmfront does the same for the containers and codecs that browsers and phones record (AAC, Opus,
Vorbis and MP3 in MP4/M4A, WebM/Matroska or an ADTS stream), whose FFmpeg decoders give float
samples; PyAV comes with ``mmfront[video]``. A container's duration is no promise (a WebM from a
browser has none), so such an item has no ``num_frames``: its length is known once decoded, and
the decode charges the budget as its frames arrive.
"""

from __future__ import annotations

import functools
from io import BytesIO
from typing import Any

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
_PYAV_CONTAINERS = frozenset({"WebM/Matroska", "MP4/M4A", "AAC"})
"""Those of them decoded with PyAV, as vLLM's fallback decodes them (AMR stays refused: rare, and
its decoders' samples are not checked against vLLM's)."""
_PYAV_CODECS = frozenset({"aac", "opus", "vorbis", "mp3"})
"""Codecs decoded with PyAV: FFmpeg's decoders for them give float samples, which vLLM's fallback
averages as they are (integer samples it would pass on unscaled, 0 to 32767 and beyond)."""
_PYAV_SAMPLE_FORMATS = frozenset({"fltp", "flt"})
_CONVERT = ("Send WAV, MP3, FLAC or Ogg audio, AAC or Opus in MP4/M4A or WebM, or the samples as a float array "
            "with their sampling rate.")


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
        if _detected(payload) in _PYAV_CONTAINERS:
            return _load_with_pyav(payload, budget=budget, lazy=lazy)
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


def _detected(payload: bytes) -> str | None:
    """The format libsndfile lacks that ``payload`` starts as, by its signature."""
    return next((name for magic, at, name in _UNDECODABLE if payload[at:at + len(magic)] == magic), None)


def _open_error(payload: bytes, exc: Exception) -> MediaFormatError | MediaDecodeError:
    """A format libsndfile lacks is named; anything else it cannot open is corrupt."""
    detected = _detected(payload)
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


def _pyav() -> Any:
    try:
        import av
    except ImportError:
        raise MediaFormatError("AAC and Opus audio are decoded with PyAV, which is not installed on this server: "
                               f"pip install 'mmfront[video]'. {_CONVERT}", parameter="multi_modal_data") from None
    return av


def _first_audio_stream(av: Any, payload: bytes) -> tuple[Any, Any]:
    """The opened container and its first audio stream, whose codec is one decoded here."""
    try:
        container = av.open(BytesIO(payload), mode="r", metadata_errors="ignore")
    except av.FFmpegError as exc:
        raise MediaDecodeError(f"The audio could not be opened ({exc.strerror or exc}): it is corrupt, truncated, or "
                               f"not an audio file. {_CONVERT}", parameter="multi_modal_data") from None
    if not container.streams.audio:
        container.close()
        raise MediaDecodeError(f"The file has no audio stream. {_CONVERT}", parameter="multi_modal_data")
    stream = container.streams.audio[0]
    codec = None if stream.codec_context is None else stream.codec_context.name  # None: a codec FFmpeg lacks
    if codec not in _PYAV_CODECS:
        container.close()
        raise MediaFormatError(f"{codec or 'Unknown'} audio in this container is not decoded. {_CONVERT}",
                               parameter="multi_modal_data")
    return container, stream


def _load_with_pyav(payload: bytes, *, budget: DecodeBudget, lazy: bool) -> MediaWithBytes[AudioWithRate]:
    """What vLLM's PyAV fallback reads, lazily: the header now (the container, codec, rate and
    channels), the samples on first access, each decoded frame charged to ``budget``."""
    av = _pyav()
    container, stream = _first_audio_stream(av, payload)
    with container:
        rate, channels = int(stream.rate or 0), int(stream.codec_context.channels or 0)
        container_name, codec = container.format.name, stream.codec_context.name
    if channels < 1 or rate < 1:
        raise MediaDecodeError(f"The audio header is invalid ({channels} channels at {rate} Hz); send a valid file.",
                               parameter="multi_modal_data")
    item: MediaWithBytes[AudioWithRate] = MediaWithBytes(
        original_bytes=payload,
        decode=functools.partial(_decode_with_pyav, payload, budget),
        info={"format": container_name, "subtype": codec, "sample_rate": rate, "channels": channels},
        budget=budget,
    )
    if not lazy:
        _ = item.media
    return item


def _decode_with_pyav(payload: bytes, budget: DecodeBudget) -> AudioWithRate:
    """vLLM's ``load_audio_pyav`` at the stream's own rate: every frame's ``to_ndarray()`` (float
    samples, channels by rows), joined, then the rows averaged with ``np.mean``. Each frame is
    charged twice as it arrives (it and its place in the joined array), so a small file that
    decodes to hours is refused at the budget instead of exhausting memory."""
    av = _pyav()
    container, stream = _first_audio_stream(av, payload)
    chunks: list[np.ndarray] = []
    rate = int(stream.rate)
    try:
        with container:
            for frame in container.decode(stream):
                if frame.format.name not in _PYAV_SAMPLE_FORMATS or (frame.format.name == "flt" and
                                                                      len(frame.layout.channels) > 1):
                    raise MediaFormatError(f"The audio decodes to {frame.format.name} samples, which are not taken. "
                                           f"{_CONVERT}", parameter="multi_modal_data")
                samples = frame.to_ndarray()
                budget.charge(2 * samples.nbytes, what="Decoded audio frames")
                chunks.append(samples)
    except av.FFmpegError as exc:
        raise MediaDecodeError(f"Could not decode the audio ({exc.strerror or exc}). Send the complete, uncorrupted "
                               "file.", parameter="multi_modal_data") from None
    if not chunks:
        raise MediaDecodeError("The audio file holds no frames; send a recording that is not empty.",
                               parameter="multi_modal_data")
    joined = np.concatenate(chunks, axis=-1)
    del chunks
    waveform = np.mean(joined, axis=0) if joined.ndim > 1 else joined
    return np.asarray(waveform, dtype=np.float32), rate
