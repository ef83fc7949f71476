"""Band-limited audio resampling with numpy alone.

Audio models expect one sample rate (16 kHz for Whisper-style encoders). vLLM resamples with
librosa or scipy; mmfront adds no dependency for it: a polyphase windowed-sinc filter (Kaiser
window) does the job. The rate ratio is reduced to ``up/down``; output sample ``k`` sits at input
position ``k*down/up``, and the ``up`` distinct fractional offsets each get one precomputed
filter, so the cost is one small dot product per output sample.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mmfront.errors import ValidationError

_ZERO_CROSSINGS = 16
"""Sinc lobes kept on each side of the centre: sets the filter's transition width."""
_ROLLOFF = 0.945
"""Cutoff as a fraction of the lower Nyquist frequency, leaving room for the transition band."""
_KAISER_BETA = 8.6
"""About 86 dB stopband attenuation."""
_MAX_PHASES = 4096
"""Ratios needing more filter phases are approximated (relative rate error below 1e-7)."""
_ROWS_PER_BLOCK = 8192


def resampled_length(num_samples: int, *, orig_sr: float, target_sr: float) -> int:
    """``round(num_samples * target_sr / orig_sr)``, computed exactly."""
    return round(Fraction(num_samples) * Fraction(target_sr) / Fraction(orig_sr))


def resample_audio(audio: np.ndarray, *, orig_sr: float, target_sr: float) -> np.ndarray:
    """``audio`` (1-D) resampled from ``orig_sr`` to ``target_sr`` Hz.

    The result has :func:`resampled_length` samples and the input's float dtype (float32 for
    other dtypes). Equal rates return the input itself.
    """
    for name, rate in (("orig_sr", orig_sr), ("target_sr", target_sr)):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise ValidationError(f"Audio sampling rate {name} must be a positive finite number, got {rate!r}",
                                  parameter="multi_modal_data")
    samples = np.asarray(audio)
    if samples.ndim != 1:
        raise ValidationError(f"Only 1-D (mono) audio can be resampled, got shape {samples.shape}; mix the channels "
                              "down to one first", parameter="multi_modal_data")
    if orig_sr == target_sr:
        return audio
    out_dtype = samples.dtype if samples.dtype.kind == "f" else np.dtype(np.float32)
    out_len = resampled_length(len(samples), orig_sr=orig_sr, target_sr=target_sr)
    out = np.zeros(out_len, dtype=np.float64)
    if out_len == 0 or len(samples) == 0:
        return out.astype(out_dtype)
    up, down = _phase_ratio(orig_sr, target_sr)
    bank = _filter_bank(up, down)
    half = (bank.shape[1] - 1) // 2
    padded = np.zeros(len(samples) + 2 * half, dtype=np.float64)
    padded[half:half + len(samples)] = samples
    windows = sliding_window_view(padded, bank.shape[1])  # windows[i] is centred on samples[i]
    # Outputs r0, r0+up, r0+2*up, ... share one filter phase and step `down` input samples apart.
    for r0 in range(min(up, out_len)):
        phase = (r0 * down) % up
        first = (r0 * down) // up
        count = len(range(r0, out_len, up))
        for start in range(0, count, _ROWS_PER_BLOCK):
            stop = min(start + _ROWS_PER_BLOCK, count)
            rows = windows[first + start * down:first + (stop - 1) * down + 1:down]
            out[r0 + start * up:r0 + stop * up:up] = np.ascontiguousarray(rows) @ bank[phase]
    return out.astype(out_dtype, copy=False)


def _phase_ratio(orig_sr: float, target_sr: float) -> tuple[int, int]:
    ratio = Fraction(target_sr) / Fraction(orig_sr)
    if ratio.numerator > _MAX_PHASES:
        ratio = 1 / (1 / ratio).limit_denominator(_MAX_PHASES)
    return ratio.numerator, ratio.denominator


@functools.lru_cache(maxsize=16)
def _filter_bank(up: int, down: int) -> np.ndarray:
    """``bank[p]`` weights the taps around an output that falls ``p/up`` of a sample after its
    centre input sample. Rows are normalised to unit DC gain."""
    cutoff = _ROLLOFF * min(1.0, up / down)
    half = math.ceil(_ZERO_CROSSINGS / cutoff)
    taps = np.arange(-half, half + 1, dtype=np.float64)
    distance = taps[None, :] - (np.arange(up, dtype=np.float64) / up)[:, None]
    edge = half + 1
    window = np.i0(_KAISER_BETA * np.sqrt(np.clip(1.0 - (distance / edge) ** 2, 0.0, 1.0))) / np.i0(_KAISER_BETA)
    bank = cutoff * np.sinc(cutoff * distance) * window
    bank /= bank.sum(axis=1, keepdims=True)
    bank.setflags(write=False)
    return bank
