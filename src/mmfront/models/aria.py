"""Aria (``rhymes-ai/Aria`` checkpoints): served by the transformers backend's HF call; what vLLM
0.33's native ``AriaForConditionalGeneration`` reads is declared here.

vLLM's ``AriaMultiModalProcessor``: one crop ``[C, H, W]`` and its ``pixel_mask`` ``[H, W]`` per image
(both batched), and a plain replacement of ``<|img|>`` by as many image tokens as the projector's
largest query count (``max(projector_patch_to_query_dict.values())``, no ``is_embed`` mask). So vLLM
serves an image of one crop at the processor's largest size alone: HF's ``split_image`` gives an
image several crops, which vLLM's batched fields count as several images (its processor fails), and a
smaller ``max_image_size`` yields fewer embeddings than vLLM's range holds (its engine fails). Both
are refused for the native class with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.parse import MultiModalDataItems
from mmfront.processing.native import NativeInputs

__all__ = ["ARIA", "ARIA_NATIVE", "aria_fields", "aria_one_crop_per_image"]


def aria_one_crop_per_image(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                            hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The outputs as they are, where vLLM's class can read them: one crop per image, at the size whose
    token count vLLM's replacement writes. Otherwise a :class:`ValidationError` saying why."""
    pixels = hf_out.get("pixel_values")
    if "image" not in mm_items or not isinstance(pixels, torch.Tensor):
        return hf_out
    count = mm_items.get_count("image", strict=False)
    if pixels.shape[0] != count:
        raise ValidationError(
            f"Aria split {count} image(s) into {pixels.shape[0]} crops (split_image): vLLM 0.33's native Aria class "
            "takes one crop per image (its processor counts each crop as an image and fails). Send the request without "
            "split_image, or serve the model with --model-impl transformers.", parameter="mm_processor_kwargs")
    conversion: Mapping[int, int] = getattr(hf_processor, "size_conversion", {})
    side = int(pixels.shape[-1])
    tokens, most = conversion.get(side), max(conversion.values(), default=None)
    if tokens != most:
        raise ValidationError(
            f"Aria resized the image(s) to {side} px ({tokens} image tokens): vLLM 0.33's native Aria class expands "
            f"every image to {most} tokens, its projector's largest query count, so its engine would not fill the range. "
            "Send the request without max_image_size, or serve the model with --model-impl transformers.",
            parameter="mm_processor_kwargs")
    return hf_out


def aria_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's Aria fields: an image's crop and its pixel mask, one per item."""
    return {"pixel_values": MultiModalFieldConfig.batched("image"),
            "pixel_mask": MultiModalFieldConfig.batched("image")}


ARIA_NATIVE = NativeInputs(("AriaForConditionalGeneration",), aria_fields, outputs=aria_one_crop_per_image,
                           whole_range_embeds=True)

ARIA = register_model(ModelSpec(model_type="aria", hf_processor_class="AriaProcessor", native=ARIA_NATIVE))
