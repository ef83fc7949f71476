"""Audio resampling with soxr, bounded and charged before anything is allocated.

Audio models expect one sample rate (16 kHz for Whisper-style encoders). vLLM resamples with
``librosa.resample``, whose default is soxr at "HQ" quality followed by ``fix_length`` to
``ceil(n * (target_sr / orig_sr))`` samples computed in float64. mmfront calls soxr the same way
and keeps that length rule, float rounding included (1 s at 22050 Hz becomes 24001 samples at
24 kHz, not 24000), so a model sees vLLM's samples and vLLM's token counts.

The rates come from file headers and from clients, so they are checked first: a ratio beyond
:data:`MAX_UPSAMPLE` / :data:`MAX_DOWNSAMPLE` is refused (soxr does not return for a 1e6x
upsampling, and its cost per input sample grows with the downsampling factor), and the output
length is known, and charged to the request's :class:`DecodeBudget`, before soxr runs.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from mmfront.errors import MediaDecodeError, ValidationError
from mmfront.media.budget import DecodeBudget

MAX_UPSAMPLE = 1 << 16
"""Largest ``target_sr / orig_sr``: 1 Hz to 16 kHz passes; far larger ratios keep soxr busy for
minutes."""
MAX_DOWNSAMPLE = 1 << 10
"""Largest ``orig_sr / target_sr``: beyond it soxr's cost per input sample grows steeply
(docs/benchmarks.md, "Design measurements")."""
_QUALITY = "HQ"
"""librosa's default ``res_type`` (``soxr_hq``), which vLLM's resampler uses."""


def check_rates(orig_sr: float, target_sr: float) -> None:
    """Refuse rates that are not positive finite numbers, and ratios outside the limits."""
    for name, rate in (("orig_sr", orig_sr), ("target_sr", target_sr)):
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not math.isfinite(rate) or rate <= 0:
            raise MediaDecodeError(f"Audio sampling rate {name} must be a positive finite number, got {rate!r}. Send "
                                   "the rate the audio was recorded at, in Hz.", parameter="multi_modal_data")
    ratio = float(target_sr) / float(orig_sr)
    if not 1 / MAX_DOWNSAMPLE <= ratio <= MAX_UPSAMPLE:
        raise MediaDecodeError(
            f"Audio at {orig_sr!r} Hz cannot be resampled to {target_sr!r} Hz: the ratio {ratio:.3g} is outside "
            f"1/{MAX_DOWNSAMPLE}..{MAX_UPSAMPLE}. Send audio recorded at a real sampling rate (such as 8000-48000 "
            "Hz), or resample it yourself first.",
            parameter="multi_modal_data",
        )


def resampled_length(num_samples: int, *, orig_sr: float, target_sr: float) -> int:
    """Samples after resampling ``num_samples``: librosa's ``ceil(n * (target_sr / orig_sr))``
    in float64, so lengths (and token counts) match vLLM's."""
    return math.ceil(num_samples * (float(target_sr) / float(orig_sr)))


def resample_audio(
    audio: np.ndarray, *, orig_sr: float, target_sr: float, budget: DecodeBudget | None = None
) -> np.ndarray:
    """``audio`` (1-D) resampled from ``orig_sr`` to ``target_sr`` Hz, as vLLM's librosa path does.

    The result has :func:`resampled_length` samples, float64 for float64 input and float32
    otherwise. Equal rates return the input itself. With a ``budget``, the output's bytes are
    charged to it before anything is allocated (a refused charge raises ``MediaTooLargeError``).
    """
    check_rates(orig_sr, target_sr)
    samples = np.asarray(audio)
    if samples.ndim != 1:
        raise ValidationError(f"Only 1-D (mono) audio can be resampled, got shape {samples.shape}; mix the channels "
                              "down to one first", parameter="multi_modal_data")
    if orig_sr == target_sr:
        return audio
    dtype = np.dtype(np.float64) if samples.dtype == np.float64 else np.dtype(np.float32)
    out_len = resampled_length(len(samples), orig_sr=orig_sr, target_sr=target_sr)
    if budget is not None:
        budget.charge(out_len * dtype.itemsize,
                      what=f"Audio resampled from {orig_sr:g} to {target_sr:g} Hz ({out_len} samples)")
    if len(samples) == 0:
        return np.zeros(out_len, dtype=dtype)
    if not (math.isfinite(samples.min()) and math.isfinite(samples.max())):
        raise MediaDecodeError("The audio samples contain NaN or infinity; send finite samples in [-1, 1].",
                               parameter="multi_modal_data")
    import soxr  # on first use: a process that never resamples never loads it

    out = soxr.resample(np.ascontiguousarray(samples, dtype=dtype), orig_sr, target_sr, quality=_QUALITY)
    if len(out) >= out_len:
        return out[:out_len]
    return np.concatenate([out, np.zeros(out_len - len(out), dtype=dtype)])
