"""mmfront.pixels and the C extension mmfront._pixels.

Strips: every path must yield exactly ``np.asarray(image).tobytes()``: the C packer (each of its
loops), and Pillow's packer when the extension is missing, when Pillow has no Arrow export, when
the image spans several memory blocks, and when the extension refuses the export.

Model-ready rows: the table path (``lut_planes``, rows in parallel) gives the very bits of the
torch path (convert, rescale and normalize as HF's torchvision backend fuses them, then cast to
the model dtype), for every dtype, setting and region shape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import blake3
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from markers import has_c_compiler, optional_extension
from mmfront import pixels
from mmfront.hashing import MultiModalHasher
from mmfront.processing.threads import map_items
from mmfront.testing.media import make_raw_image

_pixels = optional_extension("mmfront._pixels")
needs_extension = pytest.mark.skipif(_pixels is None, reason="the C extension is not built (no C compiler at install)")


def test_extension_is_built_where_a_compiler_exists() -> None:
    # setup.py marks the extension optional, so a failed build would only show as a slow hash;
    # this makes it a test failure wherever the install could have built it.
    if not has_c_compiler():
        pytest.skip("no C compiler: the install skips the extension and Pillow packs every mode")
    assert _pixels is not None, "a C compiler exists but mmfront._pixels was not built: reinstall (pip install -e .)"
    assert pixels.fast_packing_kernel() in {"avx2", "ssse3", "portable"}


THREE = ["RGB", "YCbCr", "HSV"]
FOUR = ["RGBA", "RGBX", "RGBa", "CMYK"]


def _available_kernels() -> list[str]:
    if _pixels is None:
        return []
    current = _pixels.kernel()
    names = []
    for name in ("avx2", "ssse3", "portable"):
        try:
            _pixels.kernel(name)
        except ValueError:
            continue
        names.append(name)
    _pixels.kernel(current)
    return names


KERNELS = _available_kernels()


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    current = _pixels.kernel()
    _pixels.kernel(request.param)
    yield request.param
    _pixels.kernel(current)


def numpy_bytes(image: Image.Image) -> bytes:
    return np.asarray(image).tobytes()


def joined(strips: Iterator[bytes | memoryview]) -> bytes:
    return b"".join(bytes(strip) for strip in strips)


def strips_of(image: Image.Image, *, reuse_buffer: bool = False, stream_offset: int = 0) -> list[bytes]:
    linesize = len(numpy_bytes(image)) // image.height
    return [bytes(strip) for strip in
            pixels.iter_pixel_strips(image, linesize, reuse_buffer=reuse_buffer, stream_offset=stream_offset)]


@pytest.fixture
def pack_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Records (channels, start, stop) of every call into the C packer."""
    calls: list[tuple[int, int, int]] = []
    real = pixels._pack
    if real is None:
        pytest.skip("the C extension is not built (no C compiler at install)")

    def spy(schema: object, array: object, channels: int, start: int, stop: int, out: bytearray) -> int:
        calls.append((channels, start, stop))
        return real(schema, array, channels, start, stop, out)

    monkeypatch.setattr(pixels, "_pack", spy)
    return calls


# --- the C packer -------------------------------------------------------------------------------


@needs_extension
def test_kernel_defaults_to_the_widest_this_cpu_has() -> None:
    assert _pixels.kernel() == KERNELS[0]
    assert KERNELS[-1] == "portable"


@needs_extension
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(THREE + FOUR), width=st.integers(1, 70), height=st.integers(1, 6),
       data=st.data(), kernel_name=st.sampled_from(KERNELS or ["portable"]))
def test_pack_any_byte_range_equals_numpy(mode: str, width: int, height: int, data: st.DataObject,
                                          kernel_name: str) -> None:
    image = make_raw_image(width, height, seed=width * height, mode=mode)
    expected = numpy_bytes(image)
    start = data.draw(st.integers(0, len(expected)), label="start")
    stop = data.draw(st.integers(start, len(expected)), label="stop")
    out = bytearray(b"\xab" * (stop - start + 64))
    current = _pixels.kernel()
    _pixels.kernel(kernel_name)
    try:
        written = _pixels.pack(*image.__arrow_c_array__(), len(image.getbands()), start, stop, out)
    finally:
        _pixels.kernel(current)
    assert written == stop - start
    assert out[:written] == expected[start:stop]
    assert out[written:] == b"\xab" * 64  # the SIMD loops' wide stores stay inside the range


@needs_extension
def test_pack_a_large_image_with_each_kernel(kernel: str) -> None:
    image = make_raw_image(1023, 517, seed=3)
    out = bytearray(1023 * 517 * 3)
    assert _pixels.pack(*image.__arrow_c_array__(), 3, 0, len(out), out) == len(out)
    assert out == numpy_bytes(image)


@needs_extension
def test_pack_an_empty_range_and_an_empty_image() -> None:
    image = make_raw_image(4, 4)
    assert _pixels.pack(*image.__arrow_c_array__(), 3, 5, 5, bytearray()) == 0
    assert _pixels.pack(*Image.new("RGB", (0, 3)).__arrow_c_array__(), 3, 0, 0, bytearray()) == 0


@needs_extension
def test_pack_reads_an_image_mapped_onto_a_python_buffer() -> None:
    raw = np.random.default_rng(5).integers(0, 256, 7 * 3 * 4, dtype=np.uint8).tobytes()
    image = Image.frombuffer("RGBA", (7, 3), raw, "raw", "RGBA", 0, 1)
    out = bytearray(len(raw))
    _pixels.pack(*image.__arrow_c_array__(), 4, 0, len(raw), out)
    assert out == raw == numpy_bytes(image)


def _capsules() -> tuple[object, object]:
    return make_raw_image(5, 3).__arrow_c_array__()


BAD_PACK_CALLS: list[tuple[str, Callable[[], tuple[object, ...]], type[Exception], str]] = [
    ("not capsules", lambda: (1, 2, 3, 0, 3, bytearray(3)), TypeError, "'arrow_schema' capsule"),
    ("swapped capsules", lambda: (*_capsules()[::-1], 3, 0, 3, bytearray(3)), TypeError, "'arrow_schema' capsule"),
    ("one-byte pixels", lambda: (*Image.new("L", (5, 3)).__arrow_c_array__(), 3, 0, 3, bytearray(3)), ValueError,
     "not a fixed-size list of 4 uint8"),
    ("channels 2", lambda: (*_capsules(), 2, 0, 3, bytearray(3)), ValueError, "channels must be 3 or 4"),
    ("channels str", lambda: (*_capsules(), "3", 0, 3, bytearray(3)), TypeError, "channels must be an int"),
    ("huge start", lambda: (*_capsules(), 3, 2**70, 2**70, bytearray(3)), ValueError, "start is out of range"),
    ("negative start", lambda: (*_capsules(), 3, -1, 3, bytearray(4)), ValueError, "not within"),
    ("stop before start", lambda: (*_capsules(), 3, 4, 3, bytearray(3)), ValueError, "not within"),
    ("stop past the end", lambda: (*_capsules(), 3, 0, 46, bytearray(46)), ValueError, "45 pixel bytes"),
    ("out too small", lambda: (*_capsules(), 3, 0, 45, bytearray(44)), ValueError, "out holds 44 bytes"),
    ("out read-only", lambda: (*_capsules(), 3, 0, 3, bytes(3)), TypeError, "writable contiguous buffer"),
    ("out strided", lambda: (*_capsules(), 3, 0, 3, memoryview(bytearray(8))[::2]), TypeError,
     "writable contiguous buffer"),
    ("out None", lambda: (*_capsules(), 3, 0, 3, None), TypeError, "writable contiguous buffer"),
    ("too few arguments", _capsules, TypeError, "takes 6 positional arguments"),
]


@needs_extension
@pytest.mark.parametrize(("args", "error", "message"), [case[1:] for case in BAD_PACK_CALLS],
                         ids=[case[0] for case in BAD_PACK_CALLS])
def test_pack_refuses_bad_arguments(args: Callable[[], tuple[object, ...]], error: type[Exception],
                                    message: str) -> None:
    with pytest.raises(error, match=message):
        _pixels.pack(*args())


@needs_extension
def test_kernel_refuses_unknown_names() -> None:
    current = _pixels.kernel()
    with pytest.raises(ValueError, match="'neon' is not available"):
        _pixels.kernel("neon")
    with pytest.raises(TypeError, match="must be a str or None"):
        _pixels.kernel(3)
    with pytest.raises(TypeError, match="at most 1 argument"):
        _pixels.kernel("avx2", "ssse3")
    assert _pixels.kernel() == _pixels.kernel(None) == current


# --- which path iter_pixel_strips takes ---------------------------------------------------------


@pytest.mark.parametrize("mode", THREE + FOUR)
def test_four_byte_modes_take_the_fast_path(mode: str, pack_calls: list[tuple[int, int, int]]) -> None:
    image = make_raw_image(33, 9, seed=1, mode=mode)
    assert joined(iter(strips_of(image))) == numpy_bytes(image)
    assert pack_calls == [(3 if mode in THREE else 4, 0, len(numpy_bytes(image)))]


@pytest.mark.parametrize("mode", ["1", "L", "LA", "La", "PA", "P", "I", "F", "I;16", "I;16B"])
def test_other_modes_take_pillows_path(mode: str, pack_calls: list[tuple[int, int, int]]) -> None:
    image = Image.new("RGB", (13, 5), (200, 30, 90)).convert(mode) if mode not in ("La", "I;16B") \
        else Image.frombytes(mode, (13, 5), bytes(range(13 * 5 * 2)))
    assert joined(iter(strips_of(image))) == numpy_bytes(image)
    assert pack_calls == []


@pytest.mark.parametrize("size", [(1, 1), (1, 999), (999, 1), (333, 7), (4096, 2)])
@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_edge_sizes_hash_like_numpy_on_both_paths(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                  size: tuple[int, int]) -> None:
    image = make_raw_image(*size, seed=size[0], mode=mode)
    fast = MultiModalHasher.hash_kwargs("blake3", image=image)
    assert joined(iter(strips_of(image))) == numpy_bytes(image)
    monkeypatch.setattr(pixels, "_pack", None)
    assert joined(iter(strips_of(image))) == numpy_bytes(image)
    assert MultiModalHasher.hash_kwargs("blake3", image=image) == fast


def test_without_the_extension_pillow_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    image = make_raw_image(640, 480, seed=2)
    fast = MultiModalHasher.hash_kwargs("blake3", image=image)
    monkeypatch.setattr(pixels, "_pack", None)
    monkeypatch.setattr(pixels, "_kernel", None)
    assert pixels.fast_packing_kernel() is None
    assert joined(iter(strips_of(image, reuse_buffer=True))) == numpy_bytes(image)
    assert MultiModalHasher.hash_kwargs("blake3", image=image) == fast


def test_pillow_without_an_arrow_export_falls_back(monkeypatch: pytest.MonkeyPatch,
                                                   pack_calls: list[tuple[int, int, int]]) -> None:
    monkeypatch.delattr(Image.Image, "__arrow_c_array__")  # Pillow < 11.2
    image = make_raw_image(40, 30)
    assert joined(iter(strips_of(image))) == numpy_bytes(image)
    assert pack_calls == []


def test_an_image_of_several_memory_blocks_falls_back(pack_calls: list[tuple[int, int, int]]) -> None:
    # Pillow allocates images over its block size (16 MiB) in several blocks, and refuses to
    # export those; 2049x2048 RGB needs 2049 * 2048 * 4 bytes, just over.
    image = make_raw_image(2049, 2048, seed=4)
    with pytest.raises(ValueError, match="not contiguous"):
        image.__arrow_c_array__()
    expected = numpy_bytes(image)
    digest = MultiModalHasher.hash_kwargs("blake3", image=image)
    assert pack_calls == []
    assert digest == blake3.blake3(b"".join(MultiModalHasher.iter_item_to_bytes("image", image))).hexdigest()
    assert joined(iter(strips_of(image))) == expected


def test_a_refused_export_falls_back_before_any_strip(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> int:
        raise ValueError("the Arrow schema is not a fixed-size list of 4 uint8 per pixel")

    monkeypatch.setattr(pixels, "_pack", refuse)
    monkeypatch.setattr(pixels, "_STRIP_BYTES", 1000)
    image = make_raw_image(50, 40)
    assert joined(iter(strips_of(image, reuse_buffer=True))) == numpy_bytes(image)


# --- strips, buffers and threads ----------------------------------------------------------------


@pytest.mark.parametrize("stream_offset", [0, 1, 216, 4095, 4096, 3 * 4096 + 5])
def test_strips_end_on_strip_multiples_of_the_stream(monkeypatch: pytest.MonkeyPatch, stream_offset: int) -> None:
    monkeypatch.setattr(pixels, "_STRIP_BYTES", 4096)
    image = make_raw_image(100, 50, seed=6)  # 15000 bytes
    strips = strips_of(image, reuse_buffer=True, stream_offset=stream_offset)
    assert b"".join(strips) == numpy_bytes(image)
    assert all(0 < len(strip) <= 4096 for strip in strips)
    ends = np.cumsum([len(strip) for strip in strips]) + stream_offset
    assert all(end % 4096 == 0 for end in ends[:-1])
    assert ends[-1] == stream_offset + 15000


def test_fresh_strips_can_be_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pixels, "_STRIP_BYTES", 4096)
    image = make_raw_image(64, 64, seed=7, mode="RGBA")
    linesize = 64 * 4
    kept = list(pixels.iter_pixel_strips(image, linesize, reuse_buffer=False))
    assert len(kept) == 4
    assert len({id(strip.obj) for strip in kept if isinstance(strip, memoryview)}) == 4
    assert joined(iter(kept)) == numpy_bytes(image)


def test_the_scratch_buffer_is_reused_by_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pixels, "_STRIP_BYTES", 4096)
    image = make_raw_image(100, 50)

    def buffers() -> set[int]:
        return {id(strip.obj) for strip in pixels.iter_pixel_strips(image, 300, reuse_buffer=True)
                if isinstance(strip, memoryview)}

    first = buffers()
    assert len(first) == 1
    assert buffers() == first
    other: list[set[int]] = []
    thread = threading.Thread(target=lambda: other.append(buffers()))
    thread.start()
    thread.join()
    assert other[0] != first


def test_interleaved_iterators_on_one_thread_get_their_own_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pixels, "_STRIP_BYTES", 4096)
    first_image, second_image = make_raw_image(100, 50, seed=8), make_raw_image(100, 50, seed=9)
    first_strips = pixels.iter_pixel_strips(first_image, 300, reuse_buffer=True)
    collected = [bytes(next(first_strips))]
    assert joined(pixels.iter_pixel_strips(second_image, 300, reuse_buffer=True)) == numpy_bytes(second_image)
    collected += [bytes(strip) for strip in first_strips]
    assert b"".join(collected) == numpy_bytes(first_image)


def test_threads_hash_concurrently_to_the_right_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pixels, "_STRIP_BYTES", 16384)  # several strips per image
    images = [make_raw_image(300, 200, seed=seed) for seed in range(4)]
    expected = [blake3.blake3(b"".join(MultiModalHasher.iter_item_to_bytes("image", image))).hexdigest()
                for image in images]
    results: list[list[str]] = [[] for _ in images]

    def work(index: int) -> None:
        for _ in range(25):
            results[index].append(MultiModalHasher.hash_kwargs("blake3", image=images[index]))

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(images))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [[digest] * 25 for digest in expected]


# --- model-ready rows: the table path and the torch path --------------------------------------

GEMMA3 = {"do_resize": True, "size": {"height": 64, "width": 48}, "resample": 2, "do_rescale": True,
          "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
IMAGENET = {**GEMMA3, "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711]}
RESCALE_ONLY = {**GEMMA3, "do_normalize": False}
NEITHER = {**GEMMA3, "do_normalize": False, "do_rescale": False}


def _row_regions() -> list[torch.Tensor]:
    """A region to upscale, one to downscale, one already at the target size, and a crop (a
    strided view of a larger image)."""
    rng = np.random.default_rng(0)
    big = torch.from_numpy(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8))
    return [torch.from_numpy(rng.integers(0, 256, (30, 20, 3), dtype=np.uint8)),
            torch.from_numpy(rng.integers(0, 256, (200, 150, 3), dtype=np.uint8)),
            torch.from_numpy(rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)),
            big[10:74, 30:78], big]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@needs_extension
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", [GEMMA3, IMAGENET, RESCALE_ONLY, NEITHER], ids=["gemma3", "imagenet", "rescale", "none"])
def test_the_table_path_gives_the_torch_paths_bits(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                                   config: dict[str, Any]) -> None:
    regions = _row_regions()
    fast = pixels.pixel_rows(regions, (64, 48), config, dtype, map_rows=map_items)
    monkeypatch.setattr(pixels, "_lut_interleaved", None)  # every row through a planar copy
    planar = pixels.pixel_rows(regions, (64, 48), config, dtype, map_rows=map_items)
    monkeypatch.setattr(pixels, "_lut_planes", None)
    slow = pixels.pixel_rows(regions, (64, 48), config, dtype, map_rows=map_items)
    assert fast.dtype == slow.dtype == dtype and fast.shape == (5, 3, 64, 48)
    assert torch.equal(_bits(fast), _bits(slow)) and torch.equal(_bits(planar), _bits(slow))
    reference = torch.stack([pixels.resized(r, (64, 48)) for r in regions]).float()
    pixels.normalize_(reference, config)
    assert torch.equal(_bits(fast), _bits(reference.to(dtype)))


@needs_extension
@settings(max_examples=60, deadline=None)
@given(st.booleans(), st.integers(1, 4), st.sampled_from([2, 4]), st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_lut_kernels_are_per_channel_table_lookups_into_planes(interleaved: bool, channels: int, item: int, n: int,
                                                                seed: int) -> None:
    """``lut_planes`` reads planar pixels, ``lut_interleaved`` the same pixels channels-last."""
    rng = np.random.default_rng(seed)
    kind = {2: np.uint16, 4: np.uint32}[item]
    src = rng.integers(0, 256, (channels, n), dtype=np.uint8)
    table = rng.integers(0, np.iinfo(kind).max, (channels, 256), dtype=kind, endpoint=True)
    dst = np.zeros((channels, n), kind)
    if interleaved:
        _pixels.lut_interleaved(np.ascontiguousarray(src.T), table, dst, channels)
    else:
        _pixels.lut_planes(src, table, dst, channels)
    assert np.array_equal(dst, np.take_along_axis(table, src.astype(np.intp), axis=1))


@needs_extension
def test_lut_interleaved_refuses_buffers_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="dst holds 16 bytes"):
        _pixels.lut_interleaved(np.zeros((3, 3), np.uint8), np.zeros((3, 256), np.uint16), np.zeros(8, np.uint16), 3)
    with pytest.raises(TypeError, match="4 positional arguments"):
        _pixels.lut_interleaved(np.zeros(3, np.uint8), np.zeros((3, 256), np.uint16), np.zeros(3, np.uint16))


@needs_extension
@pytest.mark.parametrize(("src", "table", "dst", "channels", "error"), [
    (np.zeros(10, np.uint8), np.zeros((3, 256), np.uint16), np.zeros(10, np.uint16), 3, "not 3 planes"),
    (np.zeros(9, np.uint8), np.zeros((3, 255), np.uint16), np.zeros(9, np.uint16), 3, "256 items of 2 or 4 bytes"),
    (np.zeros(9, np.uint8), np.zeros((3, 256), np.uint8), np.zeros(9, np.uint8), 3, "256 items of 2 or 4 bytes"),
    (np.zeros(9, np.uint8), np.zeros((3, 256), np.uint16), np.zeros(8, np.uint16), 3, "dst holds 16 bytes"),
    (np.zeros(9, np.uint8), np.zeros((3, 256), np.uint16), np.zeros(9, np.uint16), 5, "channels must be 1 to 4"),
])
def test_lut_planes_refuses_buffers_that_do_not_fit(src: Any, table: Any, dst: Any, channels: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        _pixels.lut_planes(src, table, dst, channels)


@needs_extension
def test_lut_planes_refuses_a_read_only_destination() -> None:
    dst = np.zeros(3, np.uint16)
    dst.flags.writeable = False
    with pytest.raises((BufferError, ValueError, TypeError)):
        _pixels.lut_planes(np.zeros(3, np.uint8), np.zeros((3, 256), np.uint16), dst, 3)


# --- patch rows (Qwen2-VL's patchify) ---------------------------------------------------------


def _hf_patchify(images: torch.Tensor, patch: int, merge: int, temporal: int) -> torch.Tensor:
    """HF's ``Qwen2VLImageProcessor.patchify`` (transformers 5.24), step for step."""
    batch, channel, height, width = images.shape
    grid_h, grid_w = height // patch, width // patch
    patches = images.reshape(batch, channel, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    patches = patches.permute(0, 2, 5, 3, 6, 1, 4, 7)
    return patches.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, temporal, -1, -1).reshape(
        batch, grid_h * grid_w, channel * temporal * patch * patch)


@needs_extension
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("batch", "channels", "height", "width", "patch", "merge", "temporal"), [
    (1, 3, 756, 1036, 14, 2, 2),   # a 1024x768 image at Qwen2.5-VL's standard limits
    (2, 3, 56, 84, 14, 2, 2),      # a group of two images of one shape
    (1, 3, 48, 64, 8, 2, 2),       # the qwen2_5_vl fixture's patch size
    (1, 1, 12, 18, 3, 1, 1),       # no merge, no temporal copy
    (1, 3, 32, 32, 16, 2, 3),
])
def test_patch_rows_are_hfs_patchify_bytes(dtype: torch.dtype, batch: int, channels: int, height: int, width: int,
                                           patch: int, merge: int, temporal: int) -> None:
    generator = torch.Generator().manual_seed(batch * height + width)
    images = torch.randint(0, 256, (batch, channels, height, width), generator=generator, dtype=torch.uint8)
    images = images if dtype == torch.uint8 else (images.to(torch.float32) / 255 - 0.48).to(dtype)
    rows = pixels.patch_rows(images, patch, merge, temporal)
    want = _hf_patchify(images, patch, merge, temporal)
    assert rows is not None and rows.dtype == dtype and rows.shape == want.shape
    assert torch.equal(rows.view(torch.uint8), want.contiguous().view(torch.uint8))


@needs_extension
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("batch", "height", "width"), [(1, 756, 1036), (2, 28, 56)])
def test_patch_rows_read_channels_last_and_strided_images_as_their_values(dtype: torch.dtype, batch: int,
                                                                           height: int, width: int) -> None:
    bhwc = torch.arange(batch * height * width * 3, dtype=torch.int64).remainder(251).to(dtype)
    channels_last = bhwc.reshape(batch, height, width, 3).permute(0, 3, 1, 2)  # a resize of a PIL image's view
    strided = torch.cat([channels_last, channels_last], dim=3)[..., ::2]  # neither layout: copied first
    for images in (channels_last, strided):
        rows = pixels.patch_rows(images, 14, 2, 2)
        want = _hf_patchify(images.contiguous(), 14, 2, 2)
        assert rows is not None and torch.equal(rows.view(torch.uint8), want.view(torch.uint8))


@needs_extension
@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 2), patch=st.sampled_from([1, 2, 3, 8, 14, 16]), merge=st.integers(1, 3),
       temporal=st.integers(1, 3), rows=st.integers(1, 4), columns=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_channels_last_rgb_patch_rows_split_planes_as_hf_lays_them_out(batch: int, patch: int, merge: int,
                                                                       temporal: int, rows: int, columns: int,
                                                                       seed: int) -> None:
    """The 3-byte channels-last path (planes split 16 pixels a step, then one copy per patch row)
    at widths that leave a tail of under 16 pixels and at patch sizes without a fixed-size copy."""
    height, width = rows * patch * merge, columns * patch * merge
    generator = torch.Generator().manual_seed(seed)
    bhwc = torch.randint(0, 256, (batch, height, width, 3), generator=generator, dtype=torch.uint8)
    images = bhwc.permute(0, 3, 1, 2)
    got = pixels.patch_rows(images, patch, merge, temporal)
    assert got is not None
    assert torch.equal(got, _hf_patchify(images.contiguous(), patch, merge, temporal))


@needs_extension
@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 2), patch=st.sampled_from([1, 2, 3, 8, 14, 16]), merge=st.integers(1, 3),
       temporal=st.integers(1, 3), rows=st.integers(1, 4), columns=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_rgb_planes_patch_rows_are_read_where_they_lie(batch: int, patch: int, merge: int, temporal: int, rows: int,
                                                       columns: int, seed: int) -> None:
    """The 1-byte planes path (what :func:`mmfront.bicubic.resize_planes` hands the patch rows):
    one copy per patch row straight from each plane, at patch sizes with and without a fixed-size
    copy."""
    height, width = rows * patch * merge, columns * patch * merge
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, height, width), generator=generator, dtype=torch.uint8)
    got = pixels.patch_rows(images, patch, merge, temporal)
    assert got is not None
    assert torch.equal(got, _hf_patchify(images, patch, merge, temporal))


def test_patch_rows_leave_what_they_cannot_lay_out_to_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pixels.patch_rows(torch.zeros((1, 3, 30, 28), dtype=torch.uint8), 14, 2, 2) is None  # 30 px: no whole window
    assert pixels.patch_rows(torch.zeros((0, 3, 28, 28), dtype=torch.uint8), 14, 2, 2) is None
    monkeypatch.setattr(pixels, "_patchify", None)  # built without a C compiler
    assert pixels.patch_rows(torch.zeros((1, 3, 28, 28), dtype=torch.uint8), 14, 2, 2) is None


@needs_extension
@pytest.mark.parametrize(("dst_bytes", "args", "error"), [
    (2 * 3 * 28 * 28, (1, 3, 28, 28, 1, 14, 2, 2, False), "src holds"),  # src is one byte longer below
    (3 * 28 * 28, (1, 3, 28, 28, 1, 14, 2, 2, True), "dst holds"),
    (2 * 3 * 28 * 28, (1, 3, 28, 28, 1, 14, 3, 2, False), "multiples of patch x merge"),
    (2 * 3 * 28 * 28, (1, 3, 28, 28, 0, 14, 2, 2, False), "itemsize must be positive"),
])
def test_patchify_refuses_sizes_that_do_not_fit(dst_bytes: int, args: tuple[int | bool, ...], error: str) -> None:
    src = np.zeros(3 * 28 * 28 + (1 if error == "src holds" else 0), np.uint8)
    with pytest.raises(ValueError, match=error):
        _pixels.patchify(src, np.zeros(dst_bytes, np.uint8), *args)
