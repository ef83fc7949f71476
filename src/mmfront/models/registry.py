"""Which mmfront processor serves which model.

Native processors are registered by HF processor class name (and model type); any other HF
processor with an image processor or audio feature extractor goes through the transformers
backend. Loading is always local: a folder is opened with ``AutoProcessor.from_pretrained(folder,
local_files_only=True)``, so nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mmfront.config import MultiModalConfig
from mmfront.errors import UnsupportedModelError
from mmfront.processing.processor import BaseMultiModalProcessor, ProcessingInfo


@dataclass(frozen=True)
class ProcessorFactory:
    processor_cls: type[BaseMultiModalProcessor]
    info_cls: type[ProcessingInfo]


_NATIVE: dict[str, Callable[[], ProcessorFactory]] = {}
_NATIVE_BY_MODEL_TYPE: dict[str, Callable[[], ProcessorFactory]] = {}


def register_processor(
    hf_processor_class: str, factory: Callable[[], ProcessorFactory], *, model_types: tuple[str, ...] = (),
) -> None:
    """Serve HF processors of class ``hf_processor_class`` (or folders whose config.json names one
    of ``model_types``) with a native mmfront processor. ``factory`` is called lazily, so
    registering costs no import."""
    _NATIVE[hf_processor_class] = factory
    for model_type in model_types:
        _NATIVE_BY_MODEL_TYPE[model_type] = factory


def _gemma3() -> ProcessorFactory:
    from mmfront.models.gemma3 import Gemma3MultiModalProcessor, Gemma3ProcessingInfo

    return ProcessorFactory(Gemma3MultiModalProcessor, Gemma3ProcessingInfo)


register_processor("Gemma3Processor", _gemma3, model_types=("gemma3",))


def _transformers_backend(config: MultiModalConfig) -> ProcessorFactory:
    from mmfront.models.transformers import select_backend

    return select_backend(config)


def resolve_factory(hf_processor: Any, config: MultiModalConfig, model_type: str | None = None) -> ProcessorFactory:
    name = type(hf_processor).__name__
    if name in _NATIVE:
        return _NATIVE[name]()
    if model_type in _NATIVE_BY_MODEL_TYPE:
        return _NATIVE_BY_MODEL_TYPE[model_type]()
    has_media = any(getattr(hf_processor, attr, None) is not None
                    for attr in ("image_processor", "feature_extractor", "audio_processor"))
    if not has_media or getattr(hf_processor, "tokenizer", None) is None:
        raise UnsupportedModelError(
            f"{name} is not a multimodal processor mmfront can serve: it needs a tokenizer and an image processor "
            f"or audio feature extractor. Native processors: {sorted(_NATIVE)}; other multimodal HF processors go "
            "through the transformers backend."
        )
    return _transformers_backend(config)


@cache
def make_pil_image_processors_reachable() -> None:
    """transformers 5.14.1 cannot auto-load ``Idefics3ImageProcessorPil`` without torchvision: its
    lazy-import scanner marks any ``image_processing_*`` file whose text mentions
    ``TorchvisionBackend`` as needing torchvision (that file's docstrings do), so the package's lazy
    attribute is a placeholder that ``AutoProcessor`` skips. Setting the real class (imported
    directly) on the package is what a correct lazy module holds. No-op on 5.15+, where the
    attribute already is the real class."""
    try:
        module = importlib.import_module("transformers.models.idefics3.image_processing_pil_idefics3")
    except ImportError:
        return
    real = module.Idefics3ImageProcessorPil
    package = importlib.import_module("transformers.models.idefics3")
    if getattr(package, real.__name__, None) is not real:
        setattr(package, real.__name__, real)


def load_hf_processor(folder: str | Path) -> Any:
    path = Path(folder)
    if not path.is_dir():
        raise UnsupportedModelError(
            f"Model folder {str(folder)!r} does not exist. mmfront loads processors from local folders only "
            "(save one with `processor.save_pretrained(folder)`)."
        )
    from transformers import AutoProcessor

    make_pil_image_processors_reachable()
    try:
        return AutoProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise UnsupportedModelError(f"Could not load an HF processor from {str(folder)!r}: {exc}") from exc


def model_type_of(folder: str | Path | None) -> str | None:
    if folder is None:
        return None
    try:
        return json.loads((Path(folder) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def create_processor(
    model: str | Path | Any, config: MultiModalConfig | None = None, *, model_id: str | None = None,
) -> BaseMultiModalProcessor:
    """The mmfront processor for ``model``: a local folder, or a ready HF processor.

    ``model_id`` scopes the content hashes (vLLM uses the model path as configured); it defaults
    to the folder path as given, or for a ready processor to its ``name_or_path``/class name.
    """
    config = config or MultiModalConfig()
    if isinstance(model, (str, Path)):
        hf_processor = load_hf_processor(model)
        model_dir: str | Path | None = model
        default_id = str(model)
    else:
        hf_processor = model
        model_dir = None
        default_id = getattr(hf_processor, "name_or_path", None) or type(hf_processor).__name__
    factory = resolve_factory(hf_processor, config, model_type_of(model_dir))
    info = factory.info_cls(hf_processor, model_id=model_id or default_id, config=config, model_dir=model_dir)
    return factory.processor_cls(info)
