"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: the Anthropic Messages API as ``vllm serve``
answers it. The body is translated into a chat request (:mod:`mmfront.serve.anthropic_protocol`),
served by ``/v1/chat/completions``'s machinery, and the chat answer written back as an Anthropic
message: a thinking block (the parsed reasoning, with a random signature), a text block, a
``tool_use`` block per tool call, and ``stop_reason`` ``end_turn``, ``max_tokens``,
``stop_sequence`` (with the string) or ``tool_use``; a stream as Anthropic's events
(``message_start``, a ``content_block_start``/``_delta``/``_stop`` run per block, ``message_delta``
with the stop reason and usage, ``message_stop``), each block's deltas as the chat stream's arrive.

Errors take two shapes, as in vLLM: a body that does not fit the request model is vLLM's OpenAI
error (400 ``Bad Request`` naming ``body.<field>``); anything refused or failed after that is
Anthropic's ``{"type": "error", "error": {"type", "message"}}``, the type read from the status
(``invalid_request_error``, ``not_found_error``, ``overloaded_error``, ``api_error``...), also as
a stream's last event.

Two facts about the model are probed once, on first use, as vLLM probes them: whether its chat
template takes a system message after the first turn (if not, inline system messages are merged
into the leading one), and, for ``thinking: {"type": "disabled"}`` with
``--anthropic-disabled-thinking-effort auto``, whether ``reasoning_effort: "none"`` renders a prompt
of its own (else ``"low"`` is used). Both probes are thread-safe (computed under a lock).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.sandbox
import msgspec
from msgspec import UNSET, UnsetType
from starlette.requests import Request
from starlette.responses import Response

from mmfront.chat_template import resolve_chat_template
from mmfront.errors import MMFrontError
from mmfront.preprocess import RequestOptions
from mmfront.serve import protocol, responses
from mmfront.serve.anthropic_protocol import (
    EFFORTS,
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
    DisabledThinkingEffort,
    ThinkingDisabled,
    decode_anthropic,
    to_chat_request,
)
from mmfront.serve.chat_completions import ChatStream, PreparedChat, answer_chat, prepare_chat_request
from mmfront.serve.errors import error_info
from mmfront.serve.event_stream import event_stream_response
from mmfront.serve.protocol import ChatCompletionRequest
from mmfront.serve.request_checks import check_request
from mmfront.serve.responses import ENCODER, UsageInfo
from mmfront.serve.server import Server, id_header, json_response
from mmfront.serve.tool_parsers import is_json

logger = logging.getLogger(__name__)

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
"""Anthropic's ``error.type`` by HTTP status, which Anthropic's SDKs dispatch on (vLLM's table)."""


def error_type(status: int) -> str:
    """Anthropic's word for an error of ``status``: the table's, else ``api_error`` for a server
    error and ``invalid_request_error`` for any other."""
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


# --- the bodies written ----------------------------------------------------------------------------


class AnthropicUsage(msgspec.Struct, kw_only=True):
    """The cache fields only where the chat usage has prompt-token details
    (``--enable-prompt-tokens-details``); ``input_tokens`` is the prompt less both, as Anthropic counts it."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | UnsetType = UNSET
    cache_read_input_tokens: int | UnsetType = UNSET


class TextBlock(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str | UnsetType = UNSET


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


Block = TextBlock | ThinkingBlock | ToolUseBlock


class AnthropicMessagesResponse(msgspec.Struct, kw_only=True):
    """A whole answer writes ``stop_reason``/``stop_sequence`` only when set; ``message_start``'s
    copy writes both as ``null``."""

    id: str
    type: str = "message"
    role: str = "assistant"
    content: list[Block]
    model: str
    stop_reason: StopReason | UnsetType | None = UNSET
    stop_sequence: str | UnsetType | None = UNSET
    usage: AnthropicUsage


class AnthropicDelta(msgspec.Struct, kw_only=True):
    type: Literal["text_delta", "input_json_delta", "thinking_delta", "signature_delta"] | UnsetType = UNSET
    text: str | UnsetType = UNSET
    thinking: str | UnsetType = UNSET
    partial_json: str | UnsetType = UNSET
    signature: str | UnsetType = UNSET
    stop_reason: StopReason | UnsetType | None = UNSET
    stop_sequence: str | UnsetType | None = UNSET


class AnthropicError(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorResponse(msgspec.Struct, kw_only=True):
    type: str = "error"
    error: AnthropicError


class AnthropicStreamEvent(msgspec.Struct, kw_only=True):
    type: str
    message: AnthropicMessagesResponse | UnsetType = UNSET
    delta: AnthropicDelta | UnsetType = UNSET
    content_block: Block | UnsetType = UNSET
    index: int | UnsetType = UNSET
    error: AnthropicError | UnsetType = UNSET
    usage: AnthropicUsage | UnsetType = UNSET


class ContextManagement(msgspec.Struct):
    original_input_tokens: int


class AnthropicCountTokensResponse(msgspec.Struct):
    input_tokens: int
    context_management: ContextManagement


def _anthropic_error(exc: BaseException) -> Response:
    info = error_info(exc)
    body = AnthropicErrorResponse(error=AnthropicError(error_type(info.code), info.message))
    return Response(ENCODER.encode(body), status_code=info.code, media_type="application/json")


def anthropic_usage(usage: UsageInfo | UnsetType) -> AnthropicUsage:
    """vLLM's ``_build_anthropic_usage``: cached and newly cached prompt tokens are Anthropic's
    cache fields, taken out of ``input_tokens``."""
    if isinstance(usage, UnsetType):
        return AnthropicUsage(input_tokens=0, output_tokens=0)
    out = AnthropicUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens or 0)
    details = usage.prompt_tokens_details
    if isinstance(details, responses.PromptTokenUsageInfo):
        if isinstance(details.cached_tokens, int):
            out.input_tokens -= details.cached_tokens
            out.cache_read_input_tokens = details.cached_tokens
        if isinstance(details.created_cache_tokens, int):
            out.input_tokens -= details.created_cache_tokens
            out.cache_creation_input_tokens = details.created_cache_tokens
    out.input_tokens = max(0, out.input_tokens)
    return out


def stop_reason(finish_reason: str | None, stop: int | str | None, *, tool_used: bool,
                tool_complete: bool) -> tuple[StopReason | None, str | None]:
    """Anthropic's ``(stop_reason, stop_sequence)`` of a chat finish: ``max_tokens`` always wins; a
    matched stop string wins unless the tool calls are complete (one it cut short must not run);
    a forced tool call, which chat reports as ``stop``, is ``tool_use``."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def whole_message(answer: responses.ChatCompletionResponse) -> AnthropicMessagesResponse:
    choice = answer.choices[0]
    calls = [] if isinstance(choice.message.tool_calls, UnsetType) else choice.message.tool_calls
    reason, sequence = stop_reason(choice.finish_reason, choice.stop_reason, tool_used=bool(calls),
                                   tool_complete=bool(calls))  # parsed calls' arguments are whole JSON
    content: list[Block] = []
    if choice.message.reasoning:
        content.append(ThinkingBlock(choice.message.reasoning, uuid.uuid4().hex))
    if choice.message.content:
        content.append(TextBlock(choice.message.content))
    content += [ToolUseBlock(call.id, call.function.name, json.loads(call.function.arguments)) for call in calls]
    message = AnthropicMessagesResponse(id=answer.id, content=content or [TextBlock("")], model=answer.model,
                                        usage=anthropic_usage(answer.usage))
    if reason is not None:
        message.stop_reason = reason
    if sequence is not None:
        message.stop_sequence = sequence
    return message


def _event(event: AnthropicStreamEvent) -> bytes:
    return b"event: " + event.type.encode() + b"\ndata: " + ENCODER.encode(event) + b"\n\n"


class _Blocks:
    """The stream's open content block, numbered in order (``index``: the open block's, else the
    next one's); a thinking block's signature is sent as it closes, and text that arrives inside a
    tool call waits for the call to close."""

    def __init__(self) -> None:
        self.index = 0
        self.kind: str | None = None
        self.signature: str | None = None
        self.tool_use_id: str | None = None
        self.pending: list[str] = []

    def start(self, block: Block) -> bytes:
        self.kind = str(block.__struct_config__.tag)
        self.signature = uuid.uuid4().hex if isinstance(block, ThinkingBlock) else None
        self.tool_use_id = block.id if isinstance(block, ToolUseBlock) else None
        return _event(AnthropicStreamEvent(type="content_block_start", content_block=block, index=self.index))

    def delta(self, delta: AnthropicDelta) -> bytes:
        return _event(AnthropicStreamEvent(type="content_block_delta", delta=delta, index=self.index))

    def stop(self) -> list[bytes]:
        if self.kind is None:
            return []
        events = []
        if self.signature is not None:
            events.append(self.delta(AnthropicDelta(type="signature_delta", signature=self.signature)))
        events.append(_event(AnthropicStreamEvent(type="content_block_stop", index=self.index)))
        self.kind = self.signature = self.tool_use_id = None
        self.pending = []
        self.index += 1
        return events

    def stop_and_flush(self) -> list[bytes]:
        """Close the open block, then send the text held back during a tool call as a block of its own."""
        held = "".join(self.pending)
        events = self.stop()
        if held:
            events.append(self.start(TextBlock("")))
            events.append(self.delta(AnthropicDelta(type="text_delta", text=held)))
            events += self.stop()
        return events


async def message_events(chunks: AsyncIterator[responses.ChatCompletionStreamResponse]) -> AsyncIterator[bytes]:
    """A chat stream's chunks as Anthropic's events, as vLLM's ``message_stream_converter`` writes them."""
    blocks = _Blocks()
    first = True
    finish: str | None = None
    stop: int | str | None = None
    tool_used = False
    last_arguments: list[str] = []
    call_ids: dict[int, str] = {}
    try:
        async for chunk in chunks:
            if first:
                first = False
                yield _event(AnthropicStreamEvent(type="message_start", message=AnthropicMessagesResponse(
                    id=chunk.id, content=[], model=chunk.model, stop_reason=None, stop_sequence=None,
                    usage=anthropic_usage(chunk.usage))))
                continue
            if not chunk.choices:  # the usage chunk
                for event in blocks.stop_and_flush():
                    yield event
                reason, sequence = stop_reason(finish or "stop", stop, tool_used=tool_used,
                                               tool_complete=tool_used and is_json("".join(last_arguments)))
                yield _event(AnthropicStreamEvent(type="message_delta", delta=AnthropicDelta(
                    stop_reason=reason, stop_sequence=sequence), usage=anthropic_usage(chunk.usage)))
                continue
            choice = chunk.choices[0]
            if choice.finish_reason is not None:
                finish = choice.finish_reason
                stop = None if isinstance(choice.stop_reason, UnsetType) else choice.stop_reason
            delta = choice.delta
            if isinstance(delta.reasoning, str) and delta.reasoning:
                if blocks.kind != "thinking":
                    for event in blocks.stop_and_flush():
                        yield event
                    yield blocks.start(ThinkingBlock(""))
                yield blocks.delta(AnthropicDelta(type="thinking_delta", thinking=delta.reasoning))
            if isinstance(delta.content, str) and delta.content:
                if blocks.kind == "tool_use":
                    blocks.pending.append(delta.content)
                else:
                    if blocks.kind != "text":
                        for event in blocks.stop_and_flush():
                            yield event
                        yield blocks.start(TextBlock(""))
                    yield blocks.delta(AnthropicDelta(type="text_delta", text=delta.content))
            for call in [] if isinstance(delta.tool_calls, UnsetType) else delta.tool_calls:
                arguments = call.function.arguments if isinstance(call.function.arguments, str) else ""
                if isinstance(call.id, str):
                    call_ids[call.index] = call.id
                    name = call.function.name
                    if blocks.tool_use_id != call.id and isinstance(name, str):
                        for event in blocks.stop_and_flush():
                            yield event
                        tool_used, last_arguments = True, []
                        yield blocks.start(ToolUseBlock(call.id, name, {}))
                    call_id: str | None = call.id
                else:
                    call_id = call_ids.get(call.index)
                if arguments and call_id is not None and blocks.tool_use_id == call_id:
                    last_arguments.append(arguments)
                    yield blocks.delta(AnthropicDelta(type="input_json_delta", partial_json=arguments))
        for event in blocks.stop_and_flush():
            yield event
        yield _event(AnthropicStreamEvent(type="message_stop"))
    except Exception as e:
        for event in blocks.stop():
            yield event
        info = error_info(e)
        kind = error_type(info.code) if isinstance(e, MMFrontError) else "api_error"
        yield _event(AnthropicStreamEvent(type="error", error=AnthropicError(kind, info.message)))
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


# --- the routes ------------------------------------------------------------------------------------


def merges_inline_system(template: str) -> bool:
    """Whether a chat template needs inline system messages merged into the leading one: it fails
    to render ``[system, user, system, user]`` (Qwen's ``loop.first`` guard), in a plain sandbox as
    vLLM renders the probe."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    turns = [{"role": role, "content": "t"} for role in ("system", "user", "system", "user")]
    try:
        env.from_string(template).render(messages=turns, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


class AnthropicRoutes:
    """The two routes over a :class:`~mmfront.serve.server.Server`, with the model facts they
    probe once (thread-safe: the probes run on the preparation pool, under a lock)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._merge_inline_system: bool | None = None
        configured = server.settings.anthropic_disabled_thinking_effort
        self._disabled_effort: DisabledThinkingEffort | None = None if configured == "auto" else configured

    async def messages(self, request: Request) -> Response:
        return await self.server.guarded(request, self._messages)

    async def count_tokens(self, request: Request) -> Response:
        return await self.server.guarded(request, self._count_tokens)

    async def _messages(self, request: Request, body: bytes) -> Response:
        anthropic = await self.server.off_loop(self._decode, body, AnthropicMessagesRequest)
        headers = id_header(request)
        try:
            prepared = await self.server.off_loop(self._prepare, request, anthropic)
            answer = await answer_chat(self.server, request, prepared)
            if isinstance(answer, ChatStream):
                return event_stream_response(message_events(answer.chunks), answer.gen.close, headers,
                                             self.server.settings.sse_keep_alive_interval)
            return json_response(whole_message(answer), headers=headers)
        except Exception as e:
            return self._error_response(request, e)

    async def _count_tokens(self, request: Request, body: bytes) -> Response:
        anthropic = await self.server.off_loop(self._decode, body, AnthropicCountTokensRequest)
        try:
            prepared = await self.server.off_loop(self._prepare, request, anthropic)
        except Exception as e:
            return self._error_response(request, e)
        count = len(prepared.inputs["prompt_token_ids"])
        return json_response(AnthropicCountTokensResponse(count, ContextManagement(count)))

    def _error_response(self, request: Request, exc: Exception) -> Response:
        if self.server.settings.log_error_stack:  # as the server logs the errors it answers
            logger.error("Error response to %s %s", request.method, request.url.path, exc_info=exc)
        return _anthropic_error(exc)

    def _decode(self, body: bytes, cls: type[AnthropicMessagesRequest | AnthropicCountTokensRequest],
                ) -> AnthropicMessagesRequest | AnthropicCountTokensRequest:
        self.server.check_chat_body(body)  # the same bounds as a chat body's messages and parts
        return decode_anthropic(body, cls)

    def _prepare(self, request: Request,
                 anthropic: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> PreparedChat:
        """The chat request vLLM makes of ``anthropic``, checked as vLLM checks it, prepared as the
        chat route prepares its own: one job on the preparation pool."""
        disabled = isinstance(anthropic.thinking, ThinkingDisabled)
        chat = to_chat_request(anthropic, merge_inline_system=self._merges_inline_system(),
                               disabled_thinking_effort=self._disabled_thinking_effort() if disabled else "none")
        check_request(chat)
        return prepare_chat_request(self.server, request, chat)

    def _merges_inline_system(self) -> bool:
        with self._lock:
            if self._merge_inline_system is None:
                processor = self.server.preprocessor.pipeline.processor
                self._merge_inline_system = merges_inline_system(resolve_chat_template(processor, None).text)
            return self._merge_inline_system

    def _disabled_thinking_effort(self) -> DisabledThinkingEffort:
        with self._lock:
            if self._disabled_effort is None:
                self._disabled_effort = self._probe_disabled_effort()
            return self._disabled_effort

    def _probe_disabled_effort(self) -> DisabledThinkingEffort:
        """``none`` where it renders a prompt of its own; ``low`` where the template refuses it or
        renders it as one of the thinking efforts (a model that cannot turn thinking off)."""
        none = self._probe_prompt("none")
        if none is None or any(self._probe_prompt(effort) == none for effort in EFFORTS):
            return "low"
        return "none"

    def _probe_prompt(self, effort: DisabledThinkingEffort) -> tuple[list[int], str | None] | None:
        probe = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], reasoning_effort=effort)
        kwargs = self.server.template_kwargs(protocol.template_kwargs(probe, self.server.settings.reasoning_effort_map))
        try:
            inputs = self.server.preprocess(probe.messages, RequestOptions(chat_template_kwargs=kwargs),
                                            f"anthropic-probe-{effort}")
        except MMFrontError:
            return None
        return list(inputs["prompt_token_ids"]), inputs.get("prompt")


__all__ = ["AnthropicCountTokensResponse", "AnthropicMessagesResponse", "AnthropicRoutes", "AnthropicStreamEvent",
           "AnthropicUsage", "anthropic_usage", "error_type", "merges_inline_system", "message_events",
           "stop_reason", "whole_message"]
