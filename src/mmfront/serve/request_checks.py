"""vLLM's checks of a decoded request, made before anything is prepared: its request models'
validators and its routes' checks, in vLLM's order, each refusal a
:class:`~mmfront.errors.ValidationError` naming the field as vLLM names it. A field mmfront takes
but does not honour (:data:`NOT_SUPPORTED`) is refused away from vLLM's default, never accepted and
ignored.
"""

from __future__ import annotations

import os
import re
from functools import cache
from typing import Any

import msgspec
from msgspec import UNSET

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.serve import structured
from mmfront.serve.errors import BODY_PARAM
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest, echoes_prompt_only, prompts

# --- request bounds (issue 36: list and id caps; docs/security.md) --------------------------------

MAX_REQUEST_ID_LENGTH = 256
"""Longest ``request_id`` (or ``X-Request-Id``) a request may give: it is echoed in every chunk."""
_REQUEST_ID = re.compile(r"[\x21-\x7e]+")
MAX_COMPLETION_PROMPTS = int(os.environ.get("VLLM_MAX_COMPLETION_PROMPTS", "1024"))
"""Most prompts one completion request may list (vLLM's ``VLLM_MAX_COMPLETION_PROMPTS``, read as
the server starts): each is prepared and sent as ``n`` engine requests of its own."""


NOT_SUPPORTED: dict[str, str] = {
    "prompt_embeds": "prompt embeddings are not supported by mmfront serve",
}
"""The request fields mmfront takes but does not honour, with why: a value other than vLLM's
default is refused with a 400 naming the field, never accepted and ignored."""


def check_request(request: ChatCompletionRequest | CompletionRequest) -> None:
    """vLLM's validators of a decoded request, in their order: the first that fails is the error
    vLLM answers. A chat request's ``tool_choice`` takes its default here, as in vLLM's model."""
    if isinstance(request, ChatCompletionRequest):
        check_message_content(request.messages)
        _check_tool_usage(request)
    if request.stream_options is not None and not request.stream and msgspec.structs.asdict(request.stream_options) != {
            "include_usage": UNSET, "continuous_usage_stats": UNSET}:
        raise ValidationError("Stream options can only be defined when `stream=True`.", parameter="stream_options")
    _check_logprobs(request)
    _refuse_unsupported(request)
    if thinking_token_budget(request.thinking_token_budget) is not None:
        raise ValidationError("thinking_token_budget is set but reasoning_config is not configured. Please set "
                              "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.")
    _check_cache_salt(request.cache_salt)
    if request.request_id:  # an empty one is used as it is, as vLLM uses it
        check_request_id(request.request_id, "request_id")
    _check_logit_bias_values(request.logit_bias)
    _check_structured_outputs(request)
    if isinstance(request, CompletionRequest):
        _check_completion(request)


def check_request_id(value: str, parameter: str) -> str:
    """``value`` as a request id: at most :data:`MAX_REQUEST_ID_LENGTH` visible ASCII characters
    (no spaces or controls), as it is echoed in headers, every chunk and the logs."""
    if len(value) > MAX_REQUEST_ID_LENGTH or not _REQUEST_ID.fullmatch(value):
        raise ValidationError(f"{parameter} must be 1 to {MAX_REQUEST_ID_LENGTH} visible ASCII characters (no spaces "
                              f"or control characters); got {len(value)} characters.", parameter=parameter)
    return value


def thinking_token_budget(value: Any) -> int | None:
    """vLLM's ``validate_thinking_token_budget``: a non-negative int, or -1 or ``None`` (unlimited:
    ``None``). Without a reasoning parser a budget is then refused, as vLLM refuses it."""
    if value is None:
        return None
    if isinstance(value, (bool, float)) or not isinstance(value, int) or value < -1:
        raise ValidationError("`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
                              parameter="thinking_token_budget", value=value)
    return None if value == -1 else value


_NULL_CONTENT_ROLES = frozenset({"assistant", "function"})
"""The roles whose ``content`` OpenAI's message schema lets be null."""


def check_message_content(messages: list[dict[str, Any]]) -> None:
    """What vLLM's request model takes as a message's ``content``: a string or a list of parts,
    left out whatever the role, and ``null`` only in an assistant (or function) message."""
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or "content" not in message:
            continue
        content = message["content"]
        if isinstance(content, (str, list)) or (content is None and message.get("role") in _NULL_CONTENT_ROLES):
            continue
        null = " may be null only in an assistant message; send" if content is None else " must be"
        raise RequestBodyError(f"Input should be a valid string or a list of content parts: messages[{n}].content"
                               f"{null} a string or a list of content parts, or leave the field out.",
                               parameter=f"body.messages.{n}.content")


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


def _check_logprobs(request: ChatCompletionRequest | CompletionRequest) -> None:
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


@cache
def _refused_fields(cls: type[ChatCompletionRequest | CompletionRequest]) -> tuple[tuple[str, str, Any], ...]:
    """The fields of ``cls`` that :data:`NOT_SUPPORTED` refuses away from their default: name,
    reason, default. Once per class: ``msgspec.structs.fields`` resolves the class's annotations
    on every call (~2 ms of every request's CPU)."""
    return tuple((f.name, reason, f.default) for f in msgspec.structs.fields(cls)
                 if (reason := NOT_SUPPORTED.get(f.name)) is not None)


def _refuse_unsupported(request: ChatCompletionRequest | CompletionRequest) -> None:
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


def _check_structured_outputs(request: ChatCompletionRequest | CompletionRequest) -> None:
    """vLLM's request validators for ``response_format`` and ``structured_outputs``; the
    constraint itself is checked by :func:`~mmfront.serve.sampling.verify_params` (the backend
    parses it)."""
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


__all__ = [
    "MAX_COMPLETION_PROMPTS",
    "MAX_REQUEST_ID_LENGTH",
    "NOT_SUPPORTED",
    "check_message_content",
    "check_request",
    "check_request_id",
    "thinking_token_budget",
]
