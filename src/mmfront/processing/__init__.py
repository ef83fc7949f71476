"""The processing layer: prompt updates, calling HF processors, and ``BaseMultiModalProcessor``
with its ``BaseProcessingInfo`` (vLLM's names; ``ProcessingInfo`` is the older alias)."""

from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo, ProcessingInfo

__all__ = ["BaseMultiModalProcessor", "BaseProcessingInfo", "ProcessingInfo"]
