"""GLM-4.1V: served by the transformers backend's HF call; vLLM 0.33's native
``Glm4vForConditionalGeneration`` reads Qwen2-VL's fields (``_create_qwen2vl_field_factory``: patch rows per item, grids
kept on the CPU, raw uint8 patches normalised on the device).

Its images are proven equal. Its videos are not: vLLM's video range spans
``<|begin_of_video|>...<|end_of_video|>`` (its target is the three tokens, its replacement the
frames with their markers and timestamps) where HF's expansion, and so mmfront's range, covers the
``<|video|>`` token alone, and vLLM takes one video per prompt; while the native class runs, a
video is refused with that reason (``--model-impl transformers`` serves it)."""

from __future__ import annotations

from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["GLM4V", "GLM4V_NATIVE"]

_VIDEO_UNPROVEN = ("vLLM 0.33's native GLM-4.1V class reads a video's placeholder range from <|begin_of_video|> to "
                   "<|end_of_video|>, which mmfront does not yet send (its range covers the expansion of <|video|> "
                   "alone): videos are refused rather than sent in a form the engine would misread. Serve the model "
                   "with --model-impl transformers for videos.")

GLM4V_NATIVE = NativeInputs(("Glm4vForConditionalGeneration",), qwen2_vl_fields, device_normalize=True,
                            whole_range_embeds=True, unproven={"video": _VIDEO_UNPROVEN})

GLM4V = register_model(ModelSpec(model_type="glm4v", hf_processor_class="Glm4vProcessor", native=GLM4V_NATIVE))
