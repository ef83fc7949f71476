"""mmfront.bicubic and the C extension mmfront._bicubic: every byte is torch's uint8 antialiased
bicubic resize (torchvision's ``resize(..., BICUBIC, antialias=True)``, what HF's Qwen2-VL image
processors run), with the AVX2 loops and with the portable ones, for random sizes and pixels and
for the sizes Qwen2-VL's pixel limits resize real images to."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as tvF

from markers import has_c_compiler, optional_extension
from mmfront import bicubic
from mmfront.bicubic import Mode, axis_weights, resize_planes
from mmfront.wire.warm import warm_memory

_bicubic = optional_extension("mmfront._bicubic")
needs_extension = pytest.mark.skipif(_bicubic is None, reason="the C extension is not built (no C compiler at install)")
needs_avx2 = pytest.mark.skipif(bicubic._resize is None, reason="no AVX2 loops on this CPU (or no extension): torch resizes")



def test_extension_is_built_where_a_compiler_exists() -> None:
    if not has_c_compiler():
        pytest.skip("no C compiler: the install skips the extension and torch resizes")
    assert _bicubic is not None, "a C compiler exists but mmfront._bicubic was not built: reinstall (pip install -e .)"
    assert _bicubic.loops() in {"avx2", "portable"}

def _torch_resize(images: torch.Tensor, height: int, width: int, mode: Mode = "bicubic") -> torch.Tensor:
    interpolation = InterpolationMode.BICUBIC if mode == "bicubic" else InterpolationMode.BILINEAR
    return tvF.resize(images, [height, width], interpolation=interpolation, antialias=True)


def _pixels(batch: int, height: int, width: int, seed: int) -> torch.Tensor:
    """Random RGB pixels as a JPEG decodes them (channels-last), viewed channels first."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, height, width, 3), generator=generator, dtype=torch.uint8).permute(0, 3, 1, 2)


def _c_resize(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The C loop called directly, whichever loops are switched on, at any scale it takes."""
    batch, _, in_height, in_width = images.shape
    h = axis_weights(in_width, width) if in_width != width else None
    v = axis_weights(in_height, height) if in_height != height else None
    out = torch.empty((batch, 3, height, width), dtype=torch.uint8)
    for b in range(batch):
        _bicubic.resize(images[b].permute(1, 2, 0).numpy(), out[b].numpy(), in_height, in_width, height, width,
                        *(h[:3] if h is not None else (None, None, None)),
                        *(v[:3] if v is not None else (None, None, None)))
    return out


@needs_avx2
@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 2), in_height=st.integers(1, 90), in_width=st.integers(1, 90),
       out_height=st.integers(1, 110), out_width=st.integers(1, 110), seed=st.integers(0, 2**16))
def test_resize_planes_are_torchs_bytes(mode: Mode, batch: int, in_height: int, in_width: int, out_height: int,
                                        out_width: int, seed: int) -> None:
    images = _pixels(batch, in_height, in_width, seed)
    planes = resize_planes(images, out_height, out_width, mode)
    if planes is None:  # only where torch is left the work: no resize, or a steep shrink
        axes = [axis_weights(i, o, mode) for i, o in ((in_height, out_height), (in_width, out_width)) if i != o]
        steep = any(axis.weights.shape[1] > 64 for axis in axes) or (
            in_width != out_width and not axis_weights(in_width, out_width, mode).windowed)
        assert not axes or steep
        return
    assert planes.shape == (batch, 3, out_height, out_width) and planes.is_contiguous()
    assert torch.equal(planes, _torch_resize(images, out_height, out_width, mode))


@needs_avx2
@pytest.mark.parametrize("size", [(1024, 768), (1920, 1080), (768, 1024), (640, 480), (4000, 3000), (300, 200)])
def test_gemma3_sizes_are_torchs_bilinear(size: tuple[int, int]) -> None:
    """Images resized to Gemma 3's 896x896 as its native path resizes them (torch's antialiased
    bilinear): photos shrunk, a small one enlarged. A row shrunk more than ~2x (1920 or 4000 px
    wide) is past the loop's window: torch resizes it."""
    width, height = size
    images = _pixels(1, height, width, width + height)
    planes = resize_planes(images, 896, 896, "bilinear")
    if width > 2 * 896:
        assert planes is None and not axis_weights(width, 896, "bilinear").windowed
        return
    assert planes is not None
    assert torch.equal(planes, _torch_resize(images, 896, 896, "bilinear"))


@needs_extension
@pytest.mark.parametrize("simd", [True, False], ids=["best", "portable"])
@settings(max_examples=120, deadline=None)
@given(in_height=st.integers(1, 70), in_width=st.integers(1, 70), scale_y=st.floats(0.15, 6),
       scale_x=st.floats(0.15, 6), seed=st.integers(0, 2**16))
def test_each_loop_gives_torchs_bytes_at_any_scale(simd: bool, in_height: int, in_width: int, scale_y: float,
                                                   scale_x: float, seed: int) -> None:
    """Enlargements and shrinks up to ~6x, the blocks whose taps miss their window included (the
    AVX2 loop filters those one output at a time)."""
    out_height, out_width = max(1, round(in_height * scale_y)), max(1, round(in_width * scale_x))
    images = _pixels(1, in_height, in_width, seed)
    try:
        _bicubic.loops(simd)
        got = _c_resize(images, out_height, out_width)
    finally:
        _bicubic.loops(True)
    assert torch.equal(got, _torch_resize(images, out_height, out_width))


@needs_avx2
@pytest.mark.parametrize("size", [(1024, 768), (1920, 1080), (768, 1024), (640, 480), (500, 375), (4000, 3000),
                                  (6000, 4000), (37, 41)])
def test_qwen_pixel_limits_sizes_are_torchs(size: tuple[int, int]) -> None:
    """Images resized to Qwen2.5-VL's grid at its standard limits (HF's own ``smart_resize``), an
    enlargement of a small one and a 24-megapixel photo shrunk to the 12.8-megapixel limit among
    them."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    width, height = size
    out_height, out_width = smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=12845056)
    images = _pixels(1, height, width, width * height)
    planes = resize_planes(images, out_height, out_width)
    assert planes is not None
    assert torch.equal(planes, _torch_resize(images, out_height, out_width))


@needs_avx2
def test_resized_planes_are_made_in_warm_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planes of a miss's image are dropped once patchified: they are made in a buffer of the
    process's warm memory (:func:`mmfront.wire.warm.warm_memory`), not in fresh pages each time."""
    given: list[np.ndarray] = []
    monkeypatch.setattr(bicubic, "warm_memory", lambda nbytes: given.append(warm_memory(nbytes)) or given[-1])
    images = _pixels(1, 768, 1024, 7)
    planes = resize_planes(images, 756, 1036)
    assert planes is not None and [b.nbytes for b in given] == [3 * 756 * 1036]
    assert np.shares_memory(planes.numpy(), given[0]) and isinstance(given[0].base, memoryview)
    assert torch.equal(planes, _torch_resize(images, 756, 1036))


def test_axis_weights_are_torchs_support_and_precision() -> None:
    """Pillow's support (2 source pixels each side at most scales, 2 x scale when shrinking), the
    first taps clipped to the image, the int16 scaling of the largest weight below 2**15, and
    the taps no output uses left out."""
    same = axis_weights(10, 10)  # the identity: torch's 5 taps, of which only the first 2 are ever used
    assert same.first.tolist()[:3] == [0, 0, 1] and same.weights.shape == (10, 2)
    assert same.weights[5].tolist() == [0, 1 << same.precision] and same.precision == 14
    half = axis_weights(20, 10)  # 9 taps, the last zero for every output
    assert half.weights.shape == (10, 8) and half.first.tolist() == [0, 0, 1, 3, 5, 7, 9, 11, 13, 15]
    assert axis_weights(1024, 1036).weights.shape == (1036, 4)  # an enlargement: 4 of torch's 5 taps
    for axis in (axis_weights(1024, 1036), axis_weights(768, 756), axis_weights(7, 300)):
        assert int(np.abs(axis.weights).max()) < 1 << 15 <= 2 * int(np.abs(axis.weights).max()) + 2
        assert axis.windowed
    assert not axis_weights(300, 20).windowed  # 15 source pixels per output: torch's case


@needs_avx2
def test_resize_planes_leave_to_torch_what_they_do_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    images = _pixels(1, 30, 40, 1)
    assert resize_planes(images, 30, 40) is None  # no resize at all: torch returns the image as is
    assert resize_planes(images.contiguous(), 20, 20) is None  # planes, not a decoded image's pixels
    assert resize_planes(images.float(), 20, 20) is None
    assert resize_planes(torch.zeros((1, 4, 30, 40), dtype=torch.uint8), 20, 20) is None
    assert resize_planes(images, 30, 20) is None  # a shrink past the window: torch's own kernel
    assert resize_planes(images, 3, 40) is not None  # a vertical shrink has no window
    monkeypatch.setattr(bicubic, "_resize", None)  # built without a C compiler, or no AVX2
    assert resize_planes(images, 20, 20) is None


@needs_extension
@pytest.mark.parametrize(("change", "error"), [
    ({"height": 0}, "height must be 1 to"),
    ({"src": np.zeros(29 * 40 * 3, np.uint8)}, "src holds"),
    ({"dst": np.zeros(3 * 20 * 20 - 1, np.uint8)}, "dst holds"),
    ({"h": (None, None, None)}, "changes size"),
    ({"h_first": np.zeros(20, np.int64)}, "int32 first indices"),
    ({"h_first": np.full(20, 40, np.int32)}, "must rise within"),
    ({"h_first": np.arange(20, 0, -1, dtype=np.int32)}, "must rise within"),
    ({"h_weights": np.zeros((20, 65), np.int16)}, "at most 64"),
    ({"h_precision": 0}, "precision must be"),
    ({"h_precision": 23}, "precision must be"),
])
def test_resize_refuses_arguments_that_do_not_fit(change: dict[str, Any], error: str) -> None:
    h, v = axis_weights(40, 20), axis_weights(30, 20)
    args: dict[str, Any] = {"src": np.zeros(30 * 40 * 3, np.uint8), "dst": np.zeros(3 * 20 * 20, np.uint8),
                            "height": 30, "h_first": h.first, "h_weights": h.weights, "h_precision": h.precision}
    args.update(change)
    horizontal = change.get("h", (args["h_first"], args["h_weights"], args["h_precision"]))
    with pytest.raises(ValueError, match=error):
        _bicubic.resize(args["src"], args["dst"], args["height"], 40, 20, 20, *horizontal, v.first, v.weights,
                        v.precision)


@needs_extension
def test_resize_refuses_a_read_only_destination_and_a_wrong_type() -> None:
    h = axis_weights(40, 20)
    read_only = np.zeros(3 * 20 * 40, np.uint8)
    read_only.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        _bicubic.resize(np.zeros(20 * 40 * 3, np.uint8), read_only, 20, 40, 20, 20, h.first, h.weights, h.precision,
                        None, None, None)
    with pytest.raises(TypeError, match="width must be an int"):
        _bicubic.resize(np.zeros(20 * 40 * 3, np.uint8), np.zeros(3 * 20 * 20, np.uint8), 20, 40.0, 20, 20, h.first,
                        h.weights, h.precision, None, None, None)


@needs_extension
def test_loops_report_and_switch() -> None:
    best = _bicubic.loops()
    assert best in {"avx2", "portable"}
    try:
        assert _bicubic.loops(False) == "portable"
    finally:
        assert _bicubic.loops(True) == best
    assert (bicubic._resize is not None) == (best == "avx2")


@needs_avx2
def test_threads_resize_at_once_to_their_own_bytes() -> None:
    """The C loop runs without the GIL on scratch memory of its own, and the kept weights are
    shared read-only: eight threads resizing different images at once each get torch's bytes."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [(_pixels(1, 60 + 7 * n, 80 + 5 * n, n), 50 + 3 * n, 90 + 4 * n) for n in range(8)]

    def resize(case: tuple[torch.Tensor, int, int]) -> bool:
        images, height, width = case
        return all(torch.equal(resize_planes(images, height, width), _torch_resize(images, height, width))
                   for _ in range(20))

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(resize, cases * 2))
    assert axis_weights(80, 90).weights.flags.writeable is False
