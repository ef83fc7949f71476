"""Qwen3-ASR: served by the transformers backend's HF call; what vLLM 0.33's native
``Qwen3ASRForConditionalGeneration`` reads is declared here.

vLLM's ``Qwen3ASRMultiModalProcessor`` runs HF on each clip apart (HF takes one text per clip, and
batch padding would change a clip's features) and post-processes them as Qwen2.5-Omni's processor
does (:func:`mmfront.models.qwen2_5_omni.omni_audio_outputs`): a clip's mel frames trimmed to its
own length, flat along time by ``audio_feature_lengths``, with its ``feature_attention_mask`` (HF's
``input_features_mask``), both batched on the CPU. The replacement is the ``<|audio_pad|>`` tokens
alone (no ``is_embed`` mask).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.qwen2_5_omni import omni_audio_fields, omni_audio_outputs
from mmfront.models.spec import ModelSpec
from mmfront.parse import MultiModalDataItems
from mmfront.processing.native import UNTRUNCATED_KWARGS, NativeInputs

__all__ = ["QWEN3_ASR", "QWEN3_ASR_NATIVE", "qwen3_asr_fields", "qwen3_asr_outputs"]


def qwen3_asr_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                      hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_postprocess_hf_mm_data``: the Omni audio keys from HF's ``input_features_mask``."""
    return omni_audio_outputs(hf_out, "input_features_mask")


def qwen3_asr_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``_qwen3asr_field_config``: the Omni audio fields."""
    return omni_audio_fields(hf_out)


QWEN3_ASR_NATIVE = NativeInputs(("Qwen3ASRForConditionalGeneration",), qwen3_asr_fields, outputs=qwen3_asr_outputs,
                                whole_range_embeds=True, hf_defaults=UNTRUNCATED_KWARGS)

QWEN3_ASR = register_model(ModelSpec(model_type="qwen3_asr", hf_processor_class="Qwen3ASRProcessor",
                                     native=QWEN3_ASR_NATIVE))
