"""Qwen2-Audio: served by the transformers backend's HF call (its ``replace_audio_token`` hook from
5.16); what vLLM 0.33's native ``Qwen2AudioForConditionalGeneration`` reads is declared here, with
the encoder the reference engine runs (its offline ``qwen2_audio`` fixture is
:mod:`mmfront.fixtures.models.qwen2_audio`'s).

vLLM's ``_qwen2audio_field_config``: one clip's ``input_features`` ``[mel, frames]`` and its
``feature_attention_mask`` per item (batched), and a plain replacement of ``<|AUDIO|>`` by the
clip's tokens (no ``is_embed`` mask).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel
from mmfront.processing.native import NativeInputs

__all__ = ["QWEN2_AUDIO", "QWEN2_AUDIO_NATIVE", "encode_qwen2_audio", "qwen2_audio_fields"]


def qwen2_audio_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``_qwen2audio_field_config``: features, mask and embeddings one per clip."""
    return {"audio_embeds": MultiModalFieldConfig.batched("audio"),
            "audio_num_tokens": MultiModalFieldConfig.batched("audio", keep_on_cpu=True),
            "input_features": MultiModalFieldConfig.batched("audio"),
            "feature_attention_mask": MultiModalFieldConfig.batched("audio")}


def encode_qwen2_audio(model: Any, modality: str, kwargs: BatchedTensorInputs,
                       features: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
    """Qwen2-Audio has no ``get_audio_features``: this is the audio half of its ``forward``."""
    from transformers.masking_utils import create_bidirectional_mask

    tower = model.model.audio_tower
    input_features: torch.Tensor = kwargs["input_features"]  # type: ignore[assignment]
    mask: torch.Tensor = kwargs["feature_attention_mask"]  # type: ignore[assignment]
    feat_lengths, out_lengths = tower._get_feat_extract_output_lengths(mask.sum(-1))
    steps = (input_features.shape[-1] - 2) // 2 + 1
    valid = torch.arange(steps, device=mask.device)[None, :] < feat_lengths[:, None]
    dummy = torch.zeros((valid.shape[0], steps, 1), dtype=input_features.dtype, device=input_features.device)
    attention = create_bidirectional_mask(config=tower.config, inputs_embeds=dummy, attention_mask=valid.long())
    hidden = tower(input_features, attention_mask=attention).last_hidden_state
    projected = model.model.multi_modal_projector(hidden)
    return [projected[i, :n] for i, n in enumerate(out_lengths.tolist())]


QWEN2_AUDIO_NATIVE = NativeInputs(
    ("Qwen2AudioForConditionalGeneration",), qwen2_audio_fields, whole_range_embeds=True)

QWEN2_AUDIO = register_model(ModelSpec(
    model_type="qwen2_audio",
    hf_processor_class="Qwen2AudioProcessor",
    reference=ReferenceModel(encode_qwen2_audio),
    native=QWEN2_AUDIO_NATIVE,
))
