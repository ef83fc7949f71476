"""Model processors: one module per model (Gemma 3 with its native processor; Idefics3, Emu3,
Qwen2-Audio and GLM-ASR, which the transformers backend serves), the transformers backend, and the
registry that finds the modules and picks a processor. A model module declares everything mmfront needs of it in one
:class:`ModelSpec` registered with :func:`register_model` (CONTRIBUTING.md, "Adding a model")."""

from mmfront.models.registry import ProcessorFactory, create_processor, register_model, register_processor
from mmfront.models.spec import ModelSpec, ReferenceModel
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo, ProcessingInfo

__all__ = [
    "BaseMultiModalProcessor",
    "BaseProcessingInfo",
    "ModelSpec",
    "ProcessingInfo",
    "ProcessorFactory",
    "ReferenceModel",
    "create_processor",
    "register_model",
    "register_processor",
]
