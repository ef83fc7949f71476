"""Calling a HuggingFace processor: kwargs routing, error wrapping, output dtype.

HF processors take kwargs flat (``do_pan_and_scan=True``) or scoped (``images_kwargs={...}``) and
refuse the same key given both ways. mmfront merges the deployment's and the request's kwargs with
vLLM's precedence (config flat < config scoped < request flat < request scoped), routes every flat
key into the scopes whose sub-processor declares it, and drops keys no sub-processor accepts, so a
stray kwarg never reaches (or breaks) the HF call.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import torch

from mmfront.config import ModelOption, MultiModalConfig
from mmfront.errors import ProcessorError, UnsupportedModelError, resource_error

SCOPES = ("text_kwargs", "images_kwargs", "videos_kwargs", "audio_kwargs")
_SCOPE_OWNERS = {
    "text_kwargs": ("tokenizer",),
    "images_kwargs": ("image_processor",),
    "videos_kwargs": ("video_processor",),
    "audio_kwargs": ("feature_extractor", "audio_processor"),
}


def _annotations(typed_dict: Any) -> set[str]:
    names: set[str] = set()
    for cls in getattr(typed_dict, "__mro__", (typed_dict,)):
        names.update(getattr(cls, "__annotations__", {}))
    return names


@lru_cache(maxsize=64)
def _valid_keys_for(processor_type: Any, subprocessor_types: tuple[Any, ...]) -> dict[str, frozenset[str]]:
    """Keys each scope accepts, plus top-level processor keys under ``""``."""
    kwargs_cls = getattr(processor_type, "valid_processor_kwargs", None)
    top = _annotations(kwargs_cls) if kwargs_cls is not None else set()
    annotations = getattr(kwargs_cls, "__annotations__", {}) if kwargs_cls is not None else {}
    out: dict[str, frozenset[str]] = {}
    for scope, sub_type in zip(SCOPES, subprocessor_types):
        keys = _annotations(annotations[scope]) if scope in annotations else set()
        if sub_type is not None:
            keys |= _annotations(getattr(sub_type, "valid_kwargs", None) or object)
        out[scope] = frozenset(keys)
    out[""] = frozenset(top - set(SCOPES))
    return out


def valid_hf_kwargs(hf_processor: Any) -> dict[str, frozenset[str]]:
    """Which kwargs the processor accepts, per scope (``""`` holds top-level processor keys)."""
    subs: list[Any] = []
    for scope in SCOPES:
        owner = next((getattr(hf_processor, n) for n in _SCOPE_OWNERS[scope] if getattr(hf_processor, n, None)), None)
        subs.append(type(owner) if owner is not None else None)
    processor_type: Any = type(hf_processor)
    return _valid_keys_for(processor_type, tuple(subs))


def resolve_hf_kwargs(
    hf_processor: Any, *layers: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Merge kwarg layers (later wins; within a layer scoped beats flat) into scoped dicts.

    Returns ``{"images_kwargs": {...}, ..., <top-level key>: value}`` with only accepted keys.
    """
    valid = valid_hf_kwargs(hf_processor)
    out: dict[str, Any] = {}
    scoped: dict[str, dict[str, Any]] = {scope: {} for scope in SCOPES}
    for layer in layers:
        if not layer:
            continue
        for key, value in layer.items():
            if key in SCOPES:
                continue
            if key in valid[""]:
                out[key] = value
            for scope in SCOPES:
                if key in valid[scope]:
                    scoped[scope][key] = value
        for scope in SCOPES:
            for key, value in (layer.get(scope) or {}).items():
                if key in valid[scope] or key in valid[""]:
                    scoped[scope][key] = value
    out.update({scope: values for scope, values in scoped.items() if values})
    return out


def unknown_hf_kwargs(hf_processor: Any, kwargs: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The keys of ``kwargs`` no sub-processor accepts (``images_kwargs.x`` for scoped ones), and
    every accepted flat key: what :func:`resolve_hf_kwargs` would drop, for an entry point that
    refuses instead."""
    valid = valid_hf_kwargs(hf_processor)
    accepted: set[str] = set().union(*valid.values())
    unknown: list[str] = []
    for key, value in kwargs.items():
        if key in SCOPES:
            if not isinstance(value, Mapping):
                unknown.append(key)
                continue
            unknown += [f"{key}.{k}" for k in value if k not in valid[key] and k not in valid[""]]
        elif key not in accepted:
            unknown.append(key)
    return unknown, sorted(accepted)


@dataclass(frozen=True)
class ProcessorKwargSpec:
    """One processor kwarg a request may set, with its type and range. Native processors list
    theirs (``BaseMultiModalProcessor.mm_kwarg_specs``): an unbounded kwarg is a request for
    unbounded work (a crop count of 100,000 makes 100,001 crops), and a value HF or torch fails on
    deep inside should be refused up front, naming the kwarg."""

    name: str
    type: type[bool] | type[int] | type[float]
    """``bool``, ``int`` (bools refused) or ``float`` (ints taken; must be finite)."""
    minimum: float | None = None
    maximum: float | ModelOption | None = None
    """A number, or the model's :class:`~mmfront.config.ModelOption` holding the cap (the
    deployment sets it)."""
    scope: str = "images_kwargs"
    """Where HF takes it when scoped (``{"images_kwargs": {name: value}}``)."""

    def bounds(self, config: MultiModalConfig) -> tuple[float | None, float | None]:
        cap = config.model_option(self.maximum) if isinstance(self.maximum, ModelOption) else self.maximum
        return self.minimum, cap

    def describe(self, config: MultiModalConfig) -> str:
        low, high = self.bounds(config)
        kind = {bool: "a boolean", int: "an integer", float: "a finite number"}[self.type]
        if low is not None and high is not None:
            return f"{kind} in [{low}, {high}]"
        if low is not None:
            return f"{kind} >= {low}"
        return kind if high is None else f"{kind} <= {high}"

    def accepts(self, value: object, config: MultiModalConfig) -> bool:
        if self.type is bool:
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int if self.type is int else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        low, high = self.bounds(config)
        return (low is None or value >= low) and (high is None or value <= high)


def _flat_items(kwargs: Mapping[str, Any]) -> Iterator[tuple[str | None, str, Any]]:
    """``(scope or None, key, value)`` for every flat and scoped kwarg."""
    for key, value in kwargs.items():
        if key in SCOPES and isinstance(value, Mapping):
            for inner, inner_value in value.items():
                yield key, inner, inner_value
        else:
            yield None, key, value


def refuse_processor_kwargs(
    specs: Sequence[ProcessorKwargSpec], kwargs: Mapping[str, Any], config: MultiModalConfig, *,
    accepted: frozenset[str], owner: str, name: str = "mm_processor_kwargs",
) -> str | None:
    """Why ``kwargs`` is refused under ``specs``, or None.

    A declared kwarg must have its type and range. One HF ``accepted`` but not declared is
    refused: ``owner`` does not let a request set it. Any other key is left to the caller's
    unknown-kwargs check (``apply`` drops such keys, as vLLM does)."""
    by_name = {spec.name: spec for spec in specs}
    for scope in SCOPES:
        if scope in kwargs and not isinstance(kwargs[scope], Mapping):
            return f"{name}.{scope} must be an object of kwargs, got {type(kwargs[scope]).__name__}."
    for in_scope, key, value in _flat_items(kwargs):
        spec = by_name.get(key)
        shown = f"{name}.{in_scope}.{key}" if in_scope is not None else f"{name}.{key}"
        if spec is not None and in_scope in (None, spec.scope):
            if not spec.accepts(value, config):
                cap = (f" The cap is MultiModalConfig.model_options.{spec.maximum.name}; the deployment may raise it."
                       if isinstance(spec.maximum, ModelOption) else "")
                return f"{shown} must be {spec.describe(config)}, got {value!r}.{cap}"
        elif key in accepted:
            allowed = ", ".join(f"{s.name} ({s.describe(config)})" for s in specs)
            return (f"{shown} cannot be set per request: {owner} takes only {allowed}. Settings such as the image "
                    "size are the model's, fixed by its checkpoint.")
    return None


FrozenKwargs = tuple[Any, ...]
"""A processor call's kwargs as a hashable value that gives them back exactly (:func:`freeze_kwargs`)."""

_LEAVES = (type(None), bool, int, float, str)


def freeze_kwargs(value: Any) -> FrozenKwargs | None:
    """``value`` (kwargs: dicts, lists and tuples of JSON-like leaves) as a hashable value that
    :func:`thaw_kwargs` turns back into an equal one of the same types (``3136`` and ``3136.0``
    stay apart: HF validates types); None where it holds anything else (a tensor, an array)."""
    if isinstance(value, Mapping):
        pairs = tuple((key, freeze_kwargs(item)) for key, item in value.items())
        return None if any(frozen is None for _, frozen in pairs) else ("dict", pairs)
    if isinstance(value, (list, tuple)):
        items = tuple(freeze_kwargs(item) for item in value)
        return None if any(frozen is None for frozen in items) else (type(value).__name__, items)
    return ("leaf", type(value).__name__, value) if type(value) in _LEAVES else None


def thaw_kwargs(frozen: Any) -> Any:
    kind = frozen[0]
    if kind == "dict":
        return {key: thaw_kwargs(item) for key, item in frozen[1]}
    if kind == "leaf":
        return frozen[2]
    items = [thaw_kwargs(item) for item in frozen[1]]
    return items if kind == "list" else tuple(items)


class MergedHfKwargs:
    """HF's own merge of one processor call's kwargs into its sub-processors' kwargs
    (``ProcessorMixin._merge_kwargs``: the processor's defaults, the tokenizer's init kwargs, the
    call's; transformers 5.24 validates the result through ``huggingface_hub``'s strict
    dataclasses, ~2.5 ms a call), done once per distinct set of kwargs and kept (a deployment
    sees a few: its own, and those of requests that set ``mm_processor_kwargs``). What a caller
    hands a sub-processor from it is what HF's ``__call__`` would hand it; the dicts returned
    are copies, so a sub-processor that edits its kwargs leaves the kept ones as they are."""

    def __init__(self, hf_processor: Any, *, maxsize: int = 64) -> None:
        self.hf_processor = hf_processor
        self._merged = lru_cache(maxsize=maxsize)(self._merge_frozen)

    def __call__(self, kwargs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        frozen = freeze_kwargs(kwargs)
        merged = self._merge(kwargs) if frozen is None else self._merged(frozen)
        return copy.deepcopy(merged)

    def _merge_frozen(self, frozen: FrozenKwargs) -> dict[str, dict[str, Any]]:
        return self._merge(thaw_kwargs(frozen))

    def _merge(self, kwargs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        proc = self.hf_processor
        tokenizer = getattr(proc, "tokenizer", None)
        merged: dict[str, dict[str, Any]] = proc._merge_kwargs(
            type(proc).valid_processor_kwargs,
            tokenizer_init_kwargs=tokenizer.init_kwargs if tokenizer is not None else {}, **kwargs)
        return merged


class KwargsPreparedOnce:
    """An image processor's ``preprocess`` with its preparation of a call's kwargs done once per
    distinct set of them: ``preprocess`` validates the kwargs (``huggingface_hub``'s strict
    dataclasses), fills the defaults from the processor's attributes and standardises and
    validates them before it hands them to ``_preprocess_image_like_inputs``, 0.62 ms of a
    4.25 ms Qwen2.5-VL 1024x768 call in transformers 5.24, and the same for every call of a
    deployment's kwargs. The first call of a set runs ``preprocess`` whole and keeps what it
    handed that step; later calls hand a copy of it to the step directly.

    Only for an image processor whose ``preprocess`` does nothing else (a model module opts in;
    its tests prove the bytes equal to HF's own call). A call with positional arguments or a
    kwarg :func:`freeze_kwargs` cannot key goes through ``preprocess`` whole, as does every set past
    the first ``maxsize`` kept (a deployment sees a few: its own and its requests'). Thread-safe: a
    set's first call is made under a lock, and its kwargs are kept only from the calling thread."""

    def __init__(self, image_processor: Any, hf_preprocess: Any, *, maxsize: int = 64) -> None:
        self._image_processor = image_processor
        self._hf_preprocess = hf_preprocess
        self._maxsize = maxsize
        self._kept: dict[FrozenKwargs, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, images: Any, *args: Any, **kwargs: Any) -> Any:
        frozen = None if args else freeze_kwargs(kwargs)
        if frozen is None:
            return self._hf_preprocess(images, *args, **kwargs)
        prepared = self._kept.get(frozen)
        if prepared is None:
            return self._first_call(frozen, images, kwargs)
        return self._image_processor._preprocess_image_like_inputs(images, **prepared)

    def _first_call(self, frozen: FrozenKwargs, images: Any, kwargs: dict[str, Any]) -> Any:
        step = self._image_processor._preprocess_image_like_inputs
        caller = threading.get_ident()
        seen: list[dict[str, Any]] = []

        def keep(images: Any, *args: Any, **prepared: Any) -> Any:
            if threading.get_ident() == caller and not args:
                seen.append(dict(prepared))
            return step(images, *args, **prepared)

        own = vars(self._image_processor)
        with self._lock:
            had = own.get("_preprocess_image_like_inputs")
            own["_preprocess_image_like_inputs"] = keep
            try:
                out = self._hf_preprocess(images, **kwargs)
            finally:
                if had is None:
                    del own["_preprocess_image_like_inputs"]
                else:
                    own["_preprocess_image_like_inputs"] = had
            if len(seen) == 1 and len(self._kept) < self._maxsize:
                self._kept[frozen] = seen[0]
        return out


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


def load_hf_processor(folder: str | Path, **kwargs: Any) -> Any:
    """``AutoProcessor.from_pretrained(folder, local_files_only=True, **kwargs)``; ``kwargs``
    override the folder's settings (and may pass ready sub-processors, e.g. ``tokenizer=``)."""
    path = Path(folder)
    if not path.is_dir():
        raise UnsupportedModelError(
            f"Model folder {str(folder)!r} does not exist. mmfront loads processors from local folders only "
            "(save one with `processor.save_pretrained(folder)`)."
        )
    from transformers import AutoProcessor

    make_pil_image_processors_reachable()
    try:
        return AutoProcessor.from_pretrained(str(path), local_files_only=True, **kwargs)
    except Exception as exc:
        raise UnsupportedModelError(f"Could not load an HF processor from {str(folder)!r}: {exc}") from exc


def folder_kwargs(config: Any) -> dict[str, Any]:
    """What a :class:`~mmfront.config.MultiModalConfig` adds to :func:`load_hf_processor`:
    ``trust_remote_code``, and the tokenizer of ``config.tokenizer`` (vLLM's ``--tokenizer``)."""
    kwargs: dict[str, Any] = {"trust_remote_code": True} if config.trust_remote_code else {}
    if config.tokenizer is not None:
        from transformers import AutoTokenizer

        try:
            kwargs["tokenizer"] = AutoTokenizer.from_pretrained(config.tokenizer, local_files_only=True, **kwargs)
        except Exception as exc:
            raise UnsupportedModelError(f"Could not load a tokenizer from {config.tokenizer!r} (--tokenizer): {exc}") \
                from exc
    return kwargs


def call_hf(fn: Any, *, what: str, data_desc: str, **kwargs: Any) -> Any:
    """Run an HF processor call; any failure becomes a ProcessorError saying what was processed,
    but the process running out of memory or open files is a ResourceError (not the request's)."""
    try:
        return fn(**kwargs)
    except Exception as exc:
        raise resource_error(exc, doing=f"Applying {what} on {data_desc}") or ProcessorError(
            f"Failed to apply {what} on {data_desc}: {type(exc).__name__}: {exc}. Check the media and the "
            "processor kwargs of the request."
        ) from exc


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def folder_dtype(model_dir: str | Path | None) -> torch.dtype:
    """``torch_dtype``/``dtype`` of the model folder's config.json (text config first, as vLLM
    reads it); float32 where there is none."""
    if model_dir is None:
        return torch.float32
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return torch.float32
    for section in (config.get("text_config") or {}, config):
        value = section.get("torch_dtype") or section.get("dtype")
        if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
            return _DTYPES[value.removeprefix("torch.")]
    return torch.float32


def resolve_model_dtype(setting: str, model_dir: str | Path | None) -> torch.dtype:
    """vLLM's ``--dtype`` for a GPU engine (``config/model.py`` ``_get_and_verify_dtype``): ``auto``
    is the folder's dtype, a float32 checkpoint downcast to the first dtype a compute-capability
    >= 8.0 GPU supports, bfloat16. (vLLM resolves ``auto`` on the machine it runs; the engine is a GPU,
    so what its frontend sends for a float32 checkpoint is bfloat16.)"""
    if setting != "auto":
        return _DTYPES[setting]
    if model_dir is None:  # a ready HF processor: no checkpoint says a dtype, and no engine loads one
        return torch.float32
    dtype = folder_dtype(model_dir)
    return torch.bfloat16 if dtype == torch.float32 else dtype


def cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """Cast floating tensors to the model dtype (halves the IPC payload for bf16 models) and move
    everything to CPU; integer tensors and non-tensors pass through."""
    if isinstance(data, torch.Tensor):
        if data.device.type != "cpu":
            data = data.cpu()
        return data.to(dtype) if data.is_floating_point() and data.dtype != dtype else data
    if isinstance(data, list):
        return [cast_floating(x, dtype) for x in data]
    if isinstance(data, tuple):
        return tuple(cast_floating(x, dtype) for x in data)
    return data
