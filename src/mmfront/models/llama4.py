"""Llama 4: served by the transformers backend's HF call (one call per image: its tiles carry no
per-image count); what vLLM 0.33's native ``Llama4ForConditionalGeneration`` reads is declared here.

vLLM's ``Mllama4MultiModalProcessor``: an image's tiles are its rows of ``pixel_values`` (flat,
counted by ``patches_per_image``: one tile, or the grid's tiles and the global tile), and its tile
grid ``aspect_ratios`` ``(rows, columns)``, both batched and kept on the CPU. HF's processor drops the
aspect ratios once it has written the prompt, so vLLM computes them again from the image's size
(``_postprocess_hf_mm_data``), as :func:`llama4_outputs` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.parse import ImageProcessorItems, MultiModalDataItems
from mmfront.processing.native import NativeInputs

__all__ = ["LLAMA4", "LLAMA4_NATIVE", "llama4_fields", "llama4_outputs"]


def llama4_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                   hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Each image's tile grid, found as HF's image processor finds it, and its tile count."""
    if "image" not in mm_items or "num_image_patches" not in hf_out:
        return hf_out
    # the processor's module (already imported by it): importing it first needs torchvision's ops loaded
    from transformers.image_utils import SizeDict
    from transformers.models.llama4.image_processing_llama4 import find_supported_resolutions, get_best_fit

    image_processor = hf_processor.image_processor
    tile = int(image_processor.size["height"])
    resolutions = torch.tensor(find_supported_resolutions(max_num_chunks=image_processor.max_patches,
                                                          patch_size=SizeDict(height=tile, width=tile)))
    images = mm_items.get_items("image", ImageProcessorItems)
    ratios = []
    for index in range(images.get_count()):
        size = images.get_image_size(index)
        height, width = get_best_fit((size.height, size.width), resolutions,
                                     resize_to_max_canvas=image_processor.resize_to_max_canvas)
        ratios.append((height // tile, width // tile))
    out = {k: v for k, v in hf_out.items() if k != "num_image_patches"}
    out["aspect_ratios"] = torch.tensor(ratios)
    out["patches_per_image"] = torch.tensor([1 if rows * cols == 1 else 1 + rows * cols for rows, cols in ratios])
    return out


def llama4_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``Mllama4MultiModalProcessor._get_mm_fields_config``."""
    patches = hf_out.get("patches_per_image", torch.empty(0, dtype=torch.long))
    return {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", patches),
            "patches_per_image": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
            "aspect_ratios": MultiModalFieldConfig.batched("image", keep_on_cpu=True)}


LLAMA4_NATIVE = NativeInputs(
    ("Llama4ForConditionalGeneration",), llama4_fields, outputs=llama4_outputs,
    legacy_mismatch=("it places an image's range on the one <|image|> token of HF's expansion, where vLLM's range is "
                     "the whole expansion from <|image_start|> with an is_embed mask on the patch tokens"))

LLAMA4 = register_model(ModelSpec(model_type="llama4", hf_processor_class="Llama4Processor", native=LLAMA4_NATIVE))
