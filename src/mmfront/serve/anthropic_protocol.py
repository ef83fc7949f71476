"""The Anthropic Messages API's request bodies (``POST /v1/messages``, ``/v1/messages/count_tokens``)
as ``vllm serve`` takes them, and their translation into the chat request vLLM's
``AnthropicServingMessages`` makes of them, which ``/v1/chat/completions``'s machinery then serves
(:mod:`mmfront.serve.anthropic_messages` writes the answers back in Anthropic's shapes).

A body that does not fit these structs, or that vLLM's request model refuses (an empty ``model``,
``max_tokens`` below 1, a thinking budget below 1,024 or not below ``max_tokens``, more stop
sequences than ``VLLM_MAX_STOP_STRINGS``, a tool change outside a system message), is refused as
the chat route refuses a body: 400 ``Bad Request`` naming ``body.<field>``.

The translation, as vLLM's: the top-level ``system`` (text blocks joined, Claude Code's
``x-anthropic-billing-header`` blocks left out) becomes the first system message; with a chat
template that only takes a leading system message, inline system messages are merged into it.
Text and image blocks become content parts (one text part as a plain string), ``thinking`` the
assistant's ``reasoning``, ``tool_use`` its ``tool_calls`` (the input as ``json.dumps`` writes it),
a user's ``tool_result`` a ``tool`` message (its images in a user message after it), an assistant's
``tool_result`` the text ``Tool result: ...``. ``max_tokens`` is both ``max_tokens`` and
``max_completion_tokens``, ``stop_sequences`` the ``stop`` strings; a stream asks for the usage on
every chunk. ``output_config.format`` is a JSON-schema ``response_format``, ``output_config.effort``
the ``reasoning_effort``; ``thinking`` ``enabled`` sets ``thinking_token_budget``, ``disabled`` the
effort that turns thinking off. ``tool_choice`` ``any`` is ``required``, ``tool`` a named choice;
tools, after the messages' ``tool_addition``/``tool_removal`` blocks, are functions with
``tool_choice`` ``auto`` unless one was given.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.serve.errors import BODY_PARAM
from mmfront.serve.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionToolsParam,
    FunctionDefinition,
    JsonSchemaResponseFormat,
    ResponseFormat,
    StopList,
    StreamOptions,
)
from mmfront.serve.request_decoding import check_nesting, decode_body

BILLING_HEADER = "x-anthropic-billing-header"
"""Claude Code's per-request attribution text: left out of the system prompt, as vLLM leaves it
out, since its per-request hash would defeat the prefix cache."""
THINKING_MIN_BUDGET = 1024

Effort = Literal["low", "medium", "high", "xhigh", "max"]
DisabledThinkingEffort = Literal["none", "low", "medium", "high", "xhigh", "max"]
EFFORTS: tuple[Effort, ...] = ("low", "medium", "high", "xhigh", "max")


class ToolReference(msgspec.Struct, tag_field="type", tag="tool_reference"):
    name: str


class AnthropicTool(msgspec.Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolDefinition(msgspec.Struct, tag_field="type", tag="tool_definition"):
    definition: AnthropicTool


class ContentBlock(msgspec.Struct, kw_only=True):
    """One content block; the fields its ``type`` uses."""

    type: Literal["text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
                  "tool_addition", "tool_removal"]
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    tool: ToolReference | ToolDefinition | None = None


class AnthropicMessage(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class AnthropicToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonOutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any] | None = msgspec.field(default=None, name="schema")


class OutputConfig(msgspec.Struct, kw_only=True):
    effort: Effort | None = None
    format: JsonOutputFormat | None = None


ThinkingDisplay = Literal["summarized", "omitted", "updates"]


class ThinkingEnabled(msgspec.Struct, tag_field="type", tag="enabled", kw_only=True):
    budget_tokens: Annotated[int, msgspec.Meta(ge=THINKING_MIN_BUDGET)]
    display: ThinkingDisplay | None = None


class ThinkingDisabled(msgspec.Struct, tag_field="type", tag="disabled"):
    pass


class ThinkingAdaptive(msgspec.Struct, tag_field="type", tag="adaptive", kw_only=True):
    display: ThinkingDisplay | None = None


Thinking = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive


class _Conversation(msgspec.Struct, kw_only=True):
    """What both routes take: the conversation, its tools and how the model thinks."""

    model: str
    messages: list[AnthropicMessage]
    output_config: OutputConfig | None = None
    system: str | list[ContentBlock] | None = None
    thinking: Thinking | None = None
    tool_choice: AnthropicToolChoice | None = None
    tools: list[AnthropicTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class AnthropicMessagesRequest(_Conversation, kw_only=True):
    """``POST /v1/messages``, with vLLM's own fields besides Anthropic's."""

    max_tokens: int
    metadata: dict[str, Any] | None = None
    stop_sequences: StopList | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    cache_salt: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    watermarking: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None


class AnthropicCountTokensRequest(_Conversation, kw_only=True):
    """``POST /v1/messages/count_tokens``."""


_DECODERS = {cls: msgspec.json.Decoder(cls, strict=False)
             for cls in (AnthropicMessagesRequest, AnthropicCountTokensRequest)}
"""Lax, as vLLM's pydantic models read a body (``"max_tokens": "3"``)."""


def decode_anthropic(body: bytes,
                     cls: type[AnthropicMessagesRequest | AnthropicCountTokensRequest],
                     ) -> AnthropicMessagesRequest | AnthropicCountTokensRequest:
    """``body`` as a ``cls`` request, checked as vLLM's request model checks it."""
    request: AnthropicMessagesRequest | AnthropicCountTokensRequest = decode_body(body, _DECODERS[cls])
    check_nesting(request)  # tool inputs and schemas are copied, dumped and rendered by recursive code
    _check(request)
    return request


def _check(request: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> None:
    if not request.model:
        raise RequestBodyError("Model is required", parameter=f"{BODY_PARAM}.model")
    if isinstance(request, AnthropicMessagesRequest) and request.max_tokens <= 0:
        raise RequestBodyError("max_tokens must be positive", parameter=f"{BODY_PARAM}.max_tokens")
    for m, message in enumerate(request.messages):
        if not isinstance(message.content, str):
            for b, block in enumerate(message.content):
                _check_tool_change(block, f"{BODY_PARAM}.messages.{m}.content.{b}")
        changes = _tool_changes([message])
        if message.role != "system" and changes:
            raise RequestBodyError(f'{changes[0].type} blocks are only allowed in messages with role "system"',
                                   parameter=f"{BODY_PARAM}.messages.{m}")
    changes = [] if isinstance(request.system, str) else _tool_changes(
        [AnthropicMessage(role="system", content=request.system or [])])
    if changes:
        raise RequestBodyError(f'{changes[0].type} blocks are only allowed in messages with role "system"',
                               parameter=f"{BODY_PARAM}.system")
    if request.tool_choice is not None and request.tool_choice.type == "tool" and not request.tool_choice.name:
        raise RequestBodyError("tool_choice.name is required when type is 'tool'", parameter=f"{BODY_PARAM}.tool_choice")
    for tool in request.tools or ():
        tool.input_schema.setdefault("type", "object")
    if (isinstance(request, AnthropicMessagesRequest) and isinstance(request.thinking, ThinkingEnabled)
            and not (request.kv_transfer_params or {}).get("do_remote_decode")
            and request.thinking.budget_tokens >= request.max_tokens):
        # a prefill leg of disaggregated serving is sent with max_tokens 1 and never decodes
        raise RequestBodyError("thinking.budget_tokens must be less than max_tokens", parameter=BODY_PARAM)


def _check_tool_change(block: ContentBlock, param: str) -> None:
    if block.type not in ("tool_addition", "tool_removal"):
        return
    if block.tool is None:
        raise RequestBodyError(f"tool is required for {block.type} blocks", parameter=param)
    if block.type == "tool_removal" and not isinstance(block.tool, ToolReference):
        raise RequestBodyError("tool_removal only accepts a tool_reference", parameter=param)


def _tool_changes(messages: list[AnthropicMessage]) -> list[ContentBlock]:
    return [block for message in messages if not isinstance(message.content, str)
            for block in message.content if block.type in ("tool_addition", "tool_removal")]


# --- the chat request vLLM makes of it ------------------------------------------------------------


def to_chat_request(request: AnthropicMessagesRequest | AnthropicCountTokensRequest, *, merge_inline_system: bool,
                    disabled_thinking_effort: DisabledThinkingEffort) -> ChatCompletionRequest:
    """The chat request vLLM's ``to_chat_completion_request`` makes of ``request``:
    ``merge_inline_system`` where the chat template takes only a leading system message, and the
    effort that turns thinking off for ``thinking: {"type": "disabled"}``."""
    messages = _system_message(request, merge_inline_system)
    for message in request.messages:
        messages += _chat_messages(message, merge_inline_system)
    if isinstance(request, AnthropicCountTokensRequest):
        chat = ChatCompletionRequest(model=request.model, messages=messages,
                                     chat_template_kwargs=request.chat_template_kwargs)
    else:
        chat = ChatCompletionRequest(
            model=request.model, messages=messages, max_tokens=request.max_tokens,
            max_completion_tokens=request.max_tokens, stop=request.stop_sequences, temperature=request.temperature,
            top_p=request.top_p, top_k=request.top_k, watermarking=request.watermarking, cache_salt=request.cache_salt,
            kv_transfer_params=request.kv_transfer_params, ec_transfer_params=request.ec_transfer_params,
            vllm_xargs=request.vllm_xargs, chat_template_kwargs=request.chat_template_kwargs)
        if request.stream:
            chat.stream = True
            chat.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True)
    output = request.output_config
    if output is not None and output.format is not None and output.format.json_schema:
        chat.response_format = ResponseFormat(type="json_schema", json_schema=JsonSchemaResponseFormat(
            name=output.format.type, schema=output.format.json_schema))
    if output is not None and output.effort is not None:
        chat.reasoning_effort = output.effort
    if isinstance(request.thinking, ThinkingDisabled):
        chat.reasoning_effort = disabled_thinking_effort
    elif isinstance(request.thinking, ThinkingEnabled) and isinstance(request, AnthropicMessagesRequest):
        chat.thinking_token_budget = request.thinking.budget_tokens  # a count renders, and vLLM checks no budget
    _set_tools(request, chat)
    return chat


def _system_message(request: AnthropicMessagesRequest | AnthropicCountTokensRequest,
                    merge_inline_system: bool) -> list[dict[str, Any]]:
    parts: list[str] = []
    if isinstance(request.system, str):
        parts += [request.system] if request.system else []
    elif request.system:
        parts += [b.text for b in request.system if b.type == "text" and b.text and not b.text.startswith(BILLING_HEADER)]
    if merge_inline_system:
        parts += [text for m in request.messages if m.role == "system" and (text := _system_text(m))]
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def _system_text(message: AnthropicMessage) -> str | None:
    if isinstance(message.content, str):
        return None if message.content.startswith(BILLING_HEADER) else message.content
    texts = [b.text for b in message.content if b.type == "text" and b.text and not b.text.startswith(BILLING_HEADER)]
    return "".join(texts) if texts else None


def _chat_messages(message: AnthropicMessage, merge_inline_system: bool) -> list[dict[str, Any]]:
    """The chat messages one Anthropic message becomes: a user's tool results go before it."""
    if message.role == "system":
        text = None if merge_inline_system else _system_text(message)
        return [{"role": "system", "content": text}] if text else []
    chat: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, str):
        chat["content"] = message.content
        return [chat]
    before: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in message.content:
        if block.type == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif block.type == "image" and block.source:
            parts.append({"type": "image_url", "image_url": {"url": image_url(block.source)}})
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            calls.append({"id": block.id or f"call_{int(time.time())}", "type": "function", "function": {
                "name": block.name or "", "arguments": json.dumps(block.input or {})}})
        elif block.type == "tool_result" and message.role == "user":
            before += _tool_result_messages(block)
        elif block.type == "tool_result":
            parts.append({"type": "text", "text": f"Tool result: {block.content if block.content else ''}"})
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    keep = not (message.role == "user" and "content" not in chat)
    return [*before, chat] if keep else before


def _tool_result_messages(block: ContentBlock) -> list[dict[str, Any]]:
    """A user's tool result: a ``tool`` message of its text, a user message of its images, and a
    ``tool`` message of the tools it references."""
    texts: list[str] = []
    images: list[str] = []
    references: list[dict[str, Any]] = []
    if isinstance(block.content, str):
        texts = [block.content]
    elif isinstance(block.content, list):
        for item in block.content:
            if item.get("type") == "text":
                texts.append(item.get("text", ""))
            elif item.get("type") == "image" and (url := image_url(item.get("source", {}))):
                images.append(url)
            elif item.get("type") == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
                references.append({"type": "tool_reference", "name": name})
    call_id = block.tool_use_id or ""
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": "\n".join(texts) or ""}]
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}} for url in images]})
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})
    return out


def image_url(source: dict[str, Any]) -> str:
    """An image block's source as a URL: a ``url`` source's own, else a base64 data URL
    (``media_type`` ``image/jpeg`` unless given), as vLLM makes it."""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _set_tools(request: AnthropicMessagesRequest | AnthropicCountTokensRequest, chat: ChatCompletionRequest) -> None:
    choice = request.tool_choice
    if choice is None:
        chat.tool_choice = None
    else:
        chat.parallel_tool_calls = not choice.disable_parallel_tool_use
        chat.tool_choice = ({"auto": "auto", "any": "required", "none": "none"}.get(choice.type)
                            or ChatCompletionNamedToolChoiceParam(function={"name": choice.name}))
    tools = _resolved_tools(request)
    if tools is None:
        return
    chat.tools = [ChatCompletionToolsParam(function=FunctionDefinition(
        name=t.name, description=t.description, parameters=t.input_schema,
        strict=UNSET if t.strict is None else t.strict,  # the template sees them only when given, as vLLM's
        defer_loading=UNSET if t.defer_loading is None else t.defer_loading)) for t in tools]
    if chat.tool_choice is None:
        chat.tool_choice = "auto"


def _resolved_tools(request: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> list[AnthropicTool] | None:
    """The tools in effect at the conversation's end: a tool added by reference is no longer
    deferred, one added by value is declared, a removed one is dropped."""
    changes = _tool_changes(request.messages)
    if not changes:
        return request.tools
    tools = {tool.name: tool for tool in request.tools or ()}
    removed: set[str] = set()
    for block in changes:
        change = block.tool
        if isinstance(change, ToolDefinition):
            name = change.definition.name
            tools[name] = change.definition
        else:
            assert change is not None  # _check refused a change without its tool
            name = change.name
            if name not in tools:
                raise ValidationError(f"{block.type} references tool {name!r}, which is not declared in tools")
            if block.type == "tool_addition":
                tools[name] = msgspec.structs.replace(tools[name], defer_loading=None)
        if block.type == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in tools.items() if name not in removed]


__all__ = ["BILLING_HEADER", "EFFORTS", "AnthropicCountTokensRequest", "AnthropicMessagesRequest", "ContentBlock",
           "DisabledThinkingEffort", "Effort", "ThinkingAdaptive", "ThinkingDisabled", "ThinkingEnabled",
           "decode_anthropic", "image_url", "to_chat_request"]
