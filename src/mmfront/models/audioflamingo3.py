"""AudioFlamingo3: served by the transformers backend's HF call; what vLLM 0.33's native
``AudioFlamingo3ForConditionalGeneration`` reads is declared here.

HF's processor cuts a clip into Whisper windows (``chunk_length`` seconds each, at most
``max_audio_len`` seconds in all) and returns one row of ``input_features`` and of
``input_features_mask`` per window. vLLM's ``AudioFlamingo3MultiModalProcessor`` renames the mask
``feature_attention_mask``, counts each clip's windows from its samples as ``chunk_counts``
(batched, kept on the CPU) and sends the rows flat along dim 0 by them; each range is masked to
the audio tokens (``select_token_id``). vLLM takes one clip per prompt
(``get_supported_mm_limits``: ``{"audio": 1}``); more are refused with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.parse import AudioProcessorItems, MultiModalDataItems
from mmfront.processing.native import ItemLimit, NativeInputs

__all__ = ["AUDIOFLAMINGO3", "AUDIOFLAMINGO3_NATIVE", "audioflamingo3_fields", "chunked_audio_outputs"]


def chunked_audio_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                          hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_postprocess_hf_mm_data`` (AudioFlamingo3's and GLM-ASR's alike): the windows' mask as
    ``feature_attention_mask``, and each clip's window count as ``chunk_counts``, from its samples as
    HF cuts it (at least one window, at most ``max_audio_len`` seconds of them)."""
    if "audio" not in mm_items:
        return hf_out
    out = dict(hf_out)
    if "input_features_mask" in out:
        out["feature_attention_mask"] = out.pop("input_features_mask")
    extractor = hf_processor.feature_extractor
    window = int(extractor.sampling_rate * extractor.chunk_length)
    most = int(hf_processor.max_audio_len // extractor.chunk_length)
    clips = mm_items.get_items("audio", AudioProcessorItems)
    counts = [min(max(1, -(-clips.get_audio_length(i) // window)), most) for i in range(clips.get_count())]
    out["chunk_counts"] = torch.tensor(counts, dtype=torch.long)
    return out


def audioflamingo3_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``_audioflamingo3_field_config``: a clip's windows flat by ``chunk_counts``."""
    chunk_counts = hf_out.get("chunk_counts", torch.empty(0, dtype=torch.long))
    return {"audio_embeds": MultiModalFieldConfig.batched("audio"),
            "audio_num_tokens": MultiModalFieldConfig.batched("audio", keep_on_cpu=True),
            "input_features": MultiModalFieldConfig.flat_from_sizes("audio", chunk_counts),
            "feature_attention_mask": MultiModalFieldConfig.flat_from_sizes("audio", chunk_counts),
            "chunk_counts": MultiModalFieldConfig.batched("audio", keep_on_cpu=True)}


AUDIOFLAMINGO3_NATIVE = NativeInputs(
    ("AudioFlamingo3ForConditionalGeneration",), audioflamingo3_fields, outputs=chunked_audio_outputs,
    mm_limits={"audio": ItemLimit(1, "vLLM 0.33's native AudioFlamingo3 class takes one audio clip per prompt "
                                     "(its get_supported_mm_limits); send one clip per request, or serve the model "
                                     "with --model-impl transformers.")})

AUDIOFLAMINGO3 = register_model(ModelSpec(
    model_type="audioflamingo3", hf_processor_class="AudioFlamingo3Processor", native=AUDIOFLAMINGO3_NATIVE))
