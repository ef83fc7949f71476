"""``/v1/chat/completions``: a chat body prepared in one job on the preparation pool
(:func:`prepare_chat`), its engine requests started, then answered whole or streamed as vLLM's
``OpenAIServingChat`` answers (role chunk, echo, deltas through the server's reasoning and tool
parsers, usage)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial

from msgspec import UNSET, UnsetType
from starlette.requests import Request
from starlette.responses import Response

from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import RequestOptions
from mmfront.serve import protocol, request_decoding, responses
from mmfront.serve.chat_parsing import ChoiceStream, ParsedDelta, RequestParsing
from mmfront.serve.event_stream import sse_event
from mmfront.serve.generation import Generation
from mmfront.serve.output import ChoiceOutput, Delta
from mmfront.serve.protocol import ChatCompletionRequest
from mmfront.serve.request_log import logged_message
from mmfront.serve.responses import ResponseHead, UsageInfo
from mmfront.serve.server import (
    Server,
    base_id,
    cached_tokens,
    finished_weight_versions,
    id_header,
    json_response,
    top_logprobs,
)
from mmfront.serve.tool_parsers import CallDelta
from mmfront.wire import SamplingParams


@dataclass(frozen=True)
class PreparedChat:
    """A chat request as the preparation pool hands it back to the loop."""

    req: ChatCompletionRequest
    response_id: str
    parsing: RequestParsing
    options: RequestOptions
    inputs: MultiModalInputs
    max_tokens: int | None
    params: SamplingParams | None
    """``None``: a beam search (its parameters are the search's)."""


@dataclass(frozen=True)
class ChatStream:
    """A streamed chat's generation and its chunks, before they are written as events."""

    gen: Generation
    chunks: AsyncIterator[responses.ChatCompletionStreamResponse]


async def chat(server: Server, request: Request, body: bytes) -> Response:
    prepared = await server.off_loop(partial(prepare_chat, server), request, body)
    answer = await answer_chat(server, request, prepared)
    headers = id_header(request)
    if isinstance(answer, ChatStream):
        return server.event_stream(answer.gen, _sse_events(answer.chunks), headers)
    return json_response(answer, headers=headers)


async def answer_chat(server: Server, request: Request,
                      prepared: PreparedChat) -> responses.ChatCompletionResponse | ChatStream:
    """A prepared chat's engine requests started, then its whole answer, or its stream of chunks:
    what ``/v1/chat/completions`` writes, and what ``/v1/messages`` translates."""
    req, response_id, parsing, inputs, options = (prepared.req, prepared.response_id, prepared.parsing, prepared.inputs,
                                                  prepared.options)
    if prepared.params is None:
        gen, choices = server.search(response_id, [(inputs, options)], req, prepared.max_tokens, [response_id])
    else:
        gen, choices = await server.start(response_id, [(inputs, options)], prepared.params, [response_id],
                                          weight_versions=req.return_weight_versions)
    prompt_ids = list(inputs["prompt_token_ids"])
    head = server.head(response_id)
    role = response_role(server, req)
    echo = _echoed_message(req, role) if req.echo else ""
    if req.stream:
        return ChatStream(gen, chat_chunks(server, gen, choices, head, req, inputs=inputs, role=role, echo=echo,
                                           parsing=parsing))
    await server.drain(gen, choices)
    fmt = server.logprob_format(req)
    choices = [c for c in choices if c.finished]  # a beam search may answer fewer
    body_choices = [_parsed_choice(
        parsing, i, c,
        responses.chat_logprobs(c.token_ids, c.logprobs, top_logprobs(req), fmt) if req.logprobs else None,
        echo=echo, role=role, token_ids=list(c.token_ids) if req.return_token_ids else None)
        for i, c in enumerate(choices)]
    for i, choice in enumerate(body_choices):
        choice.weight_versions = finished_weight_versions(req, gen, i)
    usage = responses.usage(len(prompt_ids), sum(len(c.token_ids) for c in choices))
    _add_reasoning_tokens(usage, parsing, choices)
    if server.settings.enable_prompt_tokens_details:
        usage.prompt_tokens_details = _chat_prompt_details(choices[0], inputs)
    answer = responses.chat_response(head, body_choices, usage, prompt_logprobs=choices[0].prompt_logprobs,
                                     prompt_token_ids=prompt_ids if req.return_token_ids else None,
                                     prompt_text=inputs.get("prompt") if req.return_prompt_text else None,
                                     metrics=server.request_metrics(gen, usage.completion_tokens))
    if server.output_log is not None:
        for choice, output in zip(body_choices, choices):
            logged = logged_message(choice.message)
            if logged:
                server.output_log.log_outputs(head.id, logged, output.token_ids, choice.finish_reason)
    return answer


async def _sse_events(chunks: AsyncIterator[responses.ChatCompletionStreamResponse]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def prepare_chat(server: Server, request: Request, body: bytes) -> PreparedChat:
    """A chat request from its body to its engine inputs and sampling parameters (none for a
    beam search), in one job on the preparation pool: each job is a round trip between the
    loop and a pool thread (a wake-up of each), and the steps ran as three."""
    return prepare_chat_request(server, request, decode_chat(server, body))


def prepare_chat_request(server: Server, request: Request, req: ChatCompletionRequest) -> PreparedChat:
    """A decoded chat request (a chat body's, or the one ``/v1/messages`` translates an Anthropic
    body into) to its engine inputs and sampling parameters, on the preparation pool."""
    server.check_model(req.model)
    server.check_mm_kwargs(req.mm_processor_kwargs, req.media_io_kwargs)
    response_id = f"chatcmpl-{base_id(request, req.request_id)}"
    # max_completion_tokens wins where given, 0 included (vLLM then refuses it)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    parsing = server.parsing.for_request(req)
    options = RequestOptions(
        hf_processor_mm_kwargs=req.mm_processor_kwargs, media_io_kwargs=req.media_io_kwargs,
        cache_salt=req.cache_salt, priority=req.priority, chat_template=req.chat_template,
        chat_template_kwargs=server.template_kwargs(protocol.template_kwargs(req, server.settings.reasoning_effort_map)),
        add_generation_prompt=req.add_generation_prompt, continue_final_message=req.continue_final_message,
        tools=protocol.template_tools(req, server.settings.exclude_tools_when_tool_choice_none),
        **server.prompt_options(request, req, requested))
    if not req.messages:  # vLLM's request model takes it; its renderer refuses it so
        raise ValidationError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    inputs = server.preprocess(req.messages, options, response_id)
    max_tokens = server.max_tokens(requested, len(inputs["prompt_token_ids"]),
                                   "max_completion_tokens" if req.max_completion_tokens else "max_tokens")
    params = None if req.use_beam_search else server.params(req, max_tokens, [inputs], parsing)
    return PreparedChat(req, response_id, parsing, options, inputs, max_tokens, params)


def decode_chat(server: Server, body: bytes) -> ChatCompletionRequest:
    """A chat body decoded off the loop: its messages and parts counted and its text measured
    before they are built (a million messages are refused before a million structs exist, a
    60 MB text before it is decoded twice)."""
    return request_decoding.decode_chat_body(body, server.check_chat_body,
                                             max_media_bytes=server.preprocessor.config.max_media_bytes)


def response_role(server: Server, req: ChatCompletionRequest) -> str:
    """vLLM's ``get_chat_request_role``: ``--response-role`` when a generation prompt is added,
    else the role of the message being continued."""
    return server.settings.response_role if req.add_generation_prompt else str(req.messages[-1].get("role"))


async def chat_chunks(server: Server, gen: Generation, choices: list[ChoiceOutput], head: ResponseHead,
                      req: ChatCompletionRequest, *, inputs: MultiModalInputs, role: str, echo: str,
                      parsing: RequestParsing) -> AsyncIterator[responses.ChatCompletionStreamResponse]:
    """The stream's chunks before ``[DONE]`` (:meth:`~mmfront.serve.server.Server.event_stream` ends
    it): each choice's role, ``echo`` (the last message's content), the deltas, the usage."""
    prompt_ids = list(inputs["prompt_token_ids"])
    with_usage, running = server.usage_options(req)
    prompt_tokens = len(prompt_ids)
    fmt = server.logprob_format(req)
    parsed = [parsing.stream(prompt_ids) for _ in choices] if parsing.active else None

    def so_far(tokens: int) -> UsageInfo | None:
        return responses.usage(prompt_tokens, tokens, details=False, completion_details=True) if running else None

    def opening() -> Iterator[responses.ChatCompletionStreamResponse]:
        for i in range(len(choices)):
            yield responses.chat_role_chunk(head, i, so_far(0), role=role,
                                            prompt_token_ids=prompt_ids if req.return_token_ids else None,
                                            prompt_text=inputs.get("prompt") if req.return_prompt_text else None)
        for i in range(len(choices) if echo else 0):
            yield responses.chat_echo_chunk(head, i, echo, so_far(0))

    opened = False
    try:
        async for i, delta in server.deltas(gen, choices):
            if not opened:  # vLLM sends the role with the first output, so a client's TTFT is the first token's
                opened = True
                for chunk in opening():
                    yield chunk
            logprobs = (responses.chat_logprobs(delta.token_ids, delta.logprobs or [], top_logprobs(req), fmt)
                        if req.logprobs else None)
            text = None if delta.finish_reason is not None and not choices[i].token_ids else delta.text
            if parsed is not None:
                step = _parsed_step(parsed[i], delta.text, delta.finish_reason is not None)
                _log_chat_delta(server, head.id, delta, content=step.content, reasoning=step.reasoning,
                                tool_args="".join(c.arguments or "" for c in step.tool_calls))
                if not step.sends_chunk and delta.finish_reason is None and logprobs is None:
                    continue  # the parsers hold this text back (vLLM sends no chunk)
                yield responses.chat_chunk(
                    head, i, step.content,
                    logprobs=logprobs, finish_reason=parsing.finish_reason(delta.finish_reason,
                                                                           parsed[i].calls_made),
                    stop_reason=delta.stop_reason, fingerprint=not with_usage,
                    usage_info=so_far(len(choices[i].token_ids)), reasoning=step.reasoning,
                    tool_calls=[_delta_call(c) for c in step.tool_calls],
                    token_ids=delta.token_ids if req.return_token_ids else None,
                    weight_versions=finished_weight_versions(req, gen, i))
                continue
            _log_chat_delta(server, head.id, delta, content=text)
            yield responses.chat_chunk(head, i, text, logprobs=logprobs, finish_reason=delta.finish_reason,
                                       stop_reason=delta.stop_reason, fingerprint=not with_usage,
                                       usage_info=so_far(len(choices[i].token_ids)),
                                       token_ids=delta.token_ids if req.return_token_ids else None,
                                       weight_versions=finished_weight_versions(req, gen, i))
    except Exception:
        if not opened and any(c.answered for c in choices):  # vLLM's role chunk precedes a failure the engine reports
            for chunk in opening():
                yield chunk
        raise
    if not opened:
        for chunk in opening():
            yield chunk
    if with_usage:
        usage = responses.usage(prompt_tokens, sum(len(c.token_ids) for c in choices), details=False)
        _add_reasoning_tokens(usage, parsing, choices)
        if server.settings.enable_prompt_tokens_details:
            usage.prompt_tokens_details = _chat_prompt_details(choices[0], inputs)
        yield responses.chat_usage_chunk(head, usage, server.request_metrics(gen, usage.completion_tokens))
    server.log_stream_complete(head.id, choices)


def _log_chat_delta(server: Server, request_id: str, delta: Delta, *, content: str | None,
                    reasoning: str | None = None, tool_args: str = "") -> None:
    """vLLM's log of a chat stream's delta: its text, ``[reasoning: ...]`` and ``[tool_calls: ...]``."""
    if server.output_log is None or not server.settings.enable_log_deltas:
        return
    parts = [part for part in (content, reasoning and f"[reasoning: {reasoning}]",
                               tool_args and f"[tool_calls: {tool_args}]") if part]
    if parts:
        server.output_log.log_outputs(request_id, " ".join(parts), delta.token_ids, delta.finish_reason,
                                      is_streaming=True, delta=True)


def _echoed_message(req: ChatCompletionRequest, role: str) -> str:
    """What chat's ``echo`` puts before the answer: the last message's text when it has the
    answer's role, its text parts joined by newlines."""
    last = req.messages[-1] if req.messages else {}
    if last.get("role") != role:
        return ""
    content = last.get("content") or ""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return str(content)


def _parsed_choice(parsing: RequestParsing, index: int, choice: ChoiceOutput,
                   logprobs: responses.ChatCompletionLogProbs | None, *, echo: str, role: str,
                   token_ids: list[int] | None) -> responses.ChatCompletionResponseChoice:
    """A whole answer's choice after ``echo``'s text, read by the server's parsers when it has any."""
    if not parsing.active:
        return responses.chat_choice(index, echo + choice.text, logprobs, choice.finish_reason, choice.stop_reason,
                                     role=role, token_ids=token_ids)
    message = parsing.whole(choice.text)
    calls = [responses.ToolCall(id=c.id, type=c.type, function=responses.FunctionCall(c.name, c.arguments))
             for c in message.tool_calls]
    content = message.content if not echo else echo + (message.content or "")
    return responses.chat_choice(index, content, logprobs,
                                 parsing.finish_reason(choice.finish_reason, bool(calls)), choice.stop_reason,
                                 role=role, token_ids=token_ids, reasoning=message.reasoning, tool_calls=calls)


def _chat_prompt_details(choice: ChoiceOutput, inputs: MultiModalInputs) -> responses.PromptTokenUsageInfo:
    """vLLM's ``_make_prompt_tokens_details``: cached and newly cached prompt tokens, and the
    multimodal placeholder tokens by modality (``None`` without media)."""
    by_modality = {modality: sum(r.length for r in ranges)
                   for modality, ranges in (inputs.get("mm_placeholders") or {}).items() if ranges}
    return responses.PromptTokenUsageInfo(
        cached_tokens=cached_tokens(choice),
        created_cache_tokens=0 if choice.prefill is None else choice.prefill.num_cache_creation_tokens,
        multimodal_tokens=by_modality or None)


def _add_reasoning_tokens(usage: UsageInfo, parsing: RequestParsing, choices: list[ChoiceOutput]) -> None:
    counts = [parsing.reasoning_tokens(c.token_ids) for c in choices]
    if counts and all(n is not None for n in counts):
        usage.completion_tokens_details = responses.CompletionTokenUsageInfo(
            reasoning_tokens=sum(n or 0 for n in counts))


def _parsed_step(stream: ChoiceStream, text: str, finished: bool) -> ParsedDelta:
    step = stream.feed(text)
    return step.then(stream.finish()) if finished else step


def _delta_call(call: CallDelta) -> responses.DeltaToolCall:
    """vLLM's delta: only the fields this fragment carries."""
    function = responses.DeltaFunctionCall(name=_given(call.name), arguments=_given(call.arguments))
    return responses.DeltaToolCall(id=_given(call.id), type=_given(call.type), index=call.index, function=function)


def _given(value: str | None) -> str | UnsetType:
    return UNSET if value is None else value


__all__ = ["ChatStream", "PreparedChat", "answer_chat", "chat", "chat_chunks", "decode_chat", "prepare_chat",
           "prepare_chat_request", "response_role"]
