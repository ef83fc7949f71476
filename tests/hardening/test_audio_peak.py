"""Issue 22, class 2: resampled audio is charged at its true peak.

A 40 KB WAV declaring 2 Hz resamples to 160 M samples at 16 kHz (640 MB of float32). Only that
output was charged to the request's decode budget, but the process peaked at 1.25 GiB: the
feature extractor copies the waveform it is given (Whisper's ``np.asarray([speech])``), and the
resampler's own output was copied once more. The charge is now the output plus the extractor's
copy (the convolution's output and its reordered copy, of the same size, are gone before the
extractor's copy is made) plus the convolution's scratch, charged before anything is allocated, so
a request's peak stays inside its budget. The samples are vLLM 0.33's: torchaudio's ``Resample``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import preloaded
from mmfront.config import MultiModalConfig
from mmfront.errors import MediaTooLargeError
from mmfront.media import DecodeBudget, load_audio_bytes, resample_audio
from mmfront.parse import MultiModalDataParser
from mmfront.testing.media import wav_bytes

MiB = 1 << 20
SLACK = 48 * MiB
"""Allocations of a request that are not media (token ids, the mel features of 30 s, allocator
slack), on top of what the budget admits."""

_PEAK_SCRIPT = textwrap.dedent("""
    import base64, json, sys, tempfile
    from pathlib import Path
    import numpy as np
    from mmfront.config import MultiModalConfig
    from mmfront.errors import MediaTooLargeError
    from mmfront.preprocess import InputPreprocessor
    from mmfront.testing.media import wav_bytes
    from mmfront.testing.models import build_model_folder

    def kib(key):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

    samples, budget = int(sys.argv[1]), int(sys.argv[2])
    folder = build_model_folder("qwen2_audio", Path(tempfile.mkdtemp()))
    pre = InputPreprocessor(folder, MultiModalConfig(max_media_request_decode_bytes=budget))
    wav = wav_bytes(np.zeros(samples, dtype=np.int16), 2)
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    pre.preprocess([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])  # warm
    before = kib("VmRSS")
    try:
        pre.preprocess([{"role": "user", "content": [part]}])
        outcome = "ok"
    except MediaTooLargeError as exc:
        outcome = "refused: " + str(exc)
    print(json.dumps({"outcome": outcome, "peak": (kib("VmHWM") - before) * 1024}))
""")


def _request_peak(samples: int, budget: int) -> tuple[str, int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    done = preloaded.run([sys.executable, "-c", _PEAK_SCRIPT, str(samples), str(budget)], env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["outcome"], result["peak"]


@pytest.mark.parametrize("budget_mib", [200, 400])
def test_a_2hz_wav_never_peaks_past_its_requests_budget(budget_mib: int) -> None:
    """4,000 samples at 2 Hz: 32 M samples at 16 kHz, 128 MB of float32, twice that at the peak."""
    budget = budget_mib * MiB
    outcome, peak = _request_peak(4000, budget)
    assert peak <= budget + SLACK, (outcome, peak)
    if budget_mib == 200:
        assert outcome.startswith("refused: ") and "max_media_request_decode_bytes" in outcome
        assert "(32000000 samples) decodes to 256000000 bytes" in outcome
    else:
        assert outcome == "ok"


def test_the_charge_covers_output_and_the_extractors_copy() -> None:
    config = MultiModalConfig()
    budget = DecodeBudget.from_config(config)
    loaded = load_audio_bytes(wav_bytes(np.zeros(20_000, dtype=np.int16), 2), config=config, budget=budget)
    with pytest.raises(MediaTooLargeError, match=r"\(160000000 samples\) decodes to 1280000000 bytes") as info:
        MultiModalDataParser(target_sr=16000).parse_mm_data({"audio": loaded})
    assert info.value.parameter == "multi_modal_data" and budget.used_bytes == 80_000


def test_audio_at_the_models_rate_pays_for_the_extractors_copy_too() -> None:
    config = MultiModalConfig()
    budget = DecodeBudget(1 << 20)
    loaded = load_audio_bytes(wav_bytes(np.zeros(1600, dtype=np.int16), 16000), config=config, budget=budget)
    MultiModalDataParser(target_sr=16000).parse_mm_data({"audio": loaded})
    assert budget.used_bytes == 1600 * 4 + 1600 * 4  # the decoded samples, and the extractor's copy


def _torchaudio_resample(audio: np.ndarray, orig: int, target: int) -> np.ndarray:
    """What vLLM 0.33's default resampler computes (oneDNN off, as vLLM runs it)."""
    import torch
    import torchaudio

    with torch.backends.mkldnn.flags(enabled=False):
        out: np.ndarray = torchaudio.transforms.Resample(orig, target)(torch.as_tensor(audio, dtype=torch.float32)).numpy()
    return out


NEEDS_TORCHAUDIO = pytest.mark.skipif(importlib.util.find_spec("torchaudio") is None,
                                      reason="the reference is torchaudio's Resample, vLLM 0.33's resampler "
                                             "(`make test` installs torchaudio)")
rates = st.sampled_from([2, 3, 7, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 37800, 44100, 48000, 88200, 96000])


@NEEDS_TORCHAUDIO
@settings(max_examples=120, deadline=None)
@given(n=st.integers(min_value=1, max_value=3000), orig=rates, target=rates, wide=st.booleans(), seed=st.integers(0, 99))
def test_resampling_gives_torchaudios_exact_samples(n: int, orig: int, target: int, wide: bool, seed: int) -> None:
    if orig == target or not 1 / 1024 <= target / orig <= 65536 or n * target / orig > 3_000_000:
        return
    audio = np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float64 if wide else np.float32)
    got = resample_audio(audio, orig_sr=orig, target_sr=target)
    want = _torchaudio_resample(audio, orig, target)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@NEEDS_TORCHAUDIO
def test_long_inputs_give_torchaudios_exact_samples() -> None:
    audio = np.random.default_rng(3).uniform(-1, 1, 300_001).astype(np.float32)
    for orig, target in ((44_100, 16_000), (8_000, 16_000), (16_000, 8_000), (3, 16_000)):
        clip = audio[: 300_001 if orig > 3 else 50]
        assert resample_audio(clip, orig_sr=orig, target_sr=target).tobytes() == \
            _torchaudio_resample(clip, orig, target).tobytes(), (orig, target)


def test_the_script_reads_this_checkout() -> None:
    """The subprocess must load the mmfront under test, not another install."""
    import mmfront

    assert Path(mmfront.__file__).resolve().parents[1] in {Path(p).resolve() for p in sys.path if p}
