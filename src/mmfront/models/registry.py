"""Which mmfront processor serves which model folder.

A native processor (registered in :mod:`mmfront.models.catalog`) serves its HF processor class or
model type; any other HF processor with an image processor or audio feature extractor goes
through the transformers backend. Loading is always local: a folder is opened with
``AutoProcessor.from_pretrained(folder, local_files_only=True)``, so nothing is ever fetched from
a model hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmfront.config import MultiModalConfig
from mmfront.errors import UnsupportedModelError
from mmfront.models.catalog import (
    ProcessorFactory,
    model_options,
    model_specs,
    native_factory,
    native_processor_classes,
)
from mmfront.models.native import folder_architectures, resolve_model_impl
from mmfront.processing.hf import folder_kwargs, load_hf_processor
from mmfront.processing.processor import BaseMultiModalProcessor


def _transformers_backend(config: MultiModalConfig, hf_processor: Any) -> ProcessorFactory:
    from mmfront.models.transformers import select_backend

    return select_backend(config, hf_processor)


def _is_legacy(factory: ProcessorFactory) -> bool:
    from mmfront.models.transformers import LegacyMultiModalProcessor

    return issubclass(factory.processor_cls, LegacyMultiModalProcessor)


def resolve_factory(hf_processor: Any, config: MultiModalConfig, model_type: str | None = None) -> ProcessorFactory:
    name = type(hf_processor).__name__
    native = native_factory(name, model_type)
    if native is not None:
        return native
    has_media = any(getattr(hf_processor, attr, None) is not None
                    for attr in ("image_processor", "feature_extractor", "audio_processor"))
    if not has_media or getattr(hf_processor, "tokenizer", None) is None:
        raise UnsupportedModelError(
            f"{name} is not a multimodal processor mmfront can serve: it needs a tokenizer and an image processor "
            f"or audio feature extractor. Native processors: {native_processor_classes()}; other multimodal HF processors go "
            "through the transformers backend."
        )
    return _transformers_backend(config, hf_processor)


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
        hf_processor = load_hf_processor(model, **folder_kwargs(config))
        model_dir: str | Path | None = model
        default_id = str(model)
    else:
        hf_processor = model
        model_dir = None
        default_id = getattr(hf_processor, "name_or_path", None) or type(hf_processor).__name__
    config.check_model_options(model_options())
    model_type = model_type_of(model_dir)
    factory = resolve_factory(hf_processor, config, model_type)
    info = factory.info_cls(hf_processor, model_id=model_id or default_id, config=config, model_dir=model_dir)
    spec = model_specs().get(model_type) if model_type else None
    if spec is not None and spec.hf_speedups is not None and model_dir is not None:  # not a caller's own object
        info.kernel_misses = spec.hf_speedups(hf_processor)
    resolved = resolve_model_impl(config.model_impl, folder_architectures(model_dir), spec.native if spec else None,
                                  config.mm_device_do_normalize, processor=type(hf_processor).__name__,
                                  legacy_backend=_is_legacy(factory))
    info.native, info.device_normalize = resolved.native, resolved.device_normalize
    if model_dir is not None:
        info.built_by = f"{__name__}:{create_processor.__name__}"
    return factory.processor_cls(info)
