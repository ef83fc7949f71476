"""Audio resampling as vLLM 0.33 does it, bounded and charged before anything is allocated.

Audio models expect one sample rate (16 kHz for Whisper-style encoders). vLLM 0.33's
``MultiModalDataParser`` resamples with ``torchaudio.transforms.Resample`` (its default
``audio_resample_method``): a Hann-windowed sinc kernel (6 zero crossings, roll-off 0.99) over the
rates rounded to integers and divided by their gcd, applied as one strided ``conv1d`` in float32
with oneDNN off, and cut to ``ceil(new * n / orig)`` samples, that quotient rounded to float32
first (1 s at 22050 Hz is 24000 samples at 24 kHz). mmfront builds the same kernel with the same
torch operations and applies it the same way, without importing torchaudio (whose PyPI build does
not load beside CPU torch), so a model sees vLLM's samples bit for bit and vLLM's token counts.
Cutting the convolution into pieces would bound its scratch memory but changes the float sums,
so it is applied whole, as vLLM does, and its scratch is charged instead.

The rates come from file headers and from clients, so they are checked first: a ratio beyond
:data:`MAX_UPSAMPLE` / :data:`MAX_DOWNSAMPLE` is refused, and so are rates whose reduced ratio
needs a kernel over :data:`MAX_KERNEL_TAPS` taps (44101 Hz to 16 kHz: 706 M), which torchaudio
would build, at gigabytes, for every such request. The peak is charged to the request's
:class:`DecodeBudget` before the kernel is built: the output, the feature extractor's float32 copy
of it (:func:`resampled_bytes`; the convolution's output and its reordered copy, at the same size,
are freed before that copy is made) and the convolution's scratch (:func:`resample_scratch_bytes`:
the padded input, the unfolded input windows, ``taps x output frames``, and a kernel too large to
be kept for the next request).
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from typing import TYPE_CHECKING

import numpy as np

from mmfront.errors import MediaDecodeError, ValidationError
from mmfront.media.budget import DecodeBudget

if TYPE_CHECKING:
    import torch

MAX_UPSAMPLE = 1 << 16
"""Largest ``target_sr / orig_sr``: 1 Hz to 16 kHz passes; a larger ratio is no recording."""
MAX_DOWNSAMPLE = 1 << 10
"""Largest ``orig_sr / target_sr``: the kernel, and the work per output sample, grow with it."""
MAX_KERNEL_TAPS = 1 << 22
"""Largest kernel (output phases x taps) built: 44.1, 22.05 and 11.025 kHz to 16 kHz need 76 k, 147 k
and 291 k; rates with no common divisor with the target (16001 Hz: 256 M) are refused. Its float64
construction peaks at :data:`KERNEL_BUILD_BYTES_PER_TAP` a tap."""
KERNEL_BUILD_BYTES_PER_TAP = 32
"""The float64 tensors alive at once while a kernel is built (times, window, sinc, product)."""
LOWPASS_WIDTH = 6
"""torchaudio's default ``lowpass_filter_width``: zero crossings of the sinc on each side."""
ROLLOFF = 0.99
"""torchaudio's default ``rolloff``: the cut-off as a fraction of the lower Nyquist frequency."""
PROCESSOR_COPY_ITEMSIZE = 4
"""Bytes per sample of the float32 copy a feature extractor makes of the waveform it is given."""
SMALL_KERNEL_TAPS = 1 << 19
"""Kernels up to this size (2 MiB of float32; 11.025, 22.05 and 44.1 kHz to 16 kHz) are kept for the
next request at the same rates, as vLLM keeps its ``Resample`` modules; larger ones are built
each time rather than held."""
_conv_lock = threading.Lock()
"""oneDNN is switched off process-wide around the convolution (as vLLM does), one at a time."""


def check_rates(orig_sr: float, target_sr: float) -> None:
    """Refuse rates that are not positive finite numbers, ratios outside the limits, and rates
    whose kernel would be larger than :data:`MAX_KERNEL_TAPS`."""
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
    orig, new = _reduced(orig_sr, target_sr)
    if min(orig, new) < 1:
        raise MediaDecodeError(f"Audio at {orig_sr!r} Hz cannot be resampled to {target_sr!r} Hz: vLLM resamples "
                               "between whole rates, and this one rounds to 0 Hz.", parameter="multi_modal_data")
    if orig != new and kernel_taps(orig, new) > MAX_KERNEL_TAPS:
        raise MediaDecodeError(
            f"Audio at {orig_sr!r} Hz cannot be resampled to {target_sr!r} Hz: the two rates share no large common "
            f"divisor, so the resampling kernel would have {kernel_taps(orig, new)} taps (at most {MAX_KERNEL_TAPS}). "
            "Send audio at a standard rate (8000, 11025, 16000, 22050, 32000, 44100 or 48000 Hz), or resample it "
            "yourself first.",
            parameter="multi_modal_data",
        )


def _reduced(orig_sr: float, target_sr: float) -> tuple[int, int]:
    """vLLM's whole rates (rounded), divided by their gcd as torchaudio does; as rounded where one
    is 0."""
    orig, new = round(orig_sr), round(target_sr)
    if orig < 1 or new < 1:
        return orig, new
    divisor = math.gcd(orig, new)
    return orig // divisor, new // divisor


def _width(orig: int, new: int) -> int:
    """Input samples the kernel reaches on each side of its window (reduced rates)."""
    return math.ceil(LOWPASS_WIDTH * orig / (min(orig, new) * ROLLOFF))


def kernel_taps(orig: int, new: int) -> int:
    """Elements of the kernel for the reduced rates: ``new`` phases of ``2 * width + orig`` taps."""
    return new * (2 * _width(orig, new) + orig)


def resampled_length(num_samples: int, *, orig_sr: float, target_sr: float) -> int:
    """Samples after resampling ``num_samples``: ``ceil(new * n / orig)`` over the reduced rates,
    the quotient rounded to float32 first, as torchaudio computes it; ``n`` where the rates round
    to the same integer (vLLM then returns the input)."""
    orig, new = _reduced(orig_sr, target_sr)
    if orig == new:
        return num_samples
    return math.ceil(float(np.float32(new * num_samples / orig)))


def resampled_bytes(num_samples: int, itemsize: int = 4) -> int:
    """What ``num_samples`` resampled samples cost at their peak: the output (``itemsize`` bytes
    each) and the feature extractor's float32 copy of it."""
    return num_samples * (itemsize + PROCESSOR_COPY_ITEMSIZE)


def resample_scratch_bytes(num_samples: int, *, orig_sr: float, target_sr: float) -> int:
    """The convolution's scratch beside its output, for ``num_samples`` input samples: the float32
    input padded on both sides, the unfolded windows (one column of ``taps`` samples per output
    frame) and, for a kernel too large to be kept, its construction. A kept kernel (at most
    :data:`SMALL_KERNEL_TAPS`, 16 MiB to build once) is not charged to every request using it."""
    orig, new = _reduced(orig_sr, target_sr)
    if orig == new:
        return 0
    width = _width(orig, new)
    taps = 2 * width + orig
    frames = num_samples // orig + 1
    build = kernel_taps(orig, new) * KERNEL_BUILD_BYTES_PER_TAP if kernel_taps(orig, new) > SMALL_KERNEL_TAPS else 0
    return build + 4 * (num_samples + 2 * width + orig + taps * frames)


def resample_audio(
    audio: np.ndarray, *, orig_sr: float, target_sr: float, budget: DecodeBudget | None = None
) -> np.ndarray:
    """``audio`` (1-D) resampled from ``orig_sr`` to ``target_sr`` Hz as vLLM 0.33 does it.

    The result is float32 with :func:`resampled_length` samples. Rates that round to the same
    integer return the input itself. With a ``budget``, the output and the convolution's scratch
    are charged to it before anything is allocated (:func:`resampled_bytes` and
    :func:`resample_scratch_bytes`); a refused charge raises ``MediaTooLargeError``.
    """
    check_rates(orig_sr, target_sr)
    samples = np.asarray(audio)
    if samples.ndim != 1:
        raise ValidationError(f"Only 1-D (mono) audio can be resampled, got shape {samples.shape}; mix the channels "
                              "down to one first", parameter="multi_modal_data")
    orig, new = _reduced(orig_sr, target_sr)
    if orig == new:
        return audio
    out_len = resampled_length(len(samples), orig_sr=orig_sr, target_sr=target_sr)
    if budget is not None:
        budget.charge(resampled_bytes(out_len), what=f"Audio resampled from {orig_sr:g} to {target_sr:g} Hz "
                      f"({out_len} samples)")
        charge_scratch(budget, len(samples), orig_sr=orig_sr, target_sr=target_sr)
    if len(samples) == 0:
        return np.zeros(0, dtype=np.float32)
    if not (math.isfinite(samples.min()) and math.isfinite(samples.max())):
        raise MediaDecodeError("The audio samples contain NaN or infinity; send finite samples in [-1, 1].",
                               parameter="multi_modal_data")
    return _convolve(samples, orig, new, out_len)


def charge_scratch(budget: DecodeBudget, num_samples: int, *, orig_sr: float, target_sr: float) -> None:
    """Charge the convolution's scratch for ``num_samples`` input samples to ``budget``."""
    scratch = resample_scratch_bytes(num_samples, orig_sr=orig_sr, target_sr=target_sr)
    if scratch:
        budget.charge(scratch, what=f"Resampling {num_samples} samples from {orig_sr:g} to {target_sr:g} Hz "
                      "(the convolution's scratch)")


def _convolve(samples: np.ndarray, orig: int, new: int, out_len: int) -> np.ndarray:
    """One strided convolution of the padded input with every phase of the kernel, the phases
    interleaved and cut to ``out_len``: torchaudio's ``_apply_sinc_resample_kernel``."""
    import torch

    kernel = _small_kernel(orig, new) if kernel_taps(orig, new) <= SMALL_KERNEL_TAPS else _kernel(orig, new)
    width = _width(orig, new)
    waveform = torch.as_tensor(samples, dtype=torch.float32)[None]
    padded = torch.nn.functional.pad(waveform, (width, width + orig))
    with _conv_lock:  # not mkldnn.flags(), which warns about Intel GPUs' TF32 on every call
        enabled = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a ContextProp, set as a bool
        try:
            phases = torch.nn.functional.conv1d(padded[:, None], kernel, stride=orig)
        finally:
            torch.backends.mkldnn.enabled = enabled
    resampled = phases.transpose(1, 2).reshape(1, -1)
    del phases
    out: np.ndarray = resampled[0, :out_len].numpy()
    return out


@functools.lru_cache(maxsize=16)
def _small_kernel(orig: int, new: int) -> torch.Tensor:
    return _kernel(orig, new)


def _kernel(orig: int, new: int) -> torch.Tensor:
    """torchaudio's ``_get_sinc_resample_kernel`` (Hann window) for the reduced rates, computed in
    float64 with its operations in its order, then float32: ``[new, 1, 2 * width + orig]``."""
    import torch

    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_WIDTH * orig / base)
    offsets = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    times = torch.arange(0, -new, -1)[:, None, None] / new + offsets
    times *= base
    times = times.clamp_(-LOWPASS_WIDTH, LOWPASS_WIDTH)
    window = torch.cos(times * math.pi / LOWPASS_WIDTH / 2) ** 2
    times *= math.pi
    kernels = torch.where(times == 0, torch.tensor(1.0).to(times), times.sin() / times)
    kernels *= window * (base / orig)
    return kernels.to(dtype=torch.float32)
