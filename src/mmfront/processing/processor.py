"""``BaseMultiModalProcessor``: one request's items -> expanded prompt, per-item kwargs, hashes.

The steps follow vLLM 0.33's ``apply`` (hash, find cached items, one HF call for the missing items
only, split per item, prompt updates per item, commit to the cache, splice the prompt), with three
changes that make the cache-hit path cheap and the P0/P1 mirror exact:

* A hit needs nothing but the item's hash: its prompt updates come from the cache, so its media is
  never decoded (lazily loaded items stay bytes) and its pixels are never touched.
* Placeholders are located *before* the cache is updated, and the updates are committed in
  placeholder-offset order, the order the engine-side cache walks. Interleaved image/audio prompts
  therefore evolve both LRUs identically (vLLM walks modality by modality on P0 and drifts).
* Missing items of one request that share a hash are processed once.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import torch

from mmfront._text import check_text
from mmfront.cache.base import BaseMultiModalProcessorCache, PromptUpdates
from mmfront.config import DEFAULT_MAX_PROMPT_CHARS, MultiModalConfig
from mmfront.errors import ConfigError, FieldConfigError, PromptUpdateError, ValidationError
from mmfront.hashing import get_mm_hashes, normalize_mm_uuids
from mmfront.inputs import (
    MultiModalFieldConfig,
    MultiModalInputs,
    MultiModalKwargsItem,
    MultiModalKwargsItems,
    mm_inputs,
    placeholders_in_prompt_order,
)
from mmfront.parse import EmbeddingItems, MultiModalDataItems, MultiModalDataParser
from mmfront.processing._splicing import apply_prompt_updates
from mmfront.processing._stray import refuse_stray_tokens, single_token_ids
from mmfront.processing.commit import (
    NOTHING_TO_COMMIT,
    PendingCommit,
    PreparedInputs,
    commit,
)
from mmfront.processing.dummy import BaseDummyInputsBuilder
from mmfront.processing.executors.base import ItemExecutor, ItemJob
from mmfront.processing.executors.inplace import InPlaceExecutor
from mmfront.processing.hf import (
    ProcessorKwargSpec,
    cast_floating,
    load_hf_processor,
    refuse_processor_kwargs,
    resolve_hf_kwargs,
    resolve_model_dtype,
    valid_hf_kwargs,
)
from mmfront.processing.native import DEVICE_NORMALIZE_KWARGS, NativeInputs, engine_range, refuse_unproven_kwargs
from mmfront.processing.updates import (
    PlaceholderFeaturesInfo,
    PromptUpdate,
    ResolvedPromptUpdate,
    cached_encode,
)
from mmfront.timing import stage

MultiModalUUIDs = Mapping[str, Sequence[str | None] | str | None]

_IN_PLACE = InPlaceExecutor()

_MAX_PROCESSOR_VARIANTS = 8
"""HF processors ``get_hf_processor(**kwargs)`` keeps per info: one per distinct kwargs, so a
kwargs churn reloads rather than holding one processor per combination ever asked for."""


class BaseProcessingInfo:
    """What a processor knows about its model: the HF processor and tokenizer (loaded once and
    reused for every request), the id hashes are scoped to, the config, and the model's limits.

    The accessors are vLLM's (``get_tokenizer()``, ``get_hf_processor(**kwargs)``,
    ``get_hf_config()``, ``model_id``), so model code ported from vLLM reads its model the same
    way; the constructor differs: vLLM passes an ``InputProcessingContext``, mmfront the loaded HF
    processor and, when it came from one, the model folder (``create_processor`` does this).
    """

    def __init__(
        self, hf_processor: Any, *, model_id: str, config: MultiModalConfig | None = None,
        model_dir: str | Path | None = None,
    ) -> None:
        self.hf_processor = hf_processor
        self.tokenizer = hf_processor.tokenizer
        self.model_id = model_id
        self.config = config or MultiModalConfig()
        self.model_dir = model_dir
        self.model_dtype: torch.dtype = resolve_model_dtype(self.config.dtype, model_dir)
        self.native: NativeInputs | None = None
        """What the engine's native class reads, where it runs one (``create_processor`` sets it from
        ``--model-impl``); ``None``: the processor's own layout (the transformers backend's)."""
        self.device_normalize = False
        """Send raw uint8 pixels: the engine normalises them (``mm_device_do_normalize``)."""
        self.kernel_misses = False
        """The model's image-processor speedups replaced every pixel step of a miss with mmfront's
        kernels (``create_processor`` sets it from ``ModelSpec.hf_speedups``)."""
        self.built_by: str | None = None
        """The function that built this processor from its folder, as ``module:name``
        (``create_processor`` sets it): a processing lane rebuilds the processor by calling it,
        so the lane's items have the caller's layout (native fields, image processor speedups)."""
        self._processor_variants: dict[str, Any] = {}

    def get_tokenizer(self) -> Any:
        """The tokenizer prompts are encoded with (the HF processor's own)."""
        return self.tokenizer

    def get_hf_processor(self, **kwargs: Any) -> Any:
        """The HF processor. Without kwargs, the one every request uses (nothing is loaded).

        With kwargs, as in vLLM, a processor built with those overrides of the folder's settings
        (``AutoProcessor.from_pretrained(model_dir, **kwargs)``, offline, sharing this tokenizer),
        kept for reuse. Request and deployment kwargs need no rebuilt processor: the pipeline
        applies them at call time. Overrides need the model folder to load from.
        """
        kwargs = {k: v for k, v in kwargs.items() if k != "tokenizer"}  # as in vLLM: always the info's tokenizer
        if not kwargs:
            return self.hf_processor
        if self.model_dir is None:
            raise ConfigError(
                f"get_hf_processor({', '.join(sorted(kwargs))}=...) rebuilds the HF processor from its model folder, "
                f"but this {type(self).__name__} was given a ready {type(self.hf_processor).__name__} without one. "
                "Create the processor from a folder (create_processor(folder)), pass model_dir= to the info, or "
                "call get_hf_processor() without kwargs."
            )
        key = json.dumps(kwargs, sort_keys=True, default=repr)
        processor = self._processor_variants.get(key)
        if processor is None:
            trust = {"trust_remote_code": True} if self.config.trust_remote_code else {}
            processor = load_hf_processor(self.model_dir, tokenizer=self.tokenizer, **trust, **kwargs)
            if len(self._processor_variants) >= _MAX_PROCESSOR_VARIANTS:
                self._processor_variants.pop(next(iter(self._processor_variants)))
            self._processor_variants[key] = processor
        return processor

    def get_hf_config(self) -> Any:
        """The model's ``transformers.PretrainedConfig``, read once from the folder's
        ``config.json`` (offline). A processor given without its folder has no config to read."""
        return self._hf_config

    @cached_property
    def _hf_config(self) -> Any:
        if self.model_dir is None:
            raise ConfigError(
                f"get_hf_config() reads config.json from the model folder, but this {type(self).__name__} was given "
                f"a ready {type(self.hf_processor).__name__} without one. Create the processor from its folder "
                "(create_processor(folder)) or pass model_dir= to the info."
            )
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(str(self.model_dir), local_files_only=True,
                                              trust_remote_code=self.config.trust_remote_code)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"Could not read the model config from {str(self.model_dir)!r}: {exc}. The folder needs the "
                "checkpoint's config.json with a `model_type` this transformers knows."
            ) from exc

    def get_generation_config_fields(self) -> Mapping[str, Any]:
        """The non-default fields of the model's generation config (vLLM's
        ``ModelConfig.try_get_generation_config``): ``generation_config.json``, else what
        ``config.json`` implies; empty for a processor without a folder or a folder with neither.
        Its ``eos_token_id`` joins every request's stop ids, as vLLM's input processor adds it."""
        return self._generation_config_fields

    @cached_property
    def _generation_config_fields(self) -> Mapping[str, Any]:
        if self.model_dir is None:
            return {}
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(str(self.model_dir), local_files_only=True)
        except OSError:
            try:
                generation_config = GenerationConfig.from_model_config(self.get_hf_config())
            except ConfigError:
                return {}
        return dict(generation_config.to_diff_dict())

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        """Items per prompt the model supports, per modality (``None``: unlimited)."""
        return {}

    def why_unsupported(self, modality: str) -> str:
        """Why the model takes no ``modality`` items, where there is more to say than that it
        does not (appended to the refusal)."""
        return ""

    def why_limited(self, modality: str) -> str:
        """Why the model takes no more ``modality`` items per prompt than its supported limit, where
        there is more to say (appended to the refusal)."""
        return ""

    @cached_property
    def allowed_mm_limits(self) -> dict[str, int]:
        out = {}
        for modality, supported in self.get_supported_mm_limits().items():
            user = self.config.get_limit_per_prompt(modality)
            out[modality] = user if supported is None else min(user, supported)
        return out

    def get_target_sample_rate(self) -> float | None:
        extractor = getattr(self.hf_processor, "feature_extractor", None) or getattr(
            self.hf_processor, "audio_processor", None
        )
        rate = getattr(extractor, "sampling_rate", None)
        return float(rate) if rate else None

    @cached_property
    def video_needs_metadata(self) -> bool:
        """Whether the HF processor reads each video's metadata (``video_metadata``), so the
        parser keeps it with the frames and refuses a video without it (vLLM's
        ``video_needs_metadata``)."""
        return False

    @cached_property
    def data_parser(self) -> MultiModalDataParser:
        return MultiModalDataParser(
            target_sr=self.get_target_sample_rate(), enable_mm_embeds=self.config.enable_mm_embeds,
            image_mode=self.config.image_mode, rgba_background_color=self.config.rgba_background_color,
            max_resample_bytes=self.config.max_media_request_decode_bytes,
            video_needs_metadata=self.video_needs_metadata,
        )

    def parse_mm_data(self, mm_data: Mapping[str, Any], *, validate: bool = True) -> MultiModalDataItems:
        items = self.data_parser.parse_mm_data(mm_data)
        if validate:
            self.validate_mm_counts(items)
        return items

    def validate_mm_counts(self, items: MultiModalDataItems) -> None:
        for modality, data in items.items():
            self.check_item_count(modality, data.get_count(), is_embed=isinstance(data, EmbeddingItems))

    def check_item_count(self, modality: str, count: int, *, is_embed: bool = False) -> None:
        """Refuse ``count`` items of ``modality`` in one prompt if the model or the config does not
        allow them (the one home of this rule: chat parsing asks before loading each item)."""
        supported = self.get_supported_mm_limits()
        if modality not in supported:
            reason = self.why_unsupported(modality)
            raise ValidationError(
                f"This model does not support {modality} inputs (it accepts: {sorted(supported) or 'none'})."
                + (f" {reason}" if reason else ""),
                parameter=modality,
            )
        if is_embed and self.config.get_limit_per_prompt(modality) == 0:
            return
        limit = self.allowed_mm_limits[modality]
        if count > limit:
            message = f"At most {limit} {modality}(s) may be provided in one prompt."
            cap = supported[modality]
            if cap is None or count <= cap:
                message += " Set `--limit-mm-per-prompt` (MultiModalConfig.limit_mm_per_prompt) to increase this limit."
            elif self.why_limited(modality):
                message += f" {self.why_limited(modality)}"
            raise ValidationError(message, parameter=modality)

    @cached_property
    def max_prompt_chars(self) -> int:
        """Longest prompt string worth tokenizing (see ``MultiModalConfig.max_prompt_chars``): a
        string longer than ``max_model_len`` times the longest token string cannot fit, and
        tokenizing it first would take memory in proportion to it (a 50 MB text part). Without
        ``max_model_len``, :data:`~mmfront.config.DEFAULT_MAX_PROMPT_CHARS` bounds that work."""
        if self.config.max_prompt_chars is not None:
            return self.config.max_prompt_chars
        if self.config.max_model_len is None:
            return DEFAULT_MAX_PROMPT_CHARS
        return self.config.max_model_len * max(map(len, self.tokenizer.get_vocab()), default=1)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Tokenize constant strings (replacements, dummy text) once, through the shared memo."""
        return cached_encode(self.tokenizer, text, add_special_tokens=add_special_tokens)


class BaseMultiModalProcessor(ABC):
    """Turns a prompt plus multimodal items into :class:`MultiModalInputs`.

    Subclasses (one per model family) say how to call the HF processor, how its outputs split into
    items, and how each item expands in the prompt. The hooks carry vLLM's names; two differ in
    signature (``_call_hf_processor`` takes parsed items, as vLLM's ``_apply_hf_processor_main``
    does). ``docs/processing.md`` maps every hook to its vLLM counterpart and has a worked example.
    """

    placeholder_str: ClassVar[Mapping[str, str]] = {}
    """Default text placeholder per modality, when it does not come from the HF processor."""

    mm_kwarg_specs: ClassVar[Sequence[ProcessorKwargSpec] | None] = None
    """The HF kwargs a request may set, with types and ranges; any other kwarg the HF processor
    takes is refused per request (the deployment's ``mm_processor_kwargs`` may still set it).
    ``None``: whatever the HF processor accepts, its failures wrapped in ``ProcessorError``."""

    items_are_independent: ClassVar[bool] = False
    """An item's outputs do not depend on the other items of its HF call (no padding to the
    batch's longest item), so executors process a call's items one call each, in parallel, and
    merge them (a 3-image request then uses 3 lanes). Otherwise a call's items stay together."""

    in_place_misses: bool = False
    """A miss's pixel work runs in mmfront's own kernels (the JPEG decode, the resize, the patch
    rows or the normalisation table: no GIL, warm memory), so the caller's threads process it for
    less than a lane's hop costs: ``mm_processing_lanes=None`` then starts no lane
    (docs/processing.md, "In place where the kernels run"). An HF processor's own steps allocate
    fresh memory on every call in ``mmfront serve`` and hold the GIL for their Python: a lane's
    warm heap and its own interpreter pay there."""

    reads_pixels: bool = False
    """The processor reads a decoded JPEG's pixels (:meth:`ImageProcessorItems.get_pixels
    <mmfront.parse.ImageProcessorItems.get_pixels>`) rather than its PIL image, so executors decode
    its lazily loaded JPEGs straight into arrays (:mod:`mmfront.media.jpeg`). Otherwise they decode
    with Pillow, as the PIL image it then reads is made at no extra cost."""

    def __init__(self, info: BaseProcessingInfo) -> None:
        self.info = info
        if self.mm_kwarg_specs is not None and info.config.mm_processor_kwargs:
            refused = refuse_processor_kwargs(self.mm_kwarg_specs, info.config.mm_processor_kwargs, info.config,
                                              accepted=frozenset(), owner=type(self).__name__,
                                              name="MultiModalConfig.mm_processor_kwargs")
            if refused:
                raise ConfigError(refused)
        unproven = refuse_unproven_kwargs(info.native, info.config.mm_processor_kwargs or {},
                                          where="MultiModalConfig.mm_processor_kwargs")
        if unproven:
            raise ConfigError(unproven)

    def check_request_kwargs(self, kwargs: Mapping[str, Any] | None) -> None:
        """Refuse a request's HF kwargs that are malformed, or out of :attr:`mm_kwarg_specs`,
        before anything is hashed or processed."""
        if kwargs is None:
            return
        if not isinstance(kwargs, Mapping):
            raise ValidationError(f"mm_processor_kwargs must be an object of HF processor kwargs, got "
                                  f"{type(kwargs).__name__}.", parameter="mm_processor_kwargs")
        specs = self.mm_kwarg_specs or ()
        accepted: frozenset[str] = frozenset()
        if self.mm_kwarg_specs is not None:
            accepted = frozenset().union(*valid_hf_kwargs(self.info.hf_processor).values())
        refused = refuse_processor_kwargs(specs, kwargs, self.info.config, accepted=accepted,
                                          owner=type(self).__name__)
        if refused:
            raise ValidationError(refused, parameter="mm_processor_kwargs")
        unproven = refuse_unproven_kwargs(self.info.native, kwargs, where="mm_processor_kwargs")
        if unproven:
            raise ValidationError(unproven, parameter="mm_processor_kwargs")

    # --- hooks -----------------------------------------------------------------------------

    def get_placeholder_str(self, modality: str, index: int) -> str:
        """The text a chat template puts where item ``index`` of ``modality`` goes."""
        try:
            return self.placeholder_str[modality]
        except KeyError:
            raise ValidationError(f"This model has no placeholder for {modality} items.", parameter=modality) from None

    def get_mm_special_tokens(self) -> set[str]:
        """Token strings that only the frontend may place (placeholders and what they expand to);
        a chat text part containing one is refused."""
        return set(self.placeholder_str.values())

    @abstractmethod
    def _call_hf_processor(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Process ``mm_items`` (never the prompt) and return the HF outputs as a dict."""

    @abstractmethod
    def _get_mm_fields_config(
        self, hf_inputs: Mapping[str, Any], hf_kwargs: Mapping[str, Any],
    ) -> Mapping[str, MultiModalFieldConfig]:
        """How each HF output key splits into items."""

    @abstractmethod
    def _get_prompt_updates(
        self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any], out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        """How each item expands in the prompt (callables receive the item index in ``mm_items``)."""

    def _tokenize_prompt(
        self, prompt: str | list[int], mm_counts: Mapping[str, int], *, add_special_tokens: bool,
    ) -> list[int]:
        """The prompt's ids before the items are spliced in (``mm_counts``: items per modality).
        A processor whose HF processor rewrites the text around its placeholders overrides this,
        so the splice lands on HF's own tokenization of that text (Legacy transformers backend)."""
        if isinstance(prompt, str):
            return list(self.info.tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        return list(prompt)

    def _apply_prompt_updates(
        self, prompt_ids: list[int], mm_prompt_updates: Mapping[str, Sequence[Sequence[ResolvedPromptUpdate]]],
    ) -> tuple[list[int], Mapping[str, Sequence[PlaceholderFeaturesInfo]]]:
        return apply_prompt_updates(prompt_ids, mm_prompt_updates, self.info.tokenizer)

    def get_max_tokens_per_item(self) -> Mapping[str, int]:
        """Most embedding tokens one item of each modality can produce (encoder budget checks)."""
        return {}

    def get_dummy_image_size(self) -> tuple[int, int]:
        """``(width, height)`` of the image with the most features (warm-up and profiling)."""
        size = getattr(getattr(self.info.hf_processor, "image_processor", None), "size", None)
        edges = [
            size.get(name) if isinstance(size, Mapping) else getattr(size, name, None)
            for name in ("height", "width", "longest_edge", "shortest_edge")
        ]
        edge = max((e for e in edges if isinstance(e, int)), default=224)
        return edge, edge

    def get_dummy_audio_length(self) -> int:
        """Samples of the longest audio the feature extractor takes in one window."""
        extractor = getattr(self.info.hf_processor, "feature_extractor", None)
        seconds = getattr(extractor, "chunk_length", None) or 30
        return int(seconds * (self.info.get_target_sample_rate() or 16000))

    # --- the pipeline ----------------------------------------------------------------------

    def apply(
        self,
        prompt: str | list[int],
        mm_data: Mapping[str, Any] | MultiModalDataItems | None,
        *,
        mm_uuids: MultiModalUUIDs | None = None,
        hf_processor_mm_kwargs: Mapping[str, Any] | None = None,
        media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        cache: BaseMultiModalProcessorCache | None = None,
        add_special_tokens: bool = True,
        executor: ItemExecutor | None = None,
    ) -> MultiModalInputs:
        """Process one prompt and its multimodal items, and commit them to ``cache`` (vLLM's
        ``apply``): :meth:`prepare` followed by :func:`~mmfront.processing.commit.commit`.

        ``prompt`` is a string (tokenized with ``add_special_tokens``) or token ids. ``mm_data``
        maps a modality to its items (PIL images, arrays, ``MediaWithBytes`` — lazily decoded ones
        stay undecoded on a cache hit — or ``None`` for an item named only by its UUID).
        ``cache`` is a P0 processor cache; ``None`` processes every item. ``executor`` runs the HF
        processing of the cache misses (:mod:`mmfront.processing.executors`); ``None``: in place.
        """
        prepared = self.prepare(
            prompt, mm_data, mm_uuids=mm_uuids, hf_processor_mm_kwargs=hf_processor_mm_kwargs,
            media_io_kwargs=media_io_kwargs, cache=cache, add_special_tokens=add_special_tokens, executor=executor,
        )
        return commit(prepared, cache)

    def prepare(
        self,
        prompt: str | list[int],
        mm_data: Mapping[str, Any] | MultiModalDataItems | None,
        *,
        mm_uuids: MultiModalUUIDs | None = None,
        hf_processor_mm_kwargs: Mapping[str, Any] | None = None,
        media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        cache: BaseMultiModalProcessorCache | None = None,
        add_special_tokens: bool = True,
        executor: ItemExecutor | None = None,
    ) -> PreparedInputs:
        """Everything :meth:`apply` does except the commit: ``cache`` is only read, so requests
        can be prepared concurrently, and one that is never committed leaves no trace in it.
        :func:`~mmfront.processing.commit.commit` turns the result into committed inputs."""
        if isinstance(prompt, str):
            self._check_prompt_chars(prompt)
            check_text(prompt, parameter="prompt", where="The prompt")
        self.check_request_kwargs(hf_processor_mm_kwargs)
        mm_items = mm_data if isinstance(mm_data, MultiModalDataItems) else self.info.parse_mm_data(mm_data or {})
        counts = {m: items.get_count() for m, items in mm_items.items() if items.get_count() > 0}
        prompt_ids = self._tokenize_prompt(prompt, counts, add_special_tokens=add_special_tokens)
        if not counts:
            text_only = mm_inputs(prompt_ids, MultiModalKwargsItems(), {}, {},
                                  prompt=prompt if isinstance(prompt, str) else None)
            return PreparedInputs(**text_only, mm_pending=NOTHING_TO_COMMIT)

        hf_processor_mm_kwargs = dict(hf_processor_mm_kwargs or {})
        with stage("hash"):
            hashes = get_mm_hashes(
                {m: mm_items[m].get_all_items_for_hash() for m in counts}, self.info.model_id,
                self.info.config.mm_hasher_algorithm, mm_uuids=normalize_mm_uuids(mm_uuids, counts),
                hf_processor_mm_kwargs=hf_processor_mm_kwargs, media_io_kwargs=media_io_kwargs,
            )
        if any(isinstance(mm_items[m], EmbeddingItems) for m in counts):
            cache = None  # embeddings are given, not processed: nothing to cache (vLLM does the same)

        # 1. Which items need processing (the first occurrence of each missing hash).
        updates_by_hash: dict[str, PromptUpdates] = {}
        missing: dict[str, list[int]] = {}
        missing_hashes: set[str] = set()
        with stage("cache"):
            for modality in counts:
                for idx, mm_hash in enumerate(hashes[modality]):
                    if mm_hash in updates_by_hash or mm_hash in missing_hashes:
                        continue
                    cached = cache.peek_prompt_updates(mm_hash) if cache is not None else None
                    if cached is not None:
                        updates_by_hash[mm_hash] = cached
                        continue
                    if mm_items[modality].get_item_for_hash(idx) is None:
                        raise ValidationError(
                            f"Cache miss for {modality} at index {idx} but data is not provided: the item was sent "
                            "by UUID only and is no longer cached. Send its data again.", parameter=modality,
                        )
                    missing_hashes.add(mm_hash)
                    missing.setdefault(modality, []).append(idx)

        # 2. One HF call for every missing item.
        new_items: dict[str, MultiModalKwargsItem] = {}
        if missing:
            with stage("hf"):
                new_items = self._process_items(mm_items, missing, hashes, hf_processor_mm_kwargs, updates_by_hash,
                                                executor=executor)

        # 3. Splice the prompt with every item's updates.
        with stage("updates"):
            mm_prompt_updates = {
                m: [[u.with_item_idx(i) for u in updates_by_hash[h]] for i, h in enumerate(hashes[m])] for m in counts
            }
            new_ids, placeholders = self._apply_prompt_updates(prompt_ids, mm_prompt_updates)
            native = self.info.native
            if native is not None and native.finish_prompt is not None:
                new_ids = native.finish_prompt(new_ids, self.info.tokenizer)
            self._validate_placeholders(placeholders, counts)
            refuse_stray_tokens(new_ids, placeholders, self._reserved_token_ids, self.info.tokenizer)

        kwargs: dict[str, list[MultiModalKwargsItem | None]] = {
            m: [new_items.get(h) for h in hashes[m]] for m in counts
        }

        def reprocess(modality: str, index: int) -> MultiModalKwargsItem:
            items = self._process_items(mm_items, {modality: [index]}, hashes, hf_processor_mm_kwargs, {},
                                        executor=executor)
            return items[hashes[modality][index]]

        mm_placeholders = {m: [engine_range(p.to_range(), self.info.native) for p in sorted(ps, key=lambda p: p.item_idx)]
                           for m, ps in placeholders.items()}
        order = placeholders_in_prompt_order(mm_placeholders)
        out = mm_inputs(new_ids, MultiModalKwargsItems(kwargs), {m: list(hashes[m]) for m in counts},
                        mm_placeholders, prompt=prompt if isinstance(prompt, str) else None)
        pending = PendingCommit(order, {m: list(hashes[m]) for m in counts}, new_items, updates_by_hash, reprocess)
        return PreparedInputs(**out, mm_pending=pending)

    def _process_items(
        self, mm_items: MultiModalDataItems, selection: Mapping[str, Sequence[int]], hashes: Mapping[str, list[str]],
        hf_processor_mm_kwargs: Mapping[str, Any], updates_by_hash: dict[str, PromptUpdates], *, executor: ItemExecutor | None,
    ) -> dict[str, MultiModalKwargsItem]:
        """Process the selected items in one job; record their updates; return items by hash.

        The HF kwargs are resolved here, on the miss path only: a hit never needs them."""
        hf_kwargs = self._hf_kwargs(hf_processor_mm_kwargs)
        kw_items, resolved = self.process_subset(mm_items.subset(selection), hf_kwargs, executor)
        out: dict[str, MultiModalKwargsItem] = {}
        for modality, idxs in selection.items():
            for j, idx in enumerate(idxs):
                mm_hash = hashes[modality][idx]
                item = kw_items[modality][j]
                assert item is not None
                out[mm_hash] = item
                updates_by_hash[mm_hash] = resolved[modality][j]
        return out

    def _hf_kwargs(self, hf_processor_mm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The HF call's kwargs: the model's native defaults, then the config's, then the request's."""
        native_defaults = self.info.native.hf_defaults if self.info.native is not None else None
        return resolve_hf_kwargs(self.info.hf_processor, native_defaults, self.info.config.mm_processor_kwargs,
                                 hf_processor_mm_kwargs, DEVICE_NORMALIZE_KWARGS if self.info.device_normalize else None)

    def warm_up(self, counts: Mapping[str, int]) -> None:
        """HF-process ``counts`` of the model's largest dummy items in one call, as vLLM's renderer
        does at start-up, so the first request finds the HF processor and torch warm. The outputs
        are dropped where they are made: run in a lane, the dummy's outputs (a Qwen2.5-VL standard
        limits image: 77 MB of patch rows) never travel to the server, whose start-up memory they
        would grow (issue 34)."""
        data = BaseDummyInputsBuilder(self).get_dummy_mm_data(counts, self.info.config.limit_mm_per_prompt)
        self.process_hf_items(self.info.parse_mm_data(data), self._hf_kwargs({}))

    def process_subset(
        self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any], executor: ItemExecutor | None = None,
    ) -> tuple[MultiModalKwargsItems, dict[str, list[list[ResolvedPromptUpdate]]]]:
        """HF-process ``mm_items`` on ``executor`` (``None``: in place); per-item kwargs and
        resolved updates, indexed within ``mm_items``."""
        kw_items = (executor or _IN_PLACE).run(ItemJob(mm_items, hf_kwargs), self)
        return kw_items, self.resolve_prompt_updates(mm_items, hf_kwargs, kw_items)

    def process_hf_items(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> MultiModalKwargsItems:
        """The HF call and its split into per-item kwargs (what an item executor runs)."""
        hf_out = self._call_hf_processor(mm_items, hf_kwargs)
        for items in mm_items.values():
            hf_out.update(items.get_passthrough_data())
        hf_out = {k: cast_floating(v, self.info.model_dtype) for k, v in hf_out.items()}
        fields = self._get_mm_fields_config(hf_out, hf_kwargs)
        native = self.info.native
        if native is not None and native.outputs is not None:
            hf_out = native.outputs(hf_out, self.info.hf_processor, mm_items, hf_kwargs)
        if native is not None and native.fields is not None:
            own = {k: f for k, f in fields.items() if self.is_consumed_key(k)}
            fields = {**native.fields(hf_out, self.info.hf_processor), **own}
        kw_items = MultiModalKwargsItems.from_hf_inputs(hf_out, fields)
        counts = mm_items.get_all_counts()
        for modality, count in counts.items():
            if kw_items.get_count(modality) != count:
                raise FieldConfigError(
                    f"Expected {count} {modality} item(s) from the processor outputs but found "
                    f"{kw_items.get_count(modality)}: the processor's _call_hf_processor and _get_mm_fields_config "
                    "disagree."
                )
        return kw_items

    def is_consumed_key(self, key: str) -> bool:
        """Whether ``key`` is an item entry this processor reads back out of its items (and removes)
        before they are sent: it stays with the items whatever the engine's class reads."""
        return False

    def resolve_prompt_updates(
        self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any], kw_items: MultiModalKwargsItems,
    ) -> dict[str, list[list[ResolvedPromptUpdate]]]:
        """Each item's prompt updates, every callable evaluated (cheap: no HF call)."""
        counts = mm_items.get_all_counts()
        updates = self._get_prompt_updates(mm_items, hf_kwargs, kw_items)
        native = self.info.native
        if native is not None and native.prompt_updates is not None:
            updates = native.prompt_updates(updates, self.info.hf_processor)
        resolved: dict[str, list[list[ResolvedPromptUpdate]]] = {}
        for modality, count in counts.items():
            own = [u for u in updates if u.modality == modality]
            if not own:
                raise PromptUpdateError(
                    f"The processor defines no prompt update for {modality} items, so they cannot be placed.",
                    modality=modality, expected=count, found=0,
                )
            resolved[modality] = [[u.resolve(i) for u in own] for i in range(count)]
        return resolved

    @cached_property
    def _reserved_token_ids(self) -> frozenset[int]:
        """The reserved multimodal tokens that are single tokens (no item may leave one behind)."""
        return single_token_ids(self.info.tokenizer, self.get_mm_special_tokens())

    def _check_prompt_chars(self, prompt: str) -> None:
        limit = self.info.max_prompt_chars
        if len(prompt) > limit:
            config = self.info.config
            if config.max_prompt_chars is not None:
                why = "MultiModalConfig.max_prompt_chars"
            elif config.max_model_len is not None:
                why = f"with max_model_len={config.max_model_len} no longer prompt fits, whatever it holds"
            else:
                why = ("the default bound without max_model_len, which keeps tokenizing fast; set max_model_len, "
                       "or raise MultiModalConfig.max_prompt_chars knowing what it costs")
            raise ValidationError(
                f"The prompt has {len(prompt)} characters; the limit is {limit} ({why}). Shorten the prompt; it "
                "was not tokenized.", parameter="prompt")

    @staticmethod
    def _validate_placeholders(
        placeholders: Mapping[str, Sequence[PlaceholderFeaturesInfo]], counts: Mapping[str, int],
    ) -> None:
        for modality, count in counts.items():
            found = len(placeholders.get(modality, ()))
            if found != count:
                raise PromptUpdateError(
                    f"Expected {count} prompt placeholder(s) for {modality} items but found {found}. Put one "
                    f"placeholder in the prompt for each {modality}.", modality=modality, expected=count, found=found,
                )
