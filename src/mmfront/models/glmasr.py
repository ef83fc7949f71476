"""GLM-ASR: served by the transformers backend's HF call; what vLLM 0.33's native
``GlmAsrForConditionalGeneration`` reads is declared here (its offline ``glmasr`` fixture is
:mod:`mmfront.fixtures.models.glmasr`'s).

vLLM's ``GlmAsrMultiModalProcessor`` post-processes HF's outputs as AudioFlamingo3's does (the
windows' mask as ``feature_attention_mask``, each clip's ``chunk_counts``, the rows flat by them:
:func:`mmfront.models.audioflamingo3.chunked_audio_outputs`), without ``audio_num_tokens``. It
declares no item limit, but calls HF with one text for all of a prompt's clips
(``<|pad|><|pad|>``), which HF's ``GlmAsrProcessor`` refuses (one text per clip): vLLM fails on a
second clip, so mmfront refuses it with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.audioflamingo3 import chunked_audio_outputs
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import ItemLimit, NativeInputs

__all__ = ["GLMASR", "GLMASR_NATIVE", "glmasr_fields"]


def glmasr_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``_glmasr_field_config``: a clip's windows flat by ``chunk_counts``."""
    chunk_counts = hf_out.get("chunk_counts", torch.empty(0, dtype=torch.long))
    return {"audio_embeds": MultiModalFieldConfig.batched("audio"),
            "input_features": MultiModalFieldConfig.flat_from_sizes("audio", chunk_counts),
            "feature_attention_mask": MultiModalFieldConfig.flat_from_sizes("audio", chunk_counts),
            "chunk_counts": MultiModalFieldConfig.batched("audio", keep_on_cpu=True)}


GLMASR_NATIVE = NativeInputs(
    ("GlmAsrForConditionalGeneration",), glmasr_fields, outputs=chunked_audio_outputs,
    mm_limits={"audio": ItemLimit(1, "vLLM 0.33's native GLM-ASR processor calls HF's GlmAsrProcessor with one text "
                                     "for all of a prompt's audio clips, which HF refuses (one text per clip), so vLLM "
                                     "fails on more than one clip per prompt; send one clip per request, or serve the "
                                     "model with --model-impl transformers.")})

GLMASR = register_model(ModelSpec(model_type="glmasr", hf_processor_class="GlmAsrProcessor", native=GLMASR_NATIVE))
