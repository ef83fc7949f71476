"""PaddleOCR-VL: served by the transformers backend's HF call; what vLLM 0.33's native
``PaddleOCRVLForConditionalGeneration`` reads is declared here.

vLLM's ``PaddleOCRVLMultiModalProcessor._get_mm_fields_config``: an image's ``pixel_values`` are
its ``t*h*w`` patch rows (flat) and its ``image_grid_thw`` is batched and kept on the CPU; the
engine normalises nothing (the class does not normalise on the device), and each placeholder range
is the image's embedding tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["PADDLEOCR_VL", "PADDLEOCR_VL_NATIVE", "paddleocr_vl_fields"]


def paddleocr_vl_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's PaddleOCR-VL fields: patch rows per image from its grid."""
    rows = hf_out.get("image_grid_thw", torch.empty((0, 3), dtype=torch.long)).prod(-1)
    return {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", rows),
            "image_grid_thw": MultiModalFieldConfig.batched("image", keep_on_cpu=True)}


PADDLEOCR_VL_NATIVE = NativeInputs(("PaddleOCRVLForConditionalGeneration",), paddleocr_vl_fields,
                                   whole_range_embeds=True)

PADDLEOCR_VL = register_model(ModelSpec(model_type="paddleocr_vl", hf_processor_class="PaddleOCRVLProcessor",
                                        native=PADDLEOCR_VL_NATIVE))
