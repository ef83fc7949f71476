"""A reference engine: a real HF model run on the ``EngineCoreRequest``s mmfront sends.

:class:`ModelRunner` loads a model folder with transformers and serves requests the way an
engine core does, so that what mmfront sends can be checked end to end against
``model.generate`` on the HF processor's outputs:

* each new item runs the model's own multimodal encoder (``get_image_features`` or the
  architecture's equivalent, as its model module declares in ``ModelSpec.reference``), batched per modality over every request admitted in a step, and
  the result is kept in an encoder cache keyed by the feature's ``identifier``, as vLLM keys its
  own; an item seen before is not encoded again;
* the encoder rows are scattered into the prompt embeddings at the ``is_embed`` positions of the
  item's placeholder range (every position when ``is_embed`` is ``None``);
* where the model numbers positions itself from its multimodal inputs (Qwen2-VL's M-RoPE), its
  module's ``ReferenceModel.positions`` gives the prompt's position ids and the offset of every
  decoded token, kept per request (the HF model keeps one offset for all);
* decoding is greedy with a KV cache per request (whatever the sampling parameters ask:
  ``mmfront worker`` refuses the requests that ask for more, :mod:`mmfront.engine.reference_limits`;
  ``max_tokens``, ``min_tokens`` (the stop tokens masked until then, as vLLM does),
  ``stop_token_ids`` and ``ignore_eos`` are honoured). A step
  prefills the requests added since the last step and decodes one token for every other running
  request. The decode runs per request: requests of different lengths would need their caches
  padded into one batch, which buys nothing on the tiny models this engine is for.

A request the model cannot serve (its placeholders do not match the encoder's output) finishes
with ``FinishReason.ERROR`` and a :class:`~mmfront.wire.structs.RequestError`; the engine and
the other requests carry on.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmfront.cache import CacheInfo, LRUCache
from mmfront.engine.input_norm import load_input_norm
from mmfront.errors import (
    ConfigError,
    FieldConfigError,
    MMFrontError,
    PromptUpdateError,
    UnsupportedModelError,
    ValidationError,
)
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, group_mm_kwargs_by_modality
from mmfront.models.catalog import model_specs, reference_model
from mmfront.wire.structs import EngineCoreOutput, EngineCoreRequest, FinishReason, RequestError

__all__ = ["ModelRunner", "error_output", "scatter_mm_embeddings"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def scatter_mm_embeddings(
    inputs_embeds: torch.Tensor, features: Sequence[MultiModalFeatureSpec], rows: Sequence[torch.Tensor],
) -> torch.Tensor:
    """Write each feature's encoder ``rows`` into ``inputs_embeds`` (``[prompt_len, hidden]``,
    in place) at its placeholder's embedding positions, in order; returns those positions' mask.

    Raises :class:`~mmfront.errors.PromptUpdateError` when a range leaves the prompt or its count of
    embedding positions differs from the item's rows: the prompt and the items disagree."""
    length = inputs_embeds.shape[0]
    is_mm = torch.zeros(length, dtype=torch.bool, device=inputs_embeds.device)
    for feature, emb in zip(features, rows, strict=True):
        pos = feature.mm_position
        if pos.offset < 0 or pos.offset + pos.length > length:
            raise PromptUpdateError(
                f"The placeholder of {feature.modality} item {feature.identifier!r} spans [{pos.offset}, "
                f"{pos.offset + pos.length}), outside the prompt of {length} tokens.", modality=feature.modality)
        span = torch.arange(pos.offset, pos.offset + pos.length, device=inputs_embeds.device)
        if pos.is_embed is not None:
            span = span[pos.is_embed.to(device=inputs_embeds.device, dtype=torch.bool)]
        if span.numel() != emb.shape[0]:
            raise PromptUpdateError(
                f"The placeholder of {feature.modality} item {feature.identifier!r} has {span.numel()} embedding "
                f"positions but its encoder output has {emb.shape[0]} rows: the prompt was not expanded for this "
                "item as processed.", modality=feature.modality, expected=emb.shape[0], found=span.numel())
        inputs_embeds[span] = emb.to(inputs_embeds.dtype)
        is_mm[span] = True
    return is_mm


@dataclass
class _Sequence:
    request_id: str
    prompt: list[int]
    features: list[MultiModalFeatureSpec]
    max_tokens: int
    min_tokens: int
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    output: list[int] = field(default_factory=list)
    cache: Any = None
    position_rows: int = 0
    """Rows of the position ids the model's ``positions`` gave the prompt (0: the model numbers them)."""
    position_offset: int = 0


class ModelRunner:
    """Greedy generation with a real HF model for ``EngineCoreRequest``s (see the module docstring).

    ``device`` defaults to CUDA when available, else the CPU; ``dtype`` (``"float32"``,
    ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``) defaults to the folder's ``config.json``.
    ``encoder_cache_bytes`` bounds the encoder cache. Not thread-safe: one engine loop drives it.
    """

    def __init__(self, model_dir: str | Path, *, device: str | torch.device | None = None,
                 dtype: str | torch.dtype | None = None, encoder_cache_bytes: int = 1 << 30) -> None:
        import transformers

        try:
            config = transformers.AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{str(model_dir)!r} is not a model folder ({exc}).") from exc
        reference = reference_model(config.model_type)
        if reference is None:
            runs = sorted(t for t, spec in model_specs().items() if spec.reference is not None)
            raise UnsupportedModelError(f"ModelRunner has no encoder for model type {config.model_type!r}; it runs "
                                        f"{runs} (a model module declares its ModelSpec.reference).")
        self._encoder, self._marks_token_types = reference.encode, reference.marks_token_types
        self._positions = reference.positions
        self._device_normalized = reference.device_normalized
        self._input_norm = load_input_norm(model_dir) if reference.device_normalized else None
        self.device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
        if isinstance(dtype, str) and dtype not in _DTYPES:
            raise ConfigError(f"dtype {dtype!r} is not one of {sorted(_DTYPES)}")
        load_dtype: Any = _DTYPES[dtype] if isinstance(dtype, str) else dtype or "auto"
        model_class = getattr(transformers, (config.architectures or [""])[0], None)
        if model_class is None:
            raise UnsupportedModelError(f"config.json of {str(model_dir)!r} names no transformers architecture "
                                        f"({config.architectures!r}).")
        try:
            model = model_class.from_pretrained(str(model_dir), dtype=load_dtype, local_files_only=True)
        except OSError as exc:
            raise ConfigError(f"Could not load weights from {str(model_dir)!r} ({exc}); the reference engine needs "
                              "the model's weights (model.safetensors) beside its config.json, as a checkpoint "
                              "ships them.") from exc
        self.model = model.to(self.device).eval()
        self.dtype: torch.dtype = self.model.dtype
        text_config = config.get_text_config()
        self.vocab_size: int = text_config.vocab_size
        self.max_model_len: int = text_config.max_position_embeddings
        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids = frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.2x
        self._keeps_logits = "logits_to_keep" in params
        self._encoder_cache: LRUCache[str, torch.Tensor] = LRUCache(encoder_cache_bytes)
        self._waiting: dict[str, _Sequence] = {}
        self._running: dict[str, _Sequence] = {}

    # --- requests ---------------------------------------------------------------------------

    def add(self, request: EngineCoreRequest) -> None:
        """Admit ``request``; its prefill runs in the next :meth:`step`. Every feature must carry
        its data or have been encoded before (the receiver fills cached items in first)."""
        rid = request.request_id
        if rid in self._waiting or rid in self._running:
            raise ValidationError(f"Request {rid!r} is already running; request ids must be unique.",
                                  parameter="request_id")
        self._waiting[rid] = self._sequence(request)

    def prefill_logits(self, request: EngineCoreRequest) -> torch.Tensor:
        """The logits of ``request``'s first generated token (``[vocab]``, float32, on the CPU),
        computed as its prefill computes them, without admitting it."""
        seq = self._sequence(request)
        with torch.inference_mode():
            encoded = self.encode(seq.features)
            logits = self._run_prompt(seq, [encoded[f.identifier] for f in seq.features])
        return logits.float().cpu()

    def _sequence(self, request: EngineCoreRequest) -> _Sequence:
        prompt = list(request.prompt_token_ids or [])
        if not prompt:
            raise ValidationError("The request has no prompt_token_ids; this engine takes token prompts only.",
                                  parameter="prompt_token_ids")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValidationError(f"A prompt token id is outside the model's vocabulary of {self.vocab_size}.",
                                  parameter="prompt_token_ids")
        room = self.max_model_len - len(prompt)
        if room <= 0:
            raise ValidationError(f"The prompt of {len(prompt)} tokens leaves no room in the model's "
                                  f"{self.max_model_len} positions.", parameter="prompt_token_ids")
        params = request.sampling_params
        if params is None:
            raise ValidationError("This engine generates: send sampling_params.", parameter="sampling_params")
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        return _Sequence(request.request_id, prompt, list(request.mm_features or []), max_tokens, params.min_tokens,
                         frozenset(params.stop_token_ids or ()), params.ignore_eos)

    def abort(self, request_id: str) -> bool:
        """Drop ``request_id`` and its KV cache; False when it is not here (finished or unknown)."""
        return (self._waiting.pop(request_id, None) or self._running.pop(request_id, None)) is not None

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def request_ids(self) -> list[str]:
        """Every request admitted and not finished: waiting for its prefill, then running."""
        return [*self._waiting, *self._running]

    def reset_encoder_cache(self) -> None:
        """Forget every encoder output (vLLM's ``reset_encoder_cache``: after a weight update)."""
        self._encoder_cache.clear()

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: True, there is nothing to drop. Each request keeps its own
        KV cache, which ends with it, and no block is shared between requests."""
        return True

    def step(self) -> list[EngineCoreOutput]:
        """Prefill the requests added since the last step (each gets its first token) and decode
        one token for every request already running; one output per request."""
        outputs: list[EngineCoreOutput] = []
        decoding = list(self._running.values())
        new, self._waiting = list(self._waiting.values()), {}
        with torch.inference_mode():
            encoded = self._encode_for(new, outputs)
            for seq in new:
                if seq.request_id in encoded:
                    outputs.append(self._prefill(seq, encoded[seq.request_id]))
            for seq in decoding:
                outputs.append(self._decode(seq))
        return outputs

    # --- the encoder ------------------------------------------------------------------------

    def encode(self, features: Sequence[MultiModalFeatureSpec]) -> dict[str, torch.Tensor]:
        """Each feature's encoder output (``[embeddings, hidden]``), by ``identifier``: cached ones
        from the encoder cache, the others encoded in one batch per modality run and cached."""
        out: dict[str, torch.Tensor] = {}
        missing: dict[str, MultiModalFeatureSpec] = {}
        for feature in features:
            key = feature.identifier
            if key in out or key in missing:
                continue
            cached = self._encoder_cache.get(key)
            if cached is not None:
                out[key] = cached
            else:
                missing[key] = feature
        if missing:
            with torch.inference_mode():
                for modality, group, kwargs in group_mm_kwargs_by_modality(list(missing.values()), device=self.device):
                    rows = self._run_encoder(modality, kwargs, group)
                    for feature, emb in zip(group, rows, strict=True):
                        out[feature.identifier] = emb
                        self._encoder_cache.put_if_fits(feature.identifier, emb, emb.nbytes)
        return out

    def encoder_cache_stats(self, *, delta: bool = False) -> CacheInfo:
        """Encoder-cache lookups and hits (cumulative, or since the previous ``delta=True`` call)."""
        return self._encoder_cache.stat(delta=delta)

    def _run_encoder(self, modality: str, kwargs: BatchedTensorInputs,
                     group: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
        """The encoder on one batch, floating inputs cast to the model's dtype and raw ``uint8``
        pixels normalised as vLLM's engine does. Items whose data the model cannot take (a missing
        key, a wrong shape) raise a typed error, so that only their requests fail."""
        cast = {k: self._engine_input(k, v) for k, v in kwargs.items()}
        try:
            return self._encoder(self.model, modality, cast, group)
        except MMFrontError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise FieldConfigError(f"The model's {modality} encoder cannot run on items "
                                   f"{[f.identifier for f in group]}: {type(exc).__name__}: {exc}") from exc

    def _engine_input(self, key: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.dtype == torch.uint8 and key in self._device_normalized:
            return value.to(self.dtype) if self._input_norm is None else self._input_norm(value, self.dtype)
        return value.to(self.dtype) if value.is_floating_point() else value

    def _encode_for(self, seqs: Iterable[_Sequence], outputs: list[EngineCoreOutput]) -> dict[str, list[torch.Tensor]]:
        """Every sequence's encoder rows, in feature order; a sequence whose items cannot be
        encoded finishes with an error output instead."""
        seqs = list(seqs)
        try:
            encoded = self.encode([f for seq in seqs for f in seq.features])
        except MMFrontError:
            encoded = None  # one request's bad items must not fail the others: encode each alone
        out: dict[str, list[torch.Tensor]] = {}
        for seq in seqs:
            try:
                mine = encoded if encoded is not None else self.encode(seq.features)
                out[seq.request_id] = [mine[f.identifier] for f in seq.features]
            except MMFrontError as exc:
                outputs.append(error_output(seq.request_id, exc))
        return out

    # --- the language model -----------------------------------------------------------------

    def _prefill(self, seq: _Sequence, rows: list[torch.Tensor]) -> EngineCoreOutput:
        try:
            logits = self._run_prompt(seq, rows)
        except MMFrontError as exc:
            return error_output(seq.request_id, exc)
        seq.features = []  # their data is in the KV cache now; do not hold it while decoding
        return self._append(seq, self._pick(seq, logits))

    def _run_prompt(self, seq: _Sequence, rows: list[torch.Tensor]) -> torch.Tensor:
        inputs_embeds = self.model.get_input_embeddings()(torch.tensor(seq.prompt, device=self.device))
        is_mm = scatter_mm_embeddings(inputs_embeds, seq.features, rows)
        extra: dict[str, Any] = {}
        if self._marks_token_types and seq.features:
            extra["token_type_ids"] = is_mm.long()[None]
        if self._positions is not None:
            position_ids, seq.position_offset = self._positions(self.model, seq.prompt, seq.features)
            seq.position_rows = position_ids.shape[0]
            extra["position_ids"] = position_ids
        return self._forward(seq, inputs_embeds[None], extra)

    def _decode(self, seq: _Sequence) -> EngineCoreOutput:
        ids = torch.tensor([[seq.output[-1]]], device=self.device)
        extra: dict[str, Any] = {}
        if seq.position_rows:
            position = len(seq.prompt) + len(seq.output) - 1 + seq.position_offset
            extra["position_ids"] = torch.full((seq.position_rows, 1, 1), position, device=self.device)
        return self._append(seq, self._pick(seq, self._forward(seq, self.model.get_input_embeddings()(ids), extra)))

    def _pick(self, seq: _Sequence, logits: torch.Tensor) -> int:
        """The likeliest token; before ``min_tokens``, the likeliest that does not stop the request
        (vLLM's ``MinTokensLogitsProcessor`` masks the EOS and stop token ids until then)."""
        if len(seq.output) < seq.min_tokens:
            stops = sorted(self.eos_token_ids | seq.stop_token_ids)
            if stops:
                logits = logits.clone()
                logits[stops] = float("-inf")
        return int(logits.argmax())

    def _forward(self, seq: _Sequence, inputs_embeds: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
        """One forward over ``inputs_embeds`` on top of ``seq``'s KV cache; the last position's logits."""
        if self._keeps_logits:
            extra["logits_to_keep"] = 1
        out = self.model(inputs_embeds=inputs_embeds, use_cache=True, **{self._cache_arg: seq.cache}, **extra)
        seq.cache = out[self._cache_arg]
        logits: torch.Tensor = out.logits[0, -1]
        return logits

    def _append(self, seq: _Sequence, token: int) -> EngineCoreOutput:
        """vLLM's stop rules, in its order: EOS, then stop token ids, then the length limit."""
        seq.output.append(token)
        reason: FinishReason | None = None
        stop_reason: int | None = None
        if len(seq.output) >= seq.min_tokens:
            if not seq.ignore_eos and token in self.eos_token_ids:
                reason = FinishReason.STOP
            elif token in seq.stop_token_ids:
                reason, stop_reason = FinishReason.STOP, token
        if reason is None and len(seq.output) >= seq.max_tokens:
            reason = FinishReason.LENGTH
        if reason is None:
            self._running[seq.request_id] = seq
        else:
            self._running.pop(seq.request_id, None)
        return EngineCoreOutput(seq.request_id, [token], finish_reason=reason, stop_reason=stop_reason)


def error_output(request_id: str, exc: MMFrontError) -> EngineCoreOutput:
    """The output that ends ``request_id`` alone with ``exc``: the other requests carry on. A
    request error's message names its field as vLLM's do, so the frontend can answer with it."""
    message = exc.vllm_message() if isinstance(exc, ValidationError) else str(exc)
    return EngineCoreOutput(request_id, [], finish_reason=FinishReason.ERROR,
                            error=RequestError(type(exc).__name__, message))
