"""LLaVA-NeXT (llava-hf ``llava-v1.6`` checkpoints): served by the transformers backend's HF call;
what vLLM 0.33's native ``LlavaNextForConditionalGeneration`` reads is declared here, and
LLaVA-OneVision's module reuses it.

vLLM's ``LlavaNextMultiModalProcessor._get_mm_fields_config``: one image per item, its anyres tiles
``[tiles, C, H, W]`` (batched ``pixel_values``) and its ``image_sizes`` kept on the CPU, and a plain
replacement of ``<image>`` by the image's tokens (no ``is_embed`` mask).

One difference is intended: vLLM processes a request's images in one HF call, which pads every
image's tiles with zero tiles up to the request's largest image, so an image's bytes there depend on
what it was sent beside. mmfront sends each image as it is alone (a cached item cannot depend on its
neighbours: the backend drops the padding, ``transformers.layout.drop_tile_padding``). The engine
reads the same embeddings: vLLM's model keeps the tiles ``image_sizes`` gives an image and drops the
padding ("Image patches might be padded for batch processing").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.parse import MultiModalDataItems
from mmfront.processing.native import NativeInputs

__all__ = ["LLAVA_NEXT", "LLAVA_NEXT_NATIVE", "anyres_tiles", "llava_next_fields"]


def anyres_tiles(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                 hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Each image's tiles as ``[tiles, C, H, W]``: the backend keeps an image's ``[1, tiles, C, H, W]``
    where a call's images had different tile counts (one call's ``[images, tiles, C, H, W]`` is
    split by the batched field as it is)."""
    pixels = hf_out.get("pixel_values")
    if not isinstance(pixels, list):
        return hf_out
    return {**hf_out, "pixel_values": [p[0] if isinstance(p, torch.Tensor) and p.ndim == 5 else p for p in pixels]}


def llava_next_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's LLaVA-NeXT fields: an image's tiles and size, or its precomputed embeddings, one per item."""
    return {"pixel_values": MultiModalFieldConfig.batched("image"),
            "image_sizes": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
            "image_embeds": MultiModalFieldConfig.batched("image")}


LLAVA_NEXT_NATIVE = NativeInputs(("LlavaNextForConditionalGeneration",), llava_next_fields, outputs=anyres_tiles,
                                 whole_range_embeds=True)

LLAVA_NEXT = register_model(ModelSpec(model_type="llava_next", hf_processor_class="LlavaNextProcessor",
                                      native=LLAVA_NEXT_NATIVE))
