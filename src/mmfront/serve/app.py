"""The HTTP surface of ``mmfront serve``: ``vllm serve``'s OpenAI routes over an
:class:`~mmfront.engine.async_client.AsyncEngineClient`, as an ASGI app (:func:`create_app`) that
``mmfront serve`` runs with uvicorn and that users may mount in their own app.

A request is prepared once (media, chat template, HF processor) on the preprocessor's worker
threads, so the event loop only parses JSON and writes chunks; its ``n`` choices are ``n``
engine requests on the same prepared inputs (vLLM's parent/child requests). Every engine stream
is read by a task of its own and merged in arrival order; ending the response for any reason (a
client that disconnects, a stop string, an error) cancels those tasks, and a cancelled stream
aborts its request in the engine (the client's contract), so the engine never generates for
nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import msgspec
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mmfront import __version__
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.errors import BodyTooLargeError, ModelNotFoundError, RequestBodyError, ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import PromptInput, RequestOptions
from mmfront.serve import protocol, responses
from mmfront.serve.chat_parsing import ChatParsing, ChoiceStream, ParsedDelta, RequestParsing
from mmfront.serve.errors import error_body
from mmfront.serve.output import ChoiceOutput, Delta, make_detokenizer
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.serve.responses import ENCODER, ResponseHead, UsageInfo
from mmfront.serve.settings import ServeSettings
from mmfront.serve.stats import ServerMetrics
from mmfront.serve.tool_parsers import ToolCall
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput

_DONE = b"data: [DONE]\n\n"


def json_response(body: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(ENCODER.encode(body), status, headers, media_type="application/json")


def error_response(exc: BaseException) -> Response:
    """``exc`` as vLLM answers it, with the status of its class (:mod:`mmfront.serve.errors`)."""
    body = error_body(exc)
    return json_response(body, body.error.code)


def _sse(chunk: msgspec.Struct) -> bytes:
    return b"data: " + ENCODER.encode(chunk) + b"\n\n"


class _Generation:
    """The engine streams of one HTTP request, each read by its own task into one queue."""

    def __init__(self, streams: list[AsyncIterator[EngineCoreOutput]]) -> None:
        self.queue: asyncio.Queue[tuple[int, EngineCoreOutput | BaseException | None]] = asyncio.Queue()
        self.tasks = [asyncio.create_task(self._pump(i, s)) for i, s in enumerate(streams)]

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


def _event_stream(chunks: AsyncIterator[bytes], gen: _Generation, headers: dict[str, str] | None,
                  ) -> StreamingResponse:
    """The SSE response; closing ``gen`` afterwards also covers a client gone before the first
    chunk, when the chunk generator never starts (so its own cleanup never runs)."""
    return StreamingResponse(chunks, media_type="text/event-stream", headers=headers,
                             background=BackgroundTask(gen.close))


class _Server:
    """The state the routes share: the client, the settings, the tokenizer and the metrics."""

    def __init__(self, client: AsyncEngineClient, settings: ServeSettings) -> None:
        self.client = client
        self.settings = settings
        self.preprocessor = client.client.processor.preprocessor
        self.tokenizer = self.preprocessor.tokenizer
        self.model_name = settings.model_names[0]
        self.created = int(time.time())
        digest = hashlib.sha256(f"{settings.model}|{self.model_name}".encode()).hexdigest()[:8]
        self.fingerprint = f"mmfront-{__version__}-{digest}"
        self.metrics = ServerMetrics(self.model_name, self.preprocessor, client)
        self.parsing = ChatParsing(settings, self.tokenizer)

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

    # --- generation routes ----------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._guarded(request, self._chat)

    async def completions(self, request: Request) -> Response:
        return await self._guarded(request, self._completions)

    async def _guarded(self, request: Request, handler: Callable[[Request, bytes], Awaitable[Response]]) -> Response:
        """Read the body, then run ``handler``; any error becomes vLLM's error JSON, and a client
        that disconnects before the response starts cancels it (which aborts its engine
        requests). The watch starts after the body is read: until then, what the server
        receives is the body."""
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":  # vLLM's check, before anything is read
            return error_response(RequestBodyError("Unsupported Media Type: Only 'application/json' is allowed",
                                                   parameter=protocol.BODY_PARAM))
        try:
            body = await _read_body(request, self.settings.max_body_bytes)
        except ClientDisconnect:
            return Response(status_code=499)
        except Exception as e:
            return error_response(e)
        task = asyncio.ensure_future(handler(request, body))
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
            return error_response(e)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    async def _chat(self, request: Request, body: bytes) -> Response:
        req: ChatCompletionRequest = protocol.decode_request(body, ChatCompletionRequest)
        self._check_model(req.model)
        response_id = f"chatcmpl-{_base_id(request, req.request_id)}"
        parsing = self.parsing.for_request(req)
        options = RequestOptions(
            hf_processor_mm_kwargs=req.mm_processor_kwargs, cache_salt=req.cache_salt, priority=req.priority,
            chat_template=req.chat_template, chat_template_kwargs=protocol.template_kwargs(req),
            add_generation_prompt=req.add_generation_prompt, continue_final_message=req.continue_final_message,
            tools=protocol.template_tools(req, self.settings.exclude_tools_when_tool_choice_none))
        inputs = await self._prepare(req.messages, options, response_id)
        params = parsing.adjust(protocol.sampling_params(
            req, self._max_tokens(req.max_completion_tokens or req.max_tokens, len(inputs["prompt_token_ids"]))))
        protocol.check_logprobs(params, self.settings.max_logprobs, len(self.tokenizer))
        gen, choices = await self._start(response_id, [(inputs, options)], params)
        prompt_tokens = len(inputs["prompt_token_ids"])
        head = self._head(response_id)
        headers = _id_header(request)
        if req.stream:
            chunks = self._chat_chunks(gen, choices, head, req, inputs["prompt_token_ids"], parsing=parsing)
            return _event_stream(chunks, gen, headers)
        try:
            await self._drain(gen, choices)
        finally:
            await gen.close()
        top = req.top_logprobs or 0
        body_choices = [_parsed_choice(
            parsing, i, c, responses.chat_logprobs(c.logprobs, top, self._decode_token) if req.logprobs else None)
            for i, c in enumerate(choices)]
        usage = responses.usage(prompt_tokens, sum(len(c.token_ids) for c in choices))
        _add_reasoning_tokens(usage, parsing, choices)
        return json_response(responses.chat_response(head, body_choices, usage), headers=headers)

    async def _completions(self, request: Request, body: bytes) -> Response:
        req: CompletionRequest = protocol.decode_request(body, CompletionRequest)
        self._check_model(req.model)
        response_id = f"cmpl-{_base_id(request, req.request_id)}"
        options = RequestOptions(hf_processor_mm_kwargs=req.mm_processor_kwargs, cache_salt=req.cache_salt,
                                 priority=req.priority)
        prepared = [(await self._prepare(p, options, response_id), options) for p in protocol.prompts(req)]
        lengths = [len(inputs["prompt_token_ids"]) for inputs, _ in prepared]
        params = protocol.sampling_params(req, self._max_tokens(req.max_tokens, max(lengths)))
        protocol.check_logprobs(params, self.settings.max_logprobs, len(self.tokenizer))
        gen, choices = await self._start(response_id, prepared, params)
        head = self._head(response_id)
        headers = _id_header(request)
        if req.stream:
            per_choice = [length for length in lengths for _ in range(params.n)]
            chunks = self._completion_chunks(gen, choices, head, req, per_choice)
            return _event_stream(chunks, gen, headers)
        try:
            await self._drain(gen, choices)
        finally:
            await gen.close()
        top = req.logprobs or 0
        body_choices = [responses.completion_choice(
            i, c.text,
            responses.completion_logprobs(c.logprobs, top, self._decode_token, 0) if req.logprobs is not None else None,
            c.finish_reason, c.stop_reason) for i, c in enumerate(choices)]
        usage = responses.usage(sum(lengths), sum(len(c.token_ids) for c in choices))
        return json_response(responses.completion_response(head, body_choices, usage), headers=headers)

    # --- the pieces -----------------------------------------------------------------------------

    def _head(self, response_id: str) -> ResponseHead:
        return ResponseHead(response_id, int(time.time()), self.model_name, self.fingerprint)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.settings.model_names:
            raise ModelNotFoundError(f"The model `{model}` does not exist. Valid aliases: "
                                     f"{', '.join(self.settings.model_names)}.", parameter="model")

    def _max_tokens(self, requested: int | None, prompt_tokens: int) -> int | None:
        """vLLM's ``get_max_tokens``: at most what the context leaves after the prompt."""
        limit = self.max_model_len
        if limit is None:
            return requested
        if requested is not None and requested > limit:
            raise ValidationError(f"max_tokens={requested} cannot be greater than max_model_len={limit}. Please "
                                  "request fewer output tokens.", parameter="max_tokens", value=requested)
        room = max(limit - prompt_tokens, 1)  # a prompt that fills the context is refused by the client
        return room if requested is None else min(requested, room)

    async def _prepare(self, prompt: PromptInput, options: RequestOptions, request_id: str) -> MultiModalInputs:
        if self.client.errored:
            raise self.client.dead_error
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.preprocessor.executor, partial(
            self.preprocessor.preprocess, prompt, request_id=request_id, options=options))

    async def _start(
        self, response_id: str, prepared: list[tuple[MultiModalInputs, RequestOptions]], params: SamplingParams,
    ) -> tuple[_Generation, list[ChoiceOutput]]:
        """Send ``params.n`` engine requests per prompt (ids ``{i}_{base}`` as vLLM's children)."""
        n = params.n
        base = f"{response_id}-{secrets.token_hex(4)}"
        streams: list[AsyncIterator[EngineCoreOutput]] = []
        choices: list[ChoiceOutput] = []
        try:
            for p, (inputs, options) in enumerate(prepared):
                for i in range(n):
                    child = protocol.child_params(params, i) if n > 1 else params
                    request_id = f"{p * n + i}_{base}" if n > 1 or len(prepared) > 1 else base
                    streams.append(await self.client.add_request(request_id, inputs, child, options=options))
                    self.metrics.on_added(len(inputs["prompt_token_ids"]))
                    choices.append(ChoiceOutput(make_detokenizer(
                        self.tokenizer, inputs["prompt_token_ids"], skip_special_tokens=params.skip_special_tokens),
                        child))
        except BaseException:
            for stream in streams:
                await stream.aclose()  # type: ignore[attr-defined]
            for _ in streams:
                self.metrics.on_finished(None, started=False)
            raise
        return _Generation(streams), choices

    async def _deltas(self, gen: _Generation, choices: list[ChoiceOutput]) -> AsyncIterator[tuple[int, Delta]]:
        """Each choice's deltas until every choice finished. Outputs that arrived while the last
        chunk was written are merged into one delta per choice, as vLLM's output collector
        merges them: a slow client gets fewer, larger chunks instead of a growing backlog."""
        open_choices = set(range(len(choices)))
        started: set[int] = set()
        given_up = "abort"
        try:
            while open_choices:
                batch = [await gen.queue.get()]
                while not gen.queue.empty():
                    batch.append(gen.queue.get_nowait())
                merged: dict[int, Delta] = {}
                for index, item in batch:
                    if index not in open_choices:
                        continue
                    if index not in started:
                        started.add(index)
                        self.metrics.on_first_output()
                    if isinstance(item, BaseException):
                        given_up = "error"
                        raise item
                    if item is None:  # the stream ended without a finish: aborted by someone else
                        choices[index].finish_reason = choices[index].finish_reason or "abort"
                        delta = Delta("", [], None, "abort")
                    else:
                        delta = choices[index].process(item)
                    self.metrics.on_tokens(len(delta.token_ids))
                    if delta.stopped:
                        gen.stop(index)
                    if delta.finish_reason is not None:
                        open_choices.discard(index)
                        self.metrics.on_finished(delta.finish_reason, started=True)
                    merged[index] = merged[index].then(delta) if index in merged else delta
                for index, delta in merged.items():
                    yield index, delta
        except Exception:
            given_up = "error"
            raise
        finally:  # what is still open was given up: the client left, or a choice failed
            for index in open_choices:
                self.metrics.on_finished(given_up, started=index in started)

    async def _drain(self, gen: _Generation, choices: list[ChoiceOutput]) -> None:
        async for _ in self._deltas(gen, choices):
            pass

    async def _chat_chunks(self, gen: _Generation, choices: list[ChoiceOutput], head: ResponseHead,
                           req: ChatCompletionRequest, prompt_ids: list[int], *, parsing: RequestParsing,
                           ) -> AsyncIterator[bytes]:
        prompt_tokens = len(prompt_ids)
        with_usage, running = protocol.include_usage(req), protocol.continuous_usage(req)
        parsed = [parsing.stream(prompt_ids) for _ in choices] if parsing.active else None

        def so_far(tokens: int) -> UsageInfo | None:
            return responses.usage(prompt_tokens, tokens, details=False, completion_details=True) if running else None

        try:
            for i in range(len(choices)):
                yield _sse(responses.chat_role_chunk(head, i, so_far(0)))
            async for i, delta in self._deltas(gen, choices):
                logprobs = (responses.chat_logprobs(delta.logprobs or [], req.top_logprobs or 0, self._decode_token)
                            if req.logprobs else None)
                text = None if delta.finish_reason is not None and not choices[i].token_ids else delta.text
                if parsed is not None:
                    step = _parsed_step(parsed[i], delta.text, delta.finish_reason is not None)
                    if not step and delta.finish_reason is None and logprobs is None:
                        continue  # the parsers hold this text back (vLLM sends no chunk)
                    yield _sse(responses.chat_chunk(
                        head, i, step.content or None,
                        logprobs=logprobs, finish_reason=parsing.finish_reason(delta.finish_reason,
                                                                               parsed[i].calls_made),
                        stop_reason=delta.stop_reason, fingerprint=not with_usage,
                        usage_info=so_far(len(choices[i].token_ids)), reasoning=step.reasoning,
                        tool_calls=[_delta_call(n, c) for n, c in step.tool_calls]))
                    continue
                yield _sse(responses.chat_chunk(head, i, text, logprobs=logprobs, finish_reason=delta.finish_reason,
                                                stop_reason=delta.stop_reason, fingerprint=not with_usage,
                                                usage_info=so_far(len(choices[i].token_ids))))
            if with_usage:
                usage = responses.usage(prompt_tokens, sum(len(c.token_ids) for c in choices), details=False)
                _add_reasoning_tokens(usage, parsing, choices)
                yield _sse(responses.chat_usage_chunk(head, usage))
        except Exception as e:
            yield _sse(error_body(e))
        finally:
            await gen.close()
        yield _DONE

    async def _completion_chunks(self, gen: _Generation, choices: list[ChoiceOutput], head: ResponseHead,
                                 req: CompletionRequest, prompt_lengths: list[int]) -> AsyncIterator[bytes]:
        """``prompt_lengths``: the prompt tokens of each choice's prompt."""
        with_usage, running = protocol.include_usage(req), protocol.continuous_usage(req)
        offsets = [0] * len(choices)
        try:
            async for i, delta in self._deltas(gen, choices):
                logprobs = None
                if req.logprobs is not None:
                    logprobs = responses.completion_logprobs(delta.logprobs or [], req.logprobs, self._decode_token,
                                                             offsets[i])
                    offsets[i] += sum(len(t) for t in logprobs.tokens)
                so_far = (responses.usage(prompt_lengths[i], len(choices[i].token_ids), details=False) if running
                          else None)
                yield _sse(responses.completion_chunk(
                    head, i, delta.text, logprobs=logprobs, finish_reason=delta.finish_reason,
                    stop_reason=delta.stop_reason, fingerprint=not with_usage, usage_info=so_far))
            if with_usage:
                usage = responses.usage(sum(prompt_lengths[::max(req.n or 1, 1)]),
                                        sum(len(c.token_ids) for c in choices), details=False)
                yield _sse(responses.completion_usage_chunk(head, usage))
        except Exception as e:
            yield _sse(error_body(e))
        finally:
            await gen.close()
        yield _DONE

    def _decode_token(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))


def _parsed_choice(parsing: RequestParsing, index: int, choice: ChoiceOutput,
                   logprobs: responses.ChatCompletionLogProbs | None) -> responses.ChatCompletionResponseChoice:
    """A whole answer's choice, read by the server's parsers when it has any."""
    if not parsing.active:
        return responses.chat_choice(index, choice.text, logprobs, choice.finish_reason, choice.stop_reason)
    message = parsing.whole(choice.text)
    calls = [responses.ToolCall(id=c.id, type=c.type, function=responses.FunctionCall(c.name, c.arguments))
             for c in message.tool_calls]
    return responses.chat_choice(index, message.content, logprobs,
                                 parsing.finish_reason(choice.finish_reason, bool(calls)), choice.stop_reason,
                                 reasoning=message.reasoning, tool_calls=calls)


def _add_reasoning_tokens(usage: UsageInfo, parsing: RequestParsing, choices: list[ChoiceOutput]) -> None:
    counts = [parsing.reasoning_tokens(c.token_ids) for c in choices]
    if counts and all(n is not None for n in counts):
        usage.completion_tokens_details = responses.CompletionTokenUsageInfo(
            reasoning_tokens=sum(n or 0 for n in counts))


def _parsed_step(stream: ChoiceStream, text: str, finished: bool) -> ParsedDelta:
    step = stream.feed(text)
    return step.then(stream.finish()) if finished else step


def _delta_call(index: int, call: ToolCall) -> responses.DeltaToolCall:
    return responses.DeltaToolCall(id=call.id, type=call.type, index=index,
                                   function=responses.FunctionCall(call.name, call.arguments))


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it passes ``limit``: a declared length is checked
    before anything is read, a chunked body as it arrives."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"The request body ({declared} bytes) is larger than the server's limit of {limit} bytes.")
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise BodyTooLargeError(f"The request body is larger than the server's limit of {limit} bytes.")
        parts.append(part)
    return b"".join(parts)


async def _disconnected(request: Request) -> None:
    """Return once the client has gone away: after the body, the next message an ASGI server
    delivers is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _base_id(request: Request, body_id: str | None) -> str:
    """vLLM's request id: the ``X-Request-Id`` header, else the body's ``request_id``, else random."""
    return request.headers.get("x-request-id") or body_id or secrets.token_hex(8)


def _id_header(request: Request) -> dict[str, str] | None:
    given = request.headers.get("x-request-id")
    return {"X-Request-Id": given} if given else None


class _ApiKey:
    """vLLM's bearer-token check: every ``/v1`` path needs ``Authorization: Bearer KEY``; the
    token is compared in constant time, on its hash."""

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
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            hashlib.sha256(token.encode()).digest(), self.digest)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods answer as FastAPI does (``{"detail": ...}``), as vLLM's do."""
    assert isinstance(exc, HTTPException)
    return json_response(responses.HTTPErrorResponse(exc.detail), exc.status_code, dict(exc.headers or {}))


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
        Route("/version", server.version, methods=["GET"]),
        Route("/metrics", server.metrics_route, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    if settings.api_key:
        app.add_middleware(_ApiKey, key=settings.api_key)
    app.state.mmfront_server = server
    return app


__all__ = ["create_app", "error_response", "json_response"]
