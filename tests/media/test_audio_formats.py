"""Issue 9, item 8: audio as OpenAI sends it (``input_audio`` with ``format`` wav, mp3, flac, ogg).

Every fixture is written in the test by soundfile itself, from a sine waveform. The chat path is
the real one on the tiny Qwen2-Audio folder (``parse_chat_messages``, then the processor's
``apply``, which both transformers backends serve): the part is loaded, resampled to 16 kHz and
processed into the model's audio tokens, under the same limits and typed errors as images.
"""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mmfront.chat import parse_chat_messages
from mmfront.config import MultiModalConfig
from mmfront.errors import ChatFormatError, MediaDecodeError, MediaFormatError, MediaTooLargeError
from mmfront.inputs import MultiModalInputs
from mmfront.media import DecodeBudget, MediaConnector, load_audio_bytes
from mmfront.models.registry import create_processor
from mmfront.processing.processor import BaseMultiModalProcessor
from mmfront.testing.media import encoded_audio, wav_bytes

SUBTYPES = {"wav": ("WAV", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "flac": ("FLAC", "PCM_16"),
            "ogg": ("OGG", "VORBIS")}
RATE = 44100
TOKENS_PER_SECOND = 25
"""The tiny Qwen2-Audio: one second at 16 kHz is 25 ``<|AUDIO|>`` tokens."""


def stereo(seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.stack([0.3 * np.sin(2 * np.pi * 440 * t), 0.2 * np.sin(2 * np.pi * 660 * t)], axis=1)


def encode(fmt: str, samples: np.ndarray | None = None, rate: int = RATE) -> bytes:
    container, subtype = SUBTYPES[fmt]
    buffer = io.BytesIO()
    soundfile.write(buffer, stereo() if samples is None else samples, rate, format=container, subtype=subtype)
    return buffer.getvalue()


ENCODED = {fmt: encode(fmt) for fmt in SUBTYPES}


def audio_chat(data: bytes, fmt: object) -> list[dict[str, Any]]:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
    return [{"role": "user", "content": [part, {"type": "text", "text": "What is said?"}]}]


def run_chat(proc: BaseMultiModalProcessor, messages: list[dict[str, Any]]) -> MultiModalInputs:
    config = proc.info.config
    chat = parse_chat_messages(messages, proc, MediaConnector(config), budget=DecodeBudget.from_config(config))
    return proc.apply(chat.prompt, chat.mm_data, mm_uuids=chat.mm_uuids, add_special_tokens=False)


@pytest.fixture(scope="module")
def proc(qwen2_audio_dir: Path) -> BaseMultiModalProcessor:
    return create_processor(qwen2_audio_dir, MultiModalConfig())


# --- decoded through the chat path ------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(SUBTYPES))
def test_input_audio_of_each_format_is_decoded_resampled_and_processed(proc: BaseMultiModalProcessor, fmt: str) -> None:
    out = run_chat(proc, audio_chat(ENCODED[fmt], fmt))
    [placeholder] = out["mm_placeholders"]["audio"]
    assert placeholder.get_num_embeds() == TOKENS_PER_SECOND


@pytest.mark.parametrize("fmt", sorted(SUBTYPES))
def test_each_format_decodes_to_the_recording(config: MultiModalConfig, budget: DecodeBudget, fmt: str) -> None:
    item = load_audio_bytes(ENCODED[fmt], config=config, budget=budget)
    container, subtype = SUBTYPES[fmt]
    assert item.info == {"format": container, "subtype": subtype, "sample_rate": RATE, "channels": 2,
                         "num_frames": RATE}
    waveform, rate = item.media
    assert rate == RATE and waveform.dtype == np.float32 and waveform.shape == (RATE,)
    mono = stereo().mean(axis=1)
    error = np.abs(waveform - mono)[2000:-2000].max()  # lossy codecs: away from the edges
    assert error < {"wav": 1e-4, "flac": 1e-4, "mp3": 0.05, "ogg": 0.05}[fmt]


def test_declared_format_is_a_label_and_the_bytes_decide(proc: BaseMultiModalProcessor) -> None:
    """vLLM identifies audio by its content too: FLAC bytes declared as wav are decoded as FLAC."""
    out = run_chat(proc, audio_chat(ENCODED["flac"], "WAV"))
    assert out["mm_placeholders"]["audio"][0].get_num_embeds() == TOKENS_PER_SECOND


@pytest.mark.parametrize(("container", "codec", "rate"), [("mp4", "aac", 44100), ("webm", "libopus", 48000)])
def test_aac_and_opus_go_through_the_chat_path_as_their_decoded_length(proc: BaseMultiModalProcessor, container: str,
                                                                      codec: str, rate: int) -> None:
    """AAC in MP4 and Opus in WebM (decoded with PyAV, as vLLM's fallback): a stereo second is
    loaded, decoded to be counted (no length in its header), averaged, resampled to 16 kHz and
    processed into as many tokens as a WAV of the samples it decodes to (AAC keeps its encoder's
    priming and padding: 46,080 samples, 26 tokens; Opus its 48,000, 25)."""
    pytest.importorskip("av")
    data = encoded_audio(stereo(1.0, rate).T.astype(np.float32), rate, container=container, codec=codec)
    budget = DecodeBudget.from_config(proc.info.config)
    decoded, decoded_rate = load_audio_bytes(data, config=proc.info.config, budget=budget).media
    want = run_chat(proc, audio_chat(wav_bytes(decoded, decoded_rate), "wav"))["mm_placeholders"]["audio"][0]
    [placeholder] = run_chat(proc, audio_chat(data, "m4a"))["mm_placeholders"]["audio"]
    assert placeholder.get_num_embeds() == want.get_num_embeds() == {"aac": 26, "libopus": 25}[codec]


# --- same limits and typed errors as images ---------------------------------------------------


@pytest.mark.parametrize("fmt", ["aac", "m4a", "webm", "", 3, None])
def test_any_declared_format_is_taken_and_the_bytes_decide(proc: BaseMultiModalProcessor, fmt: object) -> None:
    """vLLM puts ``format`` only into a data URL's media type, which its loader never reads: WAV
    declared as anything (or nothing) is decoded as WAV, not refused."""
    out = run_chat(proc, audio_chat(ENCODED["wav"], fmt))
    assert out["mm_placeholders"]["audio"][0].get_num_embeds() == TOKENS_PER_SECOND


@pytest.mark.parametrize("data", [{"format": "mp3"}, {"data": "", "format": "wav"}, {"data": None}],
                         ids=["left_out", "empty", "null"])
def test_input_audio_without_data_needs_a_uuid_as_in_vllm(proc: BaseMultiModalProcessor, data: dict[str, Any]) -> None:
    """vLLM reads empty data as an item sent before, so without a ``uuid`` it names
    ``multi_modal_uuids``; with one the item is looked up (here, no data to process)."""
    part: dict[str, Any] = {"type": "input_audio", "input_audio": data}
    messages = [{"role": "user", "content": [part]}]
    with pytest.raises(ChatFormatError, match=r"input_audio has no `data` and the part no `uuid`") as info:
        run_chat(proc, messages)
    assert info.value.parameter == "multi_modal_uuids"
    config = proc.info.config
    chat = parse_chat_messages([{"role": "user", "content": [{**part, "uuid": "clip-1"}]}], proc,
                               MediaConnector(config), budget=DecodeBudget.from_config(config))
    assert chat.mm_data == {"audio": [None]} and chat.mm_uuids == {"audio": ["clip-1"]}


def test_input_audio_data_not_a_string_is_a_chat_error(proc: BaseMultiModalProcessor) -> None:
    messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": 5, "format": "wav"}}]}]
    with pytest.raises(ChatFormatError, match="must be an object with base64 `data`") as info:
        run_chat(proc, messages)
    assert info.value.parameter == "messages"


@pytest.mark.parametrize("fmt", sorted(SUBTYPES))
def test_corrupt_bytes_are_a_decode_error(proc: BaseMultiModalProcessor, fmt: str) -> None:
    garbage = bytes(np.random.default_rng(7).integers(0, 256, 4000, dtype=np.uint8))
    with pytest.raises(MediaDecodeError, match="could not be read") as info:
        run_chat(proc, audio_chat(garbage, fmt))
    assert info.value.parameter == "multi_modal_data"


def test_truncated_mp3_fails_at_decode_naming_both_lengths(config: MultiModalConfig, budget: DecodeBudget) -> None:
    """Its Xing header still announces every frame; only what the budget paid for is read."""
    data = ENCODED["mp3"]
    item = load_audio_bytes(data[:len(data) // 2], config=config, budget=budget)
    assert item.info["num_frames"] == RATE
    with pytest.raises(MediaDecodeError, match=rf"truncated: its header announces {RATE} frames but only \d+ decode"):
        _ = item.media


@pytest.mark.parametrize("fmt", ["flac", "ogg"])
def test_truncated_flac_and_ogg_are_decode_errors(config: MultiModalConfig, budget: DecodeBudget, fmt: str) -> None:
    data = ENCODED[fmt]
    with pytest.raises(MediaDecodeError):
        load_audio_bytes(data[:len(data) // 2], config=config, budget=budget, lazy=False)


def test_containers_outside_the_list_are_refused(proc: BaseMultiModalProcessor) -> None:
    buffer = io.BytesIO()
    soundfile.write(buffer, stereo(0.1), RATE, format="AIFF")
    with pytest.raises(MediaFormatError, match=r"AIFF audio \(AIFF \(Apple/SGI\)\) is not accepted") as info:
        run_chat(proc, audio_chat(buffer.getvalue(), "wav"))
    assert info.value.parameter == "multi_modal_data"


def test_size_cap_and_decode_budget_apply_to_mp3(qwen2_audio_dir: Path) -> None:
    data = ENCODED["mp3"]
    decoded = RATE * 4 * 3  # interleaved stereo float32, then the mono mix
    for config, message in (
        (MultiModalConfig(max_media_bytes=len(data) - 1), "more than max_media_bytes"),
        (MultiModalConfig(max_media_request_decode_bytes=decoded - 1), f"1.00 s MP3 audio decodes to {decoded} bytes"),
        (MultiModalConfig(max_media_request_decode_bytes=decoded), r"resampled from 44100 to 16000 Hz \(16000 samples\)"),
    ):
        with pytest.raises(MediaTooLargeError, match=message):
            run_chat(create_processor(qwen2_audio_dir, config), audio_chat(data, "mp3"))


# --- PCM WAV: the same samples as the stdlib reader mmfront used before -------------------------


def _stdlib_pcm16(data: bytes) -> np.ndarray:
    """The former decoder: ``wave`` frames, int16 / 32768 in float64, to float32, mean over channels."""
    with wave.open(io.BytesIO(data), "rb") as reader:
        channels, raw = reader.getnchannels(), reader.readframes(reader.getnframes())
    samples = (np.frombuffer(raw, dtype="<i2").astype(np.float64) / 32768.0).astype(np.float32)
    return samples.reshape(-1, channels).mean(axis=1, dtype=np.float32) if channels > 1 else samples


@settings(max_examples=60, deadline=None)
@given(arrays(np.int16, st.tuples(st.integers(1, 300), st.integers(1, 3))))
def test_pcm16_wav_decodes_bit_identical_to_the_stdlib_reader(frames: np.ndarray) -> None:
    data = wav_bytes(frames if frames.shape[1] > 1 else frames[:, 0], 16000)
    item = load_audio_bytes(data, config=MultiModalConfig(), budget=DecodeBudget(1 << 20))
    waveform, rate = item.media
    assert rate == 16000
    assert waveform.tobytes() == _stdlib_pcm16(data).tobytes()
