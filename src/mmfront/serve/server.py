"""What ``mmfront serve``'s routes share (:class:`Server`): the engine client, the settings, the
tokenizer and the metrics, and the steps every generation route takes: a body read and answered
under a disconnect watch (:meth:`Server.guarded`), work that grows with a request run on the
preparation pool (:meth:`Server.off_loop`), engine requests started for each choice
(:meth:`Server.start`, :meth:`Server.search`) and their outputs turned into deltas
(:meth:`Server.deltas`).

A request is decoded, checked and prepared once (media, chat template, HF processor) on the
preprocessor's worker threads, so the event loop only reads bodies and writes chunks, never work
that grows with a request's fields; its ``n`` choices are ``n`` engine requests on the same
prepared inputs (vLLM's parent/child requests). Ending the response for any reason (a client that
disconnects, a stop string, an error) closes its :class:`~mmfront.serve.generation.Generation`,
which aborts its requests in the engine, so the engine never generates for nobody."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar, cast

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from mmfront import __version__
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.errors import ConfigError, ModelNotFoundError, RequestBodyError, ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import PromptInput, RequestOptions
from mmfront.preprocess.context_length import get_max_tokens
from mmfront.preprocess.truncation import resolve_truncation
from mmfront.processing import BaseProcessingInfo
from mmfront.serve import beam_search, protocol, request_checks, responses, sampling
from mmfront.serve.bodies import BodyBudget, HeldBody, read_body
from mmfront.serve.chat_bounds import check_chat_body
from mmfront.serve.chat_parsing import ChatParsing, RequestParsing
from mmfront.serve.errors import BODY_PARAM, error_body
from mmfront.serve.event_stream import SSE_DONE, DisconnectWatch, EventStreamResponse, event_stream_response, sse_event
from mmfront.serve.generation import Generation, Unanswered
from mmfront.serve.iteration_stats import Recorder, StatsRecorder
from mmfront.serve.middleware import LoadCount
from mmfront.serve.output import ChoiceOutput, Delta, LogprobTokens, WholeOutput, make_detokenizer
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.serve.request_log import RequestLogger
from mmfront.serve.responses import ENCODER, LogprobFormat, ResponseHead
from mmfront.serve.settings import ServeSettings
from mmfront.serve.stats import ServerMetrics
from mmfront.serve.stats_log import MultiModalCacheDelta, StatsLog, kv_cache_device
from mmfront.serve.weight_versions import WeightVersions, WeightVersionSpan
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput

_T = TypeVar("_T")
logger = logging.getLogger(__name__)

SESSION_ID_HEADER = "X-Session-ID"
"""The header vLLM reads a request's ``session_id`` from when the body has none."""


def json_response(body: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(ENCODER.encode(body), status, headers, media_type="application/json")


def error_response(exc: BaseException) -> Response:
    """``exc`` as vLLM answers it, with the status of its class (:mod:`mmfront.serve.errors`)."""
    body = error_body(exc)
    return json_response(body, body.error.code)


class Server:
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

    async def guarded(self, request: Request, handler: Callable[[Request, bytes], Awaitable[Response]]) -> Response:
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
        watch = DisconnectWatch(request.receive)
        watch.arm()
        try:
            response = await handler(request, cast(bytes, body))
        except asyncio.CancelledError:
            watch.close()
            if not watch.took_cancel():
                raise
            return Response(status_code=499)
        except Exception as e:
            watch.close()
            if self.settings.log_error_stack:
                logger.error("Error response to %s %s", request.method, request.url.path, exc_info=e)
            return error_response(e)
        if isinstance(response, EventStreamResponse):
            response.watch = watch  # it watches on until the stream's last chunk
        else:
            watch.close()
        return response

    def head(self, response_id: str) -> ResponseHead:
        return ResponseHead(response_id, int(time.time()), self.model_name, self.fingerprint)

    def check_model(self, model: str | None) -> None:
        """An empty name is the served model's, as in vLLM, as is none."""
        if model and model not in self.settings.model_names:
            raise ModelNotFoundError(f"The model `{model}` does not exist. Valid aliases: "
                                     f"{', '.join(self.settings.model_names)}.", parameter="model")

    def max_tokens(self, requested: int | None, prompt_tokens: int, param: str = "max_tokens") -> int | None:
        """The output budget the one context-length rule gives (vLLM's ``get_max_tokens``)."""
        return get_max_tokens(self.max_model_len, requested, prompt_tokens, max_tokens_param=param)

    def params(self, req: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
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

    async def off_loop(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` on the preparation pool: the event loop never waits on work that grows
        with a request (decoding its body, checking its fields). A request whose client leaves
        while the work is queued is cancelled before it starts (asyncio cancels the pool's future)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.preprocessor.executor, partial(work, *args))

    async def prepare(self, prompt: PromptInput, options: RequestOptions, request_id: str) -> MultiModalInputs:
        return await self.off_loop(self.preprocess, prompt, options, request_id)

    def preprocess(self, prompt: PromptInput, options: RequestOptions, request_id: str) -> MultiModalInputs:
        if self.client.errored:
            raise self.client.dead_error
        return self.preprocessor.preprocess(prompt, request_id=request_id, options=options)

    def log_inputs(self, logged: Sequence[str], prepared: list[tuple[MultiModalInputs, RequestOptions]],
                   params: SamplingParams | beam_search.BeamSearchParams) -> None:
        """``--enable-log-requests``: each prompt under the id ``logged`` gives it, as vLLM's API
        server logs it (once per prompt, whatever its ``n`` or beam steps)."""
        if self.request_log is not None:
            for log_id, (inputs, _) in zip(logged, prepared):
                self.request_log.log_inputs(log_id, inputs.get("prompt"), inputs["prompt_token_ids"], params)

    async def start(
        self, response_id: str, prepared: list[tuple[MultiModalInputs, RequestOptions]], params: SamplingParams,
        logged: Sequence[str], *, weight_versions: bool = False,
    ) -> tuple[Generation, list[ChoiceOutput]]:
        """Send ``params.n`` engine requests per prompt (ids ``{i}_{base}`` as vLLM's children;
        logged under ``logged``); ``weight_versions``: track the weights that make each one's tokens."""
        n = params.n
        base = f"{response_id}-{secrets.token_hex(4)}"
        streams: list[AsyncIterator[EngineCoreOutput]] = []
        choices: list[ChoiceOutput] = []
        request_ids = [f"{k}_{base}" if n > 1 or len(prepared) > 1 else base for k in range(len(prepared) * n)]
        if weight_versions:
            self.weight_versions.track(request_ids)
        self.log_inputs(logged, prepared, params)
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
        return Generation(streams, request_ids), choices

    def search(self, response_id: str, prepared: list[tuple[MultiModalInputs, RequestOptions]],
               req: ChatCompletionRequest | CompletionRequest, max_tokens: int | None, logged: Sequence[str],
                ) -> tuple[Generation, list[ChoiceOutput]]:
        """``use_beam_search``: each prompt's ``n`` beams (:mod:`mmfront.serve.beam_search`), logged
        under ``logged`` and checked as vLLM logs and checks them before its first step, searched by
        the generation's tasks."""
        if max_tokens is None:  # the engine named no context length to bound the search by
            raise ValidationError("Beam search needs `max_tokens` where the engine reports no max_model_len.",
                                  parameter="max_tokens")
        params = beam_search.beam_search_params(req, max_tokens)
        self.log_inputs(logged, prepared, params)
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
        return Generation.searching(searches, width, [response_id] * len(choices)), choices

    async def deltas(self, gen: Generation, choices: list[ChoiceOutput]) -> AsyncIterator[tuple[int, Delta]]:
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
                batch = await gen.arrived()
                merged: dict[int, Delta] = {}
                for index, item in batch:
                    if index not in open_choices:
                        continue
                    if isinstance(item, BaseException):
                        raise item
                    if item is Unanswered.CHOICE:  # no chunk, no choice in the answer (vLLM's)
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

    async def drain(self, gen: Generation, choices: list[ChoiceOutput]) -> None:
        """Every choice to its end, for an answer that is not streamed; the generation is closed
        however it ends."""
        try:
            async for _ in self.deltas(gen, choices):
                pass
        finally:
            await gen.close()

    def event_stream(self, gen: Generation, events: AsyncIterator[bytes],
                     headers: dict[str, str] | None) -> EventStreamResponse:
        """The SSE response of a generation's ``events``: an error ends them with vLLM's error
        event, ``[DONE]`` closes them, and the generation is closed however the stream ends."""
        return event_stream_response(_ended(gen, events), gen.close, headers, self.settings.sse_keep_alive_interval)

    def log_stream_complete(self, request_id: str, choices: list[ChoiceOutput]) -> None:
        """vLLM's log of each choice's whole text once its stream is complete."""
        if self.output_log is not None:
            for choice in choices:
                self.output_log.log_outputs(request_id, choice.text, None, "streaming_complete", is_streaming=True)

    def _decode_token(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids))

    def logprob_format(self, req: ChatCompletionRequest | CompletionRequest) -> LogprobFormat:
        as_ids = req.return_tokens_as_token_ids
        return LogprobFormat(self._decode_token,
                             self.settings.return_tokens_as_token_ids if as_ids is None else as_ids)

    def check_mm_kwargs(self, mm_processor_kwargs: dict[str, Any] | None,
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

    def request_metrics(self, gen: Generation, generated_tokens: int) -> responses.PerRequestMetrics | None:
        """``metrics`` of an answer: its one engine request's timings, where answered."""
        if not self._attributable(len(gen.request_ids)):
            return None
        return responses.per_request_metrics(gen.timings.get(0), generated_tokens)

    def prompt_options(self, request: Request, req: ChatCompletionRequest | CompletionRequest,
                       max_output_tokens: int | None) -> dict[str, Any]:
        """The request's options for its prompt (``add_special_tokens``, ``truncate_prompt_tokens``
        and ``truncation_side``, the limit checked as vLLM checks it) and its engine request's
        ``session_id`` (vLLM's ``_get_session_id``: the field, else the ``X-Session-ID`` header,
        else a string ``vllm_xargs["session_id"]``)."""
        session_id = req.session_id or request.headers.get(SESSION_ID_HEADER) or None
        if session_id is None and req.vllm_xargs and isinstance(req.vllm_xargs.get("session_id"), str):
            session_id = str(req.vllm_xargs["session_id"]) or None
        if req.truncate_prompt_tokens is not None:  # vLLM checks the output budget first
            self.max_tokens(max_output_tokens or None, 0, "max_completion_tokens"
                            if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None
                            else "max_tokens")
        truncation = resolve_truncation(req.truncate_prompt_tokens, req.truncation_side,
                                        max_model_len=self.max_model_len, max_output_tokens=max_output_tokens)
        return {"add_special_tokens": req.add_special_tokens, "truncation": truncation, "session_id": session_id}

    def check_chat_body(self, body: bytes) -> None:
        check_chat_body(body, max_messages=self.settings.max_chat_messages, max_parts=self.settings.max_content_parts,
                        max_prompt_chars=self.max_prompt_chars)

    @property
    def max_prompt_chars(self) -> int:
        return self.preprocessor.pipeline.processor.info.max_prompt_chars

    def template_kwargs(self, given: dict[str, Any] | None) -> dict[str, Any] | None:
        """A request's ``chat_template_kwargs`` over ``--default-chat-template-kwargs``."""
        defaults = self.settings.default_chat_template_kwargs
        return given if not defaults else {**defaults, **(given or {})}

    def usage_options(self, req: ChatCompletionRequest | CompletionRequest) -> tuple[bool, bool]:
        """Whether a stream ends with usage and whether every chunk carries it (vLLM's
        ``should_include_usage``: ``--enable-force-include-usage`` turns both on)."""
        if self.settings.enable_force_include_usage:
            return True, True
        return protocol.include_usage(req), protocol.continuous_usage(req)


async def _ended(gen: Generation, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield event
    except Exception as e:
        yield sse_event(error_body(e))
    finally:
        await gen.close()
        await events.aclose()  # type: ignore[attr-defined]
    yield SSE_DONE


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


def top_logprobs(req: ChatCompletionRequest | CompletionRequest) -> int:
    """How many candidates an answer lists per token (``top_logprobs``, completions' ``logprobs``):
    all (-1) with ``logprob_token_ids``, whose candidates are the ones the request named."""
    if req.logprob_token_ids:
        return -1
    asked = req.top_logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs
    return asked or 0


def finished_weight_versions(req: ChatCompletionRequest | CompletionRequest, gen: Generation,
                     index: int) -> list[WeightVersionSpan] | None:
    """A finished choice's weight-version spans, where the request asked for them."""
    return gen.weight_versions.get(index) if req.return_weight_versions else None


def cached_tokens(choice: ChoiceOutput) -> int:
    """The prompt tokens the engine's prefix cache held (0 from an engine that keeps no statistics, as vLLM's)."""
    return 0 if choice.prefill is None else choice.prefill.num_cached_tokens


def base_id(request: Request, body_id: str | None) -> str:
    """vLLM's request id: the ``X-Request-Id`` header where sent, else the body's ``request_id``,
    else random; an empty one is used as it is, as vLLM uses it (the engine's request ids stay
    unique: :meth:`Server.start` suffixes them). A header id is bounded as the body's is
    (:func:`~mmfront.serve.request_checks.check_request_id`)."""
    given = request.headers.get("x-request-id")
    if given is not None:
        return request_checks.check_request_id(given, "X-Request-Id") if given else given
    return body_id if body_id is not None else secrets.token_hex(8)


def id_header(request: Request) -> dict[str, str] | None:
    given = request.headers.get("x-request-id")
    return {"X-Request-Id": given} if given else None


__all__ = ["SESSION_ID_HEADER", "Server", "base_id", "cached_tokens", "error_response", "finished_weight_versions",
           "id_header", "json_response", "top_logprobs"]
