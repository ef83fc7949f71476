"""Qwen3-VL: served by the transformers backend's HF call; vLLM 0.33's native
``Qwen3VLForConditionalGeneration`` reads Qwen2-VL's fields (``_create_qwen2vl_field_factory``:
patch rows per item, grids kept on the CPU, raw uint8 patches normalised on the device), and a
video's range holds its frames' timestamps and markers around the embedding tokens (the mask says
which are embedded). Its images expand as Qwen2-VL's (``image_expansions``: ``t*h*w / merge_size**2``
image pads), so the transformers backend runs the image processor alone on them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields, qwen2_vl_image_expansions, qwen2_vl_pixel_limits
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["QWEN3_VL", "QWEN3_VL_NATIVE", "qwen3_vl_timestamps"]


def _video_kwarg(hf_kwargs: Mapping[str, Any], key: str) -> Any:
    scoped = hf_kwargs.get("videos_kwargs")
    return scoped.get(key) if isinstance(scoped, Mapping) and key in scoped else hf_kwargs.get(key)


def qwen3_vl_timestamps(metadata: Mapping[str, Any], hf_processor: Any,
                        hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``Qwen3VLProcessingInfo._get_video_second_idx``: the seconds of each temporal patch
    (the mean of its frames' times), from the frames kept, or those HF samples where the metadata
    leaves the sampling to it."""
    video_processor = hf_processor.video_processor
    patch = int(video_processor.temporal_patch_size)
    fps = float(metadata["fps"])
    indices = list(metadata["frames_indices"])
    if metadata.get("do_sample_frames", False):
        total = int(metadata["total_num_frames"])
        count = _video_kwarg(hf_kwargs, "num_frames")
        if count is None:
            count = int(total / fps * (_video_kwarg(hf_kwargs, "fps") or video_processor.fps))
        count = min(max(count, video_processor.min_frames), video_processor.max_frames, total)
        indices = np.linspace(0, total - 1, count).round().astype(int).tolist()
    if len(indices) % patch:
        indices = indices + [indices[-1]] * (patch - len(indices) % patch)
    seconds = [i / fps for i in indices]
    return {"timestamps": [(seconds[i] + seconds[i + patch - 1]) / 2 for i in range(0, len(seconds), patch)]}


QWEN3_VL_NATIVE = NativeInputs(("Qwen3VLForConditionalGeneration",), qwen2_vl_fields, device_normalize=True,
                               video_outputs=qwen3_vl_timestamps, whole_range_embeds=True)

QWEN3_VL = register_model(ModelSpec(model_type="qwen3_vl", hf_processor_class="Qwen3VLProcessor",
                                    native=QWEN3_VL_NATIVE, image_expansions=qwen2_vl_image_expansions,
                                    call_kwargs=qwen2_vl_pixel_limits))
