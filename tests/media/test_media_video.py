"""Video loading: vLLM's sampling and metadata, lazy decode, limits, and every kind of bad input typed.

Every clip is encoded here, small (64x48, at most a few seconds), with PyAV itself.
"""

from __future__ import annotations

import io
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av", reason="videos are decoded with PyAV: pip install 'mmfront[video]'")

from mmfront.config import MultiModalConfig  # noqa: E402
from mmfront.errors import (  # noqa: E402
    MediaDecodeError,
    MediaFetchError,
    MediaFormatError,
    MediaTooLargeError,
    UnsupportedModelError,
    ValidationError,
)
from mmfront.hashing import get_mm_hashes  # noqa: E402
from mmfront.media import DecodeBudget, MediaConnector, load_video_bytes, resolve_video_options  # noqa: E402
from mmfront.media import video as video_module  # noqa: E402
from mmfront.media.video import VideoIOOptions, sample_frames, video_sampler_for  # noqa: E402
from mmfront.parse import MultiModalDataParser, VideoProcessorItems  # noqa: E402
from mmfront.testing.media import make_video  # noqa: E402

CLIP = make_video(3.0, fps=10)


def _load(data: bytes, config: MultiModalConfig | None = None, **kwargs: object) -> object:
    config = config or MultiModalConfig()
    return load_video_bytes(data, config=config, budget=DecodeBudget(config.max_media_request_decode_bytes),
                            **kwargs)  # type: ignore[arg-type]


def _rgb_frames(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


# --- sampling and metadata --------------------------------------------------------------------


def test_a_clip_loads_lazily_with_vllms_metadata_and_decodes_only_the_frames_kept() -> None:
    item = _load(CLIP, media_io_kwargs={"video": {"num_frames": 4}})
    assert item.decode_count == 0
    metadata = item.info["metadata"]
    assert metadata == {"total_num_frames": 30, "fps": 10.0, "duration": 3.0, "video_backend": "opencv",
                        "frames_indices": [0, 9, 19, 29], "do_sample_frames": False}
    assert list(metadata) == ["total_num_frames", "fps", "duration", "video_backend", "frames_indices",
                              "do_sample_frames"]
    assert item.info["frames_nbytes"] == 4 * 48 * 64 * 3
    frames = item.media
    assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
    assert np.array_equal(frames, _rgb_frames(CLIP)[[0, 9, 19, 29]])
    assert item.decode_count == 1


@pytest.mark.parametrize(
    ("options", "indices"),
    [
        ({}, list(range(30))),  # 32 by default: fewer frames than that keeps them all
        ({"num_frames": 5}, [0, 7, 14, 21, 29]),
        ({"num_frames": -1}, list(range(30))),
        ({"fps": 1}, [0, 14, 29]),  # floor(3 s * 1 fps) frames
        ({"num_frames": 2, "fps": 1}, [0, 29]),
        ({"fps": 0.1}, [0]),  # never fewer than one
    ],
)
def test_uniform_sampling_follows_vllms_num_frames_and_fps_rules(options: dict[str, float], indices: list[int]) -> None:
    config = MultiModalConfig()
    assert sample_frames(30, 10.0, resolve_video_options(config, {"video": options})) == indices


def test_the_qwen2_vl_sampler_is_picked_for_its_processor_and_samples_at_2_fps() -> None:
    options = resolve_video_options(MultiModalConfig(), None, video_processor="Qwen2VLVideoProcessor")
    assert options.video_backend == "qwen2_vl" and options.fps == 2
    # 30 frames at 10 fps is 3 s: 6 frames at 2 fps, already a multiple of temporal_patch_size (2)
    assert sample_frames(30, 10.0, options) == [0, 5, 10, 15, 20, 25]
    # 451 frames at 30 fps: the float32 step lands the tail on 450, never past the clip
    assert sample_frames(451, 30.0, options)[-1] <= 450
    assert video_sampler_for("LlavaOnevisionVideoProcessor") == "opencv"
    with pytest.raises(UnsupportedModelError, match="'opencv_dynamic' loader"):
        video_sampler_for("Glm4vVideoProcessor")


def test_the_qwen3_vl_sampler_rounds_an_even_spread_at_2_fps() -> None:
    options = resolve_video_options(MultiModalConfig(), None, video_processor="Qwen3VLVideoProcessor")
    assert options.video_backend == "qwen3_vl" and options.fps == 2
    # 63 frames at 9 fps is 7 s: int(14.0) = 14 frames over 0..62, rounded (no multiple of 2 imposed)
    assert sample_frames(63, 9.0, options) == [0, 5, 10, 14, 19, 24, 29, 33, 38, 43, 48, 52, 57, 62]
    # a 1 s clip still keeps min_frames (4); max_frames caps a long one
    assert sample_frames(10, 10.0, options) == [0, 3, 6, 9]
    capped = resolve_video_options(MultiModalConfig(), {"video": {"max_frames": 5}},
                                   video_processor="Qwen3VLVideoProcessor")
    assert sample_frames(300, 30.0, capped) == [0, 75, 150, 224, 299]
    assert video_sampler_for("Cosmos3EdgeVideoProcessor") == "qwen3_vl"


def test_a_request_setting_num_frames_drops_the_deployments_fps() -> None:
    config = MultiModalConfig(media_io_kwargs={"video": {"fps": 1, "num_frames": 8}})
    assert resolve_video_options(config) == VideoIOOptions(num_frames=8, fps=1, video_backend="opencv")
    assert resolve_video_options(config, {"video": {"num_frames": 4}}).fps == -1
    assert resolve_video_options(config, {"video": {"fps": 2}}).num_frames == 32


@pytest.mark.parametrize("options", [{"num_frames": 0}, {"num_frames": "8"}, {"fps": "x"}, {"codec": "h264"},
                                     {"video_backend": "torchcodec"}])
def test_bad_video_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="media_io_kwargs"):
        resolve_video_options(MultiModalConfig(), {"video": options})


@pytest.mark.parametrize(("codec", "container"), [("libx264", "mp4"), ("libvpx-vp9", "webm"), ("mpeg4", "avi"),
                                                  ("mjpeg", "avi"), ("mpeg2video", "mpegts")])
def test_each_allowed_codec_and_container_decodes_the_frames_ffmpeg_gives(codec: str, container: str) -> None:
    data = make_video(1.0, fps=8, codec=codec, container=container)
    item = _load(data, media_io_kwargs={"video": {"num_frames": 3}})
    metadata = item.info["metadata"]
    assert metadata["total_num_frames"] == 8 and metadata["fps"] == 8.0
    assert np.array_equal(item.media, _rgb_frames(data)[metadata["frames_indices"]])


@pytest.mark.parametrize(("codec", "container"), [("libx264", "mp4"), ("libx264", "matroska"), ("libx265", "mp4"),
                                                  ("libvpx-vp9", "webm"), ("mpeg2video", "mpegts")])
def test_frames_not_kept_are_skipped_and_the_kept_ones_equal_a_full_decode(
    codec: str, container: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Frames nothing refers to and nobody keeps are never decoded (x264 and x265 make most
    B-frames such); the kept frames are still those a decode of every frame gives, bit for bit."""
    data = make_video(4.0, fps=10, width=96, height=64, codec=codec, container=container)
    decoded: list[int] = []
    offer = video_module._KeptFrames.offer

    def counting_offer(self: object, index: int, frame: object) -> None:
        decoded.append(index)
        offer(self, index, frame)  # type: ignore[arg-type]

    monkeypatch.setattr(video_module._KeptFrames, "offer", counting_offer)
    item = _load(data, media_io_kwargs={"video": {"num_frames": 5}})
    indices = item.info["metadata"]["frames_indices"]
    assert indices == [0, 9, 19, 29, 39]
    assert np.array_equal(item.media, _rgb_frames(data)[indices])
    assert set(indices) <= set(decoded)
    if codec in ("libx264", "libx265"):
        assert len(decoded) < 40, f"{codec}: every frame was decoded"


def test_a_stream_whose_timestamps_do_not_number_its_frames_is_decoded_by_counting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The timestamp path gives up (here: every timestamp looks repeated) and the frames are
    counted instead, as vLLM's decoder counts them: the same frames come out."""
    data = make_video(2.0, fps=10, width=96, height=64)
    monkeypatch.setattr(video_module, "_decode_by_timestamp",
                        lambda *args: (_ for _ in ()).throw(video_module._NoTimestamps()))
    item = _load(data, media_io_kwargs={"video": {"num_frames": 4}})
    assert np.array_equal(item.media, _rgb_frames(data)[item.info["metadata"]["frames_indices"]])


def test_a_rotated_phone_video_is_turned_as_its_display_matrix_says() -> None:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.set_display_rotation(90)
        for _ in range(3):
            picture = np.zeros((48, 64, 3), np.uint8)
            picture[:16, :16] = 255
            output.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        output.mux(stream.encode())
    frames = _load(buffer.getvalue()).media
    assert frames.shape == (3, 64, 48, 3)
    assert frames[0, -8:, :8].mean() > 200 and frames[0, :8, :8].mean() < 50  # top-left turned to bottom-left


# --- hashing: lazy on a hit, frames or bytes as vLLM picks -----------------------------------


def _video_hash(item: object) -> str:
    items = MultiModalDataParser().parse_mm_data({"video": item})["video"]
    return get_mm_hashes({"video": items.get_all_items_for_hash()}, "m", "blake3")["video"][0]


def test_a_video_hashes_from_its_bytes_and_metadata_without_decoding() -> None:
    item = _load(CLIP)
    key = _video_hash(item)
    assert item.decode_count == 0
    assert _video_hash(_load(CLIP)) == key
    assert _video_hash(_load(CLIP, media_io_kwargs={"video": {"num_frames": 4}})) != key
    assert _video_hash(_load(make_video(3.0, fps=10, seed=1))) != key


def test_frames_smaller_than_the_file_are_hashed_as_frames_like_vllm() -> None:
    small = make_video(1.0, fps=10, width=16, height=16)
    item = _load(small, media_io_kwargs={"video": {"num_frames": 1}})
    assert item.info["frames_nbytes"] < len(small)
    key = _video_hash(item)
    assert item.decode_count == 1
    frames_and_metadata = (item.media, item.info["metadata"])
    decoded = get_mm_hashes({"video": [(frames_and_metadata[0], frames_and_metadata[1])]}, "m", "blake3")
    assert key != decoded["video"][0]  # a bare array is hashed as an array, not under "video"


def test_the_parser_takes_every_video_form_vllm_does() -> None:
    parser = MultiModalDataParser()
    frames = _rgb_frames(CLIP)
    item = _load(CLIP)
    parsed = parser.parse_mm_data({"video": [item, frames, list(frames), (frames, item.info["metadata"]), None]})
    videos = parsed["video"]
    assert isinstance(videos, VideoProcessorItems) and videos.get_count() == 5
    assert videos.metadata[0] == item.info["metadata"] and videos.metadata[1] is None
    assert videos.get_num_frames(0) == 30 and item.decode_count == 0
    assert videos.get_item_for_hash(0) == (item, item.info["metadata"])
    assert np.array_equal(videos.get(2), frames)
    needs = MultiModalDataParser(video_needs_metadata=True)
    assert needs.parse_mm_data({"video": item})["video"].get_item_for_hash(0) == (item, item.info["metadata"])
    with pytest.raises(ValidationError, match="no metadata"):
        needs.parse_mm_data({"video": frames})
    with pytest.raises(ValidationError, match="4-D"):
        parser.parse_mm_data({"video": np.zeros((4, 4))})


# --- limits and bad input -------------------------------------------------------------------


def _vfr_clip() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.time_base = stream.time_base = Fraction(1, 1000)
        pts = 0
        for index in range(20):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), index * 10, np.uint8), format="rgb24")
            frame.pts, frame.time_base = pts, stream.time_base
            pts += 40 if index % 2 else 200
            output.mux(stream.encode(frame))
        output.mux(stream.encode())
    return buffer.getvalue()


def _audio_only() -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for _ in range(4):
            output.mux(stream.encode(frame))
        output.mux(stream.encode())
    return buffer.getvalue()


def _ts_segment(width: int, height: int, first_frame: int) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mpegts") as output:
        stream = output.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for index in range(first_frame, first_frame + 10):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), index, np.uint8), format="rgb24")
            frame.pts = index
            output.mux(stream.encode(frame))
        output.mux(stream.encode())
    return buffer.getvalue()


def _size_changing_stream() -> bytes:
    """A stream whose frames grow to 128x96 after the 64x48 its header (the first picture) announced."""
    return _ts_segment(64, 48, 0) + _ts_segment(128, 96, 10)


BAD_INPUT = {
    "zero-length": (b"", MediaDecodeError, "empty"),
    "not a video": (b"\x00garbage" * 100, MediaDecodeError, "corrupt, truncated, or not a video"),
    "truncated index": (CLIP[: len(CLIP) // 2], MediaDecodeError, "corrupt, truncated"),
    "truncated frames": (make_video(3.0, fps=10, container="matroska")[:-2500], MediaDecodeError,
                         "truncated"),
    "audio only": (_audio_only(), MediaFormatError, "audio-only.*input_audio"),
    "variable frame rate": (_vfr_clip(), MediaDecodeError, "variable or unknown frame rate.*Re-encode"),
    "header lies about the size": (_size_changing_stream(), MediaDecodeError, "header announced 64x48"),
    "container not allowed": (make_video(0.5, fps=10, codec="libx264", container="flv"), MediaFormatError,
                              "not accepted as video"),
    "codec not allowed": (make_video(0.5, fps=10, codec="ffv1", container="matroska"), MediaFormatError,
                          "ffv1 codec is not decoded"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_gets_a_typed_error_that_says_what_to_do(case: str) -> None:
    data, error, message = BAD_INPUT[case]
    with pytest.raises(error, match=message):
        _ = _load(data, media_io_kwargs={"video": {"num_frames": -1}}).media


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_video_duration": 2.0}, "lasts 3.0 s, more than max_video_duration=2.0"),
        ({"max_video_frames": 20}, "30 frames, more than max_video_frames=20"),
        ({"max_image_pixels": 1000}, "64x48 .* exceed max_image_pixels=1000"),
        ({"max_media_request_decode_bytes": 100_000}, "decode bytes left"),
        ({"max_media_bytes": 1000}, "more than max_media_bytes=1000"),
    ],
)
def test_limits_are_checked_from_the_header_before_decoding(changes: dict[str, object], message: str) -> None:
    with pytest.raises(MediaTooLargeError, match=message):
        _load(CLIP, MultiModalConfig(**changes))  # type: ignore[arg-type]


def test_the_budget_is_charged_for_the_frames_kept_plus_the_decoder_at_its_peak() -> None:
    config = MultiModalConfig()
    budget = DecodeBudget(config.max_media_request_decode_bytes)
    load_video_bytes(CLIP, config=config, budget=budget, media_io_kwargs={"video": {"num_frames": 4}})
    frame = 64 * 48 * 3
    assert budget.used_bytes == 4 * frame + frame + 20 * 64 * 48 * 3 // 2


def test_an_endless_http_stream_stops_at_max_media_bytes_within_the_deadline(http_base: str) -> None:
    connector = MediaConnector(MultiModalConfig(allowed_media_domains=("127.0.0.1",), max_media_bytes=4000))
    started = time.monotonic()
    with pytest.raises(MediaTooLargeError, match="max_media_bytes"):
        connector.load_video(f"{http_base}/big", budget=DecodeBudget(10**9))
    assert time.monotonic() - started < 5


def test_the_connector_loads_data_urls_and_allowed_files(tmp_path: Path) -> None:
    import base64

    (tmp_path / "clip.mp4").write_bytes(CLIP)
    connector = MediaConnector(MultiModalConfig(allowed_local_media_path=str(tmp_path)))
    budget = DecodeBudget(10**9)
    from_file = connector.load_video(f"file://{tmp_path}/clip.mp4", budget=budget)
    from_url = connector.load_video("data:video/mp4;base64," + base64.b64encode(CLIP).decode(), budget=budget)
    assert from_file.original_bytes == from_url.original_bytes == CLIP
    assert from_file.info["metadata"] == from_url.info["metadata"]
    with pytest.raises(MediaFetchError, match="unsupported scheme"):
        connector.load_video("ftp://host/clip.mp4", budget=budget)
