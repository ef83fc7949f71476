"""What models mmfront knows, and what each model module declares.

A model module in ``mmfront.models`` registers one :class:`~mmfront.models.spec.ModelSpec` with
:func:`register_model` when imported; the catalog imports every module of the package (a scan
of its ``__path__``) on the first lookup, so importing mmfront costs no model code and adding a
model is adding its module. :func:`register_processor` registers a native processor alone (an
application's own, from its own package). Which processor then serves a given folder is
``mmfront.models.registry``'s job.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from functools import cache
from typing import TypeVar

from mmfront.config import ModelOption
from mmfront.errors import ConfigError, InputTypeError
from mmfront.models.spec import (
    CallKwargs,
    ImageExpansions,
    ImagePatches,
    ModelSpec,
    PromptLayout,
    PromptOutput,
    ReferenceModel,
)
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo


@dataclass(frozen=True)
class ProcessorFactory:
    processor_cls: type[BaseMultiModalProcessor]
    info_cls: type[BaseProcessingInfo]


_P = TypeVar("_P", bound=type[BaseMultiModalProcessor])

_NATIVE: dict[str, ProcessorFactory] = {}
_NATIVE_BY_MODEL_TYPE: dict[str, ProcessorFactory] = {}
_MODELS: dict[str, ModelSpec] = {}
"""Every registered :class:`ModelSpec`, by model type."""


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
    _check_hf_names(hf_processor_class, types)
    if not (isinstance(info, type) and issubclass(info, BaseProcessingInfo)):
        raise InputTypeError(f"register_processor(info=...) takes a BaseProcessingInfo subclass, got {info!r}.")

    def register(processor_cls: _P) -> _P:
        _add_native(hf_processor_class, types, processor_cls, info)
        return processor_cls

    return register


def _check_hf_names(hf_processor_class: str, types: tuple[str, ...]) -> None:
    classes, known_types = _known_hf_names()
    if not _is_hf_processor_class(hf_processor_class):
        raise _unknown_name_error("an HF processor class", hf_processor_class, classes, list_all=True)
    for model_type in types:
        if model_type not in known_types:
            raise _unknown_name_error("a model type", model_type, known_types, list_all=False)
    if len(set(types)) != len(types):
        raise ConfigError(f"register_processor: model_types {list(types)} names a model type twice; name each once.")


def _ships(release: str | None) -> bool:
    """Whether the installed transformers is ``release`` or newer (``None``: every supported one)."""
    if release is None:
        return True
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) >= Version(release)


def _add_native(hf_processor_class: str, types: tuple[str, ...], processor_cls: type[BaseMultiModalProcessor],
                info: type[BaseProcessingInfo]) -> None:
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


def register_model(spec: ModelSpec) -> ModelSpec:
    """Register everything ``spec`` declares; a model module calls it once, when imported.

    Its processor (if any) serves its HF processor class and model type, as with
    :func:`register_processor`; its options and reference encoder become what
    :func:`model_options` and :func:`reference_model` find. A name
    another model already declared raises :class:`ConfigError`, before anything is registered, as
    does an HF name the installed transformers does not know (unless it predates the spec's
    ``transformers_since``: the model's folders cannot load there, and the catalog stays the same)."""
    if not isinstance(spec, ModelSpec):
        raise InputTypeError(f"register_model takes a ModelSpec, got {spec!r}.")
    if _ships(spec.transformers_since):
        _check_hf_names(spec.hf_processor_class, (spec.model_type,))
    if (spec.processor is None) != (spec.info is None):
        raise ConfigError(f"register_model: {spec.model_type!r} gives a processor without info or info without a "
                          "processor; a native processor needs both (neither: the transformers backend serves it).")
    if spec.info is not None and not (isinstance(spec.info, type) and issubclass(spec.info, BaseProcessingInfo)):
        raise InputTypeError(f"ModelSpec.info takes a BaseProcessingInfo subclass, got {spec.info!r}.")
    clashes = [f"model type {spec.model_type!r}"] if spec.model_type in _MODELS else []
    clashes += [f"option {o.name!r}" for o in spec.options if o.name in _options_of(_MODELS)]
    if clashes:
        raise ConfigError(f"register_model: {', '.join(clashes)} of {spec.model_type!r} already declared by another "
                          f"model (declared model types: {sorted(_MODELS)}); declare each name once.")
    if spec.processor is not None and spec.info is not None:
        _add_native(spec.hf_processor_class, (spec.model_type,), spec.processor, spec.info)
    _MODELS[spec.model_type] = spec
    return spec


def _discover() -> None:
    """Import every model module of ``mmfront.models`` (each registers itself); again only when
    the package's ``__path__`` has changed. The package is this module's parent, loaded before
    it, so it is read from ``sys.modules`` rather than imported back."""
    _import_modules(tuple(sys.modules[__name__.rpartition(".")[0]].__path__))


@cache
def _import_modules(path: tuple[str, ...]) -> None:
    for module in pkgutil.iter_modules(path, "mmfront.models."):
        if not module.ispkg:
            importlib.import_module(module.name)


def native_factory(hf_processor_class: str, model_type: str | None) -> ProcessorFactory | None:
    """The native processor registered for this HF processor class, else for this model type."""
    _discover()
    found = _NATIVE.get(hf_processor_class)
    if found is None and model_type is not None:
        found = _NATIVE_BY_MODEL_TYPE.get(model_type)
    return found


def native_processor_classes() -> list[str]:
    """The HF processor class names a native processor serves."""
    _discover()
    return sorted(_NATIVE)


def model_specs() -> Mapping[str, ModelSpec]:
    """Every model module's declaration, by model type."""
    _discover()
    return dict(_MODELS)


def _options_of(specs: Mapping[str, ModelSpec]) -> dict[str, ModelOption]:
    return {o.name: o for spec in specs.values() for o in spec.options}


def model_options() -> dict[str, ModelOption]:
    """Every ``MultiModalConfig.model_options`` key a model declares, by name."""
    return _options_of(model_specs())


def reference_model(model_type: str) -> ReferenceModel | None:
    """How the reference engine encodes ``model_type``'s items; None when no module says."""
    spec = model_specs().get(model_type)
    return spec.reference if spec is not None else None


def _specs_along(hf_processor_class: type) -> Iterator[ModelSpec]:
    """The specs of the models whose processor class is this class or one of its bases, nearest
    first: a subclass of a model's HF processor is served as that model is."""
    by_class = {spec.hf_processor_class: spec for spec in model_specs().values()}
    return (by_class[cls.__name__] for cls in hf_processor_class.__mro__ if cls.__name__ in by_class)


def backend_placeholder_attr(hf_processor_class: type, modality: str) -> str | None:
    """The HF processor attribute holding ``modality``'s text placeholder, where the module of
    the model whose processor class this is (or subclasses) names one for the transformers
    backend (``{modality}_token`` otherwise)."""
    return next((spec.backend_placeholders[modality] for spec in _specs_along(hf_processor_class)
                 if modality in spec.backend_placeholders), None)


def video_needs_metadata(hf_processor_class: type) -> bool:
    """Whether the module of the model whose processor class this is (or subclasses) says its
    HF processor reads each video's metadata (``ModelSpec.video_needs_metadata``)."""
    return any(spec.video_needs_metadata for spec in _specs_along(hf_processor_class))


def prompt_layout(hf_processor_class: type) -> PromptLayout | None:
    """How the HF processor of this class (or a subclass) rewrites a prompt's text before
    tokenizing it, where the module of its model says (``ModelSpec.prompt_layout``)."""
    return next((spec.prompt_layout for spec in _specs_along(hf_processor_class) if spec.prompt_layout is not None),
                None)


def unexpanded_placeholders(hf_processor_class: type) -> frozenset[str]:
    """The modalities whose placeholder the HF processor of this class (or a subclass) leaves
    unexpanded, where the module of its model says (``ModelSpec.unexpanded_placeholders``)."""
    spec = next(_specs_along(hf_processor_class), None)
    return frozenset(spec.unexpanded_placeholders) if spec is not None else frozenset()


def image_patches(hf_processor_class: type) -> ImagePatches | None:
    """Tiles per image of the HF processor of this class (or a subclass), where the module of its
    model counts them (``ModelSpec.image_patches``)."""
    return next((spec.image_patches for spec in _specs_along(hf_processor_class) if spec.image_patches is not None),
                None)


def call_kwargs(hf_processor_class: type) -> CallKwargs | None:
    """How the HF processor of this class (or a subclass) needs a call's kwargs rewritten under the
    installed transformers, where the module of its model says (``ModelSpec.call_kwargs``)."""
    return next((spec.call_kwargs for spec in _specs_along(hf_processor_class) if spec.call_kwargs is not None), None)


def image_expansions(hf_processor_class: type) -> ImageExpansions | None:
    """How the HF processor of this class (or a subclass) expands each image, from its image
    processor's outputs, where the module of its model says (``ModelSpec.image_expansions``); None
    for a subclass with its own ``replace_image_token``, whose images may expand otherwise."""
    by_class = {spec.hf_processor_class: spec for spec in model_specs().values()}
    for depth, cls in enumerate(hf_processor_class.__mro__):
        spec = by_class.get(cls.__name__)
        if spec is not None and spec.image_expansions is not None:
            below = hf_processor_class.__mro__[:depth]
            return None if any("replace_image_token" in vars(c) for c in below) else spec.image_expansions
    return None


def prompt_outputs(hf_processor_class: type) -> Mapping[str, PromptOutput]:
    """The HF outputs laid out along the prompt that the engine of this class's model rebuilds,
    with how, where the module of its model says (``ModelSpec.prompt_outputs``)."""
    spec = next(_specs_along(hf_processor_class), None)
    return dict(spec.prompt_outputs) if spec is not None else {}
