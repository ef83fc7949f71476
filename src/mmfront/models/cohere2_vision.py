"""Cohere2-Vision (Command A Vision): served by the transformers backend's HF call; what vLLM 0.33's
native ``Cohere2VisionForConditionalGeneration`` reads is declared here.

vLLM's ``Cohere2VisionMultiModalProcessor``: an image's tiles are its rows of ``pixel_values``
(flat along dim 0), counted by the image's ``num_patches`` (batched, kept on the CPU; the model
splits its embeddings by it), and each range is ``<|START_OF_IMG|>`` + tiles + ``<|END_OF_IMG|>``
with only the image tokens embedded (``select_token_id``). The transformers backend counts the same
tiles per image as ``num_image_patches`` (the image processor's ``get_number_of_image_patches``,
which vLLM calls too); vLLM's name is the one the model reads.
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

__all__ = ["COHERE2_VISION", "COHERE2_VISION_NATIVE", "cohere2_vision_fields", "cohere2_vision_outputs"]


def cohere2_vision_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                           hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The backend's per-image tile counts under the name vLLM's model reads."""
    out = dict(hf_out)
    if "num_image_patches" in out:
        out["num_patches"] = out.pop("num_image_patches")
    return out


def cohere2_vision_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's Cohere2-Vision fields: tiles flat by ``num_patches``, embeddings one per image."""
    num_patches = hf_out.get("num_patches", torch.empty(0, dtype=torch.long))
    return {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", num_patches),
            "num_patches": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
            "image_embeds": MultiModalFieldConfig.batched("image")}


COHERE2_VISION_NATIVE = NativeInputs(("Cohere2VisionForConditionalGeneration",), cohere2_vision_fields,
                                     outputs=cohere2_vision_outputs)

COHERE2_VISION = register_model(ModelSpec(model_type="cohere2_vision", hf_processor_class="Cohere2VisionProcessor",
                                          native=COHERE2_VISION_NATIVE))
