"""vLLM's ``InputProcessor``: prepared inputs become ``EngineCoreRequest``s, after vLLM's
request-level checks (empty prompt, context length, encoder budget, vocabulary), with the items
flattened into ``MultiModalFeatureSpec``s sorted by placeholder offset. It is also the commit step
of the P0 cache: :meth:`InputProcessor.commit` runs in the engine client's ordered lane, right
before the transport, so the mirror changes in the order requests go on the wire.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mmfront.cache.base import NULL_SENDER_MIRROR, BaseMultiModalProcessorCache, SenderMirror
from mmfront.errors import InputTypeError, ValidationError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalInputs, is_processed, placeholders_in_prompt_order
from mmfront.preprocess.context_length import check_context_length
from mmfront.preprocess.options import PromptInput, RequestOptions
from mmfront.preprocess.preprocessor import InputPreprocessor
from mmfront.processing.commit import commit
from mmfront.wire import EngineCoreRequest, LoRARequest, SamplingParams
from mmfront.wire.messages import MirrorOnly, MirrorStamp


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
    """vLLM's ``InputProcessor`` over the ``ModelPipeline`` of ``preprocessor``: builds
    ``EngineCoreRequest``s with vLLM's request-level checks, and is the commit step of the P0
    cache (see :mod:`mmfront.preprocess` for which methods are thread-safe)."""

    def __init__(self, preprocessor: InputPreprocessor, *, cache: BaseMultiModalProcessorCache | None = None) -> None:
        self.preprocessor = preprocessor
        self.pipeline = preprocessor.pipeline
        self.config = self.pipeline.config
        self.cache = cache if cache is not None else self.pipeline.cache
        """The P0 cache of the engine this processor's requests go to (the pipeline's, unless
        :meth:`for_another_engine` made this processor)."""
        self.vocab_size = len(preprocessor.tokenizer)
        self.max_tokens_per_item = self.pipeline.processor.get_max_tokens_per_item()

    def for_another_engine(self) -> InputProcessor:
        """A processor for one more data-parallel rank: the same model and processing, its own
        P0 mirror (see :meth:`~mmfront.preprocess.pipeline.ModelPipeline.engine_cache`)."""
        return InputProcessor(self.preprocessor, cache=self.pipeline.engine_cache())

    def prepare(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> PreparedRequest:
        """Process and check one request without committing it (thread-safe)."""
        opts = RequestOptions.of(options, kwargs)
        if is_processed(prompt):
            inputs: MultiModalInputs = prompt
        else:
            inputs = self.pipeline.prepare(prompt, opts, request_id, self.cache)
        self._validate(inputs, params)
        arrival = opts.arrival_time if opts.arrival_time is not None else time.time()
        return PreparedRequest(request_id, inputs, self._engine_params(params), opts, arrival)

    def _engine_params(self, params: SamplingParams | None) -> SamplingParams:
        """A copy of ``params`` with the model's end of sequence, as vLLM's input processor sends
        them: its engine stops a request on ``_eos_token_id`` and ``stop_token_ids`` alone."""
        engine_params = params.clone() if params is not None else SamplingParams()
        engine_params.update_from_generation_config(self.pipeline.processor.info.get_generation_config_fields(),
                                                    self.preprocessor.tokenizer.eos_token_id)
        return engine_params

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
            session_id=opts.session_id,
        )

    def build_mm_features(
        self, inputs: MultiModalInputs, lora_request: LoRARequest | None = None,
    ) -> list[MultiModalFeatureSpec]:
        """One feature per item, in prompt order (:func:`~mmfront.inputs.placeholders_in_prompt_order`)."""
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

    def _validate(self, inputs: MultiModalInputs, params: SamplingParams | None) -> None:
        ids = inputs["prompt_token_ids"]
        if not ids:
            raise ValidationError("The decoder prompt cannot be empty")  # vLLM's words, no param
        check_context_length(self.config.max_model_len, None if params is None else params.max_tokens, len(ids))
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
