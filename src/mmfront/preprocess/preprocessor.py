"""vLLM's ``InputPreprocessor``: a chat conversation, a prompt string, token ids or a vLLM prompt
dict, plus multimodal data, in; vLLM's ``MultiModalInputs`` out, prepared by a
:class:`~mmfront.preprocess.pipeline.ModelPipeline`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mmfront.cache.base import BaseMultiModalProcessorCache
from mmfront.cache.stats import MultiModalCacheStats
from mmfront.config import MultiModalConfig
from mmfront.inputs import MultiModalInputs
from mmfront.media import MediaConnector
from mmfront.preprocess.options import PromptInput, RequestOptions
from mmfront.preprocess.pipeline import ModelPipeline
from mmfront.processing.executors import ItemExecutor
from mmfront.processing.processor import BaseMultiModalProcessor


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
