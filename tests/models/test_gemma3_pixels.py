"""Gemma 3's native pixel path: its output is already in the model dtype, and a request's items
processed one call each equal one batched call. The kernels themselves: tests/test_pixels.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from mmfront import pixels
from mmfront.models import gemma3
from mmfront.processing.threads import map_items

needs_extension = pytest.mark.skipif(pixels._lut_planes is None,
                                     reason="the C extension is not built (no C compiler at install)")

GEMMA3 = {"do_resize": True, "size": {"height": 64, "width": 48}, "resample": 2, "do_rescale": True,
          "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def _regions() -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    return [torch.from_numpy(rng.integers(0, 256, (30, 20, 3), dtype=np.uint8)),
            torch.from_numpy(rng.integers(0, 256, (200, 150, 3), dtype=np.uint8))]


@needs_extension
def test_native_output_is_already_in_the_model_dtype() -> None:
    out = gemma3.Gemma3MultiModalProcessor._native(_regions(), GEMMA3, torch.bfloat16)
    assert out["pixel_values"].dtype == torch.bfloat16 and out["num_patches"].tolist() == [1, 1]


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
