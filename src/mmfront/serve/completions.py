"""``/v1/completions``: each prompt prepared, ``n`` engine requests per prompt (or a beam search),
then answered whole or streamed as vLLM's ``OpenAIServingCompletion`` answers (``echo``,
logprobs with text offsets, usage)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from mmfront.errors import ValidationError
from mmfront.preprocess import RequestOptions
from mmfront.serve import protocol, request_decoding, responses
from mmfront.serve.event_stream import sse_event
from mmfront.serve.generation import Generation
from mmfront.serve.output import ChoiceOutput, PositionLogprobs
from mmfront.serve.protocol import CompletionRequest
from mmfront.serve.responses import ResponseHead
from mmfront.serve.server import (
    Server,
    base_id,
    cached_tokens,
    finished_weight_versions,
    id_header,
    json_response,
    top_logprobs,
)


@dataclass(frozen=True)
class _EchoedPrompt:
    """A completion choice's prompt: its tokens, and the text ``echo`` puts before the answer
    (empty with ``return_token_ids``, as vLLM's)."""

    token_ids: list[int]
    text: str


async def completions(server: Server, request: Request, body: bytes) -> Response:
    req: CompletionRequest = await server.off_loop(request_decoding.decode_request, body, CompletionRequest)
    if req.stream and req.use_beam_search:  # vLLM's first check
        raise ValidationError("Streaming is not currently supported with beam search")
    server.check_model(req.model)
    server.check_mm_kwargs(req.mm_processor_kwargs, req.media_io_kwargs)
    response_id = f"cmpl-{base_id(request, req.request_id)}"
    options = RequestOptions(hf_processor_mm_kwargs=req.mm_processor_kwargs, cache_salt=req.cache_salt,
                             priority=req.priority, **server.prompt_options(request, req, req.max_tokens or 0))
    prompts = await server.off_loop(protocol.prompts, req)
    if any(p == [] for p in prompts):  # vLLM's renderer's words for an empty list of token ids
        raise ValidationError("The decoder prompt cannot be empty")
    prepared = [(await server.prepare(p, options, response_id), options) for p in prompts]
    lengths = [len(inputs["prompt_token_ids"]) for inputs, _ in prepared]
    logged = [f"{response_id}-{p}" for p in range(len(prepared))]  # the ids vLLM's request log gives them
    if req.use_beam_search:
        gen, choices = server.search(response_id, prepared, req, server.max_tokens(req.max_tokens, max(lengths)),
                                     logged)
    else:
        params = await server.off_loop(server.params, req, server.max_tokens(req.max_tokens, max(lengths)),
                                       [inputs for inputs, _ in prepared], None)
        gen, choices = await server.start(response_id, prepared, params, logged,
                                          weight_versions=req.return_weight_versions)
    head = server.head(response_id)
    headers = id_header(request)
    per_prompt = len(choices) // len(prepared)
    echoes = [_EchoedPrompt(list(inputs["prompt_token_ids"]), "" if req.return_token_ids or not req.echo
                            else p if isinstance(p, str) else server.decode(p))
              for p, (inputs, _) in zip(prompts, prepared) for _ in range(per_prompt)]
    if req.stream:
        return server.event_stream(gen, completion_chunks(server, gen, choices, head, req, prompts=echoes), headers)
    await server.drain(gen, choices)
    fmt = server.logprob_format(req)
    body_choices = []
    answered = [(c, prompt) for c, prompt in zip(choices, echoes) if c.finished]  # a beam search may answer fewer
    choices = [c for c, _ in answered]
    for i, (c, prompt) in enumerate(answered):
        text, token_ids, positions = _completion_output(req, prompt, c.text, c.token_ids, logprobs=c.logprobs,
                                                        prompt_logprobs=c.prompt_logprobs)
        logprobs = (None if req.logprobs is None
                    else responses.completion_logprobs(token_ids, positions, top_logprobs(req), fmt))
        body_choices.append(responses.completion_choice(
            i, text, logprobs, c.finish_reason, c.stop_reason,
            token_ids=list(c.token_ids) if req.return_token_ids else None, prompt_logprobs=c.prompt_logprobs,
            prompt_token_ids=prompt.token_ids if req.return_token_ids else None))
        body_choices[-1].weight_versions = finished_weight_versions(req, gen, i)
    usage = responses.usage(sum(lengths), sum(len(c.token_ids) for c in choices))
    if server.output_log is not None:
        for c in choices:
            server.output_log.log_outputs(head.id, c.text, c.token_ids, c.finish_reason)
    if server.settings.enable_prompt_tokens_details:  # the last prompt's, as vLLM's
        usage.prompt_tokens_details = responses.PromptTokenUsageInfo(
            cached_tokens=cached_tokens(choices[-1]), created_cache_tokens=None, multimodal_tokens=None)
    answer = responses.completion_response(head, body_choices, usage,
                                           metrics=server.request_metrics(gen, usage.completion_tokens))
    return json_response(answer, headers=headers)


async def completion_chunks(server: Server, gen: Generation, choices: list[ChoiceOutput], head: ResponseHead,
                            req: CompletionRequest, *, prompts: list[_EchoedPrompt]) -> AsyncIterator[bytes]:
    """The stream's events before ``[DONE]`` (:meth:`~mmfront.serve.server.Server.event_stream` ends
    it); ``prompts``: each choice's prompt, its tokens and the text ``echo`` repeats."""
    with_usage, running = server.usage_options(req)
    fmt = server.logprob_format(req)
    offsets = [0] * len(choices)
    started = [False] * len(choices)
    async for i, delta in server.deltas(gen, choices):
        prompt, first = prompts[i], not started[i]
        started[i] = True
        if first and req.echo:
            text, token_ids, positions = _completion_output(
                req, prompt, delta.text, delta.token_ids, logprobs=delta.logprobs or [],
                prompt_logprobs=choices[i].prompt_logprobs)
        else:
            text, token_ids, positions = delta.text, delta.token_ids, [*(delta.logprobs or [])]
        logprobs = None
        if req.logprobs is not None:
            logprobs = responses.completion_logprobs(token_ids, positions, top_logprobs(req), fmt,
                                                     offsets[i])
            if logprobs.tokens:
                offsets[i] = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
        so_far = (responses.usage(len(prompt.token_ids), len(choices[i].token_ids), details=False) if running
                  else None)
        if server.output_log is not None and delta.text and server.settings.enable_log_deltas:
            server.output_log.log_outputs(head.id, delta.text, delta.token_ids, delta.finish_reason,
                                          is_streaming=True, delta=True)
        yield sse_event(responses.completion_chunk(
            head, i, text, logprobs=logprobs, finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason, fingerprint=not with_usage, usage_info=so_far,
            prompt_token_ids=prompt.token_ids if first and (req.echo or req.return_token_ids) else None,
            token_ids=delta.token_ids if req.return_token_ids else None,
            weight_versions=finished_weight_versions(req, gen, i) if delta.finish_reason is not None else None))
    if with_usage:
        usage = responses.usage(sum(len(p.token_ids) for p in prompts[::max(req.n or 1, 1)]),
                                sum(len(c.token_ids) for c in choices), details=False)
        if server.settings.enable_prompt_tokens_details:
            usage.prompt_tokens_details = responses.PromptTokenUsageInfo(
                cached_tokens=cached_tokens(choices[-1]))
        yield sse_event(responses.completion_usage_chunk(head, usage,
                                                         server.request_metrics(gen, usage.completion_tokens)))
    server.log_stream_complete(head.id, choices)


def _completion_output(req: CompletionRequest, prompt: _EchoedPrompt, text: str, token_ids: list[int], *,
                       logprobs: Sequence[PositionLogprobs], prompt_logprobs: list[PositionLogprobs | None] | None,
                       ) -> tuple[str, list[int], list[PositionLogprobs | None]]:
    """The text, tokens and logprob positions a completion reports: with ``echo`` the prompt's
    first (the prompt alone when ``max_tokens`` is 0)."""
    if not req.echo:
        return text, token_ids, list(logprobs)
    if protocol.echoes_prompt_only(req):
        return prompt.text, prompt.token_ids, list(prompt_logprobs or [])
    return prompt.text + text, [*prompt.token_ids, *token_ids], [*(prompt_logprobs or []), *logprobs]


__all__ = ["completion_chunks", "completions"]
