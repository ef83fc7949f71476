"""Qwen2-Audio: served by the transformers backend (its ``replace_audio_token`` hook from 5.16).
This module declares the rest of what mmfront needs of it: the offline ``qwen2_audio`` fixture
(with a random-weight config) and the encoder the reference engine runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.kinds import TEXT_TOWER, ModelKind, special_token_ids
from mmfront.fixtures.processors import whisper_feature_extractor
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2AudioConfig, Qwen2AudioProcessor

def make_qwen2_audio_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"],
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "audio_token": "<|AUDIO|>",
            "audio_bos_token": "<|audio_bos|>",
            "audio_eos_token": "<|audio_eos|>",
        },
        add_bos=False,
    )


def make_qwen2_audio_processor(feature_size: int = 16, chunk_length: int = 2, sampling_rate: int = 16000) -> Qwen2AudioProcessor:
    """Qwen2AudioProcessor: real WhisperFeatureExtractor has feature_size=128, chunk_length=30.

    The processor forces ``padding="max_length"``, so ``input_features`` is always
    ``[num_audios, feature_size, chunk_length * sampling_rate // hop_length]`` whatever the
    audio length; ``feature_attention_mask`` ``[num_audios, frames]`` marks the real frames.
    An audio of L frames expands to ``(((L - 1) // 2 + 1) - 2) // 2 + 1`` ``<|AUDIO|>`` tokens.
    The processor's built-in default chat template is kept.
    """
    from transformers import Qwen2AudioProcessor

    return Qwen2AudioProcessor(
        feature_extractor=whisper_feature_extractor(feature_size, chunk_length, sampling_rate),
        tokenizer=make_qwen2_audio_tokenizer(),
    )


def _weights_config(processor: Any) -> Qwen2AudioConfig:
    from transformers import Qwen2AudioConfig

    tok = processor.tokenizer
    extractor = processor.feature_extractor
    return Qwen2AudioConfig(
        audio_config={"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                      "num_mel_bins": extractor.feature_size, "max_source_positions": extractor.nb_max_frames // 2},
        text_config={**TEXT_TOWER, **special_token_ids(tok), "model_type": "qwen2", "vocab_size": len(tok),
                     "tie_word_embeddings": False},
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )


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


QWEN2_AUDIO = register_model(ModelSpec(
    model_type="qwen2_audio",
    hf_processor_class="Qwen2AudioProcessor",
    fixtures={"qwen2_audio": ModelKind("qwen2_audio", "Qwen2AudioForConditionalGeneration", "float32",
                                       make_qwen2_audio_processor, ("feature_size", "chunk_length", "sampling_rate"),
                                       weights_config=_weights_config, stop_tokens=("<|im_end|>",))},
    reference=ReferenceModel(encode_qwen2_audio),
))
