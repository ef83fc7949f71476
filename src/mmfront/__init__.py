"""mmfront: a drop-in, vLLM-style multimodal frontend.

Chat requests with images and audio go in; engine requests come out: chat template and
placeholders, the model's HF processor, placeholder expansion, content hashing, a P0/P1
mirrored processor cache, and msgspec ``EngineCoreRequest``s. Names follow vLLM 0.33.

The names below are imported on first use (PEP 562), so ``import mmfront`` and the ``mmfront``
command's ``--help`` load no torch or transformers until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mmfront import _torchaudio, _torchvision
from mmfront._version import __version__

if TYPE_CHECKING:
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

_torchvision.install()
_torchaudio.install()

_HOMES = {
    "BaseMultiModalProcessor": "mmfront.processing.processor",
    "EngineCoreRequest": "mmfront.wire",
    "InputPreprocessor": "mmfront.preprocess",
    "InputProcessor": "mmfront.preprocess",
    "MMFrontError": "mmfront.errors",
    "MediaWithBytes": "mmfront.parse",
    "MultiModalConfig": "mmfront.config",
    "MultiModalFeatureSpec": "mmfront.inputs",
    "MultiModalFieldConfig": "mmfront.inputs",
    "MultiModalInputs": "mmfront.inputs",
    "MultiModalKwargsItem": "mmfront.inputs",
    "MultiModalKwargsItems": "mmfront.inputs",
    "PlaceholderRange": "mmfront.inputs",
    "RequestOptions": "mmfront.preprocess",
    "SamplingParams": "mmfront.wire",
    "create_processor": "mmfront.models.registry",
}
"""Each public name and the module it lives in."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'mmfront' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
