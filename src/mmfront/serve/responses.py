"""The OpenAI response and stream-chunk bodies ``vllm serve`` writes, as msgspec structs, and the
functions that fill them (error bodies: :mod:`mmfront.serve.errors`).

Each struct lists the fields of vLLM's pydantic model in its order, so the JSON keeps vLLM's key
order. A field vLLM writes as ``null`` defaults to ``None``; a field vLLM leaves out of a body
(a stream chunk carries only the fields vLLM sets on it) is :data:`msgspec.UNSET` until set,
and msgspec writes nothing for it. ``id``, ``object``, ``created`` and ``model`` are declared once,
in :class:`OpenAIBody`, and filled from the request's :class:`ResponseHead` in :func:`_head`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import msgspec
from msgspec import UNSET, UnsetType

from mmfront.serve.output import LOGPROB_FLOOR, TokenLogprob

ENCODER = msgspec.json.Encoder()
"""The one encoder of every body the server writes."""


@dataclass(frozen=True)
class ResponseHead:
    """What every response and chunk of one request starts with."""

    id: str
    created: int
    model: str
    fingerprint: str


class _HeadFields(TypedDict):
    id: str
    created: int
    model: str


def _head(head: ResponseHead) -> _HeadFields:
    return {"id": head.id, "created": head.created, "model": head.model}


class OpenAIBody(msgspec.Struct, kw_only=True):
    """The fields every response and chunk starts with; ``object`` is each body's own."""

    id: str
    object: str
    created: int
    model: str


# --- usage and logprobs -------------------------------------------------------------------------


class CompletionTokenUsageInfo(msgspec.Struct, kw_only=True):
    """With a reasoning parser: how many generated tokens were reasoning."""

    reasoning_tokens: int = 0


class UsageInfo(msgspec.Struct, kw_only=True):
    """vLLM's ``UsageInfo``: a whole response writes both ``*_details`` as ``null``, a chat chunk's
    running usage only ``completion_tokens_details``, other chunks neither."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: UnsetType | None = UNSET
    completion_tokens_details: CompletionTokenUsageInfo | UnsetType | None = UNSET


def usage(prompt_tokens: int, completion_tokens: int, *, details: bool = True, completion_details: bool = False,
          ) -> UsageInfo:
    """The usage of a whole response (``details``), or of a chunk (``completion_details``: a chat
    chunk's running usage)."""
    info = UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens + completion_tokens,
                     completion_tokens=completion_tokens)
    if details:
        info.prompt_tokens_details = info.completion_tokens_details = None
    elif completion_details:
        info.completion_tokens_details = None
    return info


class ChatCompletionLogProb(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb]


class ChatCompletionLogProbs(msgspec.Struct):
    """OpenAI's chat ``logprobs``."""

    content: list[ChatCompletionLogProbsContent]


class CompletionLogProbs(msgspec.Struct):
    """OpenAI's legacy completion ``logprobs``."""

    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


def chat_logprobs(entries: Sequence[TokenLogprob], top_logprobs: int, decode: Callable[[int], str],
                  ) -> ChatCompletionLogProbs:
    """Per token its text, logprob, UTF-8 bytes and the top ones."""

    def entry(token_id: int, logprob: float) -> ChatCompletionLogProb:
        token = decode(token_id)
        return ChatCompletionLogProb(token, max(logprob, LOGPROB_FLOOR), list(token.encode("utf-8", "replace")))

    limit = max(top_logprobs, 0)
    content = []
    for e in entries:
        sampled = entry(e.token_id, e.logprob)
        content.append(ChatCompletionLogProbsContent(sampled.token, sampled.logprob, sampled.bytes,
                                                     [entry(t, lp) for t, lp in e.top[:limit]]))
    return ChatCompletionLogProbs(content)


def completion_logprobs(entries: Sequence[TokenLogprob], top_logprobs: int, decode: Callable[[int], str],
                        text_offset: int) -> CompletionLogProbs:
    """Tokens, their logprobs, the top ones and each token's offset in the text from ``text_offset``."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(text_offset)
        token = decode(e.token_id)
        tokens.append(token)
        text_offset += len(token)
    return CompletionLogProbs(
        offsets, [max(e.logprob, LOGPROB_FLOOR) for e in entries], tokens,
        [{decode(t): max(lp, LOGPROB_FLOOR) for t, lp in e.top[:max(top_logprobs, 0)]} for e in entries])


# --- whole responses ----------------------------------------------------------------------------


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCall


class DeltaToolCall(msgspec.Struct, kw_only=True):
    """A stream's tool call: mmfront sends each call whole, in one delta."""

    id: str
    type: str = "function"
    index: int
    function: FunctionCall


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None
    refusal: None = None
    annotations: None = None
    audio: None = None
    function_call: None = None
    tool_calls: list[ToolCall] | UnsetType = UNSET
    reasoning: str | None = None


class ChatCompletionResponseChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: None = None
    routed_experts: None = None
    weight_versions: None = None


class CompletionResponseChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogProbs | None
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: None = None
    prompt_logprobs: None = None
    prompt_token_ids: None = None
    routed_experts: None = None
    weight_versions: None = None


class ChatCompletionResponse(OpenAIBody, kw_only=True):
    object: str = "chat.completion"
    choices: list[ChatCompletionResponseChoice]
    service_tier: None = None
    system_fingerprint: str
    usage: UsageInfo
    prompt_logprobs: None = None
    prompt_token_ids: None = None
    prompt_text: None = None
    kv_transfer_params: None = None
    ec_transfer_params: None = None
    metrics: None = None


class CompletionResponse(OpenAIBody, kw_only=True):
    object: str = "text_completion"
    choices: list[CompletionResponseChoice]
    service_tier: None = None
    system_fingerprint: str
    usage: UsageInfo
    kv_transfer_params: None = None
    ec_transfer_params: None = None
    metrics: None = None


def chat_choice(index: int, text: str | None, logprobs: ChatCompletionLogProbs | None, finish_reason: str | None,
                stop_reason: int | str | None, *, reasoning: str | None = None,
                tool_calls: Sequence[ToolCall] = ()) -> ChatCompletionResponseChoice:
    """A whole answer's choice; ``reasoning`` and ``tool_calls`` as the server's parsers read them."""
    message = ChatMessage(content=text, reasoning=reasoning, tool_calls=list(tool_calls) if tool_calls else UNSET)
    return ChatCompletionResponseChoice(index=index, message=message, logprobs=logprobs,
                                        finish_reason=finish_reason, stop_reason=stop_reason)


def completion_choice(index: int, text: str, logprobs: CompletionLogProbs | None, finish_reason: str | None,
                      stop_reason: int | str | None) -> CompletionResponseChoice:
    return CompletionResponseChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason,
                                    stop_reason=stop_reason)


def chat_response(head: ResponseHead, choices: list[ChatCompletionResponseChoice], usage_info: UsageInfo,
                  ) -> ChatCompletionResponse:
    return ChatCompletionResponse(**_head(head), choices=choices, system_fingerprint=head.fingerprint,
                                  usage=usage_info)


def completion_response(head: ResponseHead, choices: list[CompletionResponseChoice], usage_info: UsageInfo,
                        ) -> CompletionResponse:
    return CompletionResponse(**_head(head), choices=choices, system_fingerprint=head.fingerprint,
                              usage=usage_info)


# --- stream chunks ------------------------------------------------------------------------------


class DeltaMessage(msgspec.Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET
    tool_calls: list[DeltaToolCall] | UnsetType = UNSET


class ChatCompletionResponseStreamChoice(msgspec.Struct, kw_only=True):
    """A chunk's choice: the role chunk's stops at ``finish_reason``; a content chunk's adds
    ``token_ids``; the finishing one ``stop_reason`` and ``weight_versions`` too."""

    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: UnsetType | None = UNSET
    weight_versions: UnsetType | None = UNSET


class CompletionResponseStreamChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogProbs | None
    finish_reason: str | None
    stop_reason: int | str | None
    prompt_token_ids: None = None
    token_ids: None = None
    weight_versions: None = None


class ChatCompletionStreamResponse(OpenAIBody, kw_only=True):
    """A chat chunk: the role chunk carries the ``prompt_*`` fields, a content chunk
    ``kv_transfer_params``, the last one of a choice the fingerprint, the usage chunk no choices."""

    object: str = "chat.completion.chunk"
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | UnsetType = UNSET
    system_fingerprint: str | UnsetType = UNSET
    prompt_token_ids: UnsetType | None = UNSET
    prompt_text: UnsetType | None = UNSET
    kv_transfer_params: UnsetType | None = UNSET


class CompletionStreamResponse(OpenAIBody, kw_only=True):
    object: str = "text_completion"
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | UnsetType = UNSET
    system_fingerprint: str | UnsetType = UNSET
    kv_transfer_params: UnsetType | None = UNSET


def _given(value: UsageInfo | None) -> UsageInfo | UnsetType:
    return UNSET if value is None else value


def _fingerprint(head: ResponseHead, finish_reason: str | None, fingerprint: bool) -> str | UnsetType:
    """The fingerprint on a choice's finishing chunk when no usage chunk follows."""
    return head.fingerprint if fingerprint and finish_reason is not None else UNSET


def chat_role_chunk(head: ResponseHead, index: int, usage_info: UsageInfo | None = None,
                    ) -> ChatCompletionStreamResponse:
    """A stream's first chunk per choice: the role, and empty content."""
    choice = ChatCompletionResponseStreamChoice(index=index, delta=DeltaMessage(role="assistant", content=""))
    return ChatCompletionStreamResponse(**_head(head), choices=[choice], usage=_given(usage_info),
                                        prompt_token_ids=None, prompt_text=None)


def chat_chunk(head: ResponseHead, index: int, text: str | None, *, logprobs: ChatCompletionLogProbs | None,
               finish_reason: str | None, stop_reason: int | str | None, fingerprint: bool,
               usage_info: UsageInfo | None = None, reasoning: str | None = None,
               tool_calls: Sequence[DeltaToolCall] = ()) -> ChatCompletionStreamResponse:
    """A content chunk; the finishing one carries ``finish_reason`` and ``stop_reason`` (and, with
    ``fingerprint``, when no usage chunk follows, the fingerprint). ``text`` None: a choice that
    ended with no output. ``usage_info``: the usage so far (``continuous_usage_stats``).
    ``reasoning`` and ``tool_calls``: what the server's parsers read in this delta."""
    delta = DeltaMessage() if text is None else DeltaMessage(content=text)
    if reasoning is not None:
        delta.reasoning = reasoning
    if tool_calls:
        delta.tool_calls = list(tool_calls)
    choice = ChatCompletionResponseStreamChoice(
        index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason, token_ids=None)
    if finish_reason is not None:
        choice.stop_reason, choice.weight_versions = stop_reason, None
    return ChatCompletionStreamResponse(**_head(head), choices=[choice], usage=_given(usage_info),
                                        system_fingerprint=_fingerprint(head, finish_reason, fingerprint),
                                        kv_transfer_params=None)


def completion_chunk(head: ResponseHead, index: int, text: str, *, logprobs: CompletionLogProbs | None,
                     finish_reason: str | None, stop_reason: int | str | None, fingerprint: bool,
                     usage_info: UsageInfo | None = None) -> CompletionStreamResponse:
    choice = CompletionResponseStreamChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason,
                                            stop_reason=stop_reason)
    return CompletionStreamResponse(**_head(head), choices=[choice], usage=_given(usage_info),
                                    system_fingerprint=_fingerprint(head, finish_reason, fingerprint),
                                    kv_transfer_params=None)


def chat_usage_chunk(head: ResponseHead, usage_info: UsageInfo) -> ChatCompletionStreamResponse:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
    return ChatCompletionStreamResponse(**_head(head), choices=[], usage=usage_info,
                                        system_fingerprint=head.fingerprint)


def completion_usage_chunk(head: ResponseHead, usage_info: UsageInfo) -> CompletionStreamResponse:
    """The same for completions."""
    return CompletionStreamResponse(**_head(head), choices=[], usage=usage_info, system_fingerprint=head.fingerprint)


# --- models, version, refusals --------------------------------------------------------------------


class ModelPermission(msgspec.Struct, kw_only=True):
    id: str
    object: str = "model_permission"
    created: int
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: None = None
    is_blocking: bool = False


class ModelCard(msgspec.Struct, kw_only=True):
    """One ``/v1/models`` entry, as vLLM lists it."""

    id: str
    object: str = "model"
    created: int
    owned_by: str = "vllm"
    root: str
    parent: None = None
    max_model_len: int | None
    permission: list[ModelPermission]


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


def model_card(name: str, root: str, created: int, max_model_len: int | None, permission_id: str) -> ModelCard:
    return ModelCard(id=name, created=created, root=root, max_model_len=max_model_len,
                     permission=[ModelPermission(id=permission_id, created=created)])


class VersionResponse(msgspec.Struct):
    version: str


class UnauthorizedResponse(msgspec.Struct):
    """vLLM's answer to a missing or wrong API key."""

    error: Literal["Unauthorized"] = "Unauthorized"


class HTTPErrorResponse(msgspec.Struct):
    """FastAPI's answer to an unknown route or method, as vLLM's app gives it."""

    detail: Any


__all__ = [
    "ENCODER",
    "ChatCompletionLogProb",
    "ChatCompletionLogProbs",
    "ChatCompletionLogProbsContent",
    "ChatCompletionResponse",
    "ChatCompletionResponseChoice",
    "ChatCompletionResponseStreamChoice",
    "ChatCompletionStreamResponse",
    "ChatMessage",
    "CompletionLogProbs",
    "CompletionResponse",
    "CompletionResponseChoice",
    "CompletionResponseStreamChoice",
    "CompletionStreamResponse",
    "CompletionTokenUsageInfo",
    "DeltaMessage",
    "DeltaToolCall",
    "FunctionCall",
    "HTTPErrorResponse",
    "ModelCard",
    "ModelList",
    "ModelPermission",
    "OpenAIBody",
    "ResponseHead",
    "ToolCall",
    "UnauthorizedResponse",
    "UsageInfo",
    "VersionResponse",
    "chat_choice",
    "chat_chunk",
    "chat_logprobs",
    "chat_response",
    "chat_role_chunk",
    "chat_usage_chunk",
    "completion_choice",
    "completion_chunk",
    "completion_logprobs",
    "completion_response",
    "completion_usage_chunk",
    "model_card",
    "usage",
]
