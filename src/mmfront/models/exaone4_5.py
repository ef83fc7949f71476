"""EXAONE 4.5: served by the transformers backend's HF call; vLLM 0.33's native
``Exaone4_5_ForConditionalGeneration`` (a Qwen2.5-VL model class) takes its inputs from
``Qwen2VLMultiModalProcessor`` itself, so it reads Qwen2-VL's fields, raw uint8 pixels included
(:mod:`mmfront.models.qwen2_vl`)."""

from __future__ import annotations

from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["EXAONE4_5", "EXAONE4_5_NATIVE"]

EXAONE4_5_NATIVE = NativeInputs(("Exaone4_5_ForConditionalGeneration",), qwen2_vl_fields, device_normalize=True,
                                whole_range_embeds=True, hf_samples_frames=False)

EXAONE4_5 = register_model(ModelSpec(model_type="exaone4_5", hf_processor_class="Exaone4_5_Processor",
                                     native=EXAONE4_5_NATIVE))
