"""Issue 13, class 1: audio resampling never crashes, and its memory is bounded and charged.

The numpy polyphase resampler crashed on some rates (a reduced ratio whose denominator rounded
to 0; an output one sample longer than its buffer) and charged nothing: an 80 KB WAV declaring
3 Hz resampled to 16 kHz allocated over 1 GiB. Resampling is vLLM 0.33's torchaudio sinc kernel
now; the output length is computed from the rates, the ratio and the kernel are bounded, and the
output and the convolution's scratch are charged to the request's DecodeBudget before anything is
allocated.
"""

from __future__ import annotations

import base64
import hashlib
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.config import MultiModalConfig
from mmfront.errors import MediaDecodeError, MediaTooLargeError
from mmfront.hashing import MultiModalHasher, prehash_media
from mmfront.media import DecodeBudget, load_audio_bytes, resample_audio, resampled_length
from mmfront.media.resample import (
    MAX_DOWNSAMPLE,
    MAX_KERNEL_TAPS,
    MAX_UPSAMPLE,
    SMALL_KERNEL_TAPS,
    kernel_taps,
    resample_scratch_bytes,
)
from mmfront.parse import MultiModalDataParser
from mmfront.preprocess import InputPreprocessor
from mmfront.testing.media import wav_bytes

CONFIG = MultiModalConfig()
WAV_3HZ = wav_bytes(np.zeros(40_000, dtype=np.int16), 3)
"""80 KB of 16-bit PCM at 3 Hz: 213,333,328 samples (853 MB of float32, twice that with the feature
extractor's copy) at 16 kHz: ``ceil(16000 * 40000 / 3)`` rounded to float32 first, as torchaudio
computes it."""


def _ramp(n: int) -> np.ndarray:
    """Exact float32 values in [-1, 1] from integers alone, so the bytes are the same everywhere."""
    return (((np.arange(n) * 7919) % 2001 - 1000) / 1000).astype(np.float32)


def _peak_allocated(action: object) -> int:
    tracemalloc.start()
    try:
        action()  # type: ignore[operator]
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


# --- the 3 Hz WAV -----------------------------------------------------------------------------


def test_3hz_wav_is_refused_at_parse_time_without_allocating() -> None:
    assert len(WAV_3HZ) == 80_044
    budget = DecodeBudget.from_config(CONFIG)
    loaded = load_audio_bytes(WAV_3HZ, config=CONFIG, budget=budget)
    assert budget.used_bytes == 160_000 and loaded.info["sample_rate"] == 3
    parser = MultiModalDataParser(target_sr=16000)

    def parse() -> None:
        with pytest.raises(MediaTooLargeError, match=r"Audio resampled from 3 to 16000 Hz \(213333328 samples\) "
                           r"decodes to 1706666624 bytes, but this request has only 715667880") as info:
            parser.parse_mm_data({"audio": loaded})
        assert info.value.parameter == "multi_modal_data"

    assert _peak_allocated(parse) < 1 << 20
    assert loaded.decode_count == 0
    assert budget.used_bytes == 160_000  # a refused charge reserves nothing


def test_3hz_wav_sent_as_input_audio_is_refused_with_bounded_memory(qwen2_audio_dir: Path) -> None:
    pre = InputPreprocessor(qwen2_audio_dir, CONFIG)
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(WAV_3HZ).decode(), "format": "wav"}}

    def request() -> None:
        with pytest.raises(MediaTooLargeError, match="1706666624 bytes"):
            pre.preprocess([{"role": "user", "content": [part]}])

    assert _peak_allocated(request) < 4 << 20


def test_3hz_samples_as_a_tuple_are_charged_to_the_parse_budget() -> None:
    parser = MultiModalDataParser(target_sr=16000, max_resample_bytes=CONFIG.max_media_request_decode_bytes)

    def parse() -> None:
        with pytest.raises(MediaTooLargeError, match=r"\(213333328 samples\) decodes to 1706666624 bytes"):
            parser.parse_mm_data({"audio": (np.zeros(40_000), 3)})  # float64 in, float32 out as in vLLM

    assert _peak_allocated(parse) < 1 << 20


def test_a_request_pays_for_decode_and_resample_once() -> None:
    budget = DecodeBudget(1 << 20)
    loaded = load_audio_bytes(wav_bytes(np.zeros((4410, 2), dtype=np.int16), 44100), config=CONFIG, budget=budget)
    assert budget.used_bytes == 4410 * 4 * 3  # interleaved stereo, then its mono mix
    items = MultiModalDataParser(target_sr=16000).parse_mm_data({"audio": loaded})["audio"]
    # the resampled samples and the extractor's copy; the padded input and the unfolded windows
    # (475 taps x 11 frames); the kernel (160 phases of 475 taps) is kept, not charged
    charged = 4410 * 12 + 1600 * 8 + 4 * (4410 + 2 * 17 + 441 + 475 * 11)
    assert budget.used_bytes == charged
    assert items.get(0).shape == (1600,)
    assert budget.used_bytes == charged  # decoding charges nothing more


def test_resampled_wrapper_keeps_the_prehashed_state() -> None:
    data = wav_bytes(_ramp(4410), 44100)
    loaded = load_audio_bytes(data, config=CONFIG, budget=DecodeBudget(1 << 20))
    prehash_media(loaded, "audio", "blake3")
    wrapper = MultiModalDataParser(target_sr=16000).parse_mm_data({"audio": loaded})["audio"].get_item_for_hash(0)
    assert ("blake3", "audio") in wrapper.prehashed
    fresh = load_audio_bytes(data, config=CONFIG, budget=DecodeBudget(1 << 20))
    assert (MultiModalHasher.hash_kwargs("blake3", audio=wrapper, model_id="m")
            == MultiModalHasher.hash_kwargs("blake3", audio=fresh, model_id="m"))


# --- odd ratios: exact lengths, and vLLM's samples --------------------------------------------

# sha256 prefixes of vLLM 0.33's ``AudioResampler(target_sr=target).resample(_ramp(n), orig_sr=orig)``
# (its default method, torchaudio 2.11.1's ``Resample`` under torch 2.13), measured in the peer venv;
# mmfront imports neither vLLM nor torchaudio. 11025 -> 16000 and 48000 -> 16000 end on a partial
# period of the kernel's phases.
VLLM = [
    (44100, 16000, 4410, 1600, "f51b3e8fdd5e4d8d"),
    (22050, 24000, 2205, 2400, "6f85a8bb78d4acf1"),
    (1, 16000, 5, 80000, "f182da40c94ebded"),
    (7, 3, 40, 18, "5c3be11ea48643dd"),
    (11025, 16000, 1103, 1601, "9b9666773037566d"),
    (8000, 16000, 800, 1600, "cc90b72395fea6f0"),
    (48000, 16000, 4801, 1601, "46b4b0da4ca9b421"),
    (22050, 16000, 22050, 16000, "905bf18927c4fede"),
]


@pytest.mark.parametrize(("orig", "target", "n", "length", "digest"), VLLM)
def test_ratios_give_vllms_exact_samples(orig: int, target: int, n: int, length: int, digest: str) -> None:
    out = resample_audio(_ramp(n), orig_sr=orig, target_sr=target)
    assert out.dtype == np.float32
    assert len(out) == resampled_length(n, orig_sr=orig, target_sr=target) == length
    assert hashlib.sha256(out.tobytes()).hexdigest()[:16] == digest


@pytest.mark.parametrize(("orig", "target", "n", "length"), [
    (22050, 24000, 147, 160),   # exactly 160: librosa's float64 product made it 161, torchaudio's quotient does not
    (7, 3, 1, 1),
    (3, 16000, 1, 5334),
    (3, 16000, 40_000, 213_333_328),  # 213,333,333.3 rounds to float32's 213,333,328 before the ceil
    (16000.4, 16000, 7, 7),     # whole rates: the same, so the input comes back
    (44100, 16000, 0, 0),
])
def test_lengths_follow_torchaudio_including_its_rounding(orig: float, target: int, n: int, length: int) -> None:
    assert resampled_length(n, orig_sr=orig, target_sr=target) == length
    if n < 100:
        out = resample_audio(np.full(n, 0.25, dtype=np.float32), orig_sr=orig, target_sr=target)
        assert len(out) == length


@pytest.mark.parametrize(("orig", "target", "taps"), [(16001, 16000, 256_240_000), (44101, 16000, 706_160_000)])
def test_rates_without_a_common_divisor_are_refused_before_the_kernel_is_built(orig: int, target: int,
                                                                                taps: int) -> None:
    """torchaudio (so vLLM) builds these kernels, gigabytes of float64, for one sample."""
    assert kernel_taps(orig, target) == taps > MAX_KERNEL_TAPS
    with pytest.raises(MediaDecodeError, match=rf"share no large common divisor, so the resampling kernel would "
                       rf"have {taps} taps") as info:
        resample_audio(np.zeros(1, dtype=np.float32), orig_sr=orig, target_sr=target)
    assert info.value.parameter == "multi_modal_data"


def test_a_rate_that_rounds_to_zero_is_refused() -> None:
    with pytest.raises(MediaDecodeError, match="rounds to 0 Hz"):
        resample_audio(np.zeros(4, dtype=np.float32), orig_sr=0.4, target_sr=16000)


@pytest.mark.parametrize("rate", [0, -16000, math.nan, math.inf, True, "16000"])
def test_invalid_rates_are_typed(rate: object) -> None:
    for orig, target in ((rate, 16000), (16000, rate)):
        with pytest.raises(MediaDecodeError, match="must be a positive finite number") as info:
            resample_audio(np.zeros(4, dtype=np.float32), orig_sr=orig, target_sr=target)  # type: ignore[arg-type]
        assert info.value.parameter == "multi_modal_data"


@pytest.mark.parametrize(("orig", "target"), [(1, 1_000_000), (1_000_000, 1), (0.001, 16000), (16000, 15.5)])
def test_absurd_ratios_are_refused_before_anything_runs(orig: float, target: float) -> None:
    with pytest.raises(MediaDecodeError, match=r"cannot be resampled .*outside 1/1024\.\.65536") as info:
        resample_audio(np.zeros(3_000_000, dtype=np.float32), orig_sr=orig, target_sr=target)
    assert info.value.parameter == "multi_modal_data"


def test_lazy_item_with_an_absurd_rate_is_refused_at_parse_time() -> None:
    loaded = load_audio_bytes(wav_bytes(np.zeros(10, dtype=np.int16), 1), config=CONFIG, budget=DecodeBudget(1 << 20))
    with pytest.raises(MediaDecodeError, match="1 Hz cannot be resampled to 192000 Hz"):
        MultiModalDataParser(target_sr=192000).parse_mm_data({"audio": loaded})


def test_non_finite_samples_are_typed() -> None:
    with pytest.raises(MediaDecodeError, match="NaN or infinity"):
        resample_audio(np.array([0.0, np.nan, 0.5]), orig_sr=8000, target_sr=16000)


def test_budget_is_charged_the_output_and_the_scratch() -> None:
    budget = DecodeBudget(1 << 20)
    scratch = 4 * (441 + 2 * 17 + 441 + 475 * 2)
    assert resample_scratch_bytes(441, orig_sr=44100, target_sr=16000) == scratch
    resample_audio(np.zeros(441, dtype=np.float32), orig_sr=44100, target_sr=16000, budget=budget)
    assert budget.used_bytes == 160 * (4 + 4) + scratch  # the output, the extractor's copy, the scratch
    out = resample_audio(np.zeros(441), orig_sr=44100, target_sr=16000, budget=budget)
    assert out.dtype == np.float32  # float64 in, float32 out, as vLLM's float32 kernel gives
    assert budget.used_bytes == 2 * (160 * (4 + 4) + scratch)


# --- any pair of rates ------------------------------------------------------------------------

LIMIT = 64 << 20
rates = st.one_of(st.integers(min_value=1, max_value=384_000),
                  st.floats(min_value=0.5, max_value=384_000, allow_nan=False, allow_infinity=False))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(min_value=0, max_value=2000), orig=rates, target=rates)
def test_any_rates_resample_to_the_computed_length_or_a_typed_error(n: int, orig: float, target: float) -> None:
    budget = DecodeBudget(LIMIT)
    audio = _ramp(n)
    ratio = target / orig
    whole_orig, whole_target = round(orig), round(target)
    if not 1 / MAX_DOWNSAMPLE <= ratio <= MAX_UPSAMPLE or min(whole_orig, whole_target) < 1:
        with pytest.raises(MediaDecodeError, match="cannot be resampled"):
            resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget)
        return
    divisor = math.gcd(whole_orig, whole_target)
    if whole_orig != whole_target and kernel_taps(whole_orig // divisor, whole_target // divisor) > MAX_KERNEL_TAPS:
        with pytest.raises(MediaDecodeError, match="share no large common divisor"):
            resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget)
        return
    if whole_orig == whole_target:
        assert resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget) is audio
        assert budget.used_bytes == 0
        return
    length = math.ceil(np.float32(whole_target // divisor * n / (whole_orig // divisor)))
    scratch = resample_scratch_bytes(n, orig_sr=orig, target_sr=target)
    if length * 8 + scratch > LIMIT:
        with pytest.raises(MediaTooLargeError):
            resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget)
        assert budget.used_bytes == (0 if length * 8 > LIMIT else length * 8)  # a refused charge reserves nothing
        return
    out = resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget)
    assert len(out) == resampled_length(n, orig_sr=orig, target_sr=target) == length
    assert out.dtype == np.float32 and bool(np.isfinite(out).all())
    assert budget.used_bytes == length * 8 + scratch



def test_a_kernel_too_large_to_keep_is_charged_its_construction() -> None:
    """11025 Hz to 32 kHz: 1280 phases of 455 taps, over the kept size, so each request builds it
    (32 bytes a tap in float64) and is charged that; 11025 Hz to 16 kHz (640 x 455) is kept."""
    assert kernel_taps(441, 1280) == 582_400 > SMALL_KERNEL_TAPS >= kernel_taps(441, 640) == 291_200
    windows = 4 * (1103 + 2 * 7 + 441 + 455 * 3)
    assert resample_scratch_bytes(1103, orig_sr=11025, target_sr=32000) == 582_400 * 32 + windows
    assert resample_scratch_bytes(1103, orig_sr=11025, target_sr=16000) == windows
    budget = DecodeBudget(32 << 20)
    out = resample_audio(_ramp(1103), orig_sr=11025, target_sr=32000, budget=budget)
    assert len(out) == 3202 and budget.used_bytes == 3202 * 8 + 582_400 * 32 + windows
