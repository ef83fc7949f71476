"""The OpenAI request bodies ``vllm serve`` takes, decoded with msgspec, and the engine's
``SamplingParams`` made from them (the responses: :mod:`mmfront.serve.responses`).

Bodies are decoded straight into typed structs (msgspec: one pass, no intermediate dicts);
fields a client sends that vLLM does not know are ignored, as vLLM ignores them. A body that
does not fit raises :class:`~mmfront.errors.RequestBodyError` naming ``body.<field>`` (vLLM's
``param`` for request-shape errors).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.wire import RequestOutputKind, SamplingParams


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    """The sampling fields chat and completion requests share (vLLM's defaults)."""

    model: str | None = None
    n: int | None = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    mm_processor_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    request_id: str | None = None
    priority: int = 0
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # logprobs and token ids (chat's and completions' own logprobs fields are theirs)
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions`` (text or token-id prompts)."""

    prompt: str | list[Any] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None


_DECODERS = {cls: msgspec.json.Decoder(cls) for cls in (ChatCompletionRequest, CompletionRequest)}
_ANY_JSON = msgspec.json.Decoder()
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`")


BODY_PARAM = "body"
"""The ``param`` of an error in the body's shape (JSON, a missing field, a wrong type), or its
prefix (``body.messages``): a :class:`~mmfront.errors.RequestBodyError`, type ``Bad Request``."""


def decode_body(body: bytes, decoder: msgspec.json.Decoder[Any]) -> Any:
    """``body`` decoded by ``decoder``; a body that does not fit raises
    :class:`~mmfront.errors.RequestBodyError` whose ``parameter`` is :data:`BODY_PARAM` or
    ``body.<field>`` (every route's request shape is checked here)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        message = str(e)
        missing, at = _MISSING.search(message), _AT.search(message)
        if missing:
            param = f"{BODY_PARAM}.{missing['field']}"
        elif at:
            param = BODY_PARAM + re.sub(r"\[(\d+)\]", r".\1", at["path"])
        else:
            param = BODY_PARAM
        raise RequestBodyError(message, parameter=param) from e
    except msgspec.DecodeError as e:
        raise RequestBodyError(f"JSON decode error: {e}", parameter=BODY_PARAM) from e


def decode_request(body: bytes, cls: type[Any]) -> Any:
    """``body`` as a ``cls`` request; a body that does not fit raises
    :class:`~mmfront.errors.RequestBodyError` whose ``parameter`` is :data:`BODY_PARAM` or
    ``body.<field>``."""
    request = decode_body(body, _DECODERS[cls])
    if request.stream_options is not None and not request.stream:
        raise ValidationError("Stream options can only be defined when `stream=True`.", parameter="stream_options")
    _check_logprobs(request)
    if isinstance(request, CompletionRequest):
        _check_completion(request)
    return request


def _check_logprobs(request: _SamplingFields) -> None:
    """vLLM's ``check_logprobs`` validators, in their order."""
    if request.logprob_token_ids:
        if isinstance(request, ChatCompletionRequest) and not request.logprobs:
            raise ValidationError("when using `logprob_token_ids`, `logprobs` must be set to true.",
                                  parameter="logprob_token_ids")
        if isinstance(request, CompletionRequest) and echoes_prompt_only(request):
            raise ValidationError("`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because "
                                  "no output tokens are generated.", parameter="logprob_token_ids")
        if isinstance(request, CompletionRequest) and request.logprobs is None:
            raise ValidationError("when using `logprob_token_ids`, `logprobs` must be set.",
                                  parameter="logprob_token_ids")
    if (prompt := request.prompt_logprobs) is not None:
        if request.stream and (prompt > 0 or prompt == -1):
            raise ValidationError("`prompt_logprobs` are not available when `stream=True`.",
                                  parameter="prompt_logprobs")
        if prompt < 0 and prompt != -1:
            raise ValidationError("`prompt_logprobs` must be a positive value or -1.", parameter="prompt_logprobs",
                                  value=prompt)
    if isinstance(request, ChatCompletionRequest) and (top := request.top_logprobs) is not None:
        if top < 0 and top != -1:
            raise ValidationError("`top_logprobs` must be a positive value or -1.", parameter="top_logprobs",
                                  value=top)
        if (top == -1 or top > 0) and not request.logprobs:
            raise ValidationError("when using `top_logprobs`, `logprobs` must be set to true.",
                                  parameter="top_logprobs")
    if isinstance(request, CompletionRequest) and (logprobs := request.logprobs) is not None and logprobs < -1:
        raise ValidationError("`logprobs` must be a positive value or -1.", parameter="logprobs", value=logprobs)


def fits(body: bytes, cls: type[Any]) -> bool:
    """Whether ``body`` is a valid ``cls`` request as vLLM's request model validates it
    (``/invocations`` picks its route so): a chat request's checks are its model's validators,
    while a completion's prompt and options are checked by its route, so any completion-shaped
    body fits. A body that is not JSON raises :class:`~mmfront.errors.RequestBodyError`."""
    decode_body(body, _ANY_JSON)
    try:
        if cls is CompletionRequest:
            decode_body(body, _DECODERS[cls])
        else:
            decode_request(body, cls)
    except ValidationError:
        return False
    return True


def _check_completion(request: CompletionRequest) -> None:
    if request.suffix is not None:
        raise ValidationError("`suffix` is not supported by mmfront serve yet.", parameter="suffix")
    if not prompts(request):
        raise ValidationError("Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt")


def prompts(request: CompletionRequest) -> list[str | list[int]]:
    """The completion's prompts: a string, a list of strings, token ids, or lists of token ids."""
    prompt = request.prompt
    if not prompt:
        return []
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [list(prompt)]
    out: list[str | list[int]] = []
    for p in prompt:
        token_ids = isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        if p and (isinstance(p, str) or token_ids):
            out.append(p)
        else:
            raise ValidationError("prompt must be a string, a list of strings, a list of token ids, or a list of "
                                  "lists of token ids, none empty.", parameter="prompt")
    return out


def echoes_prompt_only(request: CompletionRequest) -> bool:
    """``echo`` with ``max_tokens`` 0: the answer is the prompt (the engine still makes one token)."""
    return bool(request.echo) and request.max_tokens == 0


def include_usage(request: _SamplingFields) -> bool:
    """Whether a stream ends with a usage chunk (vLLM's ``stream_options`` rules)."""
    return bool(request.stream_options is not None and request.stream_options.include_usage)


def continuous_usage(request: _SamplingFields) -> bool:
    """Whether every chunk carries the usage so far (``stream_options.continuous_usage_stats``)."""
    options = request.stream_options
    return bool(options is not None and options.include_usage and options.continuous_usage_stats)


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
    try:
        return _sampling_params(request, max_tokens, logprobs, prompt_logprobs)
    except ValidationError as e:
        if e.value is None:  # vLLM's message shows the value the request sent
            e.value = msgspec.structs.asdict(request).get(e.parameter or "")
        raise


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
        skip_clone=True,
    )


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters of choice ``index`` of an ``n``-choice request, sent as its own engine
    request (vLLM's ``ParentRequest``): ``n`` 1, and a seed of its own when one is set."""
    seed = None if params.seed is None else params.seed + index
    return msgspec.structs.replace(params, n=1, seed=seed)


__all__ = [
    "BODY_PARAM",
    "MAX_LOGPROB_TOKEN_IDS",
    "ChatCompletionRequest",
    "CompletionRequest",
    "StreamOptions",
    "check_logprobs",
    "child_params",
    "continuous_usage",
    "decode_body",
    "decode_request",
    "echoes_prompt_only",
    "fits",
    "include_usage",
    "prompts",
    "sampling_params",
]
