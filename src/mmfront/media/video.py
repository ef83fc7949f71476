"""Videos from encoded bytes: probed from the container header, sampled like vLLM 0.33, decoded lazily.

vLLM decodes videos with OpenCV; mmfront decodes them with PyAV (``pip install mmfront[video]``).
Both drive the same FFmpeg decoders and the same ``swscale`` RGB conversion, and the frames came
out identical byte for byte on every codec measured (docs/media.md, "Video"); PyAV lets mmfront
read the container and codec names before any frame is decoded (the allowlists), seek cheaply,
and it is the smaller wheel. The frame count and rate are read the way OpenCV reports them
(``nb_frames``, else the duration times the guessed rate; the rate is FFmpeg's guessed rate), so
the metadata, which is part of the hash, equals vLLM's.

Loading opens the container, checks it against the allowlists and the limits, picks the frames
to keep with vLLM's sampler for the model, and charges the decode's peak memory to the request's
budget. The frames are decoded on first access to ``.media``, one at a time up to the last frame
kept; only the frames kept are converted to RGB and stored. A request whose videos all hit the
processor cache decodes nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from io import BytesIO
from typing import Any

import numpy as np

from mmfront.config import MultiModalConfig
from mmfront.errors import (
    ConfigError,
    InputTypeError,
    MediaDecodeError,
    MediaFormatError,
    MediaTooLargeError,
    UnsupportedModelError,
    ValidationError,
)
from mmfront.media.base import MediaWithBytes
from mmfront.media.budget import DecodeBudget, check_media_size

VideoMetadata = dict[str, Any]
"""vLLM's per-video metadata: ``total_num_frames``, ``fps``, ``duration``, ``video_backend``,
``frames_indices`` and ``do_sample_frames``, in that order (the order is part of the hash)."""

DEFAULT_NUM_FRAMES = 32
"""Frames kept per video unless ``media_io_kwargs["video"]["num_frames"]`` says otherwise (vLLM's
``VideoMediaIO`` default)."""

VIDEO_CONTAINERS = {
    "mov,mp4,m4a,3gp,3g2,mj2": "MP4/MOV",
    "matroska,webm": "WebM/Matroska",
    "avi": "AVI",
    "mpegts": "MPEG-TS",
}
"""FFmpeg demuxers that may read request bytes, and their common names. FFmpeg probes hundreds
of formats (image sequences, playlists that name other files, game formats); every other one is
refused before any frame is decoded."""

VIDEO_CODECS = {
    "h264": "H.264", "hevc": "H.265/HEVC", "vp8": "VP8", "vp9": "VP9", "av1": "AV1",
    "mpeg4": "MPEG-4 Part 2", "mpeg2video": "MPEG-2", "mjpeg": "Motion JPEG",
}
"""Video codecs that are decoded (FFmpeg's codec ids)."""

VIDEO_SAMPLERS = ("opencv", "qwen2_vl", "qwen3_vl")
"""vLLM's frame samplers mmfront implements, by vLLM's ``video_backend`` name: ``opencv`` keeps
``num_frames`` frames evenly spread (fewer if ``fps`` asks for fewer); ``qwen2_vl`` is
transformers' Qwen2-VL sampling at ``fps`` (default 2), which vLLM uses for
``Qwen2VLVideoProcessor`` (Qwen2-VL, Qwen2.5-VL); ``qwen3_vl`` is Qwen3-VL's (``fps`` default 2,
rounded even spacing, no multiple of the temporal patch), which vLLM uses for
``Qwen3VLVideoProcessor`` and ``Cosmos3EdgeVideoProcessor``."""

_PROCESSOR_SAMPLERS = {"Qwen2VLVideoProcessor": "qwen2_vl", "Qwen3VLVideoProcessor": "qwen3_vl",
                       "Cosmos3EdgeVideoProcessor": "qwen3_vl"}
_UNIMPLEMENTED_SAMPLERS = {
    "Glm4vVideoProcessor": "opencv_dynamic", "Glm46VVideoProcessor": "glm46v",
    "GlmgaVideoProcessor": "glmga", "Molmo2VideoProcessor": "molmo2",
    "EmbeddingGemma2VideoProcessor": "embedding_gemma2",
}
"""Video processors vLLM samples with a model-specific loader mmfront does not have yet."""

_OPTIONS = ("num_frames", "fps", "video_backend", "min_frames", "max_frames", "temporal_patch_size")
_DECODER_WORK_FRAMES = 20
"""YUV 4:2:0 pictures a decoder holds at once, at most: 16 references (the H.264/HEVC maximum)
plus the pictures in flight on its threads. Charged on top of the frames kept."""
_THREAD_TYPES = {"h264": "SLICE", "mpeg4": "SLICE"}
"""Codecs decoded with slice threads rather than FFmpeg's choice (frame threads): measured on 2
cores, slice threads decoded a 720p H.264 clip whose frames hold several slices in 0.72x the
time, one with a single slice no slower, MPEG-4 Part 2 in 0.79x; for HEVC and VP9 they were
slower (docs/media.md, "Decoding only what is kept")."""
_BACKEND_NAME = "opencv"
"""``video_backend`` in the metadata: vLLM's name for its decoder, whose frames PyAV reproduces."""


@dataclass(frozen=True)
class VideoIOOptions:
    """How frames are sampled (``media_io_kwargs["video"]`` in vLLM).

    ``num_frames=-1`` keeps every frame; ``fps<=0`` sets no rate. ``video_backend`` picks the
    sampler (:data:`VIDEO_SAMPLERS`); ``None`` uses the model's (see :func:`video_sampler_for`).
    ``min_frames`` and ``max_frames`` tune the Qwen samplers, ``temporal_patch_size`` the
    ``qwen2_vl`` one.
    """

    num_frames: int = DEFAULT_NUM_FRAMES
    fps: float = -1
    video_backend: str | None = None
    min_frames: int = 4
    max_frames: int = 768
    temporal_patch_size: int = 2


def video_sampler_for(video_processor: str | None) -> str:
    """The sampler vLLM 0.33 uses for an HF video processor class name (``opencv`` for any it
    has no loader of its own for)."""
    if video_processor in _UNIMPLEMENTED_SAMPLERS:
        raise UnsupportedModelError(
            f"vLLM samples the videos of {video_processor} with its {_UNIMPLEMENTED_SAMPLERS[video_processor]!r} "
            "loader, which mmfront does not implement yet; this model cannot take video through mmfront."
        )
    return _PROCESSOR_SAMPLERS.get(video_processor or "", "opencv")


def resolve_video_options(
    config: MultiModalConfig,
    media_io_kwargs: Mapping[str, Any] | None = None,
    *,
    video_processor: str | None = None,
) -> VideoIOOptions:
    """``config.media_io_kwargs["video"]``, then the request's: later ones win, except that a
    request setting only one of ``num_frames`` and ``fps`` drops the other from the
    deployment's (vLLM's rule: they interact)."""
    merged: dict[str, Any] = {}
    for source, kwargs in (("config.media_io_kwargs", config.media_io_kwargs), ("media_io_kwargs", media_io_kwargs)):
        if kwargs is None:
            continue
        if not isinstance(kwargs, Mapping):
            raise InputTypeError(f"{source} must map a modality to options, got {type(kwargs).__name__}",
                                 parameter="media_io_kwargs")
        options = kwargs.get("video")
        if options is None:
            continue
        if not isinstance(options, Mapping):
            raise InputTypeError(f"{source}['video'] must be a mapping of options, got {type(options).__name__}",
                                 parameter="media_io_kwargs")
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValidationError(f"{source}['video'] has unknown options {unknown}; video loading takes "
                                  f"{list(_OPTIONS)}", parameter="media_io_kwargs")
        if source == "media_io_kwargs":
            if "num_frames" in options and "fps" not in options:
                merged.pop("fps", None)
            elif "fps" in options and "num_frames" not in options:
                merged.pop("num_frames", None)
        merged.update(options)
    for name in ("num_frames", "min_frames", "max_frames", "temporal_patch_size"):
        value = merged.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValidationError(f"media_io_kwargs['video']['{name}'] must be an integer, got {value!r}",
                                  parameter="media_io_kwargs")
    num_frames = merged.get("num_frames", DEFAULT_NUM_FRAMES)
    if num_frames == 0 or num_frames < -1:
        raise ValidationError(f"media_io_kwargs['video']['num_frames'] must be a positive number of frames, or -1 for "
                              f"every frame; got {num_frames}", parameter="media_io_kwargs")
    fps = merged.get("fps", -1)
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps):
        raise ValidationError(f"media_io_kwargs['video']['fps'] must be a number of frames per second, got {fps!r}",
                              parameter="media_io_kwargs")
    backend = merged.get("video_backend")
    if backend is None:
        backend = video_sampler_for(video_processor)
    elif backend not in VIDEO_SAMPLERS:
        raise ValidationError(f"media_io_kwargs['video']['video_backend'] {backend!r} is not a sampler mmfront has; use "
                              f"one of {list(VIDEO_SAMPLERS)}", parameter="media_io_kwargs")
    options_out = VideoIOOptions(num_frames=num_frames, fps=fps, video_backend=backend)
    tuning = {k: merged[k] for k in ("min_frames", "max_frames", "temporal_patch_size") if k in merged}
    if any(value < 1 for value in tuning.values()):
        raise ValidationError(f"media_io_kwargs['video'] {tuning} must all be >= 1", parameter="media_io_kwargs")
    if backend in ("qwen2_vl", "qwen3_vl") and "fps" not in merged:
        options_out = replace(options_out, fps=2)  # the Qwen loaders' own default rate
    return replace(options_out, **tuning)


# --- sampling (vLLM 0.33: vllm/multimodal/video.py) ----------------------------------------------

def sample_uniform(total_frames: int, duration: float, options: VideoIOOptions) -> list[int]:
    """``num_frames`` frames spread evenly from the first to the last, or fewer when ``fps``
    allows fewer over ``duration`` (never fewer than one); every frame when that is all of them."""
    count = total_frames
    if options.num_frames > 0:
        count = min(count, options.num_frames)
    if options.fps > 0:
        count = min(count, math.floor(duration * options.fps))
    count = max(count, 1)
    if count == total_frames:
        return list(range(total_frames))
    return [int(i) for i in np.linspace(0, total_frames - 1, count, dtype=int)]


def sample_qwen2_vl(total_frames: int, source_fps: float, options: VideoIOOptions) -> list[int]:
    """transformers' Qwen2-VL sampling: ``total / source_fps * fps`` frames (``fps`` capped at
    30), clamped to ``[min_frames, max_frames]`` and to the clip, rounded down to a multiple of
    ``temporal_patch_size``; indices from a float32 ``arange``, as transformers computes them."""
    import torch

    patch = options.temporal_patch_size
    max_frames = min(options.max_frames, 768)
    max_frames = math.floor(min(max_frames, total_frames) / patch) * patch
    wanted = total_frames / source_fps * min(options.fps, 30)
    wanted = min(max(wanted, options.min_frames), max_frames, total_frames)
    count = math.floor(wanted / patch) * patch
    if count < 1:
        raise MediaDecodeError(f"The video has {total_frames} frame(s), fewer than the {patch} this model takes at "
                               "least; send a longer clip.", parameter="multi_modal_data")
    indices = torch.arange(0, total_frames, total_frames / count).int()
    return [int(i) for i in torch.clamp(indices, max=total_frames - 1)]


def sample_qwen3_vl(total_frames: int, source_fps: float, options: VideoIOOptions) -> list[int]:
    """Qwen3-VL's sampling (vLLM's ``qwen3_vl`` loader, after transformers' processor):
    ``int(total / source_fps * fps)`` frames (``fps`` capped at 30), clamped to
    ``[min_frames, max_frames]`` (at most 768) and to the clip, spread evenly from the first to
    the last and rounded to the nearest frame."""
    fps = min(options.fps, 30)
    max_frames = min(options.max_frames, 768)
    count = int(total_frames / source_fps * fps)
    count = min(max(count, options.min_frames), max_frames, total_frames)
    return [int(i) for i in np.linspace(0, total_frames - 1, count).round().astype(int)]


def sample_frames(total_frames: int, source_fps: float, options: VideoIOOptions) -> list[int]:
    """The frame indices ``options`` keeps from a clip of ``total_frames`` at ``source_fps``."""
    duration = total_frames / source_fps
    if options.video_backend == "qwen2_vl":
        return sample_qwen2_vl(total_frames, source_fps, options)
    if options.video_backend == "qwen3_vl":
        return sample_qwen3_vl(total_frames, source_fps, options)
    return sample_uniform(total_frames, duration, options)


def video_metadata(total_frames: int, source_fps: float, indices: list[int]) -> VideoMetadata:
    """vLLM's metadata dict for the frames kept (``do_sample_frames`` is true when every frame
    was kept, so the HF processor may sample itself)."""
    return {
        "total_num_frames": total_frames,
        "fps": source_fps,
        "duration": total_frames / source_fps,
        "video_backend": _BACKEND_NAME,
        "frames_indices": indices,
        "do_sample_frames": len(indices) == total_frames,
    }


# --- loading -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Probe:
    container: str
    codec: str
    width: int
    height: int
    total_frames: int
    fps: float


def load_video_bytes(
    data: bytes | bytearray | memoryview,
    *,
    config: MultiModalConfig,
    budget: DecodeBudget,
    media_io_kwargs: Mapping[str, Any] | None = None,
    video_processor: str | None = None,
    lazy: bool = True,
) -> MediaWithBytes[np.ndarray]:
    """A video file as a lazy ``MediaWithBytes`` whose media is the kept frames, a
    ``(frames, height, width, 3)`` uint8 RGB array.

    ``info`` holds ``format`` and ``codec`` (FFmpeg's names), the coded ``width`` and ``height``,
    ``metadata`` (vLLM's :data:`VideoMetadata`, which the HF processor and the hash take) and
    ``frames_nbytes`` (the size of the frames array, known before decoding: the hash takes the
    frames instead of the bytes when they are smaller, as vLLM does). ``video_processor`` is the
    model's HF video processor class name, which picks vLLM's sampler for it.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InputTypeError(f"video bytes must be bytes, bytearray or memoryview, got {type(data).__name__}",
                             parameter="multi_modal_data")
    payload = bytes(data)
    check_media_size(len(payload), config, what="The video")
    options = resolve_video_options(config, media_io_kwargs, video_processor=video_processor)
    if not payload:
        raise MediaDecodeError("The video is empty (0 bytes); send a complete video file.", parameter="multi_modal_data")
    probe = _probe(payload, config)
    indices = sample_frames(probe.total_frames, probe.fps, options)
    width, height = probe.width, probe.height
    frames_nbytes = len(indices) * height * width * 3
    decoder_bytes = _DECODER_WORK_FRAMES * width * height * 3 // 2
    budget.charge(frames_nbytes + width * height * 3 + decoder_bytes,
                  what=f"A {probe.width}x{probe.height} video ({len(indices)} frames kept)")
    metadata = video_metadata(probe.total_frames, probe.fps, indices)
    item: MediaWithBytes[np.ndarray] = MediaWithBytes(
        original_bytes=payload,
        decode=functools.partial(_decode, payload, probe, tuple(indices)),
        info={"format": probe.container, "codec": probe.codec, "width": width, "height": height,
              "metadata": metadata, "frames_nbytes": frames_nbytes},
        budget=budget,
    )
    if not lazy:
        _ = item.media
    return item


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise ConfigError("Videos are decoded with PyAV, which is not installed: pip install 'mmfront[video]'.") from None
    return av


_CONVERT = "Send an MP4 (H.264), WebM (VP9/AV1) or another allowed container and codec (docs/media.md)."


def _open(av: Any, payload: bytes, *, probe_only: bool = False) -> Any:
    """``probe_only``: FFmpeg reads the stream parameters without decoding any frame (it otherwise
    decodes a few to fill them in: 100+ ms for 720p H.264, the whole cost of a cache hit); the
    container and codec headers already give what :func:`_probe` reads."""
    options = {"options": {"skip_frame": "all"}} if probe_only else {}
    try:
        return av.open(BytesIO(payload), mode="r", metadata_errors="ignore", **options)
    except av.FFmpegError as exc:
        raise MediaDecodeError(f"The video could not be opened ({exc.strerror or exc}): it is corrupt, truncated, or "
                               f"not a video file. {_CONVERT}", parameter="multi_modal_data") from None


def _probe(payload: bytes, config: MultiModalConfig) -> _Probe:
    """What the container header says, checked against the allowlists and limits; no frame is decoded."""
    av = _av()
    with _open(av, payload, probe_only=True) as container:
        name = container.format.name
        if name not in VIDEO_CONTAINERS:
            raise MediaFormatError(f"{container.format.long_name or name} files are not accepted as video. {_CONVERT}",
                                   parameter="multi_modal_data")
        if not container.streams.video:
            kind = "an audio-only file" if container.streams.audio else "a file without a video stream"
            raise MediaFormatError(f"The video is {kind}; send audio as input_audio/audio_url, or a file with a "
                                   "video track.", parameter="multi_modal_data")
        stream = container.streams.video[0]
        codec = stream.codec_context.codec
        codec_name = codec.canonical_name if codec is not None else "unknown"
        if codec_name not in VIDEO_CODECS:
            raise MediaFormatError(f"Video in the {codec_name} codec is not decoded; accepted codecs are "
                                   f"{', '.join(VIDEO_CODECS.values())}. {_CONVERT}", parameter="multi_modal_data")
        width, height = stream.codec_context.width, stream.codec_context.height
        if width <= 0 or height <= 0:
            raise MediaDecodeError(f"The video header gives no frame size ({width}x{height}); the file is corrupt. "
                                   f"{_CONVERT}", parameter="multi_modal_data")
        if width * height > config.image_pixel_limit:
            raise MediaTooLargeError(
                f"Video frames of {width}x{height} ({width * height} pixels) exceed max_image_pixels="
                f"{config.image_pixel_limit}. Send a smaller resolution, or raise max_image_pixels.",
                parameter="multi_modal_data")
        rate = stream.guessed_rate
        fps = float(rate) if rate else 0.0
        average = stream.average_rate
        if fps <= 0 or (average and abs(Fraction(average) / Fraction(rate) - 1) > Fraction(1, 1000)):
            raise MediaDecodeError(_VFR, parameter="multi_modal_data")
        total = stream.frames
        if total <= 0:
            seconds = container.duration / 1_000_000 if container.duration else 0.0
            if seconds <= 0 and stream.duration and stream.time_base:
                seconds = float(stream.duration * stream.time_base)
            total = math.floor(seconds * fps + 0.5)
        if total <= 0:
            total = sum(1 for packet in container.demux(stream) if packet.size)
        if total <= 0:
            raise MediaDecodeError("The video holds no frames; send a clip that is not empty.",
                                   parameter="multi_modal_data")
        _check_length(total, fps, config)
    return _Probe(name, codec_name, width, height, total, fps)


_VFR = ("The video has a variable or unknown frame rate, so its frames cannot be sampled by time the way the "
        "model expects. Re-encode it at a constant rate (e.g. ffmpeg -i in.mp4 -r 30 -vsync cfr out.mp4).")


def _check_length(total: int, fps: float, config: MultiModalConfig) -> None:
    seconds = total / fps
    if seconds > config.max_video_duration:
        raise MediaTooLargeError(f"The video lasts {seconds:.1f} s, more than max_video_duration="
                                 f"{config.max_video_duration} s. Send a shorter clip, or raise max_video_duration.",
                                 parameter="multi_modal_data")
    if total > config.max_video_frames:
        raise MediaTooLargeError(f"The video has {total} frames, more than max_video_frames={config.max_video_frames}. "
                                 "Send a shorter clip or a lower frame rate, or raise max_video_frames.",
                                 parameter="multi_modal_data")


class _NoTimestamps(Exception):
    """Timestamps that do not number the frames (missing, off the rate, repeated, a gap): the
    frames can only be counted, not skipped."""


def _decode(payload: bytes, probe: _Probe, indices: tuple[int, ...]) -> np.ndarray:
    """The frames at ``indices``, decoded in order up to the last one, only those converted.

    Frames not kept that no other frame refers to (most B-frames) are not decoded at all: the
    decoder is told to skip them packet by packet (FFmpeg's ``skip_frame=nonref``), which leaves
    every frame it does decode, the kept ones included, bit for bit as a full decode makes them.
    That takes frame numbers from timestamps; a stream without them, or whose timestamps are not
    one per frame at the announced rate, is decoded again frame by frame, which says what is wrong.
    The decoder's threads are chosen per codec (:data:`_THREAD_TYPES`)."""
    av = _av()
    try:
        with _open(av, payload, probe_only=True) as container:  # every packet sets skip_frame itself
            try:
                return _decode_by_timestamp(container, probe, indices)
            except _NoTimestamps:
                pass
        with _open(av, payload) as container:
            return _decode_counting(container, probe, indices)
    except av.FFmpegError as exc:
        raise MediaDecodeError(f"The video could not be decoded ({exc.strerror or exc}): it is corrupt or truncated. "
                               "Send the complete, uncorrupted file.", parameter="multi_modal_data") from None


class _KeptFrames:
    """The array of kept frames, filled as they decode."""

    def __init__(self, probe: _Probe, indices: tuple[int, ...]) -> None:
        self.probe, self.indices = probe, indices
        self.slots = {index: slot for slot, index in enumerate(indices)}
        self.frames: np.ndarray | None = None

    def offer(self, index: int, frame: Any) -> None:
        if (frame.width, frame.height) != (self.probe.width, self.probe.height):
            raise MediaDecodeError(
                f"Frame {index} of the video is {frame.width}x{frame.height}, but its header announced "
                f"{self.probe.width}x{self.probe.height}: the header does not describe the stream. Re-encode the video.",
                parameter="multi_modal_data")
        slot = self.slots.pop(index, None)
        if slot is None:
            return
        rgb = _rotate(frame.to_ndarray(format="rgb24"), frame.rotation)
        if self.frames is None:
            self.frames = np.empty((len(self.indices), *rgb.shape), dtype=np.uint8)
        self.frames[slot] = rgb

    def complete(self) -> bool:
        return not self.slots

    def result(self) -> np.ndarray:
        if self.frames is None or self.slots:
            missing = min(self.slots) if self.slots else self.indices[0]
            raise MediaDecodeError(
                f"The video is truncated: its header announces {self.probe.total_frames} frames but fewer decode "
                f"(frame {missing} is missing). Send the complete file.", parameter="multi_modal_data")
        return self.frames


def _decode_by_timestamp(container: Any, probe: _Probe, indices: tuple[int, ...]) -> np.ndarray:
    stream = container.streams.video[0]
    stream.thread_type = _THREAD_TYPES.get(probe.codec, "AUTO")
    decoder = stream.codec_context
    if stream.time_base is None:
        raise _NoTimestamps
    kept = _KeptFrames(probe, indices)
    seen: set[int] = set()
    start: int | None = stream.start_time

    def frame_number(pts: int | None) -> int:
        if pts is None or start is None:
            raise _NoTimestamps
        seconds = (pts - start) * stream.time_base
        number = round(seconds * probe.fps)
        if abs(seconds - number / probe.fps) > 1 / (2 * probe.fps):
            raise _NoTimestamps
        return number

    for packet in container.demux(stream):
        if packet.size:
            if start is None:
                start = packet.pts
            number = frame_number(packet.pts)
            if number in seen:
                raise _NoTimestamps
            seen.add(number)
            decoder.skip_frame = "DEFAULT" if number in kept.slots else "NONREF"
        for frame in decoder.decode(packet if packet.size else None):
            kept.offer(frame_number(frame.pts), frame)
        if kept.complete():
            break
    last = indices[-1]
    if kept.complete() and len(seen.intersection(range(last + 1))) != last + 1:
        raise _NoTimestamps  # a frame number no packet had: a gap
    return kept.result()


def _decode_counting(container: Any, probe: _Probe, indices: tuple[int, ...]) -> np.ndarray:
    stream = container.streams.video[0]
    stream.thread_type = _THREAD_TYPES.get(probe.codec, "AUTO")
    kept = _KeptFrames(probe, indices)
    frame_seconds = 1 / probe.fps
    start: float | None = None
    for index, frame in enumerate(container.decode(stream)):
        kept.offer(index, frame)
        if frame.time is not None:
            start = frame.time - index * frame_seconds if start is None else start
            if abs(frame.time - start - index * frame_seconds) > frame_seconds / 2:
                raise MediaDecodeError(_VFR, parameter="multi_modal_data")
        if kept.complete():
            break
    return kept.result()


_ROTATIONS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    90: lambda a: np.ascontiguousarray(np.rot90(a, 1)),
    180: lambda a: np.ascontiguousarray(a[::-1, ::-1]),
    270: lambda a: np.ascontiguousarray(np.rot90(a, -1)),
}


def _rotate(frame: np.ndarray, rotation: int) -> np.ndarray:
    """Turned as the display matrix says (phone videos), as OpenCV does by default."""
    turn = _ROTATIONS.get(rotation % 360)
    return frame if turn is None else turn(frame)
