"""Which mmfront processor serves which model.

Native processors register themselves with the :func:`register_processor` class decorator, by HF
processor class name (and model type); any other HF processor with an image processor or audio
feature extractor goes through the transformers backend. Loading is always local: a folder is opened with ``AutoProcessor.from_pretrained(folder,
local_files_only=True)``, so nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from mmfront.config import MultiModalConfig
from mmfront.errors import ConfigError, InputTypeError, UnsupportedModelError
from mmfront.processing.hf import load_hf_processor
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo


@dataclass(frozen=True)
class ProcessorFactory:
    processor_cls: type[BaseMultiModalProcessor]
    info_cls: type[BaseProcessingInfo]


_P = TypeVar("_P", bound=type[BaseMultiModalProcessor])

_NATIVE: dict[str, ProcessorFactory] = {}
_NATIVE_BY_MODEL_TYPE: dict[str, ProcessorFactory] = {}

_BUILTIN_MODULES = ("mmfront.models.gemma3",)
"""Modules whose processors register themselves when imported; imported on the first lookup, so
importing mmfront costs no model code."""


@cache
def _known_hf_names() -> tuple[frozenset[str], frozenset[str]]:
    """``(processor class names, model types)`` transformers' auto classes know."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    classes = {name for value in PROCESSOR_MAPPING_NAMES.values()
               for name in ((value,) if isinstance(value, str) else value) if name}
    return frozenset(classes), frozenset(CONFIG_MAPPING_NAMES)


def _is_hf_processor_class(name: str) -> bool:
    """Whether transformers has a processor class of that name (the auto mapping misses a few,
    such as ``DonutProcessor``)."""
    if name in _known_hf_names()[0]:
        return True
    import transformers
    from transformers import ProcessorMixin

    try:
        cls = getattr(transformers, name, None)
    except (ImportError, RuntimeError):  # a lazy attribute whose optional backend is missing
        return False
    return isinstance(cls, type) and issubclass(cls, ProcessorMixin)


def _unknown_name_error(kind: str, name: str, known: frozenset[str], *, list_all: bool) -> ConfigError:
    """What a misspelled name gets: the closest known names, how to find the right one, and
    the known names themselves (model types, some 800, by where to read them)."""
    import transformers

    close = get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    listing = (f"Known HF processor classes: {', '.join(sorted(known))}." if list_all else
               f"The {len(known)} known model types are the keys of transformers' CONFIG_MAPPING_NAMES.")
    return ConfigError(
        f"register_processor: {name!r} is not {kind} transformers {transformers.__version__} knows, so no model "
        f"would ever be served by it.{hint} Take the class name from "
        "`type(AutoProcessor.from_pretrained(folder)).__name__` and the model type from the folder's config.json. "
        + listing
    )


def register_processor(
    hf_processor_class: str, *, info: type[BaseProcessingInfo], model_types: Sequence[str] = (),
) -> Callable[[_P], _P]:
    """Class decorator: serve HF processors of class ``hf_processor_class`` (and folders whose
    config.json names one of ``model_types``) with the decorated processor and ``info``.

    vLLM registers on the model class (``MULTIMODAL_REGISTRY.register_processor(processor, info=,
    dummy_inputs=)``); mmfront has no model classes, so the processor class carries it. A name
    transformers does not know, or one already registered, raises :class:`ConfigError` here:
    otherwise a typo would send the model to the transformers backend without a word.
    """
    types = (model_types,) if isinstance(model_types, str) else tuple(model_types)
    classes, known_types = _known_hf_names()
    if not _is_hf_processor_class(hf_processor_class):
        raise _unknown_name_error("an HF processor class", hf_processor_class, classes, list_all=True)
    for model_type in types:
        if model_type not in known_types:
            raise _unknown_name_error("a model type", model_type, known_types, list_all=False)
    if len(set(types)) != len(types):
        raise ConfigError(f"register_processor: model_types {list(types)} names a model type twice; name each once.")
    if not (isinstance(info, type) and issubclass(info, BaseProcessingInfo)):
        raise InputTypeError(f"register_processor(info=...) takes a BaseProcessingInfo subclass, got {info!r}.")

    def register(processor_cls: _P) -> _P:
        if not (isinstance(processor_cls, type) and issubclass(processor_cls, BaseMultiModalProcessor)):
            raise InputTypeError(f"register_processor decorates a BaseMultiModalProcessor subclass, got {processor_cls!r}.")
        taken = [(f"HF processor class {hf_processor_class!r}", _NATIVE.get(hf_processor_class))]
        taken += [(f"model type {t!r}", _NATIVE_BY_MODEL_TYPE.get(t)) for t in types]
        for what, owner in taken:
            if owner is not None:
                raise ConfigError(
                    f"register_processor: cannot register {processor_cls.__qualname__}: {what} is already served by "
                    f"{owner.processor_cls.__qualname__}. Register each HF processor class and model type once "
                    f"(registered classes: {sorted(_NATIVE)}, model types: {sorted(_NATIVE_BY_MODEL_TYPE)})."
                )
        factory = ProcessorFactory(processor_cls, info)
        _NATIVE[hf_processor_class] = factory
        for model_type in types:
            _NATIVE_BY_MODEL_TYPE[model_type] = factory
        return processor_cls

    return register


@cache
def _load_builtin() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def _transformers_backend(config: MultiModalConfig) -> ProcessorFactory:
    from mmfront.models.transformers import select_backend

    return select_backend(config)


def resolve_factory(hf_processor: Any, config: MultiModalConfig, model_type: str | None = None) -> ProcessorFactory:
    _load_builtin()
    name = type(hf_processor).__name__
    if name in _NATIVE:
        return _NATIVE[name]
    if model_type in _NATIVE_BY_MODEL_TYPE:
        return _NATIVE_BY_MODEL_TYPE[model_type]
    has_media = any(getattr(hf_processor, attr, None) is not None
                    for attr in ("image_processor", "feature_extractor", "audio_processor"))
    if not has_media or getattr(hf_processor, "tokenizer", None) is None:
        raise UnsupportedModelError(
            f"{name} is not a multimodal processor mmfront can serve: it needs a tokenizer and an image processor "
            f"or audio feature extractor. Native processors: {sorted(_NATIVE)}; other multimodal HF processors go "
            "through the transformers backend."
        )
    return _transformers_backend(config)


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
