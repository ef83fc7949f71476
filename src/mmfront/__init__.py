"""mmfront: a drop-in, vLLM-style multimodal frontend.

Chat requests with images and audio go in; engine requests come out: chat template and
placeholders, the model's HF processor, placeholder expansion, content hashing, a P0/P1
mirrored processor cache, and msgspec ``EngineCoreRequest``s. Names follow vLLM 0.33.
"""

from __future__ import annotations

from mmfront._version import __version__
from mmfront.config import MultiModalConfig
from mmfront.errors import MMFrontError
from mmfront.inputs import (
    MultiModalFeatureSpec,
    MultiModalFieldConfig,
    MultiModalInputs,
    MultiModalKwargsItem,
    MultiModalKwargsItems,
    PlaceholderRange,
)
from mmfront.models.registry import create_processor
from mmfront.parse import MediaWithBytes
from mmfront.preprocess import InputPreprocessor, InputProcessor, RequestOptions
from mmfront.processing.processor import BaseMultiModalProcessor
from mmfront.wire import EngineCoreRequest, SamplingParams

__all__ = [
    "BaseMultiModalProcessor",
    "EngineCoreRequest",
    "InputPreprocessor",
    "InputProcessor",
    "MMFrontError",
    "MediaWithBytes",
    "MultiModalConfig",
    "MultiModalFeatureSpec",
    "MultiModalFieldConfig",
    "MultiModalInputs",
    "MultiModalKwargsItem",
    "MultiModalKwargsItems",
    "PlaceholderRange",
    "RequestOptions",
    "SamplingParams",
    "__version__",
    "create_processor",
]
