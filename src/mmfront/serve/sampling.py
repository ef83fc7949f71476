"""A request's engine ``SamplingParams``, made as vLLM's ``to_sampling_params`` makes them (unset
fields take vLLM's defaults), and the checks vLLM's API server makes of them once the model is
known: ``--max-logprobs``, token ids against the vocabulary, ``bad_words`` into token ids, a
structured-outputs constraint parsed by its backend, the fields the prompt's length bounds.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec

from mmfront.errors import ValidationError
from mmfront.serve import structured
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.wire import RequestOutputKind, SamplingParams
from mmfront.wire.params import StructuredOutputsParams

logger = logging.getLogger(__name__)


def sampling_params(request: ChatCompletionRequest | CompletionRequest, max_tokens: int | None) -> SamplingParams:
    """vLLM's ``to_sampling_params``: unset fields take vLLM's defaults; a value out of range raises
    :class:`~mmfront.errors.ValidationError` naming it."""
    prompt_logprobs = request.prompt_logprobs
    if isinstance(request, ChatCompletionRequest):
        logprobs = request.top_logprobs if request.logprobs and not request.logprob_token_ids else None
        if prompt_logprobs is None and request.echo:
            prompt_logprobs = request.top_logprobs
    else:
        logprobs = None if request.logprob_token_ids else request.logprobs
        if prompt_logprobs is None and request.echo:
            prompt_logprobs = request.logprobs
        if request.echo and request.max_tokens == 0:  # the prompt alone: one token generated, not shown
            max_tokens = 1
    if request.watermarking:
        _warn_no_watermarking()
    try:
        return _sampling_params(request, max_tokens, logprobs, prompt_logprobs)
    except ValidationError as e:
        if e.value is None:  # vLLM's message shows the value the request sent
            e.value = msgspec.structs.asdict(request).get(e.parameter or "")
        raise


@cache
def _warn_no_watermarking() -> None:
    logger.warning("Watermarking is enabled for this request, but the engine has no watermark configuration. This and "
                   "subsequent requests will run without watermarking (as vLLM's).")


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _sampling_params(request: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
                     logprobs: int | None, prompt_logprobs: int | None) -> SamplingParams:
    return SamplingParams(
        n=_pick(request.n, 1),
        presence_penalty=_pick(request.presence_penalty, 0.0),
        frequency_penalty=_pick(request.frequency_penalty, 0.0),
        repetition_penalty=_pick(request.repetition_penalty, 1.0),
        temperature=_pick(request.temperature, 1.0),
        top_p=_pick(request.top_p, 1.0),
        top_k=_pick(request.top_k, 0),
        min_p=_pick(request.min_p, 0.0),
        seed=request.seed,
        stop=request.stop,
        stop_token_ids=request.stop_token_ids,
        ignore_eos=request.ignore_eos,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logprob_token_ids=request.logprob_token_ids or None,
        skip_special_tokens=_pick(request.skip_special_tokens, True),
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured_outputs(request),
        logit_bias=_logit_bias(request.logit_bias),
        allowed_token_ids=request.allowed_token_ids,
        bad_words=request.bad_words,
        extra_args=_extra_args(request),
        repetition_detection=request.repetition_detection,
        routed_experts_prompt_start=request.routed_experts_prompt_start,
        stream_interval=request.stream_interval,
        skip_clone=True,
    )


def structured_outputs(request: ChatCompletionRequest | CompletionRequest) -> StructuredOutputsParams | None:
    """The request's one constraint: ``structured_outputs`` with ``response_format`` applied
    over it (vLLM's ``extract_structured_outputs``)."""
    given = request.structured_outputs
    params = None if given is None else StructuredOutputsParams(
        **{name: getattr(given, name) for name in structured.PUBLIC_FIELDS})
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return params
    if response_format.type == "json_object":
        overrides: dict[str, Any] = {"json_object": True}
    elif response_format.type == "json_schema":
        assert response_format.json_schema is not None  # check_request refused it
        overrides = {"json": response_format.json_schema.schema}
    else:
        overrides = {"structural_tag": response_format.structural_tag()}
    if params is None:
        return StructuredOutputsParams(**overrides)
    return StructuredOutputsParams(**{**{name: getattr(params, name) for name in structured.PUBLIC_FIELDS},
                                      **overrides})


def _extra_args(request: ChatCompletionRequest | CompletionRequest) -> dict[str, Any] | None:
    """vLLM's ``extra_args``: ``vllm_xargs``, and the KV and encoder-cache transfer parameters."""
    extra: dict[str, Any] = dict(request.vllm_xargs or {})
    if request.kv_transfer_params:
        extra["kv_transfer_params"] = request.kv_transfer_params
    if request.ec_transfer_params:
        extra["ec_transfer_params"] = request.ec_transfer_params
    return extra or None


def _logit_bias(logit_bias: dict[str, Any] | None) -> dict[int, float] | None:
    """vLLM's ``SamplingParams.from_optional``: keys read as token ids, biases clamped to ±100."""
    if logit_bias is None:
        return None
    converted: dict[int, float] = {}
    invalid: list[str] = []
    for token, bias in logit_bias.items():
        try:
            converted[int(token)] = min(100.0, max(-100.0, float(bias)))
        except ValueError:
            invalid.append(token)
    if invalid:
        raise ValidationError(f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}",
                              parameter="logit_bias", value=invalid)
    return converted


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters of choice ``index`` of an ``n``-choice request, sent as its own engine
    request (vLLM's ``ParentRequest``): ``n`` 1, and a seed of its own when one is set."""
    seed = None if params.seed is None else params.seed + index
    return msgspec.structs.replace(params, n=1, seed=seed)


MAX_LOGPROB_TOKEN_IDS = 128
"""Most ``logprob_token_ids`` one request may name (vLLM's ``MAX_LOGPROB_TOKEN_IDS``, the width
its sampler allocates per request)."""


def check_logprobs(params: SamplingParams, max_logprobs: int, vocab_size: int) -> None:
    """vLLM's ``--max-logprobs`` limit and ``logprob_token_ids`` checks, which its API server
    applies before anything runs, in its order."""
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    _check_count(params.logprobs, "logprobs", "sample", limit, vocab_size)
    if (ids := params.logprob_token_ids) is not None:
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise ValidationError(f"Requested logprob_token_ids of length {len(ids)}, which is greater than max "
                                  f"allowed: {MAX_LOGPROB_TOKEN_IDS}", parameter="logprob_token_ids", value=len(ids))
        outside = [t for t in ids if t < 0 or t >= vocab_size]
        if outside:
            raise ValidationError(f"token_id(s) {outside} in logprob_token_ids contain out-of-vocab token ids. "
                                  f"Vocabulary size: {vocab_size}", parameter="logprob_token_ids", value=outside)
    _check_count(params.prompt_logprobs, "prompt_logprobs", "prompt", limit, vocab_size)


def _check_count(asked: int | None, field: str, what: str, limit: int, vocab_size: int) -> None:
    if asked:
        asked = vocab_size if asked == -1 else asked
        if asked > limit:
            raise ValidationError(f"Requested {what} logprobs of {asked}, which is greater than max allowed: {limit}",
                                  parameter=field, value=asked)


@dataclass(frozen=True)
class Vocabulary:
    """What a request's token ids and words are checked against."""

    tokenizer: Any
    vocab_size: int
    """The model's (its config's ``vocab_size``, the width of its logits, as vLLM's
    ``get_vocab_size``), often above the tokenizer's length."""
    max_token_id: int
    """The tokenizer's largest id (vLLM's ``max_token_id``)."""

    @classmethod
    def of(cls, tokenizer: Any, vocab_size: int) -> Vocabulary:
        max_token_id = max(tokenizer.get_vocab().values())
        with contextlib.suppress(NotImplementedError, AttributeError):
            max_token_id = max(max_token_id, tokenizer.vocab_size - 1)
        return cls(tokenizer, vocab_size, max_token_id)

    @property
    def fast(self) -> bool:
        """Whether llguidance can read the tokenizer (a Rust-backed one)."""
        return bool(getattr(self.tokenizer, "is_fast", False))


MAX_NUM_BAD_WORDS = 128
"""Most token sequences ``bad_words`` may become (vLLM's ``VLLM_MAX_NUM_BAD_WORDS``)."""


def verify_params(params: SamplingParams, vocabulary: Vocabulary, *, structured_outputs_backend: str = "auto") -> None:
    """vLLM's ``SamplingParams.verify`` and ``update_from_tokenizer`` in its API server (after
    ``--max-logprobs``: :func:`check_logprobs`): token ids must be in the model's vocabulary,
    ``bad_words`` become token ids, and a structured-outputs constraint must parse with its
    backend, which is then written into it (:func:`mmfront.serve.structured.resolve_backend`)."""
    vocab_size = vocabulary.vocab_size
    for name in ("logit_bias", "stop_token_ids"):
        ids = getattr(params, name)
        invalid = [t for t in ids or () if t < 0 or t >= vocab_size]
        if invalid:
            raise ValidationError(f"token_id(s) {invalid} in {name} contain out-of-vocab token ids. Vocabulary size: "
                                  f"{vocab_size}", parameter=name, value=invalid)
    allowed = params.allowed_token_ids
    if allowed is not None:
        if not allowed:
            raise ValidationError("allowed_token_ids is not None and empty!", parameter="allowed_token_ids",
                                  value=allowed)
        invalid = [t for t in allowed if t < 0 or t >= vocab_size]
        if invalid:
            raise ValidationError("allowed_token_ids contains out-of-vocab token id!", parameter="allowed_token_ids",
                                  value=invalid)
    if params.structured_outputs is not None:
        structured.resolve_backend(params.structured_outputs, structured_outputs_backend, fast_tokenizer=vocabulary.fast)
    if params.bad_words:
        params._bad_words_token_ids = _bad_words_token_ids(params.bad_words, vocabulary)


def _bad_words_token_ids(bad_words: list[str], vocabulary: Vocabulary) -> list[list[int]]:
    """vLLM's: each word's ids, and those of the word after a space where that is a word of its own."""
    found: list[list[int]] = []
    for word in bad_words:
        for prefix in ("", " "):
            ids = list(vocabulary.tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False))
            if not ids:
                if not prefix:
                    raise ValidationError("bad_words entries must tokenize to at least one token.",
                                          parameter="bad_words", value=bad_words)
                continue
            if not prefix or (ids[0] != found[-1][0] and len(ids) == len(found[-1])):
                found.append(ids)
                if len(found) > MAX_NUM_BAD_WORDS:
                    raise ValidationError(f"Too many bad words after tokenization: {len(found)}. The max number is "
                                          f"{MAX_NUM_BAD_WORDS}.", parameter="bad_words", value=bad_words)
    top = vocabulary.max_token_id
    invalid = [t for ids in found for t in ids if t < 0 or t > top]
    if invalid:
        raise ValidationError(f"The model vocabulary size is {top + 1}, but the following tokens were specified as "
                              f"bad: {invalid}. All token id values should be integers satisfying: 0 <= token_id <= "
                              f"{top}.", parameter="bad_words", value=bad_words)
    return found


def check_prompt_bounds(params: SamplingParams, prompt_length: int) -> None:
    """vLLM's input processor's check of the fields bounded by the prompt's length."""
    if not 0 <= params.routed_experts_prompt_start <= prompt_length:
        raise ValidationError(f"routed_experts_prompt_start must be between 0 and the prompt length ({prompt_length}), "
                              "inclusive.", parameter="routed_experts_prompt_start",
                              value=params.routed_experts_prompt_start)


__all__ = [
    "MAX_LOGPROB_TOKEN_IDS",
    "MAX_NUM_BAD_WORDS",
    "Vocabulary",
    "check_logprobs",
    "check_prompt_bounds",
    "child_params",
    "sampling_params",
    "structured_outputs",
    "verify_params",
]
