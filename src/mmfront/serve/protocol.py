"""The OpenAI request bodies ``vllm serve`` takes, decoded with msgspec, and the engine's
``SamplingParams`` made from them (the responses: :mod:`mmfront.serve.responses`).

Bodies are decoded straight into typed structs (msgspec: one pass, no intermediate dicts);
fields a client sends that vLLM does not know are ignored, as vLLM ignores them. A body that
does not fit raises :class:`~mmfront.errors.RequestBodyError` naming ``body.<field>`` (vLLM's
``param`` for request-shape errors).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.serve import structured
from mmfront.wire import RequestOutputKind, SamplingParams
from mmfront.wire.params import StructuredOutputsParams

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An int a request may send where vLLM's field is bounded to 64 bits (``seed``, ``priority``)."""


class StreamOptions(msgspec.Struct):
    """Unset fields stay :data:`~msgspec.UNSET`, so ``{}`` is told from ``{"include_usage": false}``
    (vLLM refuses only a non-empty ``stream_options`` without ``stream``)."""

    include_usage: bool | UnsetType | None = UNSET
    continuous_usage_stats: bool | UnsetType | None = UNSET


# --- structured outputs (issue 33, structured) ------------------------------------------------


class StructuredOutputsRequest(msgspec.Struct, kw_only=True):
    """A request's ``structured_outputs``: vLLM's ``StructuredOutputsParams`` less the two
    backend fields, which only the server sets."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class JsonSchemaResponseFormat(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class LegacyStructuralTag(msgspec.Struct, kw_only=True):
    begin: str
    schema: dict[str, Any] | None = None
    end: str


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI's ``response_format`` and vLLM's two ``structural_tag`` forms (``format``, or the
    legacy ``structures`` with ``triggers``) in one struct."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaResponseFormat | None = None
    format: Any = UNSET
    structures: list[LegacyStructuralTag] | UnsetType = UNSET
    triggers: list[str] | UnsetType = UNSET

    def structural_tag(self) -> str:
        """The tag as vLLM passes it on: its JSON, fields in vLLM's order."""
        if self.format is not UNSET:
            return json.dumps({"type": self.type, "format": self.format})
        structures = [{"begin": s.begin, "schema": s.schema, "end": s.end} for s in self.structures or ()]
        return json.dumps({"type": self.type, "structures": structures, "triggers": self.triggers})


class _SamplingFields(msgspec.Struct, kw_only=True):
    """The sampling fields chat and completion requests share (vLLM's defaults)."""

    model: str | None = None
    n: int | None = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: Int64 | None = None
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
    priority: Int64 = 0
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # structured outputs and the token-id fields vLLM checks against the vocabulary
    logit_bias: dict[str, Any] | None = None
    allowed_token_ids: list[int] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
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
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`")


BODY_PARAM = "body"
"""The ``param`` of an error in the body's shape (JSON, a missing field, a wrong type), or its
prefix (``body.messages``): a :class:`~mmfront.errors.RequestBodyError`, type ``Bad Request``."""


def decode_request(body: bytes, cls: type[Any]) -> Any:
    """``body`` as a ``cls`` request; a body that does not fit raises
    :class:`~mmfront.errors.RequestBodyError` whose ``parameter`` is :data:`BODY_PARAM` or
    ``body.<field>``."""
    try:
        request = _DECODERS[cls].decode(body)
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
    if request.stream_options is not None and not request.stream and msgspec.structs.asdict(request.stream_options) != {
            "include_usage": UNSET, "continuous_usage_stats": UNSET}:
        raise ValidationError("Stream options can only be defined when `stream=True`.", parameter="stream_options")
    _check_cache_salt(request.cache_salt)
    _check_logit_bias_values(request.logit_bias)
    _check_structured_outputs(request)
    if isinstance(request, CompletionRequest):
        _check_completion(request)
    elif isinstance(request, ChatCompletionRequest) and request.top_logprobs is not None:
        if request.top_logprobs < 0 and request.top_logprobs != -1:
            raise ValidationError("`top_logprobs` must be a positive value or -1.", parameter="top_logprobs")
        if request.top_logprobs != 0 and not request.logprobs:
            raise ValidationError("when using `top_logprobs`, `logprobs` must be set to true.",
                                  parameter="top_logprobs")
    return request


_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")
_MAX_CACHE_SALT_LENGTH = 128


def _check_cache_salt(cache_salt: str | None) -> None:
    """vLLM's ``validate_cache_salt``: the salt becomes part of cache keys downstream."""
    if cache_salt is None:
        return
    if not cache_salt:
        raise ValidationError("Parameter 'cache_salt' must be a non-empty string if provided.", parameter="cache_salt")
    if len(cache_salt) > _MAX_CACHE_SALT_LENGTH or any(c in _CACHE_SALT_FORBIDDEN for c in cache_salt):
        raise ValidationError("Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', "
                              "'\\\\', or NUL.", parameter="cache_salt")


def _check_logit_bias_values(logit_bias: dict[str, Any] | None) -> None:
    """A bias must be a number (or a string of one, as pydantic reads it); the keys are read as
    token ids later, as vLLM reads them."""
    for key, bias in (logit_bias or {}).items():
        if isinstance(bias, bool) or not isinstance(bias, (int, float, str)) or not _is_number(bias):
            raise RequestBodyError(f"Input should be a valid number, got {bias!r} - at `$.logit_bias.{key}`",
                                   parameter=f"{BODY_PARAM}.logit_bias.{key}")


def _is_number(value: int | float | str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _check_structured_outputs(request: _SamplingFields) -> None:
    """vLLM's request validators for ``response_format`` and ``structured_outputs``; the
    constraint itself is checked by :func:`verify_params` (the backend parses it)."""
    response_format = request.response_format
    if response_format is not None:
        if response_format.type == "json_schema" and response_format.json_schema is None:
            raise ValidationError("When response_format type is 'json_schema', the 'json_schema' field must be "
                                  "provided.", parameter="response_format")
        if response_format.type == "structural_tag":
            if response_format.format is UNSET and (response_format.structures is UNSET
                                                     or response_format.triggers is UNSET):
                raise ValidationError("Invalid response_format structural_tag specification.",
                                      parameter="response_format")
            structured.check_structural_tag(response_format.structural_tag(), "response_format")
    given = request.structured_outputs
    if given is None:
        return
    if sum(getattr(given, name) is not None for name in ("json", "regex", "choice")) > 1:
        raise ValidationError("You can only use one kind of constraints for structured outputs ('json', 'regex' or "
                              "'choice').", parameter=None if isinstance(request, ChatCompletionRequest)
                              else "structured_outputs")
    if given.structural_tag is not None:
        structured.check_structural_tag(given.structural_tag, "structured_outputs")


def structured_outputs(request: ChatCompletionRequest | CompletionRequest) -> StructuredOutputsParams | None:
    """The request's one constraint: ``structured_outputs`` with ``response_format`` applied
    over it (vLLM's ``extract_structured_outputs``)."""
    given = request.structured_outputs
    params = None if given is None else StructuredOutputsParams(
        **{name: getattr(given, name) for name in structured.PUBLIC_FIELDS})
    response_format = request.response_format
    if response_format is None:
        return params
    overrides: dict[str, Any] = {}
    if response_format.type == "json_object":
        overrides = {"json_object": True}
    elif response_format.type == "json_schema":
        assert response_format.json_schema is not None  # decode_request refused it
        overrides = {"json": response_format.json_schema.schema}
    elif response_format.type == "structural_tag":
        overrides = {"structural_tag": response_format.structural_tag()}
    return structured.from_response_format(params, response_format.type, overrides)


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


def verify_params(params: SamplingParams, vocab_size: int, *, fast_tokenizer: bool,
                  structured_outputs_backend: str = "auto") -> None:
    """vLLM's ``SamplingParams.verify`` in its API server (after ``--max-logprobs``:
    :func:`check_logprobs`): token ids must be in the model's vocabulary (``vocab_size``, its
    config's, as vLLM's ``get_vocab_size``), and a structured-outputs constraint must parse with
    its backend, which is then written into it (:func:`mmfront.serve.structured.resolve_backend`)."""
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
        structured.resolve_backend(params.structured_outputs, structured_outputs_backend,
                                   fast_tokenizer=fast_tokenizer)


def _check_completion(request: CompletionRequest) -> None:
    if request.echo or request.suffix is not None:
        raise ValidationError("`echo` and `suffix` are not supported by mmfront serve yet.",
                              parameter="echo" if request.echo else "suffix")
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
    if isinstance(request, ChatCompletionRequest):
        logprobs = request.top_logprobs if request.logprobs else None
    else:
        logprobs = request.logprobs
    try:
        return _sampling_params(request, max_tokens, logprobs)
    except ValidationError as e:
        if e.value is None:  # vLLM's message shows the value the request sent
            e.value = msgspec.structs.asdict(request).get(e.parameter or "")
        raise


def check_logprobs(params: SamplingParams, max_logprobs: int, vocab_size: int) -> None:
    """vLLM's ``--max-logprobs`` limit, which its API server applies before anything runs."""
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    for asked, field, what in ((params.logprobs, "logprobs", "sample"),
                               (params.prompt_logprobs, "prompt_logprobs", "prompt")):
        if asked:
            asked = vocab_size if asked == -1 else asked
            if asked > limit:
                raise ValidationError(f"Requested {what} logprobs of {asked}, which is greater than max allowed: "
                                      f"{limit}", parameter=field, value=asked)


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _sampling_params(request: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
                     logprobs: int | None) -> SamplingParams:
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
        skip_special_tokens=_pick(request.skip_special_tokens, True),
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured_outputs(request),
        logit_bias=_logit_bias(request.logit_bias),
        allowed_token_ids=request.allowed_token_ids,
        skip_clone=True,
    )


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters of choice ``index`` of an ``n``-choice request, sent as its own engine
    request (vLLM's ``ParentRequest``): ``n`` 1, and a seed of its own when one is set."""
    seed = None if params.seed is None else params.seed + index
    return msgspec.structs.replace(params, n=1, seed=seed)


__all__ = [
    "BODY_PARAM",
    "ChatCompletionRequest",
    "CompletionRequest",
    "Int64",
    "JsonSchemaResponseFormat",
    "LegacyStructuralTag",
    "ResponseFormat",
    "StreamOptions",
    "StructuredOutputsRequest",
    "check_logprobs",
    "child_params",
    "continuous_usage",
    "decode_request",
    "include_usage",
    "prompts",
    "sampling_params",
    "structured_outputs",
    "verify_params",
]
