"""Content hashing (mmfront.hashing) against raw blake3 over the same number of bytes.

Three inputs, each hashed the way ``get_mm_hashes`` hashes an item (``hash_kwargs`` with the
framing): a 1024x1024 RGB PIL image (its 3 MiB of pixels), the same image's PNG bytes in a lazy
``MediaWithBytes`` (never decoded), and a 4 MiB float32 array. The goal is a ratio
``raw_blake3_time / mmfront_time`` close to 1: framing and dispatch cost nothing next to the
hash itself. For the PIL image, vLLM's own approach (copy all pixels into one array, then hash)
is measured in the same run as a second baseline, and so is mmfront without its C extension.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import blake3
import numpy as np
from PIL import Image

from _harness import Report, median_time
from mmfront import pixels
from mmfront.hashing import MultiModalHasher
from mmfront.parse import MediaWithBytes

GROUP = "hashing"


def _copy_first(image: Image.Image) -> dict[str, object]:
    """The value vLLM 0.33 hashes for a PIL image, built its way (``np.asarray`` copies every pixel)."""
    return {"mode": image.mode, "data": np.asarray(image)}


def _without_c_packer(measure: Callable[[], float]) -> float:
    """``measure()`` as on an install without a C compiler, where Pillow packs the pixels."""
    pack = pixels._pack
    pixels._pack = None
    try:
        return measure()
    finally:
        pixels._pack = pack


def _photo_like(size: int, seed: int) -> Image.Image:
    """Smooth gradients plus sensor-like noise, so the PNG is about as large as a photo's (~1.9 MB)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([x * 255 // (size - 1), y * 255 // (size - 1), (x + y) * 255 // (2 * size - 2)], axis=-1)
    noisy = base + rng.integers(-8, 8, base.shape)
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8), "RGB")


def run(report: Report, quick: bool) -> None:
    repeat = 7 if quick else 25
    rng = np.random.default_rng(0)
    image = _photo_like(1024, seed=0)
    png = io.BytesIO()
    image.save(png, "PNG")
    png_bytes = png.getvalue()
    lazy_png = MediaWithBytes(original_bytes=png_bytes, decode=lambda: Image.open(io.BytesIO(png_bytes)))
    array = rng.standard_normal(1 << 20).astype(np.float32)

    # The raw baseline hashes the very bytes the item stands for. (Not `bytes(n)`: a zeroed buffer
    # can be backed by the kernel's shared zero page, which hashes faster than real memory.)
    cases = [
        ("PIL 1024x1024 RGB", image, image.tobytes(), 0.7),
        ("PNG bytes (lazy MediaWithBytes)", lazy_png, png_bytes, 0.8),
        ("ndarray 4 MiB float32", array, array.tobytes(), 0.8),
    ]
    for name, value, raw, goal in cases:
        nbytes = len(raw)
        raw_s = median_time(lambda raw=raw: blake3.blake3(raw).hexdigest(), repeat=repeat)
        ours_s = median_time(lambda value=value: MultiModalHasher.hash_kwargs("blake3", image=value), repeat=repeat)
        report.add(GROUP, f"{name}: mmfront", ours_s * 1e3, "ms")
        report.add(GROUP, f"{name}: raw blake3, {nbytes / 2**20:.2f} MiB", raw_s * 1e3, "ms")
        report.ratio(GROUP, f"{name}: raw blake3 / mmfront", raw_s / ours_s, at_least=goal)
        if isinstance(value, Image.Image):
            copy_s = median_time(lambda: MultiModalHasher.hash_kwargs("blake3", image=_copy_first(image)),
                                 repeat=repeat)
            report.add(GROUP, f"{name}: copy-first (vLLM's way)", copy_s * 1e3, "ms")
            report.ratio(GROUP, f"{name}: raw blake3 / copy-first", raw_s / copy_s)
            report.ratio(GROUP, f"{name}: mmfront speed-up over copy-first", copy_s / ours_s, at_least=1.0)
            if pixels.fast_packing_kernel() is not None:
                pillow_s = _without_c_packer(lambda: median_time(
                    lambda: MultiModalHasher.hash_kwargs("blake3", image=image), repeat=repeat))
                report.add(GROUP, f"{name}: Pillow's packer (no C extension)", pillow_s * 1e3, "ms")
                report.ratio(GROUP, f"{name}: C packer ({pixels.fast_packing_kernel()}) speed-up", pillow_s / ours_s)
    assert lazy_png.decode_count == 0, "hashing decoded the lazy PNG"
