"""One model's multimodal path: the processor, the P0 caches, the media connector, the cache
statistics and the item executor (the processing lanes), and the one place requests are prepared
and committed.

Preparing a request only *reads* the P0 cache. The caches P1 depends on (the mirrored LRU, shared
memory) change only when a request is committed, and a request is committed only by the step
that hands it to the transport (``InputProcessor.commit``, run by
``mmfront.engine.client.EngineClient`` in its ordered lane). So a request that is processed and
never sent leaves no trace.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any

from mmfront.cache.base import BaseMultiModalProcessorCache
from mmfront.cache.factory import processor_cache_from_config, processor_only_cache_from_config
from mmfront.cache.stats import MultiModalCacheStats
from mmfront.chat import parse_chat_messages
from mmfront.config import MultiModalConfig
from mmfront.errors import ConfigError, InputTypeError, MMFrontError, ValidationError, resource_error
from mmfront.hashing import scope_uuids
from mmfront.inputs import MultiModalInputs
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.preprocess.options import PromptInput, RequestOptions, from_prompt_dict, is_chat, refuse_chat_options
from mmfront.preprocess.truncation import added_special_tokens, truncate_prompt
from mmfront.processing.commit import PreparedInputs, commit, pending_commit
from mmfront.processing.executors import InPlaceExecutor, ItemExecutor, executor_from_config
from mmfront.processing.hf import unknown_hf_kwargs
from mmfront.processing.processor import BaseMultiModalProcessor, MultiModalUUIDs
from mmfront.processing.threads import ThreadPlan, apply_thread_plan
from mmfront.timing import stage


class ModelPipeline:
    """The frontend's multimodal path for one model: owns the processor, the P0 caches, the media
    connector, the cache statistics and the item executor (the processing lanes), and is the one
    place requests are prepared and committed.
    :class:`~mmfront.preprocess.preprocessor.InputPreprocessor` and
    :class:`~mmfront.preprocess.input_processor.InputProcessor` are vLLM's faces of it."""

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
        self.threads = ThreadPlan.from_config(self.config, in_place_misses=self.processor.in_place_misses)
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
        """A P0 cache for one more engine rank: each rank's P1 cache mirrors its own P0 cache, so
        a mirrored cache is per rank, while a processor-only one (P1 does not depend on it) is
        shared."""
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
        self.stats.record_request(cache, counted=pending.first_commit.take())
        return committed

    def _prepare(
        self, prompt: PromptInput, opts: RequestOptions, request_id: str, cache: BaseMultiModalProcessorCache | None,
    ) -> PreparedInputs:
        if isinstance(prompt, Mapping):
            prompt, opts = from_prompt_dict(prompt, opts)
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
        if not is_chat(prompt):
            refuse_chat_options(opts)
        if is_chat(prompt):
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
            add_special_tokens = False if opts.add_special_tokens is None else opts.add_special_tokens
        elif isinstance(prompt, str):
            text, add_special_tokens = prompt, opts.add_special_tokens is not False
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            text, add_special_tokens = list(prompt), False  # type: ignore[arg-type]
        else:
            raise InputTypeError("prompt must be a string, a list of token ids, a list of chat messages or a vLLM "
                                 f"prompt dict; got {type(prompt).__name__}.", parameter="prompt")
        if mm_data and not self.config.needs_content_hashes:
            mm_uuids = _per_request_uuids(request_id, mm_data, mm_uuids)
        elif mm_uuids:
            mm_uuids = scope_uuids(mm_uuids, opts.cache_salt)
        prepared = self.processor.prepare(
            text, mm_data, mm_uuids=mm_uuids, hf_processor_mm_kwargs=opts.hf_processor_mm_kwargs,
            media_io_kwargs=opts.media_io_kwargs, cache=cache, add_special_tokens=add_special_tokens,
            executor=self.item_executor,
        )
        truncation = opts.truncation
        if truncation is None or len(prepared["prompt_token_ids"]) <= truncation.tokens:
            return prepared
        added = (0, 0)
        if isinstance(text, str) and add_special_tokens and truncation.side is None and not prepared["mm_placeholders"]:
            plain = list(self.processor.info.tokenizer.encode(text, add_special_tokens=False))
            added = added_special_tokens(prepared["prompt_token_ids"], plain)
        return truncate_prompt(prepared, truncation, added_specials=added)  # type: ignore[return-value]

    # --- lifecycle ------------------------------------------------------------------------------

    def warmup(self) -> None:
        """Run one largest dummy item per supported modality through the HF processor, as vLLM's
        renderer does at start-up, so the first real request finds the HF processor and torch
        warm: where misses are processed (a lane warms itself and keeps the outputs to itself), and
        through no cache, so the P0/P1 mirror is untouched."""
        counts = {m: 1 for m, limit in self.processor.info.allowed_mm_limits.items() if limit > 0}
        if counts:
            self.item_executor.warm_up(counts, self.processor)

    def clear_cache(self) -> None:
        """Reset the P0 caches (vLLM's ``reset_mm_cache``); P1 must be reset alongside it (the
        mirrored cache starts a new epoch, which tells P1 with the next request)."""
        for cache in (self.cache, self.tokenize_only_cache):
            if cache is not None:
                cache.clear_cache()
        self.stats.reset = True


def _unknown_hf_kwargs(processor: BaseMultiModalProcessor, kwargs: Mapping[str, Any], name: str) -> str | None:
    """Why ``kwargs`` is refused, or None. A kwarg no sub-processor takes would be dropped (vLLM
    drops it with a warning), so a typo such as ``do_pan_and_scn`` would silently change nothing."""
    unknown, accepted = unknown_hf_kwargs(processor.info.hf_processor, kwargs)
    if not unknown:
        return None
    return (f"{name} has key(s) {unknown} that {type(processor.info.hf_processor).__name__} does not accept. "
            f"Accepted: {', '.join(accepted)}.")


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
