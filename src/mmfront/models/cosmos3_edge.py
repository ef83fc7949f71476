"""Cosmos3 Edge: served by the transformers backend's HF call; vLLM 0.33's native
``Cosmos3EdgeForConditionalGeneration`` takes its inputs from ``Cosmos3EdgeMultiModalProcessor``, a
Qwen3-VL processor, so it reads Qwen2-VL's fields (patch rows per item, grids kept on the CPU) and
each video's frame ``timestamps`` (:mod:`mmfront.models.qwen3_vl`). Unlike Qwen3-VL its class does
not normalise on the device: the patches arrive normalised, in the model dtype. A video's range is
its whole ``<|vision_start|><|video_pad|><|vision_end|>`` replacement, per-frame timestamps and
markers around the embedding tokens (the mask says which are embedded)."""

from __future__ import annotations

from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields
from mmfront.models.qwen3_vl import qwen3_vl_timestamps
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["COSMOS3_EDGE", "COSMOS3_EDGE_NATIVE"]

COSMOS3_EDGE_NATIVE = NativeInputs(
    ("Cosmos3EdgeForConditionalGeneration",), qwen2_vl_fields, video_outputs=qwen3_vl_timestamps,
    whole_range_embeds=True, placeholders={"video": ("vision_start_token", "video_token", "vision_end_token")})

COSMOS3_EDGE = register_model(ModelSpec(model_type="cosmos3_edge", hf_processor_class="Cosmos3EdgeProcessor",
                                        transformers_since="5.15.0", native=COSMOS3_EDGE_NATIVE))
