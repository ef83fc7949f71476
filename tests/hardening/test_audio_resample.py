"""Issue 13, class 1: audio resampling never crashes, and its memory is bounded and charged.

The numpy polyphase resampler crashed on some rates (a reduced ratio whose denominator rounded
to 0; an output one sample longer than its buffer) and charged nothing: an 80 KB WAV declaring
3 Hz resampled to 16 kHz allocated over 1 GiB. Resampling is soxr now, called as vLLM's librosa
path calls it; the output length is computed from the rates, the ratio is bounded, and the
output is charged to the request's DecodeBudget before anything is allocated.
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
from mmfront.media.resample import MAX_DOWNSAMPLE, MAX_UPSAMPLE
from mmfront.parse import MultiModalDataParser
from mmfront.preprocess import InputPreprocessor
from mmfront.testing.media import wav_bytes

CONFIG = MultiModalConfig()
WAV_3HZ = wav_bytes(np.zeros(40_000, dtype=np.int16), 3)
"""80 KB of 16-bit PCM at 3 Hz: 213,333,334 samples (853 MB of float32, twice that with the feature
extractor's copy) at 16 kHz."""


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
        with pytest.raises(MediaTooLargeError, match=r"Audio resampled from 3 to 16000 Hz \(213333334 samples\) "
                           r"decodes to 1706666672 bytes, but this request has only 715667880") as info:
            parser.parse_mm_data({"audio": loaded})
        assert info.value.parameter == "multi_modal_data"

    assert _peak_allocated(parse) < 1 << 20
    assert loaded.decode_count == 0
    assert budget.used_bytes == 160_000  # a refused charge reserves nothing


def test_3hz_wav_sent_as_input_audio_is_refused_with_bounded_memory(qwen2_audio_dir: Path) -> None:
    pre = InputPreprocessor(qwen2_audio_dir, CONFIG)
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(WAV_3HZ).decode(), "format": "wav"}}

    def request() -> None:
        with pytest.raises(MediaTooLargeError, match="1706666672 bytes"):
            pre.preprocess([{"role": "user", "content": [part]}])

    assert _peak_allocated(request) < 4 << 20


def test_3hz_samples_as_a_tuple_are_charged_to_the_parse_budget() -> None:
    parser = MultiModalDataParser(target_sr=16000, max_resample_bytes=CONFIG.max_media_request_decode_bytes)

    def parse() -> None:
        with pytest.raises(MediaTooLargeError, match=r"\(213333334 samples\) decodes to 2560000008 bytes"):
            parser.parse_mm_data({"audio": (np.zeros(40_000), 3)})  # float64 in, float64 out

    assert _peak_allocated(parse) < 1 << 20


def test_a_request_pays_for_decode_and_resample_once() -> None:
    budget = DecodeBudget(1 << 20)
    loaded = load_audio_bytes(wav_bytes(np.zeros((4410, 2), dtype=np.int16), 44100), config=CONFIG, budget=budget)
    assert budget.used_bytes == 4410 * 4 * 3  # interleaved stereo, then its mono mix
    items = MultiModalDataParser(target_sr=16000).parse_mm_data({"audio": loaded})["audio"]
    assert budget.used_bytes == 4410 * 12 + 1600 * 8  # the resampled samples and the extractor's copy
    assert items.get(0).shape == (1600,)
    assert budget.used_bytes == 4410 * 12 + 1600 * 8  # decoding charges nothing more


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

# sha256 prefixes of librosa 0.11.0's ``librosa.resample(_ramp(n), orig_sr, target_sr)`` (soxr 1.1.0,
# what vLLM 0.33 runs), measured once with librosa installed; mmfront does not depend on librosa.
LIBROSA = [
    (44100, 16000, 4410, 1600, "b1ccf91c8903c84c"),
    (22050, 24000, 2205, 2400, "f48f1b189cbc8139"),
    (1, 16000, 5, 80000, "de3f8e26a9dbb646"),
    (7, 3, 40, 18, "b0a3183dbb7f169c"),
    (16001, 16000, 1600, 1600, "c0094d2db10498de"),
]


@pytest.mark.parametrize(("orig", "target", "n", "length", "digest"), LIBROSA)
def test_odd_ratios_give_librosas_exact_samples(orig: int, target: int, n: int, length: int, digest: str) -> None:
    out = resample_audio(_ramp(n), orig_sr=orig, target_sr=target)
    assert out.dtype == np.float32
    assert len(out) == resampled_length(n, orig_sr=orig, target_sr=target) == math.ceil(n * (target / orig)) == length
    assert hashlib.sha256(out.tobytes()).hexdigest()[:16] == digest


@pytest.mark.parametrize(("orig", "target", "n", "length"), [
    (22050, 24000, 147, 161),   # exactly 160 in rationals; float64 rounding adds one, as in librosa
    (16001, 16000, 1, 1),
    (7, 3, 1, 1),
    (3, 16000, 1, 5334),        # soxr returns 5333: padded with a zero, as librosa's fix_length does
    (44100, 16000, 0, 0),
])
def test_lengths_follow_librosa_including_its_rounding(orig: int, target: int, n: int, length: int) -> None:
    out = resample_audio(np.full(n, 0.25, dtype=np.float32), orig_sr=orig, target_sr=target)
    assert len(out) == resampled_length(n, orig_sr=orig, target_sr=target) == length


@pytest.mark.parametrize("rate", [0, -16000, math.nan, math.inf, True, "16000"])
def test_invalid_rates_are_typed(rate: object) -> None:
    for orig, target in ((rate, 16000), (16000, rate)):
        with pytest.raises(MediaDecodeError, match="must be a positive finite number") as info:
            resample_audio(np.zeros(4, dtype=np.float32), orig_sr=orig, target_sr=target)  # type: ignore[arg-type]
        assert info.value.parameter == "multi_modal_data"


@pytest.mark.parametrize(("orig", "target"), [(1, 1_000_000), (1_000_000, 1), (0.001, 16000), (16000, 15.5)])
def test_absurd_ratios_are_refused_before_soxr_runs(orig: float, target: float) -> None:
    """soxr did not return within 120 s for 1 Hz -> 1 MHz; 1 MHz -> 1 Hz took 17 s for 3 s of input."""
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


def test_budget_is_charged_with_the_output_dtype() -> None:
    budget = DecodeBudget(1 << 20)
    resample_audio(np.zeros(441, dtype=np.float32), orig_sr=44100, target_sr=16000, budget=budget)
    assert budget.used_bytes == 160 * (4 + 4)  # the output, and the feature extractor's float32 copy
    resample_audio(np.zeros(441), orig_sr=44100, target_sr=16000, budget=budget)
    assert budget.used_bytes == 160 * (4 + 4) + 160 * (8 + 4)


# --- any pair of rates ------------------------------------------------------------------------

LIMIT = 1 << 20
rates = st.one_of(st.integers(min_value=1, max_value=384_000),
                  st.floats(min_value=0.5, max_value=384_000, allow_nan=False, allow_infinity=False))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(min_value=0, max_value=2000), orig=rates, target=rates)
def test_any_rates_resample_to_the_computed_length_or_a_typed_error(n: int, orig: float, target: float) -> None:
    budget = DecodeBudget(LIMIT)
    audio = _ramp(n)
    ratio = target / orig
    if not 1 / MAX_DOWNSAMPLE <= ratio <= MAX_UPSAMPLE:
        with pytest.raises(MediaDecodeError, match="cannot be resampled"):
            resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget)
        return
    length = math.ceil(n * ratio)
    if orig != target and length * 8 > LIMIT:
        with pytest.raises(MediaTooLargeError):
            resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget)
        assert budget.used_bytes == 0
        return
    out = resample_audio(audio, orig_sr=orig, target_sr=target, budget=budget)
    assert len(out) == resampled_length(n, orig_sr=orig, target_sr=target) == length
    assert out.dtype == np.float32 and bool(np.isfinite(out).all())
    assert budget.used_bytes == (0 if orig == target else length * 8)
