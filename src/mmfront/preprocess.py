"""Requests in, processed inputs and ``EngineCoreRequest``s out.

:class:`InputPreprocessor` takes a chat conversation, a prompt string, or token ids plus
multimodal data, and returns vLLM's ``MultiModalInputs``. :class:`InputProcessor` adds the
request-level checks of vLLM's ``InputProcessor`` (empty prompt, model length, encoder budget,
vocabulary) and flattens the items into ``MultiModalFeatureSpec``s sorted by placeholder offset.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmfront.cache.base import BaseMultiModalProcessorCache
from mmfront.cache.factory import processor_cache_from_config, processor_only_cache_from_config
from mmfront.cache.stats import MultiModalCacheStats
from mmfront.chat import parse_chat_messages
from mmfront.config import MultiModalConfig
from mmfront.errors import InputTypeError, ValidationError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalInputs
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.processing.dummy import BaseDummyInputsBuilder
from mmfront.processing.processor import BaseMultiModalProcessor, MultiModalUUIDs
from mmfront.wire import EngineCoreRequest, LoRARequest, SamplingParams

PromptInput = str | Sequence[int] | Sequence[Mapping[str, Any]]
"""A prompt string, token ids, or a list of OpenAI chat messages."""


def _is_chat(prompt: object) -> bool:
    return isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)) and len(prompt) > 0 \
        and all(isinstance(m, Mapping) for m in prompt)


class InputPreprocessor:
    """The frontend's multimodal path for one model: owns the processor, the P0 cache, the media
    connector and the cache statistics."""

    def __init__(
        self, model: str | Path | Any, config: MultiModalConfig | None = None, *, model_id: str | None = None,
        processor: BaseMultiModalProcessor | None = None,
    ) -> None:
        self.config = config or MultiModalConfig()
        self.processor = processor or create_processor(model, self.config, model_id=model_id)
        self.cache: BaseMultiModalProcessorCache | None = processor_cache_from_config(self.config)
        self.tokenize_only_cache = processor_only_cache_from_config(self.config)
        self.connector = MediaConnector(self.config)
        self.stats = MultiModalCacheStats()
        self._request_counter = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.processor.info.tokenizer

    def preprocess(
        self,
        prompt: PromptInput,
        mm_data: Mapping[str, Any] | None = None,
        *,
        mm_uuids: MultiModalUUIDs | None = None,
        hf_processor_mm_kwargs: Mapping[str, Any] | None = None,
        media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        skip_mm_cache: bool = False,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> MultiModalInputs:
        """Process one request. Chat messages carry their media as content parts; a string or
        token-id prompt takes ``mm_data``. ``skip_mm_cache`` (warm-up, tokenize-only requests) uses
        a separate processor-only cache so the P0/P1 mirror is never disturbed."""
        request_id = request_id or f"mmfront-{next(self._request_counter)}"
        if _is_chat(prompt):
            if mm_data:
                raise InputTypeError("Chat messages carry their media as content parts; do not pass mm_data too.")
            chat = parse_chat_messages(
                prompt, self.processor, self.connector,  # type: ignore[arg-type]
                budget=DecodeBudget(self.config.max_media_request_decode_bytes), media_io_kwargs=media_io_kwargs,
                add_generation_prompt=add_generation_prompt, chat_template=chat_template,
                chat_template_kwargs=chat_template_kwargs,
            )
            text: str | list[int] = chat.prompt
            mm_data, mm_uuids = chat.mm_data, chat.mm_uuids
            add_special_tokens = False  # the template writes BOS itself
        elif isinstance(prompt, str):
            text, add_special_tokens = prompt, True
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            text, add_special_tokens = list(prompt), False  # type: ignore[arg-type]
        else:
            raise InputTypeError("prompt must be a string, a list of token ids, or a list of chat messages; got "
                                 f"{type(prompt).__name__}.")
        cache = self.tokenize_only_cache if skip_mm_cache else self.cache
        if cache is not None:
            cache.begin_request(request_id)
        if mm_data and cache is None and not self.config.enable_prefix_caching:
            mm_uuids = _per_request_uuids(request_id, mm_data, mm_uuids)
        out = self.processor.apply(
            text, mm_data, mm_uuids=mm_uuids, hf_processor_mm_kwargs=hf_processor_mm_kwargs,
            media_io_kwargs=media_io_kwargs, cache=cache, add_special_tokens=add_special_tokens,
        )
        if cache is not None and out["mm_hashes"]:
            delta = cache.make_stats(delta=True)
            self.stats.record(delta.total, delta.hits)
        return out

    def warmup(self) -> None:
        """Run one largest dummy item per supported modality, as vLLM's renderer does at start-up,
        so the first real request finds the HF processor and torch warm. It goes through the
        processor-only cache (never the P0/P1 mirror), which is cleared afterwards."""
        counts = {m: 1 for m, limit in self.processor.info.allowed_mm_limits.items() if limit > 0}
        if not counts:
            return
        ids, data = BaseDummyInputsBuilder(self.processor).get_dummy_processor_inputs(
            counts, self.config.limit_mm_per_prompt)
        self.processor.apply(ids, data, cache=self.tokenize_only_cache)
        if self.tokenize_only_cache is not None:
            self.tokenize_only_cache.clear_cache()

    def clear_cache(self) -> None:
        """Reset the P0 cache (vLLM's ``reset_mm_cache``); P1 must be reset alongside it."""
        for cache in (self.cache, self.tokenize_only_cache):
            if cache is not None:
                cache.clear_cache()
        self.stats.reset = True


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


class InputProcessor:
    """Builds ``EngineCoreRequest``s with vLLM's request-level checks."""

    def __init__(self, preprocessor: InputPreprocessor) -> None:
        self.preprocessor = preprocessor
        self.config = preprocessor.config
        tokenizer = preprocessor.tokenizer
        self.vocab_size = len(tokenizer)
        self.max_tokens_per_item = preprocessor.processor.get_max_tokens_per_item()

    def process_inputs(
        self,
        request_id: str,
        prompt: PromptInput | MultiModalInputs,
        params: SamplingParams | None = None,
        *,
        mm_data: Mapping[str, Any] | None = None,
        mm_uuids: MultiModalUUIDs | None = None,
        hf_processor_mm_kwargs: Mapping[str, Any] | None = None,
        media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> EngineCoreRequest:
        if isinstance(prompt, Mapping):
            if prompt.get("type") != "multimodal":
                raise InputTypeError("A mapping prompt must be a MultiModalInputs returned by InputPreprocessor.")
            inputs = prompt
        else:
            inputs = self.preprocessor.preprocess(
                prompt, mm_data, mm_uuids=mm_uuids, hf_processor_mm_kwargs=hf_processor_mm_kwargs,
                media_io_kwargs=media_io_kwargs, request_id=request_id,
            )
        self._validate(inputs)
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=inputs["prompt_token_ids"],
            mm_features=self.build_mm_features(inputs, lora_request) or None,
            sampling_params=params or SamplingParams(),
            pooling_params=None,
            arrival_time=arrival_time if arrival_time is not None else time.time(),
            lora_request=lora_request,
            cache_salt=cache_salt,
            data_parallel_rank=data_parallel_rank,
            priority=priority,
        )

    def build_mm_features(
        self, inputs: MultiModalInputs, lora_request: LoRARequest | None = None,
    ) -> list[MultiModalFeatureSpec]:
        """One feature per item, sorted by placeholder offset (stable: ties keep modality, then
        item order)."""
        hashes = inputs["mm_hashes"]
        for modality, values in hashes.items():
            if not all(isinstance(h, str) for h in values):
                raise InputTypeError(f"mm_hashes[{modality!r}] must contain only strings: an incorrect custom "
                                     "implementation of BaseMultiModalProcessor.apply.")
        flat = [(r.offset, m, i) for m, ranges in inputs["mm_placeholders"].items() for i, r in enumerate(ranges)]
        flat.sort(key=lambda x: x[0])
        prefix = (f"{lora_request.lora_name}:" if lora_request is not None and self.config.enable_tower_connector_lora
                  else "")
        features = []
        for _, modality, i in flat:
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
