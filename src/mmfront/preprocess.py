"""Requests in, processed inputs and ``EngineCoreRequest``s out.

:class:`ModelPipeline` owns one model's processor, P0 caches, statistics and item executor (the processing lanes),
and is where requests are prepared and committed. Over it, under vLLM's names,
:class:`InputPreprocessor` takes a chat conversation, a prompt string, token ids, or a vLLM
prompt dict, plus multimodal data, and returns vLLM's ``MultiModalInputs``; :class:`InputProcessor`
adds the request-level checks of vLLM's ``InputProcessor`` (empty prompt, model length, encoder
budget, vocabulary) and flattens the items into ``MultiModalFeatureSpec``s sorted by placeholder
offset.

Preparing a request only *reads* the P0 cache. The caches P1 depends on (the mirrored LRU, shared
memory) change only when a request is committed, and a request is committed only by the step
that hands it to the transport (:meth:`InputProcessor.commit`, run by
``mmfront.engine.client.EngineClient`` in its ordered lane). So a request that is processed and
never sent leaves no trace, and ``preprocess`` then ``process_inputs`` on the same messages gives
a request that carries all of its data.

Thread-safety: :meth:`InputPreprocessor.preprocess`, :meth:`InputProcessor.prepare` and
:meth:`InputProcessor.process_inputs` may run on many threads at once (media loading, hashing and
HF processing run in parallel); :meth:`InputProcessor.commit` must be called from one lane at a
time, in the order the requests are sent.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from mmfront.cache.base import NULL_SENDER_MIRROR, BaseMultiModalProcessorCache, SenderMirror
from mmfront.cache.factory import processor_cache_from_config, processor_only_cache_from_config
from mmfront.cache.stats import MultiModalCacheStats
from mmfront.chat import parse_chat_messages
from mmfront.config import MultiModalConfig
from mmfront.errors import ConfigError, InputTypeError, MMFrontError, ValidationError, resource_error
from mmfront.hashing import scope_uuids
from mmfront.inputs import MultiModalFeatureSpec, MultiModalInputs
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.processing.commit import PreparedInputs, commit, pending_commit, placeholders_in_prompt_order
from mmfront.processing.dummy import BaseDummyInputsBuilder
from mmfront.processing.executors import InPlaceExecutor, ItemExecutor, executor_from_config
from mmfront.processing.hf import unknown_hf_kwargs
from mmfront.processing.processor import BaseMultiModalProcessor, MultiModalUUIDs
from mmfront.processing.threads import ThreadPlan, apply_thread_plan
from mmfront.timing import stage
from mmfront.wire import EngineCoreRequest, LoRARequest, SamplingParams
from mmfront.wire.messages import MirrorOnly, MirrorStamp

PromptInput = str | Sequence[int] | Sequence[Mapping[str, Any]] | Mapping[str, Any]
"""A prompt string, token ids, a list of OpenAI chat messages, or a vLLM prompt dict
(``{"prompt" | "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids"}``)."""

_PROMPT_DICT_KEYS = frozenset({"prompt", "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs",
                               "multi_modal_uuids", "cache_salt"})


@dataclass(frozen=True)
class RequestOptions:
    """Everything about one request besides its prompt and sampling parameters: the one home of
    the per-request options that ``preprocess``, ``process_inputs`` and the client all take
    (as keyword arguments, or as one ``options=`` value)."""

    mm_data: Mapping[str, Any] | None = None
    mm_uuids: MultiModalUUIDs | None = None
    hf_processor_mm_kwargs: Mapping[str, Any] | None = None
    media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None
    arrival_time: float | None = None
    lora_request: LoRARequest | None = None
    cache_salt: str | None = None
    priority: int = 0
    data_parallel_rank: int | None = None
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: Sequence[Mapping[str, Any]] | None = None

    @classmethod
    def of(cls, options: RequestOptions | None, kwargs: Mapping[str, Any]) -> RequestOptions:
        """``options`` updated with keyword arguments; an unknown keyword is refused by name."""
        unknown = set(kwargs) - _OPTION_NAMES
        if unknown:
            raise InputTypeError(f"Unknown request option(s) {sorted(unknown)}; the options are "
                                 f"{sorted(_OPTION_NAMES)}.", parameter=sorted(unknown)[0])
        base = options or _DEFAULT_OPTIONS
        return replace(base, **kwargs) if kwargs else base

    def chat_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"add_generation_prompt": self.add_generation_prompt,
                               "chat_template": self.chat_template, "chat_template_kwargs": self.chat_template_kwargs}
        if self.continue_final_message:
            out["continue_final_message"] = True
        if self.tools is not None:
            out["tools"] = self.tools
        return out


_OPTION_NAMES = frozenset(f.name for f in fields(RequestOptions))
_DEFAULT_OPTIONS = RequestOptions()


def _is_chat(prompt: object) -> bool:
    return isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)) and len(prompt) > 0 \
        and all(isinstance(m, Mapping) for m in prompt)


def _from_prompt_dict(prompt: Mapping[str, Any], options: RequestOptions) -> tuple[Any, RequestOptions]:
    """vLLM's ``TextPrompt``/``TokensPrompt`` dicts: the prompt and the options they carry."""
    unknown = set(prompt) - _PROMPT_DICT_KEYS
    if unknown:
        raise InputTypeError(f"Unknown prompt key(s) {sorted(unknown)}; a prompt dict takes "
                             f"{sorted(_PROMPT_DICT_KEYS)}.", parameter="prompt")
    if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
        raise ValidationError("A prompt dict needs exactly one of `prompt` and `prompt_token_ids`.", parameter="prompt")
    text = prompt["prompt"] if "prompt" in prompt else prompt["prompt_token_ids"]
    updates: dict[str, Any] = {}
    for key, option in (("multi_modal_data", "mm_data"), ("mm_processor_kwargs", "hf_processor_mm_kwargs"),
                        ("multi_modal_uuids", "mm_uuids"), ("cache_salt", "cache_salt")):
        if prompt.get(key) is not None:
            if getattr(options, option) not in (None, {}):
                raise InputTypeError(f"`{key}` is given both in the prompt dict and as the `{option}` option; give it "
                                     "once.", parameter=key)
            updates[option] = prompt[key]
    return text, replace(options, **updates) if updates else options


class ModelPipeline:
    """The frontend's multimodal path for one model: owns the processor, the P0 caches, the media
    connector, the cache statistics and the item executor (the processing lanes), and is the one place requests are
    prepared and committed. :class:`InputPreprocessor` and :class:`InputProcessor` are vLLM's
    faces of it."""

    def __init__(
        self, model: str | Path | Any, config: MultiModalConfig | None = None, *, model_id: str | None = None,
        processor: BaseMultiModalProcessor | None = None,
    ) -> None:
        self.config = config or MultiModalConfig()
        self.processor = processor or create_processor(model, self.config, model_id=model_id)
        refused = _unknown_hf_kwargs(self.processor, self.config.mm_processor_kwargs or {}, "mm_processor_kwargs")
        if refused:
            raise ConfigError(refused)
        self.cache: BaseMultiModalProcessorCache | None = processor_cache_from_config(self.config)
        self.tokenize_only_cache = processor_only_cache_from_config(self.config)
        self.connector = MediaConnector(self.config)
        self.stats = MultiModalCacheStats()
        self._request_counter = itertools.count()
        self.threads = ThreadPlan.from_config(self.config)
        apply_thread_plan(self.threads)
        self.item_executor: ItemExecutor = executor_from_config(self.processor, self.config, self.threads.lanes)
        """Where cache misses are HF-processed: the lanes ``mm_processing_lanes`` asks for, or in place."""

    def close(self) -> None:
        """Stop the processing lanes (idempotent); later misses are processed in place."""
        executor, self.item_executor = self.item_executor, InPlaceExecutor()
        executor.close()

    @cached_property
    def executor(self) -> ThreadPoolExecutor:
        """The threads the async entry points prepare requests on: one per core of the thread
        budget, plus one per processing lane (a thread whose miss is on a lane waits, it does not
        compute). Preparation is CPU work that mostly runs without the GIL (decoding, resizing,
        the pixel tables); fewer threads leave cores idle, more only queue for the GIL and delay
        the loop (docs/benchmarks.md, "Design measurements")."""
        workers = self.threads.budget + self.threads.lanes
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mmfront-prepare")

    # --- prepare and commit -------------------------------------------------------------------

    def prepare(
        self, prompt: PromptInput, opts: RequestOptions, request_id: str | None,
        cache: BaseMultiModalProcessorCache | None,
    ) -> MultiModalInputs:
        """Process one request against ``cache`` (the P0 cache of the engine it goes to). A cache
        P1 depends on is only read: the result is prepared, and committed when it is sent
        (:meth:`commit`). Any other cache is committed to at once, since a request that is never
        sent cannot disturb it."""
        try:
            prepared = self._prepare(prompt, opts, request_id or f"mmfront-{next(self._request_counter)}", cache)
        except (OSError, MemoryError) as exc:  # a lazy import or an open() with no descriptor left, ...
            found = None if isinstance(exc, MMFrontError) else resource_error(exc, doing="Preparing the request")
            if found is None:
                raise
            raise found from exc
        if cache is not None and not cache.commit_at_send:
            return self._commit(prepared, cache)
        return prepared

    def commit(
        self, inputs: MultiModalInputs, request_id: str, cache: BaseMultiModalProcessorCache | None,
    ) -> MultiModalInputs:
        """``inputs`` committed to ``cache`` as they are sent, if it commits at send (then exactly
        one of the mirror's ``take_stamp`` and ``take_mirror_only`` must follow), otherwise only
        completed with the data of every item the cache does not serve."""
        if cache is None or not cache.commit_at_send:
            return commit(inputs, None)
        return self._commit(inputs, cache, request_id)

    def engine_cache(self) -> BaseMultiModalProcessorCache | None:
        """A P0 cache for one more engine rank: a mirrored one per rank (each rank's P1 mirrors its own), a processor-only one shared."""
        if self.cache is None or not self.cache.commit_at_send:
            return self.cache
        if self.config.mm_processor_cache_type == "shm":
            raise ConfigError("The shm processor cache serves one engine rank (its segment is the engine's); with "
                              "data_parallel_size > 1 use mm_processor_cache_type='lru', which keeps one mirror "
                              "per rank.")
        return processor_cache_from_config(self.config)

    def _commit(
        self, inputs: MultiModalInputs, cache: BaseMultiModalProcessorCache, request_id: str | None = None,
    ) -> MultiModalInputs:
        pending = pending_commit(inputs)
        if pending is None or not pending.order:
            return commit(inputs, None)
        if request_id is not None:
            cache.begin_request(request_id)
        committed = commit(inputs, cache)
        self.stats.record_request(cache)
        return committed

    def _prepare(
        self, prompt: PromptInput, opts: RequestOptions, request_id: str, cache: BaseMultiModalProcessorCache | None,
    ) -> PreparedInputs:
        if isinstance(prompt, Mapping):
            prompt, opts = _from_prompt_dict(prompt, opts)
        if opts.hf_processor_mm_kwargs:
            if not isinstance(opts.hf_processor_mm_kwargs, Mapping):
                raise ValidationError("mm_processor_kwargs must be an object of HF processor kwargs.",
                                      parameter="mm_processor_kwargs")
            refused = _unknown_hf_kwargs(self.processor, opts.hf_processor_mm_kwargs, "mm_processor_kwargs")
            if refused:
                raise ValidationError(refused, parameter="mm_processor_kwargs")
        mm_data, mm_uuids = opts.mm_data, opts.mm_uuids
        if isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)) and not prompt:
            raise ValidationError("The decoder prompt cannot be empty: send a non-empty list of chat messages, a "
                                  "prompt string, or token ids.", parameter="prompt")
        if not _is_chat(prompt):
            _refuse_chat_options(opts)
        if _is_chat(prompt):
            if mm_data:
                raise InputTypeError("Chat messages carry their media as content parts; do not pass mm_data too.", parameter="multi_modal_data")
            with stage("load"):
                chat = parse_chat_messages(
                    prompt, self.processor, self.connector,  # type: ignore[arg-type]
                    budget=DecodeBudget(self.config.max_media_request_decode_bytes),
                    media_io_kwargs=opts.media_io_kwargs, **opts.chat_kwargs(),
                )
            text: str | list[int] = chat.prompt
            mm_data, mm_uuids = chat.mm_data, chat.mm_uuids
            add_special_tokens = False  # the template writes BOS itself
        elif isinstance(prompt, str):
            text, add_special_tokens = prompt, True
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            text, add_special_tokens = list(prompt), False  # type: ignore[arg-type]
        else:
            raise InputTypeError("prompt must be a string, a list of token ids, a list of chat messages or a vLLM "
                                 f"prompt dict; got {type(prompt).__name__}.", parameter="prompt")
        if mm_data and not self.config.needs_content_hashes:
            mm_uuids = _per_request_uuids(request_id, mm_data, mm_uuids)
        elif mm_uuids:
            mm_uuids = scope_uuids(mm_uuids, opts.cache_salt)
        return self.processor.prepare(
            text, mm_data, mm_uuids=mm_uuids, hf_processor_mm_kwargs=opts.hf_processor_mm_kwargs,
            media_io_kwargs=opts.media_io_kwargs, cache=cache, add_special_tokens=add_special_tokens,
            executor=self.item_executor,
        )

    # --- lifecycle ------------------------------------------------------------------------------

    def warmup(self) -> None:
        """Run one largest dummy item per supported modality, as vLLM's renderer does at start-up,
        so the first real request finds the HF processor and torch warm. It goes through the
        processor-only cache (never the P0/P1 mirror), which is cleared afterwards."""
        counts = {m: 1 for m, limit in self.processor.info.allowed_mm_limits.items() if limit > 0}
        if not counts:
            return
        ids, data = BaseDummyInputsBuilder(self.processor).get_dummy_processor_inputs(
            counts, self.config.limit_mm_per_prompt)
        self.processor.apply(ids, data, cache=self.tokenize_only_cache, executor=self.item_executor)
        if self.tokenize_only_cache is not None:
            self.tokenize_only_cache.clear_cache()

    def clear_cache(self) -> None:
        """Reset the P0 caches (vLLM's ``reset_mm_cache``); P1 must be reset alongside it (the
        mirrored cache starts a new epoch, which tells P1 with the next request)."""
        for cache in (self.cache, self.tokenize_only_cache):
            if cache is not None:
                cache.clear_cache()
        self.stats.reset = True


class InputPreprocessor:
    """vLLM's ``InputPreprocessor`` over a :class:`ModelPipeline`: requests in,
    ``MultiModalInputs`` out."""

    def __init__(
        self, model: str | Path | Any, config: MultiModalConfig | None = None, *, model_id: str | None = None,
        processor: BaseMultiModalProcessor | None = None,
    ) -> None:
        self.pipeline = ModelPipeline(model, config, model_id=model_id, processor=processor)

    @property
    def config(self) -> MultiModalConfig:
        return self.pipeline.config

    @property
    def processor(self) -> BaseMultiModalProcessor:
        return self.pipeline.processor

    @property
    def cache(self) -> BaseMultiModalProcessorCache | None:
        return self.pipeline.cache

    @property
    def tokenize_only_cache(self) -> BaseMultiModalProcessorCache | None:
        return self.pipeline.tokenize_only_cache

    @property
    def connector(self) -> MediaConnector:
        return self.pipeline.connector

    @property
    def stats(self) -> MultiModalCacheStats:
        return self.pipeline.stats

    @property
    def item_executor(self) -> ItemExecutor:
        return self.pipeline.item_executor

    @property
    def executor(self) -> ThreadPoolExecutor:
        return self.pipeline.executor

    @property
    def tokenizer(self) -> Any:
        return self.pipeline.processor.info.tokenizer

    def close(self) -> None:
        self.pipeline.close()

    def __enter__(self) -> InputPreprocessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def preprocess(
        self,
        prompt: PromptInput,
        mm_data: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
        skip_mm_cache: bool = False,
        options: RequestOptions | None = None,
        **kwargs: Any,
    ) -> MultiModalInputs:
        """Process one request (keyword options: the fields of :class:`RequestOptions`). Chat
        messages carry their media as content parts; a string or token-id prompt takes
        ``mm_data``. ``skip_mm_cache`` (warm-up, tokenize-only requests) uses a separate
        processor-only cache so the P0/P1 mirror is never disturbed.

        The result is *prepared*: a cache P1 depends on is only read, and the items it would
        send as references are committed (or processed again) when the inputs become a request."""
        opts = RequestOptions.of(options, kwargs if mm_data is None else {**kwargs, "mm_data": mm_data})
        cache = self.pipeline.tokenize_only_cache if skip_mm_cache else self.pipeline.cache
        return self.pipeline.prepare(prompt, opts, request_id, cache)

    async def preprocess_async(
        self, prompt: PromptInput, mm_data: Mapping[str, Any] | None = None, **kwargs: Any,
    ) -> MultiModalInputs:
        """:meth:`preprocess` on a worker thread, so the event loop stays free while media load
        and the HF processor runs."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: self.preprocess(prompt, mm_data, **kwargs))

    def warmup(self) -> None:
        self.pipeline.warmup()

    def clear_cache(self) -> None:
        self.pipeline.clear_cache()

    reset_mm_cache = clear_cache


def _unknown_hf_kwargs(processor: BaseMultiModalProcessor, kwargs: Mapping[str, Any], name: str) -> str | None:
    """Why ``kwargs`` is refused, or None. A kwarg no sub-processor takes would be dropped (vLLM
    drops it with a warning), so a typo such as ``do_pan_and_scn`` would silently change nothing."""
    unknown, accepted = unknown_hf_kwargs(processor.info.hf_processor, kwargs)
    if not unknown:
        return None
    return (f"{name} has key(s) {unknown} that {type(processor.info.hf_processor).__name__} does not accept. "
            f"Accepted: {', '.join(accepted)}.")


_CHAT_DEFAULTS = {"chat_template": None, "chat_template_kwargs": None, "add_generation_prompt": True,
                  "continue_final_message": False, "tools": None}


def _refuse_chat_options(opts: RequestOptions) -> None:
    """Chat options on a prompt string or token ids would be ignored: refuse them by name."""
    for name, default in _CHAT_DEFAULTS.items():
        value = getattr(opts, name)
        if value != default and not (default is None and not value):
            raise ValidationError(f"`{name}` applies to chat messages only; this prompt is a string or token ids, "
                                  "so nothing would render it. Send the prompt as messages, or drop the option.",
                                  parameter=name)


def _per_request_uuids(
    request_id: str, mm_data: Mapping[str, Any], mm_uuids: MultiModalUUIDs | None,
) -> dict[str, list[str | None]]:
    """With every cache off, items are named ``{request_id}-{modality}-{index}`` instead of being
    content-hashed: nothing could hit, so hashing would be wasted work."""
    out: dict[str, list[str | None]] = {}
    for modality, data in mm_data.items():
        count = len(data) if isinstance(data, list) else 1
        given = (mm_uuids or {}).get(modality)
        given_list = [given] if isinstance(given, str) else list(given or [None] * count)
        out[modality] = [u if u is not None else f"{request_id}-{modality}-{i}" for i, u in enumerate(given_list)]
    return out


@dataclass
class PreparedRequest:
    """A request processed and checked but not yet committed to the P0 cache: what
    :meth:`InputProcessor.commit` turns into the ``EngineCoreRequest`` that is sent. It keeps its
    prepared inputs, so a resend after a P1 cache miss commits them again without reprocessing."""

    request_id: str
    inputs: MultiModalInputs
    params: SamplingParams
    options: RequestOptions
    arrival_time: float


class InputProcessor:
    """vLLM's ``InputProcessor`` over the :class:`ModelPipeline` of ``preprocessor``: builds
    ``EngineCoreRequest``s with vLLM's request-level checks, and is the commit step of the P0
    cache (see the module docstring for which methods are thread-safe)."""

    def __init__(self, preprocessor: InputPreprocessor, *, cache: BaseMultiModalProcessorCache | None = None) -> None:
        self.preprocessor = preprocessor
        self.pipeline = preprocessor.pipeline
        self.config = self.pipeline.config
        self.cache = cache if cache is not None else self.pipeline.cache
        """The P0 cache of this processor's engine (the pipeline's, unless :meth:`for_another_engine` made it)."""
        self.vocab_size = len(preprocessor.tokenizer)
        self.max_tokens_per_item = self.pipeline.processor.get_max_tokens_per_item()

    def for_another_engine(self) -> InputProcessor:
        """A processor for one more data-parallel rank: the same model and processing, its own
        P0 mirror (see :meth:`ModelPipeline.engine_cache`)."""
        return InputProcessor(self.preprocessor, cache=self.pipeline.engine_cache())

    def prepare(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> PreparedRequest:
        """Process and check one request without committing it (thread-safe)."""
        opts = RequestOptions.of(options, kwargs)
        if isinstance(prompt, Mapping) and prompt.get("type") == "multimodal":
            inputs: MultiModalInputs = prompt  # type: ignore[assignment]
        else:
            inputs = self.pipeline.prepare(prompt, opts, request_id, self.cache)
        self._validate(inputs)
        arrival = opts.arrival_time if opts.arrival_time is not None else time.time()
        return PreparedRequest(request_id, inputs, params or SamplingParams(), opts, arrival)

    def process_inputs(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> EngineCoreRequest:
        """One self-contained ``EngineCoreRequest``: every item carries its data unless a cache
        that P1 does not depend on already served it. The P0/P1 mirror is not touched; send
        requests through ``EngineClient`` to use it."""
        prepared = self.prepare(request_id, prompt, params, options=options, **kwargs)
        return self._build(prepared, commit(prepared.inputs, None))

    def commit(self, prepared: PreparedRequest) -> EngineCoreRequest:
        """Commit ``prepared`` to the P0 cache and build the request to send. Not thread-safe: the
        client calls it from one ordered lane, right before the transport, so the mirror's order
        is the order on the wire. Then exactly one of :meth:`take_stamp` (it is sent) and
        :meth:`take_mirror_only` (it is not) must follow."""
        return self._build(prepared, self.pipeline.commit(prepared.inputs, prepared.request_id, self.cache))

    @property
    def mirror(self) -> SenderMirror:
        return NULL_SENDER_MIRROR if self.cache is None else self.cache.mirror

    def take_stamp(self, request_id: str, *, keep: bool = False) -> MirrorStamp | None:
        """The stamp of ``request_id``'s commit, to send with it (``None``: it changed nothing);
        ``keep``: leave it issued until the send succeeded (see :meth:`take_mirror_only`)."""
        return self.mirror.take_stamp(request_id, keep=keep)

    def take_mirror_only(self, request_id: str) -> tuple[MirrorStamp, MirrorOnly] | None:
        """For a committed request that will not be sent after all: what P1 must replay."""
        return self.mirror.take_mirror_only(request_id)

    def invalidate(self, mm_hashes: Sequence[str]) -> None:
        """P1 lacks these items: the next commit sends their data."""
        if self.cache is not None:
            for mm_hash in mm_hashes:
                self.cache.invalidate(mm_hash)

    def reset_shadow(self, epoch: int | None = None) -> bool:
        """Clear the mirror's P0 shadow (a new epoch), if it is still in ``epoch`` (``None``: any)."""
        current = self.mirror.epoch
        if self.cache is None or current is None or (epoch is not None and current != epoch):
            return False
        self.cache.clear_cache()
        self.pipeline.stats.reset = True
        return True

    def request_finished(self, request_id: str, *, aborted: bool = False) -> None:
        """The request left the engine: what the P0 cache held for it (shm chunks) may be reused."""
        if self.cache is not None:
            if aborted:
                self.cache.on_request_aborted(request_id)
            else:
                self.cache.on_request_finished(request_id)

    def clear_cache(self) -> None:
        """The P0 half of vLLM's ``reset_mm_cache`` for this processor's engine: its cache and the
        pipeline's processor-only one."""
        if self.cache is not None and self.cache is not self.pipeline.cache:
            self.cache.clear_cache()
        self.pipeline.clear_cache()

    def _build(self, prepared: PreparedRequest, inputs: MultiModalInputs) -> EngineCoreRequest:
        opts = prepared.options
        return EngineCoreRequest(
            request_id=prepared.request_id,
            prompt_token_ids=inputs["prompt_token_ids"],
            mm_features=self.build_mm_features(inputs, opts.lora_request) or None,
            sampling_params=prepared.params,
            pooling_params=None,
            arrival_time=prepared.arrival_time,
            lora_request=opts.lora_request,
            cache_salt=opts.cache_salt,
            data_parallel_rank=opts.data_parallel_rank,
            priority=opts.priority,
        )

    def build_mm_features(
        self, inputs: MultiModalInputs, lora_request: LoRARequest | None = None,
    ) -> list[MultiModalFeatureSpec]:
        """One feature per item, in prompt order (:func:`~mmfront.processing.commit.placeholders_in_prompt_order`)."""
        hashes = inputs["mm_hashes"]
        for modality, values in hashes.items():
            if not all(isinstance(h, str) for h in values):
                raise InputTypeError(f"mm_hashes[{modality!r}] must contain only strings: an incorrect custom "
                                     "implementation of BaseMultiModalProcessor.apply.", parameter="mm_hashes")
        prefix = (f"{lora_request.lora_name}:" if lora_request is not None and self.config.enable_tower_connector_lora
                  else "")
        features = []
        for _, modality, i in placeholders_in_prompt_order(inputs["mm_placeholders"]):
            mm_hash = hashes[modality][i]
            features.append(MultiModalFeatureSpec(
                data=inputs["mm_kwargs"][modality][i], modality=modality, identifier=prefix + mm_hash,
                mm_position=inputs["mm_placeholders"][modality][i], mm_hash=mm_hash,
            ))
        return features

    def _validate(self, inputs: MultiModalInputs) -> None:
        ids = inputs["prompt_token_ids"]
        if not ids:
            raise ValidationError("The decoder prompt cannot be empty", parameter="prompt")
        max_len = self.config.max_model_len
        if max_len is not None and len(ids) >= max_len:
            if len(ids) > max_len:
                raise ValidationError(
                    f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of {max_len}. "
                    "Make sure that `max_model_len` is no smaller than the number of text tokens plus multimodal "
                    "tokens. For image inputs, the number of image tokens depends on the number of images, and "
                    "possibly their aspect ratios as well.", parameter="prompt")
            raise ValidationError(
                f"The decoder prompt (length {len(ids)}) is as long as the maximum model length of {max_len}, "
                "leaving no room for an output token.", parameter="prompt")
        budget = self.config.encoder_cache_size
        if budget is not None:
            budget = max([budget, *self.max_tokens_per_item.values()])
            for modality, ranges in inputs["mm_placeholders"].items():
                for r in ranges:
                    embeds = r.get_num_embeds()
                    if embeds > budget:
                        raise ValidationError(
                            f"The decoder prompt contains a(n) {modality} item with {embeds} embedding tokens, which "
                            f"exceeds the pre-allocated encoder cache size {budget}. Please reduce the input size or "
                            "increase the encoder cache size.", parameter=modality)
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValidationError(f"Token id {bad} is out of vocabulary (vocabulary size {self.vocab_size}).",
                                  parameter="prompt")
