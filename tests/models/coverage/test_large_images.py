"""Real-size images on families that tile them. The coverage survey's small images fit one tile;
a 1024x768 photo is cut into many, and a processor that cannot say how many tiles each image got
(Llama 4: no ``_get_num_multimodal_tokens``) must still have each image's tiles attributed to it:
the backend then processes each image alone, where it owns every row of its call, or takes the
model module's count (LFM2-VL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from markers import NEEDS_TORCHVISION
from mmfront import MultiModalConfig
from mmfront.cache import processor_cache_from_config
from mmfront.models.registry import create_processor
from mmfront.testing.coverage import build_processor_folder, has_processor_class, prompt_for
from mmfront.testing.media import make_image
from mmfront.testing.models import load_processor

pytestmark = [pytest.mark.backend, NEEDS_TORCHVISION]

IMAGES = [make_image(1024, 768, seed=1), make_image(300, 200, seed=2)]
TILES = {"Llama4Processor": [13, 1], "Lfm2VlProcessor": [7, 1]}
"""Llama 4: 3x4 tiles and the global view; LFM2-VL: a 3x2 grid and its thumbnail (HF's processor
drops the grid: the model module counts it, ``ModelSpec.image_patches``). The small image: one tile."""


@pytest.mark.parametrize("processor_class", sorted(TILES))
@pytest.mark.hf_version(">=5.15", reason="the Legacy backend cannot locate two Llama 4 images in 5.14.1's expansion "
                                          "of its dummy text (one image token for both), nor a tiled LFM2-VL image's "
                                          "runs between its tile markers; Offsets serves them")
def test_a_tiled_photo_beside_a_small_image_equals_hf(processor_class: str, tmp_path: Path) -> None:
    if not has_processor_class(processor_class):
        pytest.skip(f"this transformers has no {processor_class}")
    folder = build_processor_folder(processor_class, tmp_path / processor_class)
    proc = create_processor(folder, MultiModalConfig(dtype="float32"), model_id=processor_class)
    prompt = prompt_for(proc.get_placeholder_str("image", 0), 2)
    cache = processor_cache_from_config(MultiModalConfig())
    out = proc.apply(prompt, {"image": IMAGES}, cache=cache)
    hf: Any = load_processor(folder)(text=[prompt], images=IMAGES, return_tensors="pt")

    assert out["prompt_token_ids"] == hf["input_ids"][0].tolist()
    pixels = [item["pixel_values"].data for item in out["mm_kwargs"]["image"]]
    assert [p.shape[0] for p in pixels] == TILES[processor_class]
    assert torch.equal(torch.cat(pixels), hf["pixel_values"])
    assert proc.apply(prompt, {"image": IMAGES}, cache=cache)["prompt_token_ids"] == out["prompt_token_ids"]
