"""Model processors: native ones (Gemma 3), the transformers backend, and the registry that picks
one. A native processor subclasses ``BaseProcessingInfo`` and ``BaseMultiModalProcessor`` and
declares itself with ``@register_processor(...)``."""

from mmfront.models.registry import ProcessorFactory, create_processor, register_processor
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo, ProcessingInfo

__all__ = [
    "BaseMultiModalProcessor",
    "BaseProcessingInfo",
    "ProcessingInfo",
    "ProcessorFactory",
    "create_processor",
    "register_processor",
]
