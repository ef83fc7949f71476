"""Mistral 3 (``mistral3`` checkpoints, whose processor is ``PixtralProcessor``): served by the
transformers backend's HF call; what vLLM 0.33's native ``Mistral3ForConditionalGeneration`` reads
is declared here.

vLLM's ``Mistral3MultiModalProcessor._get_mm_fields_config``: one image per item, its pixels
``[C, H, W]`` cropped to the image's own size (batched ``pixel_values``; no ``image_sizes``: the
model reads an image's size from its pixels), raw ``uint8`` since the class normalises on the
device (``supports_mm_device_do_normalize``). Its replacement is rows of ``[IMG]`` tokens closed by
``[IMG_BREAK]`` and the last by ``[IMG_END]``, with only the ``[IMG]`` tokens embedded
(``PromptUpdateDetails.select_token_id``): ranges keep their ``is_embed`` mask.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["MISTRAL3", "MISTRAL3_NATIVE", "mistral3_fields"]


def mistral3_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's Mistral 3 fields: an image's pixels, or its precomputed embeddings, one per item."""
    return {"pixel_values": MultiModalFieldConfig.batched("image"),
            "image_embeds": MultiModalFieldConfig.batched("image")}


MISTRAL3_NATIVE = NativeInputs(("Mistral3ForConditionalGeneration",), mistral3_fields, device_normalize=True)

MISTRAL3 = register_model(ModelSpec(model_type="mistral3", hf_processor_class="PixtralProcessor",
                                    native=MISTRAL3_NATIVE))
