"""LLaVA (llava-hf checkpoints): served by the transformers backend's HF call; what vLLM 0.33's
native ``LlavaForConditionalGeneration`` reads is declared here.

vLLM's ``LlavaMultiModalProcessor._get_mm_fields_config``: one ``[C, H, W]`` image per item
(batched ``pixel_values``), and a plain replacement of ``<image>`` by the image's tokens (no
``is_embed`` mask). The engine normalises nothing: pixels go in the model dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["LLAVA", "LLAVA_NATIVE", "llava_fields"]


def llava_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's LLaVA fields: an image's pixels, or its precomputed embeddings, one per item."""
    return {"pixel_values": MultiModalFieldConfig.batched("image"),
            "image_embeds": MultiModalFieldConfig.batched("image")}


LLAVA_NATIVE = NativeInputs(("LlavaForConditionalGeneration",), llava_fields, whole_range_embeds=True)

LLAVA = register_model(ModelSpec(model_type="llava", hf_processor_class="LlavaProcessor", native=LLAVA_NATIVE))
