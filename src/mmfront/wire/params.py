"""The per-request parameters of vLLM 0.33, field for field: sampling, pooling, LoRA.

They travel inside an ``EngineCoreRequest``, so their field names, order, defaults and struct
options are vLLM's: ``SamplingParams`` is a map with defaults omitted, ``PoolingParams`` and
``LoRARequest`` are positional arrays. ``SamplingParams.__post_init__`` normalises exactly as
vLLM's does (``stop`` becomes a list, greedy sampling resets ``top_p``/``top_k``/``min_p``, ...):
a stock engine runs the same normalisation again when it decodes, and both must land on the same
values, and mmfront's frames must be byte-identical to vLLM's for the same arguments.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec
import numpy as np

from mmfront.errors import ValidationError

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-5
_MAX_TEMP = 1e-2
DEFAULT_MAX_N_SEQUENCES = 16384
"""vLLM's ``VLLM_MAX_N_SEQUENCES`` default: most choices (``n``) one request may ask for, each an
engine request of its own; the environment variable of that name raises or lowers it, as in vLLM."""


def max_n_sequences() -> int:
    """The most choices (or beams) one request may ask for (``VLLM_MAX_N_SEQUENCES``)."""
    return int(os.environ.get("VLLM_MAX_N_SEQUENCES", DEFAULT_MAX_N_SEQUENCES))


class RequestOutputKind(Enum):
    """How often the frontend reports progress (encoded as the int value)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputsFields(msgspec.Struct):
    """A constraint (``json`` ... ``structural_tag``) and its options as a request states them:
    vLLM's ``StructuredOutputsParams`` less the two backend fields only its API server sets."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class StructuredOutputsParams(StructuredOutputsFields):
    """Exactly one constraint plus its options; a map on the wire with every field, the two backend
    fields the engine fills in included (a struct, not a dataclass, because msgspec leaves a
    dataclass's underscored fields out)."""

    _backend: str | None = None
    _backend_was_auto: bool = False

    def __post_init__(self) -> None:
        count = sum(getattr(self, name) is not None for name in _CONSTRAINTS)
        if count != 1:  # vLLM's words, which show every field
            fields = {name: getattr(self, name) for name in self.__struct_fields__}
            raise ValidationError(
                f"You can only use one kind of structured outputs constraint but multiple are specified: {fields}"
                if count else f"You must use one kind of structured outputs constraint but none are specified: {fields}")


@dataclass
class RepetitionDetectionParams:
    """Stop when an n-gram of ``min_pattern_size..max_pattern_size`` tokens repeats ``min_count``
    times (all 0: off)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        if self.max_pattern_size < 0 or self.min_pattern_size < 0 or self.min_pattern_size > self.max_pattern_size:
            raise ValidationError(
                "repetition_detection needs 0 <= min_pattern_size <= max_pattern_size (both 0 disable it).",
                parameter="repetition_detection",
            )
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValidationError(
                "repetition_detection.min_count must be at least 2 when max_pattern_size is set.",
                parameter="repetition_detection",
            )


class SamplingParams(msgspec.Struct, omit_defaults=True):
    """vLLM 0.33's sampling parameters, in its field order (a map on the wire, defaults omitted).

    Out-of-range values raise :class:`~mmfront.errors.ValidationError` naming the parameter, as
    vLLM's ``VLLMValidationError`` does; the underscored fields are the engine's own bookkeeping
    and travel like the others."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    watermarking: bool | None = None
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    prompt_logprob_token_ids: np.ndarray | None = None
    prompt_logprob_start: int | None = None
    logprob_token_ids: list[int] | None = None
    flat_logprobs: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stream_interval: int | None = None
    skip_clone: bool = False
    output_text_buffer_length: int = 0
    _eos_token_id: int | None = None
    _all_stop_token_ids: set[int] = msgspec.field(default_factory=set)
    _watermarking_skipped: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    _bad_words_token_ids: list[list[int]] | None = None
    skip_reading_prefix_cache: bool | None = None
    thinking_token_budget: int | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    routed_experts_prompt_start: int = 0
    trace_decode_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if 0 < self.temperature < _MAX_TEMP:
            logger.warning("temperature %s is below %s and was raised to it (vLLM does the same).",
                           self.temperature, _MAX_TEMP)
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        self.thinking_token_budget = _thinking_budget(self.thinking_token_budget)
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_token_ids = [] if self.stop_token_ids is None else list(dict.fromkeys(self.stop_token_ids))
        self.bad_words = [] if self.bad_words is None else list(dict.fromkeys(self.bad_words))
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1
        self._verify()
        if self.temperature < _SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            _check(self.n == 1, "n", f"n must be 1 when using greedy sampling, got {self.n}.")
        self._all_stop_token_ids.update(self.stop_token_ids)
        if self.skip_reading_prefix_cache is None:
            self.skip_reading_prefix_cache = (
                self.prompt_logprobs is not None or self.prompt_logprob_token_ids is not None)

    def __repr__(self) -> str:
        """vLLM's ``SamplingParams.__repr__`` (its request log prints it): these fields, in this order."""
        return (f"SamplingParams(n={self.n}, presence_penalty={self.presence_penalty}, "
                f"frequency_penalty={self.frequency_penalty}, repetition_penalty={self.repetition_penalty}, "
                f"temperature={self.temperature}, watermarking={self.watermarking}, top_p={self.top_p}, "
                f"top_k={self.top_k}, min_p={self.min_p}, seed={self.seed}, stop={self.stop}, "
                f"stop_token_ids={self.stop_token_ids}, bad_words={self.bad_words}, "
                f"thinking_token_budget={self.thinking_token_budget}, "
                f"include_stop_str_in_output={self.include_stop_str_in_output}, ignore_eos={self.ignore_eos}, "
                f"max_tokens={self.max_tokens}, min_tokens={self.min_tokens}, logprobs={self.logprobs}, "
                f"prompt_logprobs={self.prompt_logprobs}, skip_special_tokens={self.skip_special_tokens}, "
                f"spaces_between_special_tokens={self.spaces_between_special_tokens}, "
                f"structured_outputs={self.structured_outputs}, extra_args={self.extra_args})")

    def clone(self) -> SamplingParams:
        """vLLM's ``clone``: a deep copy, or a shallow one where ``skip_clone`` says these
        parameters were made for one request (the OpenAI server's are; a deep copy cost 67 us of
        each request's commit). The stop-token set, which :meth:`update_from_generation_config`
        adds to, is the copy's own either way."""
        if not self.skip_clone:
            return copy.deepcopy(self)
        twin = copy.copy(self)
        twin._all_stop_token_ids = set(self._all_stop_token_ids)
        return twin

    @property
    def is_greedy(self) -> bool:
        """Whether each token is the likeliest one (temperature 0: vLLM's ``SamplingType.GREEDY``)."""
        return self.temperature < _SAMPLING_EPS

    @property
    def all_stop_token_ids(self) -> frozenset[int]:
        """Every token id that ends the request: ``stop_token_ids`` and the model's end of
        sequence once :meth:`update_from_generation_config` added it (vLLM's property)."""
        return frozenset(self._all_stop_token_ids)

    def update_from_generation_config(self, generation_config: Mapping[str, Any], eos_token_id: int | None) -> None:
        """vLLM's rule for the model's end of sequence: the tokenizer's ``eos_token_id`` stops the
        request (unless ``ignore_eos``) and counts for ``min_tokens``; the generation config's
        other EOS ids join ``stop_token_ids``. vLLM's engine stops on these fields alone."""
        if not self.ignore_eos:
            self._eos_token_id = eos_token_id
        if eos_token_id is not None:
            self._all_stop_token_ids.add(eos_token_id)
        configured = generation_config.get("eos_token_id")
        if configured is None:
            return
        extra = {configured} if isinstance(configured, int) else set(configured)
        extra.discard(eos_token_id)
        if extra:
            self._all_stop_token_ids.update(extra)
            if not self.ignore_eos:  # built as vLLM builds it, so the list's order is vLLM's too
                extra.update(self.stop_token_ids or ())
                self.stop_token_ids = list(extra)

    def _verify(self) -> None:
        """vLLM's ``_verify_args``: its checks in its order, in its words, with the value where
        vLLM's error carries one. Every error names its field (vLLM's name none for the
        penalties, ``top_k``, ``min_p``, ``min_tokens``, ``stop`` and ``bad_words``:
        docs/serving.md, "Differences")."""
        _check(self.n >= 1, "n", f"n must be at least 1, got {self.n}.")
        _check(self.n <= (most := max_n_sequences()), "n", f"n must be at most {most}, got {self.n}. To increase "
               "this limit, set the VLLM_MAX_N_SEQUENCES environment variable.")
        if self.extra_args:
            _check(_ints_fit(self.extra_args), "extra_args", "extra_args integers must be between -2**63 and 2**64 - 1.")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
               f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
               f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        _check(math.isfinite(self.repetition_penalty), "repetition_penalty",
               f"repetition_penalty must be a finite number, got {self.repetition_penalty}.")
        _check(self.repetition_penalty > 0.0, "repetition_penalty",
               f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        temperature = self.temperature
        _check(math.isfinite(temperature), "temperature", f"temperature must be a finite number, got {temperature}.",
               temperature)
        _check(temperature >= 0.0, "temperature", f"temperature must be non-negative, got {temperature}.", temperature)
        _check(temperature <= 2.0, "temperature", f"temperature must be in [0, 2], got {temperature}.", temperature)
        _check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p}.", self.top_p)
        _check(self.top_k >= -1, "top_k", f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {self.min_p}.")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens",
               f"max_tokens must be at least 1, got {self.max_tokens}.", self.max_tokens)
        _check(self.min_tokens >= 0, "min_tokens",
               f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}.")
        _check(self.stream_interval is None or self.stream_interval >= 1, "stream_interval",
               f"stream_interval must be at least 1, got {self.stream_interval}.", self.stream_interval)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or value >= -1, name, f"{name} must be non-negative or -1, got {value}.", value)
        assert isinstance(self.stop, list)
        _check(all(self.stop), "stop", "stop cannot contain an empty string.")
        _check(not self.stop or self.detokenize, "stop",
               "stop strings are only supported when detokenize is True. Set detokenize=True to use stop.")
        _check(all(self.bad_words or ()), "bad_words",
               f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}")


def _check(ok: bool, parameter: str, message: str, value: object = None) -> None:
    if not ok:
        raise ValidationError(message, parameter=parameter, value=value)


def _thinking_budget(value: Any) -> int | None:
    """-1 and None mean unlimited; anything else must be a non-negative int."""
    if value is None or (type(value) is int and value == -1):
        return None
    _check(type(value) is int and value >= 0, "thinking_token_budget",
           f"thinking_token_budget must be a non-negative integer or -1 (unlimited), got {value!r}.")
    return int(value)


def _ints_fit(value: Any) -> bool:
    """Whether every int in a JSON-like tree fits msgpack's 64 bits (iterative: no recursion limit)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, int) and not -(2**63) <= item < 2**64:
            return False
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return True


class LateInteractionParams(msgspec.Struct, omit_defaults=True, array_like=True):
    mode: str
    query_key: str
    query_uses: int | None = None


class LateChunkingParams(msgspec.Struct, omit_defaults=True, array_like=True):
    chunk_size: int


class PoolingParams(msgspec.Struct, omit_defaults=True, array_like=True):
    """vLLM 0.33's pooling parameters (a positional array); mmfront only carries them."""

    use_activation: bool | None = None
    dimensions: int | None = None
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None
    task: str | None = None
    requires_token_ids: bool = False
    skip_reading_prefix_cache: bool | None = None
    late_interaction_params: LateInteractionParams | None = None
    extra_kwargs: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY
    late_chunking_params: LateChunkingParams | None = None


class LoRARequest(msgspec.Struct, omit_defaults=True, array_like=True):
    """A LoRA adapter (a positional array). vLLM's engine also requires a non-empty
    ``lora_path`` when it decodes one; ``lora_name`` enters the prefix-cache keys."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False

    def __post_init__(self) -> None:
        _check(self.lora_int_id >= 1, "lora_request", f"lora_int_id must be at least 1, got {self.lora_int_id}.")


__all__ = [
    "DEFAULT_MAX_N_SEQUENCES",
    "LateChunkingParams",
    "LateInteractionParams",
    "LoRARequest",
    "PoolingParams",
    "RepetitionDetectionParams",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsFields",
    "StructuredOutputsParams",
    "max_n_sequences",
]
