"""torch's uint8 antialiased bicubic and bilinear resizes, bit for bit, into planes: what HF's
torchvision image processors run on a Qwen2-VL image (``F.interpolate(mode="bicubic",
antialias=True)`` on uint8), and what Gemma 3's native path runs on an image it resizes (the same
with ``mode="bilinear"``).

torch's CPU kernel repacks the pixels to 4 bytes each, filters a pixel's channels together and
writes channels-last pixels, which the patch rows then split into planes again; on a Qwen2.5-VL
1024x768 miss it was the lane's second-largest step after the JPEG decode, and its scratch
buffers are fresh pages on every call where ``mmfront serve`` fixes glibc's mmap threshold (a
Gemma 3 1024x768 miss processed in the server faulted 1,683 pages in, all in torch's resize). The
C loop of ``mmfront._bicubic`` goes from the channels-last pixels a JPEG decodes to straight to
planes in warm memory, with the weights made here exactly as torch makes them for either filter
(:func:`axis_weights`: the two share torch's separable uint8 kernel and differ only in the filter
and its reach), so every byte is torch's: the tests compare the two over random sizes and pixels.

Where the extension is not built or this CPU has no AVX2, or an image is not one it takes
(:func:`resize_planes` says None), the caller runs torch's resize as before.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import numpy as np
import torch

from mmfront.wire.warm import warm_memory

__all__ = ["AxisWeights", "Mode", "axis_weights", "resize_planes", "resizes_in_c"]

_KEYS_A = -0.5
"""The cubic's ``a`` with antialiasing (Keys', as Pillow's); torch uses -0.75 without it."""
_MAX_TAPS = 64
"""The most taps the C loop takes (a downscale past ~15x has more; torch does those)."""
_WINDOW = 16
_BLOCK = 8


_Resize = Callable[..., None]


def _load_resize() -> _Resize | None:
    """The C loop, where it beats torch's: built (a C compiler at install) and with its AVX2
    loops on this CPU (its portable loops, kept for other machines' tests, are slower than torch)."""
    try:
        from mmfront._bicubic import loops, resize
    except ImportError:  # installed without a C compiler: torch resizes
        return None
    return resize if loops() == "avx2" else None


_resize = _load_resize()


def resizes_in_c() -> bool:
    """Whether :func:`resize_planes` resizes here (else it always says None and torch resizes)."""
    return _resize is not None


class AxisWeights(NamedTuple):
    """One axis of the resize as torch computes it for uint8: each output's first source index,
    its taps' int16 weights (zero past its own taps; the taps no output uses left out) and their
    fixed-point precision."""

    first: np.ndarray
    weights: np.ndarray
    precision: int
    windowed: bool
    """Every 8 consecutive outputs read within 16 source pixels: the C loop's fast case."""


def _keys_cubic(x: np.ndarray) -> np.ndarray:
    """torch's ``aa_filter`` for bicubic, evaluated in torch's order of operations."""
    a = _KEYS_A
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _triangle(x: np.ndarray) -> np.ndarray:
    """torch's ``aa_filter`` for bilinear."""
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


Mode = Literal["bicubic", "bilinear"]
_FILTERS: dict[str, tuple[int, Callable[[np.ndarray], np.ndarray]]] = {"bicubic": (4, _keys_cubic),
                                                                        "bilinear": (2, _triangle)}
"""Each mode's ``interp_size`` (the source pixels its filter spans at scale 1) and filter."""


@functools.lru_cache(maxsize=256)
def axis_weights(in_size: int, out_size: int, mode: Mode = "bicubic") -> AxisWeights:
    """torch's ``_compute_index_ranges_int16_weights`` for an antialiased ``mode`` axis (no
    ``align_corners``, no scale factor: the size alone): the support and centres of Pillow, the
    weights normalised in float64 and summed in tap order, then scaled to int16 at the largest
    precision under which the axis's largest weight stays below 2**15. Kept per pair of sizes:
    a deployment's images come in a few sizes, and computing one axis costs ~0.1 ms."""
    interp_size, aa_filter = _FILTERS[mode]
    scale = in_size / out_size
    support = (interp_size * 0.5) * scale if scale >= 1.0 else interp_size * 0.5
    taps = math.ceil(support) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    center = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    first = np.maximum((center - support + 0.5).astype(np.int64), 0)
    sizes = np.clip(np.minimum((center + support + 0.5).astype(np.int64), in_size) - first, 0, taps)
    weights = np.zeros((out_size, taps), dtype=np.float64)
    total = np.zeros(out_size, dtype=np.float64)
    for j in range(taps):
        w = np.where(j < sizes, aa_filter(((j + first).astype(np.float64) - center + 0.5) * invscale), 0.0)
        weights[:, j] = w
        total = total + w  # in tap order, as torch sums them
    summed = total != 0.0
    np.divide(weights, total[:, None], out=weights, where=summed[:, None])
    largest = float(weights[summed].max(initial=0.0))
    precision = next((p for p in range(22) if int(0.5 + largest * (1 << (p + 1))) >= 1 << 15), 22)
    scaled = weights * (1 << precision)
    rounded = np.where(scaled < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled)).astype(np.int16)
    # torch keeps 2 x ceil(support) + 1 taps; the last ones are zero for every output at most
    # scales (an enlargement uses 4 of its 5), and a zero tap adds nothing: the loop skips them
    used = int(np.flatnonzero(rounded.any(axis=0)).max(initial=0)) + 1
    rounded = rounded[:, :used].copy()
    first = first.astype(np.int32)
    for array in (first, rounded):
        array.flags.writeable = False  # kept and shared between threads
    return AxisWeights(first, rounded, precision, _windowed(first, rounded))


def _windowed(first: np.ndarray, weights: np.ndarray) -> bool:
    taps = weights.shape[1]
    used = np.where(weights != 0, np.arange(taps), -1).max(axis=1)
    reach = first + np.maximum(used, 0)
    whole = len(first) // _BLOCK * _BLOCK
    if not whole:
        return True
    block_first = first[:whole:_BLOCK]
    block_reach = reach[:whole].reshape(-1, _BLOCK).max(axis=1)
    return bool((block_reach - block_first < _WINDOW).all())


def resize_planes(images: torch.Tensor, height: int, width: int, mode: Mode = "bicubic") -> torch.Tensor | None:
    """``F.interpolate(images, (height, width), mode=mode, antialias=True)`` of uint8 RGB
    ``images`` (B, 3, H, W) laid out channels-last (a decoded image's pixels, viewed channels
    first), as contiguous planes (B, 3, height, width) of the same bytes, in warm memory (a miss's
    planes are dropped once patchified). None where torch should do it: no extension, another
    layout or dtype, an axis that keeps its size alone where both do, or a shrink steep enough that
    the C loop's fast case does not hold."""
    if _resize is None or images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        return None
    batch, _, in_height, in_width = images.shape
    if (in_height, in_width) == (height, width) or not (batch and in_height and in_width and height and width):
        return None
    pixels = images.permute(0, 2, 3, 1)
    if images.device.type != "cpu" or not pixels.is_contiguous():
        return None
    h = axis_weights(in_width, width, mode) if in_width != width else None
    v = axis_weights(in_height, height, mode) if in_height != height else None
    if any(axis is not None and axis.weights.shape[1] > _MAX_TAPS for axis in (h, v)) or (h is not None and not h.windowed):
        return None
    out = torch.from_numpy(warm_memory(batch * 3 * height * width)).view(batch, 3, height, width)
    source, planes = pixels.numpy(), out.numpy()
    for b in range(batch):
        _resize(source[b], planes[b], in_height, in_width, height, width,
                *(h[:3] if h is not None else (None, None, None)), *(v[:3] if v is not None else (None, None, None)))
    return out
