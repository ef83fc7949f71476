"""Pixel kernels, in C where the optional extension ``mmfront._pixels`` is built, in Python or
torch where it is not. Three jobs, all bit-exact with the slow path they replace:

* **Strips for hashing**: a PIL image's pixels as the bytes of ``np.asarray(image)``, in strips,
  without one big copy. This is what content hashing feeds the hasher (vLLM hashes
  ``np.asarray(image)``), so the bytes must match numpy's array exactly. The fast path, for
  modes Pillow stores in 4 bytes per pixel (RGB, YCbCr and HSV keep the first 3; RGBA, RGBX,
  RGBa and CMYK keep all 4), reads Pillow's pixel memory through its zero-copy Arrow export and
  packs each strip with SIMD and without the GIL, into a scratch buffer reused by the thread.
  RGB packing then costs about a third of what the hash does, where Pillow's own packer costs
  as much as the hash. Pillow's raw encoder takes every other mode and whatever the fast path
  cannot: the extension was not built (no C compiler at install), Pillow predates its Arrow
  export (< 11.2), or the image is not one block of memory (Pillow splits images over 16 MiB).
* **Model-ready rows**: uint8 regions resized (torch's antialiased bilinear, into planes by
  :mod:`mmfront.bicubic` where it takes them, else by torch's channels-last kernel), rescaled,
  normalized and cast to the model dtype, as HF's torchvision backend does; with the extension each row goes through a per-channel table in one pass (``lut_planes``).
  A native processor calls :func:`pixel_rows`; what the settings mean is its model's business.
* **Patch rows**: resized planes laid out as Qwen2-VL's image processor lays them out (its
  ``patchify``: a permute, a temporal expand and a reshape, which torch copies element by element
  through an 8-dimensional stride pattern), in one pass of ``patch``-wide copies
  (:func:`patch_rows`).
"""

from __future__ import annotations

import itertools
import math
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from mmfront.bicubic import resize_planes
from mmfront.errors import HashingTypeError
from mmfront.wire.shared_buffer import reply_memory

__all__ = ["fast_packing_kernel", "iter_pixel_strips", "normalize_", "patch_rows", "patch_rows_in_c", "pixel_rows",
           "resized", "to_hwc_uint8"]

_STRIP_BYTES = 1 << 19
"""Pixel bytes per strip: big enough that per-strip overhead vanishes, small enough that a packed
strip is still in the core's cache when the hasher reads it (docs/benchmarks.md, "Design
measurements")."""

_PACKED_CHANNELS = {"RGB": 3, "YCbCr": 3, "HSV": 3, "RGBA": 4, "RGBX": 4, "RGBa": 4, "CMYK": 4}
"""Modes stored in 4 bytes per pixel whose array holds the first 3 or all 4 of them. (Not LAB:
Pillow stores its a and b signed and packs them with the top bit flipped.)"""

_Pack = Callable[[object, object, int, int, int, bytearray], int]


_LutPlanes = Callable[[object, object, object, int], None]
_Patchify = Callable[[object, object, int, int, int, int, int, int, int, int, bool], None]


class _Extension(NamedTuple):
    pack: _Pack | None = None
    kernel: Callable[[], str] | None = None
    lut_planes: _LutPlanes | None = None
    patchify: _Patchify | None = None
    lut_interleaved: _LutPlanes | None = None


def _load_extension() -> _Extension:
    try:
        from mmfront._pixels import kernel, lut_planes, pack
    except ImportError:  # installed without a C compiler: Pillow's packer and torch do the work
        return _Extension()
    # an extension built from an older source lacks the newer kernels: those fall back alone
    module = sys.modules["mmfront._pixels"]
    return _Extension(pack, kernel, lut_planes, getattr(module, "patchify", None),
                      getattr(module, "lut_interleaved", None))


_pack, _kernel, _lut_planes, _patchify, _lut_interleaved = _load_extension()
_local = threading.local()


def patch_rows_in_c() -> bool:
    """Whether :func:`patch_rows` lays rows out here (else it always says None: HF's ``patchify`` does)."""
    return _patchify is not None


def fast_packing_kernel() -> str | None:
    """The loop the fast path packs RGB with on this machine (``"avx2"``, ``"ssse3"`` or
    ``"portable"``), or None when the C extension is not installed and Pillow packs instead."""
    return _kernel() if _kernel is not None and _pack is not None else None


def iter_pixel_strips(
    image: Image.Image, linesize: int, *, reuse_buffer: bool, stream_offset: int = 0
) -> Iterator[bytes | memoryview]:
    """The bytes of ``np.asarray(image)`` (``linesize`` bytes per row), in strips.

    With ``reuse_buffer`` a strip may live in a scratch buffer the next strip overwrites: the
    caller must be done with each strip (e.g. have hashed it) before asking for the next, and
    must not keep it. Without it every strip is a fresh object.

    ``stream_offset`` is where the pixels start in the caller's byte stream. The fast path cuts
    its strips anywhere, even inside a pixel, so that each ends on a multiple of the strip size in
    that stream: blake3 then hashes every strip in whole groups of 16 chunks on its widest SIMD
    path, where strips shifted by the header bytes hash slower. Pillow's path cuts
    whole rows."""
    channels = _PACKED_CHANNELS.get(image.mode)
    if channels is not None and _pack is not None:
        strips = _packed_strips(_pack, image, channels, reuse_buffer, stream_offset)
        if strips is not None:
            return strips
    return _encoded_strips(image, linesize)


def _packed_strips(
    pack: _Pack, image: Image.Image, channels: int, reuse_buffer: bool, stream_offset: int
) -> Iterator[memoryview] | None:
    """The fast path's strips, or None when this image cannot take it. The first strip is
    packed here, before anything is handed out, so a refusal falls back cleanly."""
    export = getattr(image, "__arrow_c_array__", None)
    if export is None:
        return None
    try:
        schema, array = export()
    except (ValueError, TypeError, NotImplementedError):  # several memory blocks, or a mode Pillow won't export
        return None
    width, height = image.size
    strips = _pack_strips(pack, (schema, array), channels, width * height * channels,
                          first=_STRIP_BYTES - stream_offset % _STRIP_BYTES, reuse_buffer=reuse_buffer)
    try:
        first = next(strips)
    except (ValueError, TypeError):  # the extension refused the export
        return None
    return itertools.chain((first,), strips)


def _pack_strips(
    pack: _Pack, export: tuple[object, object], channels: int, total: int, *, first: int, reuse_buffer: bool
) -> Iterator[memoryview]:
    # `export` holds the capsules: Pillow's pixel memory stays alive until the last strip is packed.
    schema, array = export
    scratch = _take_scratch(_STRIP_BYTES) if reuse_buffer else None
    try:
        start, stop = 0, min(first, total)
        while start < total:
            buffer = scratch if scratch is not None else bytearray(stop - start)
            packed = pack(schema, array, channels, start, stop, buffer)
            yield memoryview(buffer)[:packed]
            start, stop = stop, min(stop + _STRIP_BYTES, total)
    finally:
        if scratch is not None:
            _give_back_scratch(scratch)


def _take_scratch(nbytes: int) -> bytearray:
    """The thread's scratch buffer, removed from the thread while in use, so that a second
    strip iterator on the same thread gets a buffer of its own instead of sharing it."""
    buffer: bytearray | None = getattr(_local, "scratch", None)
    _local.scratch = None
    if buffer is None or len(buffer) < nbytes:
        buffer = bytearray(nbytes)
    return buffer


def _give_back_scratch(buffer: bytearray) -> None:
    _local.scratch = buffer


def _encoded_strips(image: Image.Image, linesize: int) -> Iterator[bytes]:
    # Mode "1" is the one mode whose array is not the raw packing: numpy sees one 0/255 byte per
    # pixel, which is Pillow's "L" raw packing of the same image.
    rawmode = "L" if image.mode == "1" else image.mode
    encoder = Image._getencoder(image.mode, "raw", rawmode)
    try:
        encoder.setimage(image.im, (0, 0, *image.size))
        bufsize = max(_STRIP_BYTES // linesize, 1) * linesize
        while True:
            _, status, data = encoder.encode(bufsize)
            if status < 0:
                raise HashingTypeError(
                    f"Pillow could not pack the pixels of a {image.mode!r} image (encoder status {status}); "
                    "convert the image to RGB first, or pass its encoded bytes in a MediaWithBytes."
                )
            yield data
            if status:
                return
    finally:
        encoder.cleanup()


# --- model-ready rows -------------------------------------------------------------------------


def to_hwc_uint8(image: Any) -> torch.Tensor | None:
    """A uint8 HWC view of an RGB image (PIL, or a uint8 HWC or CHW array or tensor), or None
    when the native path cannot take it."""
    if isinstance(image, Image.Image):
        if image.mode != "RGB":
            return None
        with warnings.catch_warnings():  # read-only view: the pipeline never writes into its input
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(np.asarray(image))
    array = image.numpy() if isinstance(image, torch.Tensor) else image
    if isinstance(array, np.ndarray) and array.dtype == np.uint8 and array.ndim == 3:
        if array.shape[-1] == 3:
            return torch.from_numpy(np.ascontiguousarray(array))
        if array.shape[0] == 3:
            return torch.from_numpy(np.ascontiguousarray(array.transpose(1, 2, 0)))
    return None


def resized(hwc: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """uint8 CHW view of ``hwc`` resized to ``out_hw`` by torch's antialiased bilinear: as planes
    in warm memory by :func:`mmfront.bicubic.resize_planes` (torch's bytes) where it takes them,
    else by torch (channels-last memory: its fast kernel)."""
    chw = hwc.permute(2, 0, 1).unsqueeze(0)
    if tuple(chw.shape[-2:]) != out_hw:
        planes = resize_planes(chw, *out_hw, mode="bilinear")
        chw = planes if planes is not None else F.interpolate(chw, size=out_hw, mode="bilinear", antialias=True,
                                                               align_corners=False)
    return chw[0]


def normalize_(pixels: torch.Tensor, settings: Mapping[str, Any]) -> None:
    """Rescale and normalize in place, fused as HF's torchvision backend does (HF's
    ``do_rescale``, ``rescale_factor``, ``do_normalize``, ``image_mean``, ``image_std``)."""
    rescale = float(settings.get("rescale_factor") or 1 / 255) if settings.get("do_rescale") else 1.0
    if settings.get("do_normalize"):
        mean = torch.tensor(settings["image_mean"], dtype=torch.float32).view(-1, 1, 1) / rescale
        std = torch.tensor(settings["image_std"], dtype=torch.float32).view(-1, 1, 1) / rescale
        pixels.sub_(mean).div_(std)
    elif rescale != 1.0:
        pixels.mul_(rescale)


_TABLE_BITS = {2: torch.int16, 4: torch.int32}
"""Integer views of 2- and 4-byte dtypes: the table's values are copied bit for bit."""


def _normalization_table(settings: Mapping[str, Any], dtype: torch.dtype) -> torch.Tensor:
    """Every value a uint8 pixel of each channel becomes: (3, 256) in ``dtype``, computed by
    :func:`normalize_` and the cast to the model dtype themselves, so looking a pixel up gives
    the very bits the elementwise ops would."""
    table = torch.arange(256, dtype=torch.float32).expand(3, 256).contiguous()
    normalize_(table.view(1, 3, 1, 256), settings)
    return table.to(dtype)


def _in_turn(fn: Callable[[int], None], rows: Sequence[int]) -> object:
    for row in rows:
        fn(row)
    return None


def pixel_rows(regions: Sequence[torch.Tensor], out_hw: tuple[int, int], settings: Mapping[str, Any],
               dtype: torch.dtype, *, map_rows: Callable[[Callable[[int], None], Sequence[int]], object] = _in_turn,
               ) -> torch.Tensor:
    """``regions`` (uint8 HWC) resized, rescaled, normalized and cast to ``dtype``: (N, 3, H, W).

    A uint8 channel has 256 values, so with the C extension each resized row goes through a
    per-channel table in one pass, straight into the ``dtype`` output (a few times cheaper than
    converting, normalizing and casting it with torch), and ``map_rows`` may run the rows in
    parallel (both steps run without the GIL; a processor passes its thread pool's map). A row
    whose pixels lie channels-last (an image's HWC pixels that need no resize; torch's antialiased
    resize gives planar rows) is read where it lies, without a planar copy first. Without the
    extension, torch does those steps, a row at a time."""
    pixel_values = _reply_tensor((len(regions), 3, *out_hw), dtype)
    bits = _TABLE_BITS.get(dtype.itemsize)
    lut_planes, lut_interleaved = _lut_planes, _lut_interleaved
    if lut_planes is not None and bits is not None and dtype.is_floating_point:
        table = _normalization_table(settings, dtype).view(bits).numpy()

        def fill(row: int) -> None:
            chw = resized(regions[row], out_hw)
            out = pixel_values[row].view(bits).numpy()
            hwc = chw.permute(1, 2, 0)
            if lut_interleaved is not None and hwc.is_contiguous():
                lut_interleaved(hwc.numpy(), table, out, 3)
            else:
                lut_planes(chw.contiguous().numpy(), table, out, 3)

        map_rows(fill, range(len(regions)))
        return pixel_values
    staged = pixel_values if dtype == torch.float32 else torch.empty(pixel_values.shape, dtype=torch.float32)
    for row, region in enumerate(regions):
        staged[row].copy_(resized(region, out_hw))
    normalize_(staged, settings)
    return staged if staged is pixel_values else pixel_values.copy_(staged)


def patch_rows(images: torch.Tensor, patch: int, merge: int, temporal: int) -> torch.Tensor | None:
    """``images`` (B, C, H, W) as Qwen2-VL's patch rows, (B, H/patch * W/patch, C * temporal *
    patch * patch), each image repeated ``temporal`` times: the very bytes of HF's ``patchify``
    (rows in merge-window order, then channel, time, patch row, patch column). Contiguous and
    channels-last images are read where they lie (a resize of a PIL image's view is channels-last);
    others are made contiguous first. None where the C extension is not built or the sizes are not
    whole merge windows (HF's own call then raises or does the work)."""
    batch, channels, height, width = images.shape
    unit = patch * merge
    if _patchify is None or height % unit or width % unit or not (batch and channels and height and width):
        return None
    channels_last = not images.is_contiguous() and images.is_contiguous(memory_format=torch.channels_last)
    source = images.permute(0, 2, 3, 1) if channels_last else images.contiguous()
    rows = _reply_tensor((batch, (height // patch) * (width // patch), channels * temporal * patch * patch),
                         images.dtype)
    _patchify(_bytes_view(source), _bytes_view(rows), batch, channels, height, width, images.element_size(), patch,
              merge, temporal, channels_last)
    return rows


def _reply_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor for model-ready rows, in the memory of the reply they go out in
    where this process is a processing lane (:func:`mmfront.wire.shared_buffer.reply_memory`)."""
    count = math.prod(shape)
    if not count:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(reply_memory(count * dtype.itemsize)).view(dtype).view(shape)


def _bytes_view(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's memory as a flat uint8 array (any dtype, bfloat16 included)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()
