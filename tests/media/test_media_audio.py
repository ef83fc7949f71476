from __future__ import annotations

import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from media_samples import float_wav_bytes

from mmfront.config import MultiModalConfig
from mmfront.errors import InputTypeError, MediaDecodeError, MediaFormatError, MediaTooLargeError, ValidationError
from mmfront.media import DecodeBudget, load_audio_bytes, resample_audio, resampled_length
from mmfront.testing.media import encoded_audio, wav_bytes

# --- WAV decoding -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "ints", "expected"),
    [
        (1, [0, 64, 128, 255], [-1.0, -0.5, 0.0, 127 / 128]),
        (2, [-32768, -16384, 0, 32767], [-1.0, -0.5, 0.0, 32767 / 32768]),
        (3, [-(1 << 23), -(1 << 22), 0, (1 << 23) - 1], [-1.0, -0.5, 0.0, ((1 << 23) - 1) / (1 << 23)]),
        (4, [-(1 << 31), -(1 << 30), 0, (1 << 31) - 1], [-1.0, -0.5, 0.0, ((1 << 31) - 1) / (1 << 31)]),
    ],
)
def test_pcm_wav_of_every_width_decodes_to_float32(
    config: MultiModalConfig, budget: DecodeBudget, width: int, ints: list[int], expected: list[float]
) -> None:
    data = wav_bytes(np.array(ints), 8000, sample_width=width)
    item = load_audio_bytes(data, config=config, budget=budget)
    assert item.decode_count == 0
    subtype = {1: "PCM_U8", 2: "PCM_16", 3: "PCM_24", 4: "PCM_32"}[width]
    assert item.info == {"format": "WAV", "subtype": subtype, "sample_rate": 8000, "channels": 1, "num_frames": 4}
    assert budget.used_bytes == 16
    waveform, rate = item.media
    assert rate == 8000
    assert waveform.dtype == np.float32
    assert waveform.tolist() == pytest.approx(expected, abs=0, rel=1e-7)
    assert item.decode_count == 1


def test_stereo_is_averaged_to_mono(config: MultiModalConfig, budget: DecodeBudget) -> None:
    frames = np.array([[16384, -8192], [-32768, 32767], [0, 0]])
    item = load_audio_bytes(wav_bytes(frames, 16000), config=config, budget=budget, lazy=False)
    assert item.info["channels"] == 2 and item.info["num_frames"] == 3
    waveform, rate = item.media
    assert rate == 16000
    assert waveform.tolist() == [0.125, -0.5 / 32768, 0.0]


def test_formats_libsndfile_lacks_are_named_and_garbage_is_a_decode_error(
    config: MultiModalConfig, budget: DecodeBudget
) -> None:
    with pytest.raises(MediaFormatError, match=r"looks like AMR audio, .*WAV, MP3, FLAC or Ogg audio, AAC or Opus") as info:
        load_audio_bytes(b"#!AMR\n" + b"\x00" * 64, config=config, budget=budget)
    assert info.value.parameter == "multi_modal_data"
    for garbage in (b"\x1aE\xdf\xa3" + b"\x00" * 64, b"\x00\x00\x00\x20ftypM4A " + b"\x00" * 64):  # PyAV's turn
        with pytest.raises(MediaDecodeError, match=r"The audio could not be opened \(.*\): it is corrupt"):
            load_audio_bytes(garbage, config=config, budget=budget)
    with pytest.raises(MediaDecodeError, match=r"could not be read \(Format not recognised\.\)"):
        load_audio_bytes(b"\x00" * 64, config=config, budget=budget)
    assert budget.used_bytes == 0


def sine_planes(channels: int, rate: int) -> np.ndarray:
    wave = (0.1 * np.sin(np.arange(rate) / 5)).astype(np.float32)
    return np.stack([wave, -0.5 * wave][:channels])


def pyav_frames(data: bytes) -> np.ndarray:
    """The decoded frames' samples joined, channels by rows: what vLLM's fallback averages."""
    import av

    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray() for frame in container.decode(container.streams.audio[0])], axis=-1)


@pytest.mark.parametrize(("container", "codec", "rate", "channels", "length", "name"), [
    ("mp4", "aac", 16000, 1, 17408, "mov,mp4,m4a,3gp,3g2,mj2"),
    ("mp4", "aac", 44100, 2, 46080, "mov,mp4,m4a,3gp,3g2,mj2"),
    ("webm", "libopus", 48000, 1, 48000, "matroska,webm"),
    ("matroska", "libopus", 48000, 2, 48000, "matroska,webm"),
])
def test_aac_and_opus_are_decoded_with_pyav_as_vllms_fallback(
    config: MultiModalConfig, container: str, codec: str, rate: int, channels: int, length: int, name: str
) -> None:
    """Lazily: the header gives the rate and channels but no length (a container's duration is no
    promise), the decode gives vLLM's samples (the frames joined, the channels averaged with
    ``np.mean``; tests/serve/test_vllm_serve_audio.py compares them with vLLM's own loader) and
    charges the budget as it goes."""
    pytest.importorskip("av")
    data = encoded_audio(sine_planes(channels, rate), rate, container=container, codec=codec)
    budget = DecodeBudget(config.max_media_request_decode_bytes)
    item = load_audio_bytes(data, config=config, budget=budget)
    assert item.info == {"format": name, "subtype": codec.removeprefix("lib"), "sample_rate": rate,
                         "channels": channels}
    assert budget.used_bytes == 0
    waveform, sample_rate = item.media
    want = np.mean(pyav_frames(data), axis=0)
    assert (sample_rate, waveform.dtype, len(waveform)) == (rate, np.float32, length)
    assert waveform.tobytes() == want.astype(np.float32).tobytes()
    assert budget.used_bytes == 2 * channels * length * 4


def test_a_pyav_decode_past_the_budget_is_refused(config: MultiModalConfig) -> None:
    pytest.importorskip("av")
    data = encoded_audio(sine_planes(2, 48000), 48000, container="webm", codec="libopus")
    item = load_audio_bytes(data, config=config, budget=DecodeBudget(256 * 1024))
    with pytest.raises(MediaTooLargeError, match="Decoded audio frames"):
        _ = item.media


def test_pyav_codecs_outside_the_list_and_files_without_audio_are_refused(config: MultiModalConfig,
                                                                          budget: DecodeBudget) -> None:
    with pytest.raises(MediaFormatError, match=r"pcm_s16le audio in this container is not decoded"):
        load_audio_bytes(_pcm_in_matroska(), config=config, budget=budget)
    with pytest.raises(MediaDecodeError, match="The file has no audio stream"):
        load_audio_bytes(_video_only_webm(), config=config, budget=budget)


def _pcm_in_matroska() -> bytes:
    av = pytest.importorskip("av")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as out:
        stream = out.add_stream("pcm_s16le", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1600), dtype=np.int16), format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def _video_only_webm() -> bytes:
    av = pytest.importorskip("av")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="webm") as out:
        stream = out.add_stream("libvpx-vp9", rate=1)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), dtype=np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def test_float_wav_decodes_like_vllm(config: MultiModalConfig, budget: DecodeBudget) -> None:
    samples = np.array([0.25, -1.0, 0.5, 1e-3], dtype=np.float32)
    item = load_audio_bytes(float_wav_bytes(samples), config=config, budget=budget, lazy=False)
    assert item.info["subtype"] == "FLOAT"
    assert np.array_equal(item.media[0], samples)


def test_truncated_wav_keeps_the_frames_present(config: MultiModalConfig, budget: DecodeBudget) -> None:
    """libsndfile (so vLLM) reads what a truncated PCM WAV holds; the header length follows."""
    data = wav_bytes(np.arange(1000, dtype=np.int16), 16000)
    item = load_audio_bytes(data[:-500], config=config, budget=budget)
    assert item.info["num_frames"] == 750
    assert item.media[0].tolist() == (np.arange(750) / 32768).tolist()


def test_truncated_wav_header_fails_at_load(config: MultiModalConfig, budget: DecodeBudget) -> None:
    data = wav_bytes(np.zeros(10, dtype=np.int16), 16000)
    with pytest.raises(MediaDecodeError, match=r"could not be read .*corrupt, truncated"):
        load_audio_bytes(data[:20], config=config, budget=budget)


def test_empty_wav_is_refused(config: MultiModalConfig, budget: DecodeBudget) -> None:
    with pytest.raises(MediaDecodeError, match="holds no frames"):
        load_audio_bytes(wav_bytes(np.zeros(0, dtype=np.int16), 16000), config=config, budget=budget)


def test_audio_budget_and_size_cap(config: MultiModalConfig) -> None:
    data = wav_bytes(np.zeros(1000, dtype=np.int16), 16000)
    with pytest.raises(MediaTooLargeError, match="decodes to 4000 bytes, but this request has only 3999"):
        load_audio_bytes(data, config=config, budget=DecodeBudget(3999))
    with pytest.raises(MediaTooLargeError, match=rf"The audio is {len(data)} bytes, more than max_media_bytes=100"):
        load_audio_bytes(data, config=MultiModalConfig(max_media_bytes=100), budget=DecodeBudget(1 << 20))


def test_audio_wrong_python_type(config: MultiModalConfig, budget: DecodeBudget) -> None:
    with pytest.raises(InputTypeError, match="audio bytes must be bytes, bytearray or memoryview, got list"):
        load_audio_bytes([0, 1], config=config, budget=budget)  # type: ignore[arg-type]


# --- resampling -------------------------------------------------------------------------------


def _dominant_frequency(signal: np.ndarray, rate: float) -> float:
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(len(signal))))
    return float(np.fft.rfftfreq(len(signal), 1 / rate)[int(np.argmax(spectrum))])


@pytest.mark.parametrize(("orig", "target", "length"),
                         [(44100, 16000, 16000), (8000, 16000, 16000), (48000, 16000, 16000), (22050, 24000, 24000)])
def test_resampled_sine_keeps_its_frequency_and_shape(orig: int, target: int, length: int) -> None:
    """One second in: exactly one second out (torchaudio's reduced-rate quotient, as in vLLM 0.33)."""
    n = orig
    sine = np.sin(2 * np.pi * 440 * np.arange(n) / orig).astype(np.float32)
    out = resample_audio(sine, orig_sr=orig, target_sr=target)
    assert len(out) == resampled_length(n, orig_sr=orig, target_sr=target) == length
    assert out.dtype == np.float32
    assert _dominant_frequency(out, target) == pytest.approx(440.0, abs=target / len(out))  # within one FFT bin
    ideal = np.sin(2 * np.pi * 440 * np.arange(len(out)) / target)
    assert np.max(np.abs(out - ideal)[200:-200]) < 1e-3


def test_downsampling_removes_frequencies_above_the_new_nyquist() -> None:
    tone = np.sin(2 * np.pi * 12000 * np.arange(44100) / 44100)
    out = resample_audio(tone, orig_sr=44100, target_sr=16000)
    assert out.dtype == np.float32  # vLLM's float32 kernel, whatever the input
    assert np.max(np.abs(out[200:-200])) < 2e-3  # the 6-crossing Hann-windowed sinc: about -55 dB left


def test_equal_rates_return_the_input_itself() -> None:
    audio = np.zeros(10, dtype=np.float32)
    assert resample_audio(audio, orig_sr=16000, target_sr=16000) is audio


def test_resample_rejects_bad_rates_and_shapes() -> None:
    with pytest.raises(ValidationError, match="orig_sr must be a positive finite number, got 0"):
        resample_audio(np.zeros(4), orig_sr=0, target_sr=16000)
    with pytest.raises(ValidationError, match=r"Only 1-D \(mono\) audio can be resampled, got shape \(2, 4\)"):
        resample_audio(np.zeros((2, 4)), orig_sr=8000, target_sr=16000)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=3000),
    orig=st.sampled_from([8000, 11025, 16000, 22050, 44100, 48000]),
    target=st.sampled_from([16000, 24000, 8000]),
)
def test_resample_length_and_dc_gain(n: int, orig: int, target: int) -> None:
    out = resample_audio(np.full(n, 0.5), orig_sr=orig, target_sr=target)
    assert len(out) == resampled_length(n, orig_sr=orig, target_sr=target) == math.ceil(n * target / orig)
    if len(out) > 600:  # the kernel reaches at most 2 * 6 / 0.99 input periods past either edge
        assert np.allclose(out[300:-300], 0.5, atol=1e-3)
