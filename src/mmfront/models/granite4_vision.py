"""Granite 4 Vision: served by the transformers backend's HF call; what vLLM 0.33's native
``Granite4VisionForConditionalGeneration`` reads is declared here.

vLLM runs LLaVA-NeXT's processing for it (``Granite4VisionMultiModalProcessor`` extends
``BaseLlavaNextMultiModalProcessor``): one image per item, its anyres tiles ``[tiles, C, H, W]``
(batched ``pixel_values``) and its ``image_sizes`` kept on the CPU, no precomputed embeddings, and a
plain replacement of ``<image>`` by the image's tokens (no ``is_embed`` mask). vLLM counts those
tokens from the config's ``downsample_rate``, HF from the processor's; a checkpoint ships both.
As for LLaVA-NeXT, mmfront sends each image's tiles as it is alone, where vLLM pads a request's
images to its largest tile count (:mod:`mmfront.models.llava_next`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.llava_next import anyres_tiles
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["GRANITE4_VISION", "GRANITE4_VISION_NATIVE", "granite4_vision_fields"]


def granite4_vision_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's Granite 4 Vision fields: an image's tiles and its size, one per item."""
    return {"pixel_values": MultiModalFieldConfig.batched("image"),
            "image_sizes": MultiModalFieldConfig.batched("image", keep_on_cpu=True)}


GRANITE4_VISION_NATIVE = NativeInputs(("Granite4VisionForConditionalGeneration",), granite4_vision_fields,
                                      outputs=anyres_tiles, whole_range_embeds=True)

GRANITE4_VISION = register_model(ModelSpec(model_type="granite4_vision", hf_processor_class="Granite4VisionProcessor",
                                           native=GRANITE4_VISION_NATIVE))
