"""The HTTP surface of ``mmfront serve``: ``vllm serve``'s OpenAI routes over an
:class:`~mmfront.engine.async_client.AsyncEngineClient`, as an ASGI app (:func:`create_app`) that
``mmfront serve`` runs with uvicorn and that users may mount in their own app.

A request is decoded, checked and prepared once (media, chat template, HF processor) on the
preprocessor's worker threads, so the event loop only reads bodies and writes chunks, never work
that grows with a request's fields; its ``n`` choices are ``n`` engine requests on the same prepared inputs (vLLM's parent/child requests). Every engine stream
is read by a task of its own and merged in arrival order; ending the response for any reason (a
client that disconnects, a stop string, an error) cancels those tasks, and a cancelled stream
aborts its request in the engine (the client's contract), so the engine never generates for
nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any, TypeVar, cast

import msgspec
from msgspec import UNSET, UnsetType
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mmfront import __version__
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.errors import ConfigError, ModelNotFoundError, RequestBodyError, ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import PromptInput, RequestOptions
from mmfront.preprocess.context_length import get_max_tokens
from mmfront.preprocess.truncation import resolve_truncation
from mmfront.processing import BaseProcessingInfo
from mmfront.serve import (
    beam_search,
    openapi,
    protocol,
    request_checks,
    request_decoding,
    responses,
    sampling,
    tokenize,
)
from mmfront.serve.bodies import BodyBudget, HeldBody, read_body
from mmfront.serve.chat_bounds import check_chat_body
from mmfront.serve.chat_parsing import ChatParsing, ChoiceStream, ParsedDelta, RequestParsing
from mmfront.serve.errors import BODY_PARAM, error_body
from mmfront.serve.event_stream import SSE_DONE, event_stream_response, sse_event
from mmfront.serve.iteration_stats import Recorder, RequestTimings, StatsRecorder
from mmfront.serve.middleware import LoadCount, LoadTracker, RootPath, XRequestIdMiddleware, add_user_middleware
from mmfront.serve.output import ChoiceOutput, Delta, LogprobTokens, PositionLogprobs, WholeOutput, make_detokenizer
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.serve.request_log import RequestLogger, logged_message
from mmfront.serve.responses import ENCODER, LogprobFormat, ResponseHead, UsageInfo
from mmfront.serve.settings import ServeSettings
from mmfront.serve.stats import ServerMetrics
from mmfront.serve.stats_log import MultiModalCacheDelta, StatsLog, kv_cache_device, log_stats_interval
from mmfront.serve.tool_parsers import CallDelta
from mmfront.serve.weight_versions import WeightVersions, WeightVersionSpan
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput

_T = TypeVar("_T")
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/invocations"})
"""The routes ``--enable-server-load-tracking`` counts (vLLM's, of those mmfront serves)."""
logger = logging.getLogger(__name__)

SESSION_ID_HEADER = "X-Session-ID"
"""The header vLLM reads a request's ``session_id`` from when the body has none."""


def json_response(body: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(ENCODER.encode(body), status, headers, media_type="application/json")


def error_response(exc: BaseException) -> Response:
    """``exc`` as vLLM answers it, with the status of its class (:mod:`mmfront.serve.errors`)."""
    body = error_body(exc)
    return json_response(body, body.error.code)


class _Unanswered(Enum):
    CHOICE = "a beam search found fewer beams than it was asked for"


_QueueItem = EngineCoreOutput | WholeOutput | BaseException | _Unanswered | None


class _Generation:
    """The engine streams of one HTTP request, each read by its own task into one queue
    (``request_ids``: each stream's request), or its beam searches (:meth:`searching`)."""

    def __init__(self, streams: list[AsyncIterator[EngineCoreOutput]], request_ids: list[str]) -> None:
        self.request_ids = request_ids
        self.timings: dict[int, RequestTimings] = {}
        """Each finished choice's timings, where kept (``--enable-per-request-metrics``)."""
        self.weight_versions: dict[int, list[WeightVersionSpan] | None] = {}
        """Each finished choice's weight-version spans (``return_weight_versions``)."""
        self.queue: asyncio.Queue[tuple[int, _QueueItem]] = asyncio.Queue()
        self.tasks = [asyncio.create_task(self._pump(i, s)) for i, s in enumerate(streams)]

    @classmethod
    def searching(cls, searches: list[Coroutine[Any, Any, list[WholeOutput]]], width: int,
                  request_ids: list[str]) -> _Generation:
        """One beam search per prompt, each answering choices ``width * p`` on at once when it ends."""
        gen = cls([], request_ids)
        gen.tasks = [asyncio.create_task(gen._search(p * width, width, search)) for p, search in enumerate(searches)]
        return gen

    async def _search(self, first: int, width: int, search: Coroutine[Any, Any, list[WholeOutput]]) -> None:
        try:
            found = await search
        except Exception as e:
            self.queue.put_nowait((first, e))
            return
        for k in range(width):
            self.queue.put_nowait((first + k, found[k] if k < len(found) else _Unanswered.CHOICE))

    async def _pump(self, index: int, stream: AsyncIterator[EngineCoreOutput]) -> None:
        try:
            async for output in stream:
                self.queue.put_nowait((index, output))
        except Exception as e:
            self.queue.put_nowait((index, e))
            return
        self.queue.put_nowait((index, None))

    def stop(self, index: int) -> None:
        """Stop reading choice ``index``: its engine request is aborted."""
        self.tasks[index].cancel()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class _Server:
    """The state the routes share: the client, the settings, the tokenizer and the metrics."""

    def __init__(self, client: AsyncEngineClient, settings: ServeSettings) -> None:
        self.client = client
        self.settings = settings
        self.preprocessor = client.client.processor.preprocessor
        self.tokenizer = self.preprocessor.tokenizer
        self.logprob_tokens = LogprobTokens(self.tokenizer)
        self.vocab_size = _model_vocab_size(self.preprocessor.pipeline.processor.info, len(self.tokenizer))
        self.vocabulary = sampling.Vocabulary.of(self.tokenizer, self.vocab_size)
        self.end_of_sequence = beam_search.end_of_sequence_ids(
            self.preprocessor.pipeline.processor.info.get_generation_config_fields(), self.tokenizer.eos_token_id)
        """The tokens that finish a beam (``use_beam_search``)."""
        self.model_name = settings.model_names[0]
        self.created = int(time.time())
        digest = hashlib.sha256(f"{settings.model}|{self.model_name}".encode()).hexdigest()[:8]
        self.fingerprint = {"none": None, "custom": settings.fingerprint_value}.get(
            settings.fingerprint_mode, f"mmfront-{__version__}-{digest}")
        engines = [rank.index for rank in client.client.ranks] or [0]
        context = self.max_model_len or _model_context(self.preprocessor.pipeline.processor.info)
        self.metrics = ServerMetrics(self.model_name, self.preprocessor, client, max_model_len=context,
                                     engine_indexes=engines, engine_stats=not settings.disable_log_stats)
        self.stats_log = None
        if settings.api_server_count > 1 and not settings.disable_log_stats:
            logger.warning("--api-server-count is more than 1: no stats line, as in vLLM (each API server sees only "
                           "its own requests); /metrics is kept.")
        elif not settings.disable_log_stats:
            self.stats_log = StatsLog(engines, MultiModalCacheDelta(self.preprocessor.stats),
                                      kv_cache_device=kv_cache_device())
        loggers: list[Recorder] = [] if settings.disable_log_stats else [self.metrics.record]
        self.stats = StatsRecorder(loggers + ([] if self.stats_log is None else [self.stats_log.record]))
        if loggers:
            client.add_step_observer(self.stats.on_step)
        self.weight_versions = WeightVersions()
        client.add_step_observer(self.weight_versions.on_step)
        self.request_log = RequestLogger(settings.max_log_len) if settings.enable_log_requests else None
        self.output_log = self.request_log if settings.enable_log_outputs else None
        """Where ``--enable-log-outputs`` logs (it needs ``--enable-log-requests``, as vLLM's)."""
        self.load_tracker = LoadCount()
        self.parsing = ChatParsing(settings, self.tokenizer)
        self.bodies = BodyBudget(settings.max_body_bytes_in_flight)

    @property
    def max_model_len(self) -> int | None:
        """The context this app serves: the engines' ``max_model_len``, capped by the processing
        configuration's (``--max-model-len``), which the client is not changed to carry (it may
        serve other apps)."""
        limits = [n for n in (self.client.max_model_len, self.preprocessor.config.max_model_len) if n is not None]
        return min(limits) if limits else None

    # --- plain routes ---------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self.client.errored else 200)

    async def ping(self, request: Request) -> Response:
        """SageMaker's health check (GET and POST), answered as ``/health``."""
        return await self.health(request)

    async def version(self, request: Request) -> Response:
        return json_response(responses.VersionResponse(__version__))

    async def models(self, request: Request) -> Response:
        root = str(self.settings.model)
        cards = [responses.model_card(name, root, self.created, self.max_model_len,
                                      f"modelperm-{secrets.token_hex(8)}") for name in self.settings.model_names]
        return json_response(responses.ModelList(data=cards))

    async def metrics_route(self, request: Request) -> Response:
        body, content_type = self.metrics.render()
        return Response(body, headers={"Content-Type": content_type})

    async def load(self, request: Request) -> Response:
        """vLLM's ``/load``: generation requests in flight (counted with ``--enable-server-load-tracking``)."""
        return json_response(responses.ServerLoad(self.load_tracker.in_flight))

    async def tokenizer_info(self, request: Request) -> Response:
        info = tokenize.tokenizer_info(self.tokenizer, self.preprocessor.config.chat_template)
        return Response(ENCODER.encode(info), media_type="application/json")

    # --- tokenizer routes -----------------------------------------------------------------------

    async def tokenize_route(self, request: Request) -> Response:
        return await self._guarded(request, self._tokenize)

    async def detokenize_route(self, request: Request) -> Response:
        return await self._guarded(request, self._detokenize)

    async def _tokenize(self, request: Request, body: bytes) -> Response:
        req = await self._off_loop(self._decode_tokenize, body)
        self._check_model(req.model)
        if isinstance(req, tokenize.TokenizeChatRequest):
            self._check_mm_kwargs(req.mm_processor_kwargs, req.media_io_kwargs)
            req.chat_template_kwargs = self._template_kwargs(req.chat_template_kwargs)
        request_id = f"tokenize-{_base_id(request, None)}"
        if self.request_log is not None:
            self.request_log.log_tokenize(request_id, req)
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self.preprocessor.executor, partial(
            tokenize.tokenize, self.preprocessor, req, self.max_model_len, request_id))
        return json_response(answer)

    async def _detokenize(self, request: Request, body: bytes) -> Response:
        req = await self._off_loop(tokenize.decode_detokenize, body)
        self._check_model(req.model)
        return json_response(await self._off_loop(tokenize.detokenize, self.tokenizer, req))

    # --- generation routes ----------------------------------------------------------------------

    async def invocations(self, request: Request) -> Response:
        """SageMaker's one inference route: a chat completion body is answered as
        ``/v1/chat/completions``, else a completion body as ``/v1/completions`` (vLLM's order)."""
        return await self._guarded(request, self._invoke)

    async def _invoke(self, request: Request, body: bytes) -> Response:
        for handler, kind in ((self._chat, ChatCompletionRequest), (self._completions, CompletionRequest)):
            if await self._off_loop(request_decoding.fits, body, kind):
                return await handler(request, body)
        return error_response(ValidationError(
            "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"))

    async def chat(self, request: Request) -> Response:
        return await self._guarded(request, self._chat)

    async def completions(self, request: Request) -> Response:
        return await self._guarded(request, self._completions)

    async def _guarded(self, request: Request, handler: Callable[[Request, bytes], Awaitable[Response]]) -> Response:
        """Read the body, then run ``handler``; any error becomes vLLM's error JSON, and a client
        that disconnects before the response starts cancels it (which aborts its engine
        requests). The watch starts after the body is read: until then, what the server
        receives is the body. The body counts against ``--max-body-bytes-in-flight`` until the
        handler returns."""
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":  # vLLM's check, before anything is read
            return error_response(RequestBodyError("Unsupported Media Type: Only 'application/json' is allowed",
                                                   parameter=BODY_PARAM))
        held = HeldBody(self.bodies)
        try:
            return await self._answer(request, held, handler)
        finally:
            held.release()

    async def _answer(self, request: Request, held: HeldBody,
                      handler: Callable[[Request, bytes], Awaitable[Response]]) -> Response:
        try:
            body = await read_body(request, self.settings.max_body_bytes, held)
        except ClientDisconnect:
            return Response(status_code=499)
        except Exception as e:
            return error_response(e)
        # held once, as read: the handlers and msgspec read any buffer, so no bytes copy is made
        task = asyncio.ensure_future(handler(request, cast(bytes, body)))
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                return Response(status_code=499)
            return task.result()
        except Exception as e:
            if self.settings.log_error_stack:
                logger.error("Error response to %s %s", request.method, request.url.path, exc_info=e)
            return error_response(e)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    async def _chat(self, request: Request, body: bytes) -> Response:
        chat = await self._off_loop(self._prepare_chat, request, body)
        req, response_id, parsing, inputs, options = chat.req, chat.response_id, chat.parsing, chat.inputs, chat.options
        if chat.params is None:
            gen, choices = self._search(response_id, [(inputs, options)], req, chat.max_tokens, [response_id])
        else:
            gen, choices = await self._start(response_id, [(inputs, options)], chat.params, [response_id],
                                             weight_versions=req.return_weight_versions)
        prompt_ids = list(inputs["prompt_token_ids"])
        head = self._head(response_id)
        headers = _id_header(request)
        role = self._role(req)
        echo = _echoed_message(req, role) if req.echo else ""
        if req.stream:
            chunks = self._chat_chunks(gen, choices, head, req, inputs=inputs, role=role, echo=echo, parsing=parsing)
            return event_stream_response(chunks, gen.close, headers, self.settings.sse_keep_alive_interval)
        try:
            await self._drain(gen, choices)
        finally:
            await gen.close()
        fmt = self._logprob_format(req)
        choices = [c for c in choices if c.finished]  # a beam search may answer fewer
        body_choices = [_parsed_choice(
            parsing, i, c,
            responses.chat_logprobs(c.token_ids, c.logprobs, _top_logprobs(req), fmt) if req.logprobs else None,
            echo=echo, role=role, token_ids=list(c.token_ids) if req.return_token_ids else None)
            for i, c in enumerate(choices)]
        for i, choice in enumerate(body_choices):
            choice.weight_versions = _weight_versions(req, gen, i)
        usage = responses.usage(len(prompt_ids), sum(len(c.token_ids) for c in choices))
        _add_reasoning_tokens(usage, parsing, choices)
        if self.settings.enable_prompt_tokens_details:
            usage.prompt_tokens_details = _chat_prompt_details(choices[0], inputs)
        answer = responses.chat_response(head, body_choices, usage, prompt_logprobs=choices[0].prompt_logprobs,
                                         prompt_token_ids=prompt_ids if req.return_token_ids else None,
                                         prompt_text=inputs.get("prompt") if req.return_prompt_text else None,
                                         metrics=self._metrics(gen, usage.completion_tokens))
        if self.output_log is not None:
            for choice, output in zip(body_choices, choices):
                logged = logged_message(choice.message)
                if logged:
                    self.output_log.log_outputs(head.id, logged, output.token_ids, choice.finish_reason)
        return json_response(answer, headers=headers)

    async def _completions(self, request: Request, body: bytes) -> Response:
        req: CompletionRequest = await self._off_loop(request_decoding.decode_request, body, CompletionRequest)
        if req.stream and req.use_beam_search:  # vLLM's first check
            raise ValidationError("Streaming is not currently supported with beam search")
        self._check_model(req.model)
        self._check_mm_kwargs(req.mm_processor_kwargs, None)
        response_id = f"cmpl-{_base_id(request, req.request_id)}"
        options = RequestOptions(hf_processor_mm_kwargs=req.mm_processor_kwargs, cache_salt=req.cache_salt,
                                 priority=req.priority, **self._prompt_options(request, req, req.max_tokens or 0))
        prompts = await self._off_loop(protocol.prompts, req)
        prepared = [(await self._prepare(p, options, response_id), options) for p in prompts]
        lengths = [len(inputs["prompt_token_ids"]) for inputs, _ in prepared]
        logged = [f"{response_id}-{p}" for p in range(len(prepared))]  # the ids vLLM's request log gives them
        if req.use_beam_search:
            gen, choices = self._search(response_id, prepared, req, self._max_tokens(req.max_tokens, max(lengths)),
                                        logged)
        else:
            params = await self._off_loop(self._params, req, self._max_tokens(req.max_tokens, max(lengths)),
                                          [inputs for inputs, _ in prepared], None)
            gen, choices = await self._start(response_id, prepared, params, logged,
                                             weight_versions=req.return_weight_versions)
        head = self._head(response_id)
        headers = _id_header(request)
        per_prompt = len(choices) // len(prepared)
        echoes = [_EchoedPrompt(list(inputs["prompt_token_ids"]), "" if req.return_token_ids or not req.echo
                                else p if isinstance(p, str) else self._decode(p))
                  for p, (inputs, _) in zip(prompts, prepared) for _ in range(per_prompt)]
        if req.stream:
            chunks = self._completion_chunks(gen, choices, head, req, echoes)
            return event_stream_response(chunks, gen.close, headers, self.settings.sse_keep_alive_interval)
        try:
            await self._drain(gen, choices)
        finally:
            await gen.close()
        fmt = self._logprob_format(req)
        body_choices = []
        answered = [(c, prompt) for c, prompt in zip(choices, echoes) if c.finished]  # a beam search may answer fewer
        choices = [c for c, _ in answered]
        for i, (c, prompt) in enumerate(answered):
            text, token_ids, positions = _completion_output(req, prompt, c.text, c.token_ids, logprobs=c.logprobs,
                                                            prompt_logprobs=c.prompt_logprobs)
            logprobs = (None if req.logprobs is None
                        else responses.completion_logprobs(token_ids, positions, _top_logprobs(req), fmt))
            body_choices.append(responses.completion_choice(
                i, text, logprobs, c.finish_reason, c.stop_reason,
                token_ids=list(c.token_ids) if req.return_token_ids else None, prompt_logprobs=c.prompt_logprobs,
                prompt_token_ids=prompt.token_ids if req.return_token_ids else None))
            body_choices[-1].weight_versions = _weight_versions(req, gen, i)
        usage = responses.usage(sum(lengths), sum(len(c.token_ids) for c in choices))
        if self.output_log is not None:
            for c in choices:
                self.output_log.log_outputs(head.id, c.text, c.token_ids, c.finish_reason)
        if self.settings.enable_prompt_tokens_details:  # the last prompt's, as vLLM's
            usage.prompt_tokens_details = responses.PromptTokenUsageInfo(
                cached_tokens=_cached_tokens(choices[-1]), created_cache_tokens=None, multimodal_tokens=None)
        answer = responses.completion_response(head, body_choices, usage,
                                               metrics=self._metrics(gen, usage.completion_tokens))
        return json_response(answer, headers=headers)

    # --- the pieces -----------------------------------------------------------------------------

    def _head(self, response_id: str) -> ResponseHead:
        return ResponseHead(response_id, int(time.time()), self.model_name, self.fingerprint)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.settings.model_names:
            raise ModelNotFoundError(f"The model `{model}` does not exist. Valid aliases: "
                                     f"{', '.join(self.settings.model_names)}.", parameter="model")

    def _max_tokens(self, requested: int | None, prompt_tokens: int, param: str = "max_tokens") -> int | None:
        """The output budget the one context-length rule gives (vLLM's ``get_max_tokens``)."""
        return get_max_tokens(self.max_model_len, requested, prompt_tokens, max_tokens_param=param)

    def _prepare_chat(self, request: Request, body: bytes) -> _PreparedChat:
        """A chat request from its body to its engine inputs and sampling parameters (none for a
        beam search), in one job on the preparation pool: each job is a round trip between the
        loop and a pool thread (a wake-up of each), and the steps ran as three."""
        req = self._decode_chat(body)
        self._check_model(req.model)
        self._check_mm_kwargs(req.mm_processor_kwargs, None)
        response_id = f"chatcmpl-{_base_id(request, req.request_id)}"
        parsing = self.parsing.for_request(req)
        options = RequestOptions(
            hf_processor_mm_kwargs=req.mm_processor_kwargs, cache_salt=req.cache_salt, priority=req.priority,
            chat_template=req.chat_template, chat_template_kwargs=self._template_kwargs(
                protocol.template_kwargs(req, self.settings.reasoning_effort_map)),
            add_generation_prompt=req.add_generation_prompt, continue_final_message=req.continue_final_message,
            tools=protocol.template_tools(req, self.settings.exclude_tools_when_tool_choice_none),
            **self._prompt_options(request, req, req.max_completion_tokens if req.max_completion_tokens is not None
                                   else req.max_tokens))
        inputs = self._preprocess(req.messages, options, response_id)
        max_tokens = self._max_tokens(req.max_completion_tokens or req.max_tokens, len(inputs["prompt_token_ids"]),
                                      "max_completion_tokens" if req.max_completion_tokens else "max_tokens")
        params = None if req.use_beam_search else self._params(req, max_tokens, [inputs], parsing)
        return _PreparedChat(req, response_id, parsing, options, inputs, max_tokens, params)

    def _params(self, req: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
                prepared: list[MultiModalInputs], parsing: RequestParsing | None) -> SamplingParams:
        """The request's ``SamplingParams``, checked as vLLM's API server checks them (logprob
        limits, token ids against the vocabulary, ``bad_words`` tokenized, a structured-outputs
        constraint compiled): work that grows with the request's fields, so it runs off the loop."""
        params = sampling.sampling_params(req, max_tokens)
        if parsing is not None:
            params = parsing.adjust(params)
        sampling.check_logprobs(params, self.settings.max_logprobs, self.vocab_size)
        sampling.verify_params(params, self.vocabulary)
        for inputs in prepared:
            sampling.check_prompt_bounds(params, len(inputs["prompt_token_ids"]))
        return params

    async def _off_loop(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` on the preparation pool: the event loop never waits on work that grows
        with a request (decoding its body, checking its fields). A request whose client leaves
        while the work is queued is cancelled before it starts (asyncio cancels the pool's future)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.preprocessor.executor, partial(work, *args))

    async def _prepare(self, prompt: PromptInput, options: RequestOptions, request_id: str) -> MultiModalInputs:
        return await self._off_loop(self._preprocess, prompt, options, request_id)

    def _preprocess(self, prompt: PromptInput, options: RequestOptions, request_id: str) -> MultiModalInputs:
        if self.client.errored:
            raise self.client.dead_error
        return self.preprocessor.preprocess(prompt, request_id=request_id, options=options)

    def _log_inputs(self, logged: Sequence[str], prepared: list[tuple[MultiModalInputs, RequestOptions]],
                    params: SamplingParams | beam_search.BeamSearchParams) -> None:
        """``--enable-log-requests``: each prompt under the id ``logged`` gives it, as vLLM's API
        server logs it (once per prompt, whatever its ``n`` or beam steps)."""
        if self.request_log is not None:
            for log_id, (inputs, _) in zip(logged, prepared):
                self.request_log.log_inputs(log_id, inputs.get("prompt"), inputs["prompt_token_ids"], params)

    async def _start(
        self, response_id: str, prepared: list[tuple[MultiModalInputs, RequestOptions]], params: SamplingParams,
        logged: Sequence[str], *, weight_versions: bool = False,
    ) -> tuple[_Generation, list[ChoiceOutput]]:
        """Send ``params.n`` engine requests per prompt (ids ``{i}_{base}`` as vLLM's children;
        logged under ``logged``); ``weight_versions``: track the weights that make each one's tokens."""
        n = params.n
        base = f"{response_id}-{secrets.token_hex(4)}"
        streams: list[AsyncIterator[EngineCoreOutput]] = []
        choices: list[ChoiceOutput] = []
        request_ids = [f"{k}_{base}" if n > 1 or len(prepared) > 1 else base for k in range(len(prepared) * n)]
        if weight_versions:
            self.weight_versions.track(request_ids)
        self._log_inputs(logged, prepared, params)
        try:
            for p, (inputs, options) in enumerate(prepared):
                self.stats.add_requests(request_ids[p * n:(p + 1) * n], len(inputs["prompt_token_ids"]),
                                        params.max_tokens, stop_strings=bool(params.stop),
                                        keep_timings=self._attributable(len(request_ids)))
                for i in range(n):
                    child = sampling.child_params(params, i) if n > 1 else params
                    streams.append(await self.client.add_request(request_ids[p * n + i], inputs, child,
                                                                 options=options))
                    choices.append(ChoiceOutput(make_detokenizer(
                        self.tokenizer, inputs["prompt_token_ids"], skip_special_tokens=params.skip_special_tokens),
                        child, self.logprob_tokens))
        except BaseException:
            for stream in streams:
                await stream.aclose()  # type: ignore[attr-defined]
            for request_id in request_ids:
                self.stats.drop(request_id)
                self.weight_versions.drop(request_id)
            raise
        return _Generation(streams, request_ids), choices

    def _search(self, response_id: str, prepared: list[tuple[MultiModalInputs, RequestOptions]],
                req: ChatCompletionRequest | CompletionRequest, max_tokens: int | None, logged: Sequence[str],
                ) -> tuple[_Generation, list[ChoiceOutput]]:
        """``use_beam_search``: each prompt's ``n`` beams (:mod:`mmfront.serve.beam_search`), logged
        under ``logged`` and checked as vLLM logs and checks them before its first step, searched by
        the generation's tasks."""
        if max_tokens is None:  # the engine named no context length to bound the search by
            raise ValidationError("Beam search needs `max_tokens` where the engine reports no max_model_len.",
                                  parameter="max_tokens")
        params = beam_search.beam_search_params(req, max_tokens)
        self._log_inputs(logged, prepared, params)
        if params.allowed_token_ids:  # vLLM's stock engines run its V1 model runner, which has no exact-id logprobs
            raise ValidationError("Beam allowlists require the V2 model runner")
        step = params.step_params()
        sampling.check_logprobs(step, self.settings.max_logprobs, self.vocab_size)
        search = beam_search.BeamSearch(self.client, self.tokenizer, self.end_of_sequence, self.stats)
        width = params.beam_width
        searches = [search.run(response_id if len(prepared) == 1 else f"{response_id}_{p}", inputs, options, params)
                    for p, (inputs, options) in enumerate(prepared)]
        choices = [ChoiceOutput(make_detokenizer(self.tokenizer, inputs["prompt_token_ids"],
                                                 skip_special_tokens=params.skip_special_tokens), step)
                   for inputs, _ in prepared for _ in range(width)]
        return _Generation.searching(searches, width, [response_id] * len(choices)), choices

    async def _deltas(self, gen: _Generation, choices: list[ChoiceOutput]) -> AsyncIterator[tuple[int, Delta]]:
        """Each choice's deltas until every choice finished. Outputs that arrived while the last
        chunk was written are merged into one delta per choice, as vLLM's output collector
        merges them: a slow client gets fewer, larger chunks instead of a growing backlog."""
        open_choices = set(range(len(choices)))
        held: dict[int, Delta] = {}
        """Each choice's deltas held back by its ``stream_interval`` (vLLM's output processor sends
        a stream's first tokens at once, then every ``stream_interval`` tokens, and its end)."""
        started: set[int] = set()
        try:
            while open_choices:
                batch = [await gen.queue.get()]
                while not gen.queue.empty():
                    batch.append(gen.queue.get_nowait())
                merged: dict[int, Delta] = {}
                for index, item in batch:
                    if index not in open_choices:
                        continue
                    if isinstance(item, BaseException):
                        raise item
                    if item is _Unanswered.CHOICE:  # no chunk, no choice in the answer (vLLM's)
                        open_choices.discard(index)
                        continue
                    if item is None:  # the stream ended without a finish: aborted by someone else
                        choices[index].finish_reason = choices[index].finish_reason or "abort"
                        delta = Delta("", [], None, "abort")
                        self.stats.drop(gen.request_ids[index])
                    elif isinstance(item, WholeOutput):
                        delta = choices[index].complete(item)
                    else:
                        try:
                            delta = choices[index].process(item)
                        finally:  # it counts as searched for stop strings, as vLLM's output processor counts
                            self.stats.consumed(gen.request_ids[index], choices[index].finish_reason)
                    if delta.stopped:  # vLLM's output processor finishes it as the engine would
                        gen.stop(index)
                    if delta.finish_reason is not None:
                        open_choices.discard(index)
                        timings = self.stats.take_timings(gen.request_ids[index])
                        if timings is not None:
                            gen.timings[index] = timings
                        gen.weight_versions[index] = self.weight_versions.take(gen.request_ids[index],
                                                                               len(choices[index].token_ids))
                    if index in held:
                        delta = held.pop(index).then(delta)
                    interval = choices[index].params.stream_interval or 1
                    if (interval > 1 and delta.finish_reason is None and index in started
                            and len(delta.token_ids) < interval):
                        held[index] = delta
                        continue
                    started.add(index)
                    merged[index] = merged[index].then(delta) if index in merged else delta
                for index, delta in merged.items():
                    yield index, delta
        finally:  # what is still open was given up: the client left, or a choice failed
            for index in open_choices:
                self.stats.drop(gen.request_ids[index])
                self.weight_versions.drop(gen.request_ids[index])

    async def _drain(self, gen: _Generation, choices: list[ChoiceOutput]) -> None:
        async for _ in self._deltas(gen, choices):
            pass

    async def _chat_chunks(self, gen: _Generation, choices: list[ChoiceOutput], head: ResponseHead,
                           req: ChatCompletionRequest, *, inputs: MultiModalInputs, role: str, echo: str,
                           parsing: RequestParsing) -> AsyncIterator[bytes]:
        """``echo``: the last message's content, sent first (``echo``)."""
        prompt_ids = list(inputs["prompt_token_ids"])
        with_usage, running = self._usage_options(req)
        prompt_tokens = len(prompt_ids)
        fmt = self._logprob_format(req)
        parsed = [parsing.stream(prompt_ids) for _ in choices] if parsing.active else None

        def so_far(tokens: int) -> UsageInfo | None:
            return responses.usage(prompt_tokens, tokens, details=False, completion_details=True) if running else None

        try:
            for i in range(len(choices)):
                yield sse_event(responses.chat_role_chunk(head, i, so_far(0), role=role,
                                                     prompt_token_ids=prompt_ids if req.return_token_ids else None,
                                                     prompt_text=inputs.get("prompt") if req.return_prompt_text
                                                     else None))
            for i in range(len(choices) if echo else 0):
                yield sse_event(responses.chat_echo_chunk(head, i, echo, so_far(0)))
            async for i, delta in self._deltas(gen, choices):
                logprobs = (responses.chat_logprobs(delta.token_ids, delta.logprobs or [], _top_logprobs(req), fmt)
                            if req.logprobs else None)
                text = None if delta.finish_reason is not None and not choices[i].token_ids else delta.text
                if parsed is not None:
                    step = _parsed_step(parsed[i], delta.text, delta.finish_reason is not None)
                    self._log_chat_delta(head.id, step.content, step.reasoning,
                                         "".join(c.arguments or "" for c in step.tool_calls), delta)
                    if not step.sends_chunk and delta.finish_reason is None and logprobs is None:
                        continue  # the parsers hold this text back (vLLM sends no chunk)
                    yield sse_event(responses.chat_chunk(
                        head, i, step.content,
                        logprobs=logprobs, finish_reason=parsing.finish_reason(delta.finish_reason,
                                                                               parsed[i].calls_made),
                        stop_reason=delta.stop_reason, fingerprint=not with_usage,
                        usage_info=so_far(len(choices[i].token_ids)), reasoning=step.reasoning,
                        tool_calls=[_delta_call(c) for c in step.tool_calls],
                        token_ids=delta.token_ids if req.return_token_ids else None,
                        weight_versions=_weight_versions(req, gen, i)))
                    continue
                self._log_chat_delta(head.id, text, None, "", delta)
                yield sse_event(responses.chat_chunk(head, i, text, logprobs=logprobs, finish_reason=delta.finish_reason,
                                                stop_reason=delta.stop_reason, fingerprint=not with_usage,
                                                usage_info=so_far(len(choices[i].token_ids)),
                                                token_ids=delta.token_ids if req.return_token_ids else None,
                                                weight_versions=_weight_versions(req, gen, i)))
            if with_usage:
                usage = responses.usage(prompt_tokens, sum(len(c.token_ids) for c in choices), details=False)
                _add_reasoning_tokens(usage, parsing, choices)
                if self.settings.enable_prompt_tokens_details:
                    usage.prompt_tokens_details = _chat_prompt_details(choices[0], inputs)
                yield sse_event(responses.chat_usage_chunk(head, usage, self._metrics(gen, usage.completion_tokens)))
            self._log_stream_complete(head.id, choices)
        except Exception as e:
            yield sse_event(error_body(e))
        finally:
            await gen.close()
        yield SSE_DONE

    async def _completion_chunks(self, gen: _Generation, choices: list[ChoiceOutput], head: ResponseHead,
                                 req: CompletionRequest, prompts: list[_EchoedPrompt]) -> AsyncIterator[bytes]:
        """``prompts``: each choice's prompt, its tokens and the text ``echo`` repeats."""
        with_usage, running = self._usage_options(req)
        fmt = self._logprob_format(req)
        offsets = [0] * len(choices)
        started = [False] * len(choices)
        try:
            async for i, delta in self._deltas(gen, choices):
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
                    logprobs = responses.completion_logprobs(token_ids, positions, _top_logprobs(req), fmt,
                                                             offsets[i])
                    if logprobs.tokens:
                        offsets[i] = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
                so_far = (responses.usage(len(prompt.token_ids), len(choices[i].token_ids), details=False) if running
                          else None)
                if self.output_log is not None and delta.text and self.settings.enable_log_deltas:
                    self.output_log.log_outputs(head.id, delta.text, delta.token_ids, delta.finish_reason,
                                                is_streaming=True, delta=True)
                yield sse_event(responses.completion_chunk(
                    head, i, text, logprobs=logprobs, finish_reason=delta.finish_reason,
                    stop_reason=delta.stop_reason, fingerprint=not with_usage, usage_info=so_far,
                    prompt_token_ids=prompt.token_ids if first and (req.echo or req.return_token_ids) else None,
                    token_ids=delta.token_ids if req.return_token_ids else None,
                    weight_versions=_weight_versions(req, gen, i) if delta.finish_reason is not None else None))
            if with_usage:
                usage = responses.usage(sum(len(p.token_ids) for p in prompts[::max(req.n or 1, 1)]),
                                        sum(len(c.token_ids) for c in choices), details=False)
                if self.settings.enable_prompt_tokens_details:
                    usage.prompt_tokens_details = responses.PromptTokenUsageInfo(
                        cached_tokens=_cached_tokens(choices[-1]))
                yield sse_event(responses.completion_usage_chunk(head, usage,
                                                                 self._metrics(gen, usage.completion_tokens)))
            self._log_stream_complete(head.id, choices)
        except Exception as e:
            yield sse_event(error_body(e))
        finally:
            await gen.close()
        yield SSE_DONE

    def _log_chat_delta(self, request_id: str, content: str | None, reasoning: str | None, tool_args: str,
                        delta: Delta) -> None:
        """vLLM's log of a chat stream's delta: its text, ``[reasoning: ...]`` and ``[tool_calls: ...]``."""
        if self.output_log is None or not self.settings.enable_log_deltas:
            return
        parts = [part for part in (content, reasoning and f"[reasoning: {reasoning}]",
                                   tool_args and f"[tool_calls: {tool_args}]") if part]
        if parts:
            self.output_log.log_outputs(request_id, " ".join(parts), delta.token_ids, delta.finish_reason,
                                        is_streaming=True, delta=True)

    def _log_stream_complete(self, request_id: str, choices: list[ChoiceOutput]) -> None:
        """vLLM's log of each choice's whole text once its stream is complete."""
        if self.output_log is not None:
            for choice in choices:
                self.output_log.log_outputs(request_id, choice.text, None, "streaming_complete", is_streaming=True)

    def _decode_token(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def _decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids))

    def _logprob_format(self, req: ChatCompletionRequest | CompletionRequest) -> LogprobFormat:
        as_ids = req.return_tokens_as_token_ids
        return LogprobFormat(self._decode_token,
                             self.settings.return_tokens_as_token_ids if as_ids is None else as_ids)

    def _check_mm_kwargs(self, mm_processor_kwargs: dict[str, Any] | None,
                         media_io_kwargs: dict[str, Any] | None) -> None:
        """vLLM's ``validate_request_mm_kwargs``: per-request processing options only from trusted clients."""
        if self.settings.trust_request_mm_kwargs:
            return
        for name, given, what in (("mm_processor_kwargs", mm_processor_kwargs, "preprocessing"),
                                  ("media_io_kwargs", media_io_kwargs, "media loading")):
            if given:
                raise ValidationError(
                    f"Per-request {name} are disabled by default because they can change multimodal {what} "
                    "resource usage. Start the server with --trust-request-mm-kwargs only when clients are trusted.",
                    parameter=name)

    def _attributable(self, engine_requests: int) -> bool:
        """Whether a request's timings are answered (``--enable-per-request-metrics``): only where
        one engine request makes it (vLLM leaves them out for ``n`` > 1 and several prompts)."""
        return self.settings.enable_per_request_metrics and engine_requests == 1

    def _metrics(self, gen: _Generation, generated_tokens: int) -> responses.PerRequestMetrics | None:
        """``metrics`` of an answer: its one engine request's timings, where answered."""
        if not self._attributable(len(gen.request_ids)):
            return None
        return responses.per_request_metrics(gen.timings.get(0), generated_tokens)

    def _prompt_options(self, request: Request, req: ChatCompletionRequest | CompletionRequest,
                        max_output_tokens: int | None) -> dict[str, Any]:
        """The request's options for its prompt (``add_special_tokens``, ``truncate_prompt_tokens``
        and ``truncation_side``, the limit checked as vLLM checks it) and its engine request's
        ``session_id`` (vLLM's ``_get_session_id``: the field, else the ``X-Session-ID`` header,
        else a string ``vllm_xargs["session_id"]``)."""
        session_id = req.session_id or request.headers.get(SESSION_ID_HEADER) or None
        if session_id is None and req.vllm_xargs and isinstance(req.vllm_xargs.get("session_id"), str):
            session_id = str(req.vllm_xargs["session_id"]) or None
        if req.truncate_prompt_tokens is not None:  # vLLM checks the output budget first
            self._max_tokens(max_output_tokens or None, 0, "max_completion_tokens"
                             if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None
                             else "max_tokens")
        truncation = resolve_truncation(req.truncate_prompt_tokens, req.truncation_side,
                                        max_model_len=self.max_model_len, max_output_tokens=max_output_tokens)
        return {"add_special_tokens": req.add_special_tokens, "truncation": truncation, "session_id": session_id}

    def _check_chat_body(self, body: bytes) -> None:
        check_chat_body(body, max_messages=self.settings.max_chat_messages, max_parts=self.settings.max_content_parts,
                        max_prompt_chars=self.max_prompt_chars)

    def _decode_chat(self, body: bytes) -> ChatCompletionRequest:
        """A chat body decoded off the loop: its messages and parts counted and its text measured
        before they are built (a million messages are refused before a million structs exist, a
        60 MB text before it is decoded twice)."""
        self._check_chat_body(body)
        return request_decoding.decode_request(body, ChatCompletionRequest)

    def _decode_tokenize(self, body: bytes) -> tokenize.TokenizeCompletionRequest | tokenize.TokenizeChatRequest:
        """A ``/tokenize`` body decoded off the loop, a chat one's bounds checked first."""
        self._check_chat_body(body)
        return tokenize.decode_tokenize(body)

    @property
    def max_prompt_chars(self) -> int:
        return self.preprocessor.pipeline.processor.info.max_prompt_chars

    def _template_kwargs(self, given: dict[str, Any] | None) -> dict[str, Any] | None:
        """A request's ``chat_template_kwargs`` over ``--default-chat-template-kwargs``."""
        defaults = self.settings.default_chat_template_kwargs
        return given if not defaults else {**defaults, **(given or {})}

    def _role(self, req: ChatCompletionRequest) -> str:
        """vLLM's ``get_chat_request_role``: ``--response-role`` when a generation prompt is added,
        else the role of the message being continued."""
        return self.settings.response_role if req.add_generation_prompt else str(req.messages[-1].get("role"))

    def _usage_options(self, req: ChatCompletionRequest | CompletionRequest) -> tuple[bool, bool]:
        """Whether a stream ends with usage and whether every chunk carries it (vLLM's
        ``should_include_usage``: ``--enable-force-include-usage`` turns both on)."""
        if self.settings.enable_force_include_usage:
            return True, True
        return protocol.include_usage(req), protocol.continuous_usage(req)


def _model_vocab_size(info: BaseProcessingInfo, tokenizer_size: int) -> int:
    """The model's vocabulary (its config's, which may be padded past the tokenizer's), what vLLM's
    ``get_vocab_size`` gives ``-1`` logprobs; the tokenizer's where the model has no config."""
    try:
        config = info.get_hf_config()
    except ConfigError:
        return tokenizer_size
    return int(getattr(config.get_text_config(), "vocab_size", None) or tokenizer_size)


def _model_context(info: BaseProcessingInfo) -> int:
    """The context vLLM would derive from the model's config (``max_position_embeddings``), for
    an app whose engines did not say theirs; 1 where the model has no config."""
    try:
        config = info.get_hf_config()
    except ConfigError:
        return 1
    return int(getattr(config.get_text_config(), "max_position_embeddings", None) or 1)


@dataclass(frozen=True)
class _PreparedChat:
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
class _EchoedPrompt:
    """A completion choice's prompt: its tokens, and the text ``echo`` puts before the answer
    (empty with ``return_token_ids``, as vLLM's)."""

    token_ids: list[int]
    text: str


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


def _top_logprobs(req: ChatCompletionRequest | CompletionRequest) -> int:
    """How many candidates an answer lists per token (``top_logprobs``, completions' ``logprobs``):
    all (-1) with ``logprob_token_ids``, whose candidates are the ones the request named."""
    if req.logprob_token_ids:
        return -1
    asked = req.top_logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs
    return asked or 0


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


def _weight_versions(req: ChatCompletionRequest | CompletionRequest, gen: _Generation,
                     index: int) -> list[WeightVersionSpan] | None:
    """A finished choice's weight-version spans, where the request asked for them."""
    return gen.weight_versions.get(index) if req.return_weight_versions else None


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


def _cached_tokens(choice: ChoiceOutput) -> int:
    """The prompt tokens the engine's prefix cache held (0 from an engine that keeps no statistics, as vLLM's)."""
    return 0 if choice.prefill is None else choice.prefill.num_cached_tokens


def _chat_prompt_details(choice: ChoiceOutput, inputs: MultiModalInputs) -> responses.PromptTokenUsageInfo:
    """vLLM's ``_make_prompt_tokens_details``: cached and newly cached prompt tokens, and the
    multimodal placeholder tokens by modality (``None`` without media)."""
    by_modality = {modality: sum(r.length for r in ranges)
                   for modality, ranges in (inputs.get("mm_placeholders") or {}).items() if ranges}
    return responses.PromptTokenUsageInfo(
        cached_tokens=_cached_tokens(choice),
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


async def _disconnected(request: Request) -> None:
    """Return once the client has gone away: after the body, the next message an ASGI server
    delivers is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _base_id(request: Request, body_id: str | None) -> str:
    """vLLM's request id: the ``X-Request-Id`` header, else the body's ``request_id``, else random;
    a header id is bounded as the body's is (:func:`~mmfront.serve.request_checks.check_request_id`)."""
    given = request.headers.get("x-request-id")
    return request_checks.check_request_id(given, "X-Request-Id") if given else body_id or secrets.token_hex(8)


def _id_header(request: Request) -> dict[str, str] | None:
    given = request.headers.get("x-request-id")
    return {"X-Request-Id": given} if given else None


class _ApiKey:
    """vLLM's bearer-token check: every ``/v1`` path needs ``Authorization: Bearer KEY``; the
    token is compared in constant time, on its hash. Of several ``Authorization`` headers the
    first is checked, as vLLM checks it (``request.headers.get``)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.digest = hashlib.sha256(key.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path.startswith("/v1") and not self._valid(scope):
                await json_response(responses.UnauthorizedResponse(), 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _valid(self, scope: Scope) -> bool:
        header = Headers(scope=scope).get("authorization", "")  # the first, as vLLM reads it
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            hashlib.sha256(token.encode()).digest(), self.digest)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods answer as FastAPI does (``{"detail": ...}``), as vLLM's do."""
    assert isinstance(exc, HTTPException)
    return json_response(responses.HTTPErrorResponse(exc.detail), exc.status_code, dict(exc.headers or {}))


@contextlib.asynccontextmanager
async def _log_stats_periodically(stats_log: StatsLog | None, app: Starlette) -> AsyncIterator[None]:
    """vLLM's lifespan task: the stats line every ``VLLM_LOG_STATS_INTERVAL`` seconds while the app runs."""
    async def run(log: StatsLog) -> None:
        interval = log_stats_interval()
        while True:
            await asyncio.sleep(interval)
            log.log()

    task = None if stats_log is None else asyncio.create_task(run(stats_log))
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def create_app(client: AsyncEngineClient, settings: ServeSettings) -> Starlette:
    """The OpenAI-compatible app of ``vllm serve`` over ``client``.

    The app does not own ``client``, and leaves it as it is: close it when the app is done. The
    processing configuration's ``max_model_len``, when lower than the engines', is the app's limit."""
    server = _Server(client, settings)
    routes = [
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/ping", server.ping, methods=["GET", "POST"]),
        Route("/version", server.version, methods=["GET"]),
        Route("/metrics", server.metrics_route, methods=["GET"]),
        Route("/tokenize", server.tokenize_route, methods=["POST"]),
        Route("/detokenize", server.detokenize_route, methods=["POST"]),
        Route("/invocations", server.invocations, methods=["POST"]),
        Route("/load", server.load, methods=["GET"]),
    ]
    if settings.enable_tokenizer_info_endpoint:
        routes.append(Route("/tokenizer_info", server.tokenizer_info, methods=["GET"]))
    if not settings.disable_fastapi_docs:
        routes += openapi.routes([(r.path, sorted(r.methods or ())) for r in routes])
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error},
                    lifespan=partial(_log_stats_periodically, server.stats_log))
    # vLLM's order: the last added is outermost (user middleware, X-Request-Id, the API key, CORS)
    app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                       allow_credentials=settings.allow_credentials, allow_methods=list(settings.allowed_methods),
                       allow_headers=list(settings.allowed_headers))
    if settings.api_key:
        app.add_middleware(_ApiKey, key=settings.api_key)
    if settings.enable_server_load_tracking:
        app.add_middleware(LoadTracker, count=server.load_tracker, paths=GENERATION_PATHS)
    if settings.enable_request_id_headers:
        app.add_middleware(XRequestIdMiddleware)
    for path in settings.middleware:
        add_user_middleware(app, path)
    if settings.root_path:  # outermost, as FastAPI sets it before any middleware
        app.add_middleware(RootPath, root_path=settings.root_path)
    app.state.mmfront_server = server
    return app


__all__ = ["create_app", "error_response", "json_response"]
