"""The OpenAI request bodies ``vllm serve`` takes, decoded with msgspec, and the engine's
``SamplingParams`` made from them (the responses: :mod:`mmfront.serve.responses`).

Bodies are decoded straight into typed structs (msgspec: one pass, no intermediate dicts);
fields a client sends that vLLM does not know are ignored, as vLLM ignores them. A body that
does not fit raises :class:`~mmfront.errors.RequestBodyError` naming ``body.<field>`` (vLLM's
``param`` for request-shape errors).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.wire import RequestOutputKind, SamplingParams


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


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
    if isinstance(request, ChatCompletionRequest):
        _check_tool_usage(request)
    if request.stream_options is not None and not request.stream:
        raise ValidationError("Stream options can only be defined when `stream=True`.", parameter="stream_options")
    if isinstance(request, CompletionRequest):
        _check_completion(request)
    elif isinstance(request, ChatCompletionRequest) and request.top_logprobs is not None:
        if request.top_logprobs < 0 and request.top_logprobs != -1:
            raise ValidationError("`top_logprobs` must be a positive value or -1.", parameter="top_logprobs")
        if request.top_logprobs != 0 and not request.logprobs:
            raise ValidationError("when using `top_logprobs`, `logprobs` must be set to true.",
                                  parameter="top_logprobs")
    return request


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


def template_kwargs(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The chat template's variables (and the reasoning parser's view of them): the request's
    ``chat_template_kwargs``, with ``reasoning_effort`` and, unless the request set it,
    ``enable_thinking`` (off for effort ``"none"``), as vLLM's ``build_chat_params`` adds them."""
    given = request.chat_template_kwargs
    effort = request.reasoning_effort
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
        skip_clone=True,
    )


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters of choice ``index`` of an ``n``-choice request, sent as its own engine
    request (vLLM's ``ParentRequest``): ``n`` 1, and a seed of its own when one is set."""
    seed = None if params.seed is None else params.seed + index
    return msgspec.structs.replace(params, n=1, seed=seed)


__all__ = [
    "BODY_PARAM",
    "ChatCompletionNamedToolChoiceParam",
    "ChatCompletionRequest",
    "ChatCompletionToolsParam",
    "CompletionRequest",
    "StreamOptions",
    "check_logprobs",
    "child_params",
    "continuous_usage",
    "decode_request",
    "include_usage",
    "named_tool",
    "prompts",
    "sampling_params",
    "template_kwargs",
    "template_tools",
]
