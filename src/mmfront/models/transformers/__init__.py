"""The transformers backend: any HF multimodal processor mmfront has no native processor for.

Two processors share one base: :class:`OffsetsMultiModalProcessor` (transformers >= 5.15, places
items with the replacements HF reports) and :class:`LegacyMultiModalProcessor` (older
transformers, locates each item's expansion in HF's ids); both are cached.
``MultiModalProcessor`` is the one the installed transformers calls for; ``MultiModalConfig.
transformers_backend`` overrides it. See ``docs/transformers-backend.md``.
"""

from __future__ import annotations

import logging
from typing import Any

from mmfront.config import MultiModalConfig
from mmfront.errors import MissingOffsetsError
from mmfront.models.catalog import ProcessorFactory, unexpanded_placeholders
from mmfront.models.transformers.base import TransformersProcessingInfo
from mmfront.models.transformers.legacy import LegacyMultiModalProcessor
from mmfront.models.transformers.offsets import (
    OFFSETS_MIN_VERSION,
    TRANSFORMERS_VERSION,
    OffsetsMultiModalProcessor,
    has_replacement_hook,
    offsets_request_kwargs,
)

logger = logging.getLogger(__name__)

MultiModalProcessor: type[LegacyMultiModalProcessor] | type[OffsetsMultiModalProcessor] = (
    LegacyMultiModalProcessor if TRANSFORMERS_VERSION < OFFSETS_MIN_VERSION else OffsetsMultiModalProcessor
)


def select_backend(config: MultiModalConfig, hf_processor: Any = None) -> ProcessorFactory:
    """The backend ``config.transformers_backend`` asks for: ``auto`` (by transformers version),
    ``legacy`` or ``offsets``. Offsets on transformers < 5.15 serves only processors that already
    report offsets there (Idefics3, GLM-ASR); the others are refused when built.

    With ``auto`` and a ready ``hf_processor``, a processor that reports no offsets (no
    ``replace_<modality>_token`` hook, or a ``__call__`` that never reaches it, as Mllama's) is
    served by Legacy instead of being refused: probed once, here, and logged. A processor whose
    model module says HF leaves its placeholders unexpanded (Mllama) reports no offsets by design:
    it goes to Legacy without a probe or a warning."""
    if config.transformers_backend == "legacy":
        return ProcessorFactory(LegacyMultiModalProcessor, TransformersProcessingInfo)
    if config.transformers_backend == "offsets":
        return ProcessorFactory(OffsetsMultiModalProcessor, TransformersProcessingInfo)
    if MultiModalProcessor is OffsetsMultiModalProcessor and hf_processor is not None:
        if unexpanded_placeholders(type(hf_processor)):
            return ProcessorFactory(LegacyMultiModalProcessor, TransformersProcessingInfo)
        reason = offsets_missing(hf_processor, config)
        if reason is not None:
            logger.warning("%s is served by the Legacy transformers backend: %s", type(hf_processor).__name__,
                           str(reason).split(". ")[0])
            return ProcessorFactory(LegacyMultiModalProcessor, TransformersProcessingInfo)
    return ProcessorFactory(MultiModalProcessor, TransformersProcessingInfo)


def offsets_missing(hf_processor: Any, config: MultiModalConfig) -> MissingOffsetsError | None:
    """Why Offsets cannot serve ``hf_processor`` (the error it would raise), or None."""
    info = TransformersProcessingInfo(hf_processor, model_id=type(hf_processor).__name__, config=config)
    try:
        return OffsetsMultiModalProcessor(info).offsets_missing()
    except MissingOffsetsError as exc:
        return exc


__all__ = [
    "OFFSETS_MIN_VERSION",
    "TRANSFORMERS_VERSION",
    "LegacyMultiModalProcessor",
    "MultiModalProcessor",
    "OffsetsMultiModalProcessor",
    "TransformersProcessingInfo",
    "has_replacement_hook",
    "offsets_missing",
    "offsets_request_kwargs",
    "select_backend",
]
