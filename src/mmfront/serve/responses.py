"""The OpenAI response and stream-chunk bodies ``vllm serve`` writes, as msgspec structs, and the
functions that fill them (error bodies: :mod:`mmfront.serve.errors`).

Each struct lists the fields of vLLM's pydantic model in its order, so the JSON keeps vLLM's key
order. A field vLLM writes as ``null`` defaults to ``None``; a field vLLM leaves out of a body
(a stream chunk carries only the fields vLLM sets on it) is :data:`msgspec.UNSET` until set,
and msgspec writes nothing for it. ``id``, ``object``, ``created`` and ``model`` are declared once,
in :class:`OpenAIBody`, and filled from the request's :class:`ResponseHead` in :func:`_head`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import msgspec
from msgspec import UNSET, UnsetType

from mmfront.serve.iteration_stats import RequestTimings
from mmfront.serve.output import LOGPROB_FLOOR, Logprob, PositionLogprobs, PromptLogprobs
from mmfront.serve.weight_versions import WeightVersionSpan

ENCODER = msgspec.json.Encoder()
"""The one encoder of every body the server writes."""


@dataclass(frozen=True)
class ResponseHead:
    """What every response and chunk of one request starts with."""

    id: str
    created: int
    model: str
    fingerprint: str | None


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


class PromptTokenUsageInfo(msgspec.Struct, kw_only=True):
    """vLLM's ``PromptTokenUsageInfo`` (``--enable-prompt-tokens-details``); a stream's chunk
    carries only the fields vLLM sets."""

    cached_tokens: int | UnsetType | None = UNSET
    created_cache_tokens: int | UnsetType | None = UNSET
    multimodal_tokens: dict[str, int] | UnsetType | None = UNSET


class UsageInfo(msgspec.Struct, kw_only=True):
    """vLLM's ``UsageInfo``: a whole response writes both ``*_details`` as ``null``, a chat chunk's
    running usage only ``completion_tokens_details``, other chunks neither."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: PromptTokenUsageInfo | UnsetType | None = UNSET
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
    logprob: float = LOGPROB_FLOOR
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = msgspec.field(default_factory=list)


class ChatCompletionLogProbs(msgspec.Struct):
    """OpenAI's chat ``logprobs``."""

    content: list[ChatCompletionLogProbsContent] | None = None


class CompletionLogProbs(msgspec.Struct):
    """OpenAI's legacy completion ``logprobs``: ``None`` where a position has none (an echoed
    prompt's first token)."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


TOKEN_ID_PREFIX = "token_id:"
"""``return_tokens_as_token_ids`` writes token ``N`` as ``token_id:N`` (vLLM's placeholder)."""


@dataclass(frozen=True)
class LogprobFormat:
    """How a request writes its logprob tokens: the tokenizer's texts, or ``token_id:N``
    (``return_tokens_as_token_ids``); ``decode`` names a token no position lists."""

    decode: Callable[[int], str]
    as_token_ids: bool = False

    def token(self, token_id: int, logprob: Logprob | None) -> str:
        if self.as_token_ids:
            return f"{TOKEN_ID_PREFIX}{token_id}"
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        return self.decode(token_id)


def _floor(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def chat_top_logprobs_limit(top_logprobs: int | None) -> int | None:
    """How many of a position's candidates a chat answer lists, sampled token first: all for -1."""
    return None if top_logprobs == -1 else top_logprobs or 0


def completion_top_logprobs_limit(logprobs: int | None) -> int | None:
    """The same for completions: ``logprobs + 1`` (OpenAI's convention), all for -1."""
    return None if logprobs is None or logprobs == -1 else max(logprobs + 1, 0)


def chat_logprobs(token_ids: Sequence[int], positions: Sequence[PositionLogprobs | None], top_logprobs: int | None,
                  fmt: LogprobFormat) -> ChatCompletionLogProbs:
    """Per token its text, logprob, UTF-8 bytes and the top ones (vLLM's ``_create_chat_logprobs``:
    the sampled token's bytes are its text's even where ``token`` is ``token_id:N``)."""
    content = []
    limit = chat_top_logprobs_limit(top_logprobs)
    for token_id, position in zip(token_ids, positions):
        step = None if position is None else position.get(token_id)
        if step is None:
            token = fmt.token(token_id, None)
            content.append(ChatCompletionLogProbsContent(token, bytes=list(token.encode("utf-8", "replace"))))
            continue
        assert position is not None
        top = []
        for candidate_id, candidate in itertools.islice(position.items(), limit):
            text = fmt.token(candidate_id, candidate)
            top.append(ChatCompletionLogProb(text, _floor(candidate.logprob), list(text.encode("utf-8", "replace"))))
        decoded = step.decoded_token
        content.append(ChatCompletionLogProbsContent(
            fmt.token(token_id, step), _floor(step.logprob),
            None if decoded is None else list(decoded.encode("utf-8", "replace")), top))
    return ChatCompletionLogProbs(content)


def completion_logprobs(token_ids: Sequence[int], positions: Sequence[PositionLogprobs | None], logprobs: int,
                        fmt: LogprobFormat, text_offset: int = 0) -> CompletionLogProbs:
    """Tokens, their logprobs, the top ones (keyed by text: candidates of one text are one entry)
    and each token's offset in the text from ``text_offset``."""
    out = CompletionLogProbs([], [], [], [])
    limit = completion_top_logprobs_limit(logprobs)
    for token_id, position in zip(token_ids, positions):
        step = None if position is None else position.get(token_id)
        token = fmt.token(token_id, step)
        out.text_offset.append(out.text_offset[-1] + len(out.tokens[-1]) if out.tokens else text_offset)
        out.tokens.append(token)
        if step is None or position is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_floor(step.logprob))
        out.top_logprobs.append({fmt.token(t, c): _floor(c.logprob)
                                 for t, c in itertools.islice(position.items(), limit)})
    return out


def clamp_prompt_logprobs(prompt_logprobs: PromptLogprobs | None) -> PromptLogprobs | None:
    """The prompt's logprobs as a response writes them: ``-inf`` as :data:`LOGPROB_FLOOR`."""
    if prompt_logprobs is None:
        return None
    return [None if position is None else {
        t: Logprob(LOGPROB_FLOOR, c.rank, c.decoded_token) if c.logprob == float("-inf") else c
        for t, c in position.items()} for position in prompt_logprobs]


# --- whole responses ----------------------------------------------------------------------------


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCall


class DeltaFunctionCall(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class DeltaToolCall(msgspec.Struct, kw_only=True):
    """A stream's tool-call delta (vLLM's): a call's first carries ``id``, ``type`` and
    ``function.name``; later ones, with its ``index``, fragments of ``function.arguments``."""

    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    index: int
    function: DeltaFunctionCall


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
    token_ids: list[int] | None = None
    routed_experts: None = None
    weight_versions: list[WeightVersionSpan] | None = None


class CompletionResponseChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogProbs | None
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    routed_experts: None = None
    weight_versions: list[WeightVersionSpan] | None = None


class PerRequestMetrics(msgspec.Struct, kw_only=True):
    """vLLM's ``PerRequestMetrics`` (``--enable-per-request-metrics``): one request's times, in
    milliseconds, each ``None`` where a timestamp it needs is missing."""

    time_to_first_token_ms: float | None = None
    generation_time_ms: float | None = None
    queue_time_ms: float | None = None
    mean_itl_ms: float | None = None
    tokens_per_second: float | None = None
    speculative_decoding: None = None


class StreamPerRequestMetrics(PerRequestMetrics, kw_only=True, omit_defaults=True):
    """The same on a stream's usage chunk, whose ``None`` fields vLLM leaves out."""


def per_request_metrics(timings: RequestTimings | None, num_generation_tokens: int) -> PerRequestMetrics:
    """vLLM's ``build_per_request_timing_metrics``: the time to the first token from the request's
    scheduling, the decode time (first to last token), the queue time, the mean inter-token
    latency and the output throughput over the inference time (scheduling to last token)."""
    if timings is None:
        return PerRequestMetrics()
    queued, scheduled, first, last = (timings.queued_ts, timings.scheduled_ts, timings.first_token_ts,
                                      timings.last_token_ts)
    metrics = PerRequestMetrics()
    if scheduled > 0 and first > 0:
        metrics.time_to_first_token_ms = (first - scheduled) * 1000
    if first > 0 and last > 0:
        metrics.generation_time_ms = (last - first) * 1000
        if num_generation_tokens > 1:
            metrics.mean_itl_ms = (last - first) / (num_generation_tokens - 1) * 1000
    if queued > 0 and scheduled > 0:
        metrics.queue_time_ms = (scheduled - queued) * 1000
    if scheduled > 0 and last > 0:
        inference_ms = (last - scheduled) * 1000
        if inference_ms > 0:
            metrics.tokens_per_second = num_generation_tokens / inference_ms * 1000
    return metrics


class ChatCompletionResponse(OpenAIBody, kw_only=True):
    object: str = "chat.completion"
    choices: list[ChatCompletionResponseChoice]
    service_tier: None = None
    system_fingerprint: str | None
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    kv_transfer_params: None = None
    ec_transfer_params: None = None
    metrics: PerRequestMetrics | None = None


class CompletionResponse(OpenAIBody, kw_only=True):
    object: str = "text_completion"
    choices: list[CompletionResponseChoice]
    service_tier: None = None
    system_fingerprint: str | None
    usage: UsageInfo
    kv_transfer_params: None = None
    ec_transfer_params: None = None
    metrics: PerRequestMetrics | None = None


def chat_choice(index: int, text: str | None, logprobs: ChatCompletionLogProbs | None, finish_reason: str | None,
                stop_reason: int | str | None, *, role: str = "assistant", token_ids: list[int] | None = None,
                reasoning: str | None = None, tool_calls: Sequence[ToolCall] = ()) -> ChatCompletionResponseChoice:
    """A whole answer's choice; ``token_ids``: its tokens (``return_token_ids``); ``reasoning`` and
    ``tool_calls`` as the server's parsers read them."""
    message = ChatMessage(role=role, content=text, reasoning=reasoning,
                          tool_calls=list(tool_calls) if tool_calls else UNSET)
    return ChatCompletionResponseChoice(index=index, message=message, logprobs=logprobs,
                                        finish_reason=finish_reason, stop_reason=stop_reason, token_ids=token_ids)


def completion_choice(index: int, text: str, logprobs: CompletionLogProbs | None, finish_reason: str | None,
                      stop_reason: int | str | None, *, token_ids: list[int] | None = None,
                      prompt_logprobs: PromptLogprobs | None = None, prompt_token_ids: list[int] | None = None,
                      ) -> CompletionResponseChoice:
    """``token_ids`` and ``prompt_token_ids``: ``return_token_ids``; ``prompt_logprobs`` as asked."""
    return CompletionResponseChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason,
                                    stop_reason=stop_reason, token_ids=token_ids,
                                    prompt_logprobs=clamp_prompt_logprobs(prompt_logprobs),
                                    prompt_token_ids=prompt_token_ids)


def chat_response(head: ResponseHead, choices: list[ChatCompletionResponseChoice], usage_info: UsageInfo, *,
                  prompt_logprobs: PromptLogprobs | None = None, prompt_token_ids: list[int] | None = None,
                  prompt_text: str | None = None, metrics: PerRequestMetrics | None = None,
                  ) -> ChatCompletionResponse:
    """``prompt_text``: the rendered prompt (``return_prompt_text``); ``metrics``: the request's
    timings (``--enable-per-request-metrics``)."""
    return ChatCompletionResponse(**_head(head), choices=choices, system_fingerprint=head.fingerprint,
                                  usage=usage_info, prompt_logprobs=clamp_prompt_logprobs(prompt_logprobs),
                                  prompt_token_ids=prompt_token_ids, prompt_text=prompt_text, metrics=metrics)


def completion_response(head: ResponseHead, choices: list[CompletionResponseChoice], usage_info: UsageInfo, *,
                        metrics: PerRequestMetrics | None = None) -> CompletionResponse:
    return CompletionResponse(**_head(head), choices=choices, system_fingerprint=head.fingerprint,
                              usage=usage_info, metrics=metrics)


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
    token_ids: list[int] | UnsetType | None = UNSET
    weight_versions: list[WeightVersionSpan] | UnsetType | None = UNSET


class CompletionResponseStreamChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogProbs | None
    finish_reason: str | None
    stop_reason: int | str | None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    weight_versions: list[WeightVersionSpan] | None = None


class ChatCompletionStreamResponse(OpenAIBody, kw_only=True):
    """A chat chunk: the role chunk carries the ``prompt_*`` fields, a content chunk
    ``kv_transfer_params``, the last one of a choice the fingerprint, the usage chunk no choices."""

    object: str = "chat.completion.chunk"
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | UnsetType = UNSET
    system_fingerprint: str | UnsetType | None = UNSET
    prompt_token_ids: list[int] | UnsetType | None = UNSET
    prompt_text: str | UnsetType | None = UNSET
    metrics: StreamPerRequestMetrics | UnsetType = UNSET
    kv_transfer_params: UnsetType | None = UNSET


class CompletionStreamResponse(OpenAIBody, kw_only=True):
    object: str = "text_completion"
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | UnsetType = UNSET
    system_fingerprint: str | UnsetType | None = UNSET
    metrics: StreamPerRequestMetrics | UnsetType = UNSET
    kv_transfer_params: UnsetType | None = UNSET


def _given(value: UsageInfo | None) -> UsageInfo | UnsetType:
    return UNSET if value is None else value


def _fingerprint(head: ResponseHead, finish_reason: str | None, fingerprint: bool) -> str | UnsetType | None:
    """The fingerprint on a choice's finishing chunk when no usage chunk follows."""
    return head.fingerprint if fingerprint and finish_reason is not None else UNSET


def chat_role_chunk(head: ResponseHead, index: int, usage_info: UsageInfo | None = None, *, role: str = "assistant",
                    prompt_token_ids: list[int] | None = None, prompt_text: str | None = None,
                    ) -> ChatCompletionStreamResponse:
    """A stream's first chunk per choice: the role, and empty content (and the prompt's tokens,
    with ``return_token_ids``; its rendered text, with ``return_prompt_text``)."""
    choice = ChatCompletionResponseStreamChoice(index=index, delta=DeltaMessage(role=role, content=""))
    return ChatCompletionStreamResponse(**_head(head), choices=[choice], usage=_given(usage_info),
                                        prompt_token_ids=prompt_token_ids, prompt_text=prompt_text)


def chat_echo_chunk(head: ResponseHead, index: int, text: str, usage_info: UsageInfo | None = None,
                    ) -> ChatCompletionStreamResponse:
    """With ``echo``, the chunk after the role chunk: the last message's content."""
    choice = ChatCompletionResponseStreamChoice(index=index, delta=DeltaMessage(content=text))
    return ChatCompletionStreamResponse(**_head(head), choices=[choice], usage=_given(usage_info))


def chat_chunk(head: ResponseHead, index: int, text: str | None, *, logprobs: ChatCompletionLogProbs | None,
               finish_reason: str | None, stop_reason: int | str | None, fingerprint: bool,
               usage_info: UsageInfo | None = None, token_ids: list[int] | None = None, reasoning: str | None = None,
               tool_calls: Sequence[DeltaToolCall] = (), weight_versions: list[WeightVersionSpan] | None = None,
               ) -> ChatCompletionStreamResponse:
    """A content chunk; the finishing one carries ``finish_reason`` and ``stop_reason`` (and, with
    ``fingerprint``, when no usage chunk follows, the fingerprint). ``text`` None: a choice that
    ended with no output. ``usage_info``: the usage so far (``continuous_usage_stats``).
    ``reasoning`` and ``tool_calls``: what the server's parsers read in this delta;
    ``weight_versions``: the finished choice's (``return_weight_versions``)."""
    delta = DeltaMessage() if text is None else DeltaMessage(content=text)
    if reasoning is not None:
        delta.reasoning = reasoning
    if tool_calls:
        delta.tool_calls = list(tool_calls)
    choice = ChatCompletionResponseStreamChoice(
        index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason, token_ids=token_ids)
    if finish_reason is not None:
        choice.stop_reason, choice.weight_versions = stop_reason, weight_versions
    return ChatCompletionStreamResponse(**_head(head), choices=[choice], usage=_given(usage_info),
                                        system_fingerprint=_fingerprint(head, finish_reason, fingerprint),
                                        kv_transfer_params=None)


def completion_chunk(head: ResponseHead, index: int, text: str, *, logprobs: CompletionLogProbs | None,
                     finish_reason: str | None, stop_reason: int | str | None, fingerprint: bool,
                     usage_info: UsageInfo | None = None, prompt_token_ids: list[int] | None = None,
                     token_ids: list[int] | None = None, weight_versions: list[WeightVersionSpan] | None = None,
                     ) -> CompletionStreamResponse:
    """``prompt_token_ids`` on a choice's first chunk and ``token_ids`` on each (``return_token_ids``);
    ``weight_versions`` on its last (``return_weight_versions``)."""
    choice = CompletionResponseStreamChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason,
                                            stop_reason=stop_reason, prompt_token_ids=prompt_token_ids,
                                            token_ids=token_ids, weight_versions=weight_versions)
    return CompletionStreamResponse(**_head(head), choices=[choice], usage=_given(usage_info),
                                    system_fingerprint=_fingerprint(head, finish_reason, fingerprint),
                                    kv_transfer_params=None)


def chat_usage_chunk(head: ResponseHead, usage_info: UsageInfo, metrics: PerRequestMetrics | None = None,
                     ) -> ChatCompletionStreamResponse:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage (and the
    request's ``metrics``, ``--enable-per-request-metrics``)."""
    return ChatCompletionStreamResponse(**_head(head), choices=[], usage=usage_info,
                                        system_fingerprint=head.fingerprint, metrics=_stream_metrics(metrics))


def completion_usage_chunk(head: ResponseHead, usage_info: UsageInfo, metrics: PerRequestMetrics | None = None,
                           ) -> CompletionStreamResponse:
    """The same for completions."""
    return CompletionStreamResponse(**_head(head), choices=[], usage=usage_info, system_fingerprint=head.fingerprint,
                                    metrics=_stream_metrics(metrics))


def _stream_metrics(metrics: PerRequestMetrics | None) -> StreamPerRequestMetrics | UnsetType:
    return UNSET if metrics is None else StreamPerRequestMetrics(**msgspec.structs.asdict(metrics))


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


class ServerLoad(msgspec.Struct):
    """``/load``."""

    server_load: int


class UnauthorizedResponse(msgspec.Struct):
    """vLLM's answer to a missing or wrong API key."""

    error: Literal["Unauthorized"] = "Unauthorized"


class HTTPErrorResponse(msgspec.Struct):
    """FastAPI's answer to an unknown route or method, as vLLM's app gives it."""

    detail: Any


__all__ = [
    "ENCODER",
    "TOKEN_ID_PREFIX",
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
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "FunctionCall",
    "HTTPErrorResponse",
    "LogprobFormat",
    "ModelCard",
    "ModelList",
    "ModelPermission",
    "OpenAIBody",
    "PerRequestMetrics",
    "PromptTokenUsageInfo",
    "ResponseHead",
    "ServerLoad",
    "StreamPerRequestMetrics",
    "ToolCall",
    "UnauthorizedResponse",
    "UsageInfo",
    "VersionResponse",
    "chat_choice",
    "chat_chunk",
    "chat_echo_chunk",
    "chat_logprobs",
    "chat_response",
    "chat_role_chunk",
    "chat_top_logprobs_limit",
    "chat_usage_chunk",
    "clamp_prompt_logprobs",
    "completion_choice",
    "completion_chunk",
    "completion_logprobs",
    "completion_response",
    "completion_top_logprobs_limit",
    "completion_usage_chunk",
    "model_card",
    "per_request_metrics",
    "usage",
]
