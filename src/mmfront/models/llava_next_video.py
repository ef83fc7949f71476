"""LLaVA-NeXT-Video (llava-hf ``LLaVA-NeXT-Video`` checkpoints): served by the transformers
backend's HF call; what vLLM 0.33's native ``LlavaNextVideoForConditionalGeneration`` reads is
declared here.

vLLM's ``LlavaNextVideoMultiModalProcessor``: videos only, one per prompt
(``get_supported_mm_limits``: ``{"video": 1}``, so an image is refused with vLLM's limit of 0), a
video's frames ``[frames, C, H, W]`` per item (batched ``pixel_values_videos``), and a plain
replacement of ``<video>`` by the video's tokens (no ``is_embed`` mask). vLLM counts those tokens
from the config (the pooled patch grid times the frames), where HF's processor does not report a
video's count (``_get_num_multimodal_tokens``) and the backend alone would not place it; HF's
expansion is proven equal to vLLM's count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import ItemLimit, NativeInputs

__all__ = ["LLAVA_NEXT_VIDEO", "LLAVA_NEXT_VIDEO_NATIVE", "llava_next_video_fields"]


def llava_next_video_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's LLaVA-NeXT-Video fields: one video's frames per item."""
    return {"pixel_values_videos": MultiModalFieldConfig.batched("video")}


LLAVA_NEXT_VIDEO_NATIVE = NativeInputs(
    ("LlavaNextVideoForConditionalGeneration",), llava_next_video_fields, whole_range_embeds=True,
    mm_limits={"video": ItemLimit(1)},
    legacy_mismatch=("the class takes videos only, and the transformers backend places videos from transformers 5.18 "
                     "on (vLLM 0.33's gate too), so the Legacy backend has nothing to send it"))

LLAVA_NEXT_VIDEO = register_model(ModelSpec(model_type="llava_next_video", hf_processor_class="LlavaNextVideoProcessor",
                                            native=LLAVA_NEXT_VIDEO_NATIVE))
