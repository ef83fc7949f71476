"""Gemma 3's native pixel steps: the table path (C extension ``lut_planes``, rows in parallel)
gives the very bits of the torch path (convert, rescale and normalize as HF's torchvision backend
fuses them, then cast to the model dtype), for every dtype, setting and region shape."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.models import gemma3
from mmfront.processing.threads import map_items

lut_planes = gemma3._lut_planes
needs_extension = pytest.mark.skipif(lut_planes is None, reason="the C extension is not built (no C compiler at install)")

GEMMA3 = {"do_resize": True, "size": {"height": 64, "width": 48}, "resample": 2, "do_rescale": True,
          "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
IMAGENET = {**GEMMA3, "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711]}
RESCALE_ONLY = {**GEMMA3, "do_normalize": False}
NEITHER = {**GEMMA3, "do_normalize": False, "do_rescale": False}


def _regions() -> list[torch.Tensor]:
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
    regions = _regions()
    fast = gemma3._pixel_rows(regions, (64, 48), config, dtype)
    monkeypatch.setattr(gemma3, "_lut_planes", None)
    slow = gemma3._pixel_rows(regions, (64, 48), config, dtype)
    assert fast.dtype == slow.dtype == dtype and fast.shape == (5, 3, 64, 48)
    assert torch.equal(_bits(fast), _bits(slow))
    reference = torch.stack([gemma3._resized(r, (64, 48)) for r in regions]).float()
    gemma3._normalize_(reference, config)
    assert torch.equal(_bits(fast), _bits(reference.to(dtype)))


@needs_extension
def test_native_output_is_already_in_the_model_dtype() -> None:
    out = gemma3.Gemma3MultiModalProcessor._native(_regions()[:2], GEMMA3, torch.bfloat16)
    assert out["pixel_values"].dtype == torch.bfloat16 and out["num_patches"].tolist() == [1, 1]


@needs_extension
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.sampled_from([2, 4]), st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_lut_planes_is_a_per_plane_table_lookup(channels: int, item: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    kind = {2: np.uint16, 4: np.uint32}[item]
    src = rng.integers(0, 256, (channels, n), dtype=np.uint8)
    table = rng.integers(0, np.iinfo(kind).max, (channels, 256), dtype=kind, endpoint=True)
    dst = np.zeros((channels, n), kind)
    lut_planes(src, table, dst, channels)
    assert np.array_equal(dst, np.take_along_axis(table, src.astype(np.intp), axis=1))


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
        lut_planes(src, table, dst, channels)


@needs_extension
def test_lut_planes_refuses_a_read_only_destination() -> None:
    dst = np.zeros(3, np.uint16)
    dst.flags.writeable = False
    with pytest.raises((BufferError, ValueError, TypeError)):
        lut_planes(np.zeros(3, np.uint8), np.zeros((3, 256), np.uint16), dst, 3)


def test_map_items_keeps_order_and_raises_the_first_error() -> None:
    assert map_items(lambda x: x * x, list(range(20))) == [x * x for x in range(20)]
    assert map_items(lambda x: x, []) == []

    def boom(x: int) -> int:
        if x == 3:
            raise ValueError("item 3")
        return x

    with pytest.raises(ValueError, match="item 3"):
        map_items(boom, list(range(6)))


@pytest.mark.parametrize("pan_and_scan", [False, True])
def test_items_processed_one_call_each_equal_one_batched_call(gemma3_dir: Any, pan_and_scan: bool) -> None:
    """In place, Gemma 3 (``items_are_independent``) processes a request's items one call each, in
    parallel: every item, its tensors and its flat slices, equals what one call over all of them
    gives, and each item's tensors own their storage (no copy out of a shared batch)."""
    from mmfront.models.registry import create_processor
    from mmfront.testing.media import make_image

    proc = create_processor(gemma3_dir)
    assert proc.items_are_independent
    kwargs = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16} if pan_and_scan else {}
    images = [make_image(128, 32, seed=1), make_image(40, 30, seed=2), make_image(32, 96, seed=3)]
    mm_items = proc.info.parse_mm_data({"image": images})
    per_item, resolved = proc.process_subset(mm_items, kwargs)
    batched = proc.process_hf_items(mm_items, kwargs)
    assert per_item.get_count("image") == batched.get_count("image") == 3
    for mine, theirs in zip(per_item["image"], batched["image"]):
        assert mine is not None and theirs is not None
        assert mine == theirs  # data and fields (flat slices included)
        pixels = mine["pixel_values"].data
        assert isinstance(pixels, torch.Tensor) and pixels.untyped_storage().nbytes() == pixels.nbytes
    assert resolved == proc.resolve_prompt_updates(mm_items, kwargs, batched)
    assert [int(i["num_patches"].data) for i in per_item["image"] if i is not None] == (
        [5, 3, 4] if pan_and_scan else [1, 1, 1])
