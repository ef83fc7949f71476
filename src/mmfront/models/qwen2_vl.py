"""Qwen2-VL: served by the transformers backend's HF call; what vLLM 0.33's native
``Qwen2VLForConditionalGeneration`` reads is declared here (Qwen2.5-VL's module adds its
``second_per_grid_ts``).

vLLM's ``_create_qwen2vl_field_factory``: an item's ``pixel_values`` are its ``t*h*w`` patch rows
(flat), its grid ``image_grid_thw`` is batched and kept on the CPU, as are a video's
``video_grid_thw``; the engine normalises raw uint8 patches on the GPU by default
(``supports_mm_device_do_normalize``), and each placeholder range is embedding tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["QWEN2_VL", "QWEN2_VL_NATIVE", "qwen2_vl_fields"]


def _merge_size(hf_processor: Any) -> int:
    return int(getattr(hf_processor.image_processor, "merge_size", 2))


def qwen2_vl_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``_qwen2vl_field_config``: patch rows per item from its grid."""
    unit = _merge_size(hf_processor) ** 2
    image_rows = hf_out.get("image_grid_thw", torch.empty((0, 3), dtype=torch.long)).prod(-1)
    video_rows = hf_out.get("video_grid_thw", torch.empty((0, 3), dtype=torch.long)).prod(-1)
    return {
        "pixel_values": MultiModalFieldConfig.flat_from_sizes("image", image_rows),
        "image_embeds": MultiModalFieldConfig.flat_from_sizes("image", image_rows // unit),
        "image_grid_thw": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
        "pixel_values_videos": MultiModalFieldConfig.flat_from_sizes("video", video_rows),
        "video_embeds": MultiModalFieldConfig.flat_from_sizes("video", video_rows // unit),
        "video_grid_thw": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
        "timestamps": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
    }


QWEN2_VL_NATIVE = NativeInputs(("Qwen2VLForConditionalGeneration",), qwen2_vl_fields, device_normalize=True,
                               whole_range_embeds=True, hf_samples_frames=False)

QWEN2_VL = register_model(ModelSpec(model_type="qwen2_vl", hf_processor_class="Qwen2VLProcessor",
                                    native=QWEN2_VL_NATIVE))
