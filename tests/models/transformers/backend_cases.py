"""Shared helpers of the transformers-backend tests: building either backend class directly
(bypassing the version gate), and the parameter that runs a test over both classes."""

from __future__ import annotations

from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.models.transformers import (
    LegacyMultiModalProcessor,
    OffsetsMultiModalProcessor,
    TransformersProcessingInfo,
)

OFFSETS_REASON = "Gemma3/Emu3 report text_replacement_offsets from transformers 5.15.0"

#: both classes; Offsets skips below 5.15 where the processor under test reports no offsets
BACKENDS = [
    pytest.param(LegacyMultiModalProcessor, id="legacy"),
    pytest.param(OffsetsMultiModalProcessor, id="offsets", marks=pytest.mark.hf_version(">=5.15", reason=OFFSETS_REASON)),
]

#: both classes, Offsets on every version (Idefics3 and GLM-ASR report offsets since 5.14.1)
BACKENDS_ANY_VERSION = [
    pytest.param(LegacyMultiModalProcessor, id="legacy"),
    pytest.param(OffsetsMultiModalProcessor, id="offsets"),
]


def build(cls: type, hf_processor: Any, **config: Any) -> Any:
    """``cls`` over ``hf_processor``; float32 so outputs compare bit-exact with HF's."""
    config.setdefault("dtype", "float32")
    info = TransformersProcessingInfo(hf_processor, model_id="tiny", config=MultiModalConfig(**config))
    return cls(info)


def token_id(hf_processor: Any, token: str) -> int:
    return int(hf_processor.tokenizer.convert_tokens_to_ids(token))


def encode(hf_processor: Any, text: str) -> list[int]:
    return list(hf_processor.tokenizer.encode(text, add_special_tokens=False))
