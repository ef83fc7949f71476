"""The OpenAI request bodies ``vllm serve`` takes, decoded with msgspec, and the engine's
``SamplingParams`` made from them (the responses: :mod:`mmfront.serve.responses`).

Bodies are decoded straight into typed structs (msgspec: one pass, no intermediate dicts);
fields a client sends that vLLM does not know are ignored, as vLLM ignores them. A body that
does not fit raises :class:`~mmfront.errors.RequestBodyError` naming ``body.<field>`` (vLLM's
``param`` for request-shape errors).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.serve import structured
from mmfront.wire import RequestOutputKind, SamplingParams
from mmfront.wire.params import RepetitionDetectionParams, StructuredOutputsFields, StructuredOutputsParams

logger = logging.getLogger(__name__)

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An int a request may send where vLLM's field is bounded to 64 bits (``seed``, ``priority``), or
one no other rule bounds before it reaches the engine (``top_k``: a 400 naming it rather than a
send that cannot encode it)."""

# --- request bounds (issue 36: JSON depth, wire ints, list and id caps; docs/security.md) ---------

MAX_STOP_STRINGS = int(os.environ.get("VLLM_MAX_STOP_STRINGS", "4"))
"""Most ``stop`` strings a request may give (vLLM's ``VLLM_MAX_STOP_STRINGS``, read as the server
starts): each is searched for in every output step's new text."""
StopList = Annotated[list[str], msgspec.Meta(max_length=MAX_STOP_STRINGS)]
MAX_JSON_DEPTH = 2 * structured.MAX_JSON_NESTING
"""Deepest nesting of arrays and objects a request's fields may reach, the body being level 1
(128): room for the deepest structured-output schema vLLM takes (64 levels, plus 16 for a
structural tag's wrapping) inside the body, and far below where decoding, copying, hashing or
templating a value would exhaust Python's recursion limit."""
MAX_REQUEST_ID_LENGTH = 256
"""Longest ``request_id`` (or ``X-Request-Id``) a request may give: it is echoed in every chunk."""
_REQUEST_ID = re.compile(r"[\x21-\x7e]+")
def _nesting_past(value: Any, depth: int, limit: int) -> bool:
    """Whether ``value``, at nesting level ``depth`` of the body, holds arrays, objects or structs
    deeper than ``limit``: walked a level at a time (no recursion), each container seen once."""
    level = [value]
    while level:
        containers = [item for item in level if isinstance(item, (dict, list, msgspec.Struct))]
        if not containers:
            return False
        if depth > limit:
            return True
        level = [child for node in containers for child in (
            node.values() if isinstance(node, dict) else
            node if isinstance(node, list) else (getattr(node, f) for f in node.__struct_fields__))]
        depth += 1
    return False


def _check_nesting(request: _SamplingFields) -> None:
    """Refuse a request whose decoded fields nest deeper than :data:`MAX_JSON_DEPTH` (the body is
    level 1): the free-form ones (kwargs, schemas, messages) reach code that copies, hashes or
    renders them with recursion. A field vLLM does not know is skipped by the decoder, and nesting
    past the stack's reach is refused there (:func:`decode_body`)."""
    for name in request.__struct_fields__:
        if _nesting_past(getattr(request, name), 2, MAX_JSON_DEPTH):
            raise RequestBodyError(f"JSON decode error: `{name}` nests arrays and objects deeper than "
                                   f"{MAX_JSON_DEPTH} levels.", parameter=f"{BODY_PARAM}.{name}")




def check_request_id(value: str, parameter: str) -> str:
    """``value`` as a request id: at most :data:`MAX_REQUEST_ID_LENGTH` visible ASCII characters
    (no spaces or controls), as it is echoed in headers, every chunk and the logs."""
    if len(value) > MAX_REQUEST_ID_LENGTH or not _REQUEST_ID.fullmatch(value):
        raise ValidationError(f"{parameter} must be 1 to {MAX_REQUEST_ID_LENGTH} visible ASCII characters (no spaces "
                              f"or control characters); got {len(value)} characters.", parameter=parameter)
    return value


class StreamOptions(msgspec.Struct):
    """Unset fields stay :data:`~msgspec.UNSET`, so ``{}`` is told from ``{"include_usage": false}``
    (vLLM refuses only a non-empty ``stream_options`` without ``stream``)."""

    include_usage: bool | UnsetType | None = UNSET
    continuous_usage_stats: bool | UnsetType | None = UNSET


# --- structured outputs --------------------------------------------------------------------------


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


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | UnsetType | None = UNSET
    defer_loading: bool | UnsetType | None = UNSET


class ChatCompletionToolsParam(msgspec.Struct, kw_only=True):
    """A tool as the chat template gets it (vLLM's ``model_dump``: ``strict`` and ``defer_loading``
    only when sent)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition
    defer_loading: bool | UnsetType | None = UNSET


class ChatCompletionNamedFunction(msgspec.Struct):
    name: Any = None


class ChatCompletionNamedToolChoiceParam(msgspec.Struct, kw_only=True):
    function: Any = None
    type: Literal["function"] = "function"


class _SamplingFields(msgspec.Struct, kw_only=True):
    """The sampling fields chat and completion requests share (vLLM's defaults)."""

    model: str | None = None
    n: int | None = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    min_p: float | None = None
    seed: Int64 | None = None
    stop: str | StopList | None = None
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
    # logprobs and token ids (chat's and completions' own logprobs fields are theirs)
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    # structured outputs, the token-id fields vLLM checks against the vocabulary, the engine's extras
    logit_bias: dict[str, Any] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsFields | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    routed_experts_prompt_start: Annotated[int, msgspec.Meta(ge=0)] = 0
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    watermarking: bool | None = None
    # beam search, run by the API server as vLLM's runs it (serve/beam_search.py): ``n`` beams
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # taken and ignored, as vLLM ignores them here (the /render endpoints only)
    return_token_offsets: bool | None = False
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None
    # the prompt's tokens, the engine request's session, a stream's chunks, the weights' versions (vLLM's
    # renderer, engine and output-processor fields)
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1, le=2**63 - 1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    session_id: str | None = None
    stream_interval: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_weight_versions: bool = False
    # refused while not set to vLLM's default (NOT_SUPPORTED says why)
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    thinking_token_budget: Any = None


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
    # the rendered prompt: special tokens added on top of the template's, RAG documents, the text returned
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    return_prompt_text: bool | None = None
    # tools and reasoning (serve/tool_parsers, serve/reasoning)
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: str | ChatCompletionNamedToolChoiceParam | UnsetType | None = UNSET
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions`` (text or token-id prompts)."""

    prompt: str | list[Any] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    add_special_tokens: bool = True
    # refused while not set to vLLM's default (NOT_SUPPORTED says why)
    prompt_embeds: Any = None


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
    except RecursionError as e:  # deeper than the decoder's stack reaches (~1,000 levels, as vLLM's)
        raise RequestBodyError(f"JSON decode error: the body nests arrays and objects deeper than {MAX_JSON_DEPTH} "
                               "levels.", parameter=BODY_PARAM) from e
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
    _check_nesting(request)
    if isinstance(request, ChatCompletionRequest):
        _check_tool_usage(request)
    if request.stream_options is not None and not request.stream and msgspec.structs.asdict(request.stream_options) != {
            "include_usage": UNSET, "continuous_usage_stats": UNSET}:
        raise ValidationError("Stream options can only be defined when `stream=True`.", parameter="stream_options")
    _check_logprobs(request)
    _refuse_unsupported(request)
    if request.media_io_kwargs:
        raise ValidationError("Per-request media_io_kwargs are disabled by default because they can change multimodal "
                              "media loading resource usage. Start the server with --trust-request-mm-kwargs only "
                              "when clients are trusted.", parameter="media_io_kwargs")
    if thinking_token_budget(request.thinking_token_budget) is not None:
        raise ValidationError("thinking_token_budget is set but reasoning_config is not configured. Please set "
                              "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.")
    _check_cache_salt(request.cache_salt)
    if request.request_id:  # an empty one is none, as in vLLM (a random id is made)
        check_request_id(request.request_id, "request_id")
    _check_logit_bias_values(request.logit_bias)
    _check_structured_outputs(request)
    if isinstance(request, CompletionRequest):
        _check_completion(request)
    return request


def _check_logprobs(request: _SamplingFields) -> None:
    """vLLM's ``check_logprobs`` validators, in their order."""
    if request.use_beam_search:
        if request.logprob_token_ids:
            raise ValidationError("`logprob_token_ids` is not supported with beam search.",
                                  parameter="logprob_token_ids")
        if isinstance(request, CompletionRequest) and request.echo and request.logprobs is not None:
            raise ValidationError("`echo` with `logprobs` is not supported with beam search because beam search does "
                                  "not compute prompt logprobs.", parameter="echo")
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


NOT_SUPPORTED: dict[str, str] = {
    "prompt_embeds": "prompt embeddings are not supported by mmfront serve",
}
"""The request fields mmfront takes but does not honour, with why: a value other than vLLM's
default is refused with a 400 naming the field, never accepted and ignored."""


def thinking_token_budget(value: Any) -> int | None:
    """vLLM's ``validate_thinking_token_budget``: a non-negative int, or -1 or ``None`` (unlimited:
    ``None``). Without a reasoning parser a budget is then refused, as vLLM refuses it."""
    if value is None:
        return None
    if isinstance(value, (bool, float)) or not isinstance(value, int) or value < -1:
        raise ValidationError("`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
                              parameter="thinking_token_budget", value=value)
    return None if value == -1 else value


@cache
def _refused_fields(cls: type[_SamplingFields]) -> tuple[tuple[str, str, Any], ...]:
    """The fields of ``cls`` that :data:`NOT_SUPPORTED` refuses away from their default: name,
    reason, default. Once per class: ``msgspec.structs.fields`` resolves the class's annotations
    on every call (~2 ms of every request's CPU)."""
    return tuple((f.name, reason, f.default) for f in msgspec.structs.fields(cls)
                 if (reason := NOT_SUPPORTED.get(f.name)) is not None)


def _refuse_unsupported(request: _SamplingFields) -> None:
    for name, reason, default in _refused_fields(type(request)):
        if getattr(request, name) != default:
            raise ValidationError(f"`{name}` is refused: {reason}.", parameter=name)


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
    constraints = sum(getattr(given, name) is not None for name in ("json", "regex", "choice"))
    if constraints > 1:
        raise ValidationError("You can only use one kind of constraints for structured outputs ('json', 'regex' or "
                              "'choice').", parameter=None if isinstance(request, ChatCompletionRequest)
                              else "structured_outputs")
    if constraints and isinstance(request, ChatCompletionRequest) and request.tool_choice is not UNSET and (
            request.tool_choice not in ("none", "auto", "required")):  # a named tool, or null
        raise ValidationError("You can only either use constraints for structured outputs or tools, not both.")
    if given.structural_tag is not None:
        structured.check_structural_tag(given.structural_tag, "structured_outputs")


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
        assert response_format.json_schema is not None  # decode_request refused it
        overrides = {"json": response_format.json_schema.schema}
    else:
        overrides = {"structural_tag": response_format.structural_tag()}
    if params is None:
        return StructuredOutputsParams(**overrides)
    return StructuredOutputsParams(**{**{name: getattr(params, name) for name in structured.PUBLIC_FIELDS},
                                      **overrides})


def _extra_args(request: _SamplingFields) -> dict[str, Any] | None:
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


_NAMED_TOOL = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _check_tool_usage(request: ChatCompletionRequest) -> None:
    """vLLM's ``check_tool_usage``: ``tool_choice`` defaults to ``"auto"`` with tools, else
    ``"none"``; a choice needs tools, and a named one one of them."""
    if request.tools is not None and not request.tools:
        raise ValidationError("`tools` must not be an empty array. Either provide at least one tool or omit the "
                              "field entirely.", parameter="tools")
    if request.tool_choice is UNSET:
        request.tool_choice = "auto" if request.tools else "none"
        return
    choice = request.tool_choice
    if choice is None or choice == "none":
        return
    if request.tools is None:
        raise ValidationError("When using `tool_choice`, `tools` must be set.", parameter="tool_choice")
    if isinstance(choice, str):
        if choice not in ("auto", "required"):
            raise ValidationError(f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or '
                                  '"required" are supported.', parameter="tool_choice")
        return
    function = choice.function
    if not isinstance(function, dict):
        raise ValidationError(f"Invalid value for `function`: `{function}` in `tool_choice`! {_NAMED_TOOL}",
                              parameter="tool_choice.function")
    if "name" not in function:
        raise ValidationError(f"Expected field `name` in `function` in `tool_choice`! {_NAMED_TOOL}",
                              parameter="tool_choice.function.name")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise ValidationError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_NAMED_TOOL}",
                              parameter="tool_choice.function.name")
    if not any(tool.function.name == name for tool in request.tools):
        raise ValidationError("The tool specified in `tool_choice` does not match any of the specified `tools`",
                              parameter="tool_choice")


def named_tool(request: ChatCompletionRequest) -> str | None:
    """The function a named ``tool_choice`` forces, if it names one."""
    choice = request.tool_choice
    return choice.function["name"] if isinstance(choice, ChatCompletionNamedToolChoiceParam) else None


def template_kwargs(request: ChatCompletionRequest,
                    effort_map: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The chat template's variables (and the reasoning parser's view of them): the request's
    ``chat_template_kwargs``, with ``reasoning_effort`` (rewritten by ``--reasoning-effort-map``)
    and, unless the request set it, ``enable_thinking`` (off for effort ``"none"``), as vLLM's
    ``build_chat_params`` adds them."""
    given = request.chat_template_kwargs
    if request.documents is not None:  # vLLM's: the request's documents win over chat_template_kwargs'
        given = {**(given or {}), "documents": request.documents}
    effort: str | None = request.reasoning_effort
    if effort is not None and effort_map:
        effort = effort_map.get(effort, effort)
    if effort is None:
        return given
    merged = {**(given or {}), "reasoning_effort": effort}
    if "enable_thinking" not in (given or {}):
        merged["enable_thinking"] = effort != "none"
    return merged


def template_tools(request: ChatCompletionRequest, exclude_when_none: bool) -> list[dict[str, Any]] | None:
    """The tools as the chat template gets them (``--exclude-tools-when-tool-choice-none``)."""
    if request.tools is None or (request.tool_choice == "none" and exclude_when_none):
        return None
    return [msgspec.to_builtins(tool) for tool in request.tools]


MAX_COMPLETION_PROMPTS = int(os.environ.get("VLLM_MAX_COMPLETION_PROMPTS", "1024"))
"""Most prompts one completion request may list (vLLM's ``VLLM_MAX_COMPLETION_PROMPTS``, read as
the server starts): each is prepared and sent as ``n`` engine requests of its own."""


def check_prompt_bounds(params: SamplingParams, prompt_length: int) -> None:
    """vLLM's input processor's check of the fields bounded by the prompt's length."""
    if not 0 <= params.routed_experts_prompt_start <= prompt_length:
        raise ValidationError(f"routed_experts_prompt_start must be between 0 and the prompt length ({prompt_length}), "
                              "inclusive.", parameter="routed_experts_prompt_start",
                              value=params.routed_experts_prompt_start)


def _check_completion(request: CompletionRequest) -> None:
    prompt = request.prompt
    if isinstance(prompt, list) and len(prompt) > MAX_COMPLETION_PROMPTS and not all(
            isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        raise ValidationError(f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
                              f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS "
                              "environment variable.", parameter="prompt")
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
    if request.watermarking:
        _warn_no_watermarking()
    try:
        return _sampling_params(request, max_tokens, logprobs, prompt_logprobs)
    except ValidationError as e:
        if e.value is None:  # vLLM's message shows the value the request sent
            e.value = msgspec.structs.asdict(request).get(e.parameter or "")
        raise


MAX_LOGPROB_TOKEN_IDS = 128
"""Most ``logprob_token_ids`` one request may name (vLLM's ``MAX_LOGPROB_TOKEN_IDS``, the width
its sampler allocates per request)."""


@cache
def _warn_no_watermarking() -> None:
    logger.warning("Watermarking is enabled for this request, but the engine has no watermark configuration. This and "
                   "subsequent requests will run without watermarking (as vLLM's).")


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


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters of choice ``index`` of an ``n``-choice request, sent as its own engine
    request (vLLM's ``ParentRequest``): ``n`` 1, and a seed of its own when one is set."""
    seed = None if params.seed is None else params.seed + index
    return msgspec.structs.replace(params, n=1, seed=seed)


__all__ = [
    "BODY_PARAM",
    "MAX_COMPLETION_PROMPTS",
    "MAX_JSON_DEPTH",
    "MAX_LOGPROB_TOKEN_IDS",
    "MAX_NUM_BAD_WORDS",
    "MAX_REQUEST_ID_LENGTH",
    "MAX_STOP_STRINGS",
    "NOT_SUPPORTED",
    "ChatCompletionNamedToolChoiceParam",
    "ChatCompletionRequest",
    "ChatCompletionToolsParam",
    "CompletionRequest",
    "Int64",
    "JsonSchemaResponseFormat",
    "LegacyStructuralTag",
    "ResponseFormat",
    "StreamOptions",
    "Vocabulary",
    "check_logprobs",
    "check_prompt_bounds",
    "check_request_id",
    "child_params",
    "continuous_usage",
    "decode_body",
    "decode_request",
    "echoes_prompt_only",
    "fits",
    "include_usage",
    "named_tool",
    "prompts",
    "sampling_params",
    "structured_outputs",
    "template_kwargs",
    "template_tools",
    "thinking_token_budget",
    "verify_params",
]
