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

The charge is the peak the resampled waveform costs, not only its size (:func:`resampled_bytes`):
the output, plus the float32 copy every audio feature extractor makes of its input (Whisper's
``np.asarray([speech], dtype=np.float32)``), which lives next to it. soxr streams into the
preallocated output in chunks of :data:`CHUNK_SAMPLES` output samples, so it adds no buffer of the
output's size: ``soxr.resample`` holds its own output, which a zero-padding to librosa's length
copied once more (a 2 Hz WAV of 40 KB peaked at three times its 640 MB output).
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
CHUNK_SAMPLES = 1 << 16
"""Output samples soxr produces per step: the only buffer besides the output (256 KiB of float32)."""
PROCESSOR_COPY_ITEMSIZE = 4
"""Bytes per sample of the float32 copy a feature extractor makes of the waveform it is given."""


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


def resampled_bytes(num_samples: int, itemsize: int = 4) -> int:
    """What ``num_samples`` resampled samples cost at their peak: the output (``itemsize`` bytes
    each) and the feature extractor's float32 copy of it."""
    return num_samples * (itemsize + PROCESSOR_COPY_ITEMSIZE)


def resample_audio(
    audio: np.ndarray, *, orig_sr: float, target_sr: float, budget: DecodeBudget | None = None
) -> np.ndarray:
    """``audio`` (1-D) resampled from ``orig_sr`` to ``target_sr`` Hz, as vLLM's librosa path does.

    The result has :func:`resampled_length` samples, float64 for float64 input and float32
    otherwise. Equal rates return the input itself. With a ``budget``, the peak is charged to it
    before anything is allocated (:func:`resampled_bytes`, plus a converted copy of the input when
    one is needed); a refused charge raises ``MediaTooLargeError``.
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
        converted = samples.dtype != dtype or not samples.flags.c_contiguous
        budget.charge(resampled_bytes(out_len, dtype.itemsize) + (samples.size * dtype.itemsize if converted else 0),
                      what=f"Audio resampled from {orig_sr:g} to {target_sr:g} Hz ({out_len} samples)")
    if len(samples) == 0:
        return np.zeros(out_len, dtype=dtype)
    if not (math.isfinite(samples.min()) and math.isfinite(samples.max())):
        raise MediaDecodeError("The audio samples contain NaN or infinity; send finite samples in [-1, 1].",
                               parameter="multi_modal_data")
    return _stream(np.ascontiguousarray(samples, dtype=dtype), float(orig_sr), float(target_sr), out_len)


def _stream(samples: np.ndarray, orig_sr: float, target_sr: float, out_len: int) -> np.ndarray:
    """soxr's samples written straight into the zero-padded output: byte for byte what
    ``soxr.resample`` returns, which keeps at most ``floor(n * target / orig) + 1`` samples (its
    buffer), then padded with zeros to ``out_len`` as librosa's ``fix_length`` does."""
    import soxr  # on first use: a process that never resamples never loads it

    out = np.zeros(out_len, dtype=samples.dtype)
    keep = min(out_len, int(len(samples) * target_sr / orig_sr) + 1)
    stream = soxr.ResampleStream(orig_sr, target_sr, 1, dtype=samples.dtype, quality=_QUALITY)
    step = max(1, int(CHUNK_SAMPLES * orig_sr / target_sr))
    filled = 0
    for start in range(0, len(samples), step):
        chunk = stream.resample_chunk(samples[start:start + step], last=start + step >= len(samples))
        take = min(len(chunk), keep - filled)
        out[filled:filled + take] = chunk[:take]
        filled += take
    return out
