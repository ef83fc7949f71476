"""Model processors: one module per model that declares something of its own (which ones:
:func:`~mmfront.models.catalog.model_specs`, and README.md's model list, generated from it), the
transformers backend, the catalog that finds the modules, and the registry that picks a
processor. A model module declares everything mmfront needs of it in one :class:`ModelSpec`
registered with :func:`register_model` (CONTRIBUTING.md, "Adding a model")."""

from mmfront.models.catalog import ProcessorFactory, register_model, register_processor
from mmfront.models.registry import create_processor
from mmfront.models.spec import ModelSpec, ReferenceModel
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo

__all__ = [
    "BaseMultiModalProcessor",
    "BaseProcessingInfo",
    "ModelSpec",
    "ProcessorFactory",
    "ReferenceModel",
    "create_processor",
    "register_model",
    "register_processor",
]
