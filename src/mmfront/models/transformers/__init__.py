"""The transformers backend: any HF multimodal processor mmfront has no native processor for.

Two processors share one base: :class:`OffsetsMultiModalProcessor` (transformers >= 5.15, places
items with the replacements HF reports) and :class:`LegacyMultiModalProcessor` (older
transformers, locates each item's expansion in HF's ids); both are cached.
``MultiModalProcessor`` is the one the installed transformers calls for; ``MultiModalConfig.
transformers_backend`` overrides it. See ``docs/transformers-backend.md``.
"""

from __future__ import annotations

from mmfront.config import MultiModalConfig
from mmfront.models.catalog import ProcessorFactory
from mmfront.models.transformers.base import TransformersProcessingInfo
from mmfront.models.transformers.legacy import LegacyMultiModalProcessor
from mmfront.models.transformers.offsets import (
    OFFSETS_MIN_VERSION,
    TRANSFORMERS_VERSION,
    OffsetsMultiModalProcessor,
    has_replacement_hook,
    offsets_request_kwargs,
)

MultiModalProcessor: type[LegacyMultiModalProcessor] | type[OffsetsMultiModalProcessor] = (
    LegacyMultiModalProcessor if TRANSFORMERS_VERSION < OFFSETS_MIN_VERSION else OffsetsMultiModalProcessor
)


def select_backend(config: MultiModalConfig) -> ProcessorFactory:
    """The backend ``config.transformers_backend`` asks for: ``auto`` (by transformers version),
    ``legacy`` or ``offsets``. Offsets on transformers < 5.15 serves only processors that already
    report offsets there (Idefics3, GLM-ASR); the others are refused when built."""
    if config.transformers_backend == "legacy":
        return ProcessorFactory(LegacyMultiModalProcessor, TransformersProcessingInfo)
    if config.transformers_backend == "offsets":
        return ProcessorFactory(OffsetsMultiModalProcessor, TransformersProcessingInfo)
    return ProcessorFactory(MultiModalProcessor, TransformersProcessingInfo)


__all__ = [
    "OFFSETS_MIN_VERSION",
    "TRANSFORMERS_VERSION",
    "LegacyMultiModalProcessor",
    "MultiModalProcessor",
    "OffsetsMultiModalProcessor",
    "TransformersProcessingInfo",
    "has_replacement_hook",
    "offsets_request_kwargs",
    "select_backend",
]
