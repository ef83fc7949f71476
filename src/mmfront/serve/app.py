"""The HTTP surface of ``mmfront serve``: ``vllm serve``'s OpenAI routes over an
:class:`~mmfront.engine.async_client.AsyncEngineClient`, as an ASGI app (:func:`create_app`) that
``mmfront serve`` runs with uvicorn and that users may mount in their own app: the routes table,
the middleware in vLLM's order, and the small routes. The generation routes live in
:mod:`~mmfront.serve.chat_completions` and :mod:`~mmfront.serve.completions`, over the shared
:class:`~mmfront.serve.server.Server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator
from functools import partial

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mmfront import __version__
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.errors import ValidationError
from mmfront.serve import chat_completions, completions, openapi, request_decoding, responses, tokenize
from mmfront.serve.anthropic_messages import AnthropicRoutes
from mmfront.serve.middleware import LoadTracker, RootPath, XRequestIdMiddleware, add_user_middleware
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.serve.responses import ENCODER
from mmfront.serve.server import Server, base_id, error_response, json_response
from mmfront.serve.settings import ServeSettings
from mmfront.serve.stats_log import StatsLog, log_stats_interval

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/invocations", "/v1/messages",
                              "/v1/messages/count_tokens"})
"""The routes ``--enable-server-load-tracking`` counts (vLLM's, of those mmfront serves)."""


class _Routes:
    """The routes over a :class:`~mmfront.serve.server.Server`."""

    def __init__(self, server: Server) -> None:
        self.server = server

    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self.server.client.errored else 200)

    async def ping(self, request: Request) -> Response:
        """SageMaker's health check (GET and POST), answered as ``/health``."""
        return await self.health(request)

    async def version(self, request: Request) -> Response:
        return json_response(responses.VersionResponse(__version__))

    async def models(self, request: Request) -> Response:
        root = str(self.server.settings.model)
        cards = [responses.model_card(name, root, self.server.created, self.server.max_model_len,
                                      f"modelperm-{secrets.token_hex(8)}") for name in self.server.settings.model_names]
        return json_response(responses.ModelList(data=cards))

    async def metrics_route(self, request: Request) -> Response:
        body, content_type = self.server.metrics.render()
        return Response(body, headers={"Content-Type": content_type})

    async def load(self, request: Request) -> Response:
        """vLLM's ``/load``: generation requests in flight (counted with ``--enable-server-load-tracking``)."""
        return json_response(responses.ServerLoad(self.server.load_tracker.in_flight))

    async def tokenizer_info(self, request: Request) -> Response:
        info = tokenize.tokenizer_info(self.server.tokenizer, self.server.preprocessor.config.chat_template)
        return Response(ENCODER.encode(info), media_type="application/json")

    async def tokenize_route(self, request: Request) -> Response:
        return await self.server.guarded(request, self._tokenize)

    async def detokenize_route(self, request: Request) -> Response:
        return await self.server.guarded(request, self._detokenize)

    async def _tokenize(self, request: Request, body: bytes) -> Response:
        req = await self.server.off_loop(self._decode_tokenize, body)
        self.server.check_model(req.model)
        if isinstance(req, tokenize.TokenizeChatRequest):
            self.server.check_mm_kwargs(req.mm_processor_kwargs, req.media_io_kwargs)
            req.chat_template_kwargs = self.server.template_kwargs(req.chat_template_kwargs)
        request_id = f"tokenize-{base_id(request, None)}"
        if self.server.request_log is not None:
            self.server.request_log.log_tokenize(request_id, req)
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self.server.preprocessor.executor, partial(
            tokenize.tokenize, self.server.preprocessor, req, self.server.max_model_len, request_id))
        return json_response(answer)

    async def _detokenize(self, request: Request, body: bytes) -> Response:
        req = await self.server.off_loop(tokenize.decode_detokenize, body)
        self.server.check_model(req.model)
        return json_response(await self.server.off_loop(tokenize.detokenize, self.server.tokenizer, req))

    def _decode_tokenize(self, body: bytes) -> tokenize.TokenizeCompletionRequest | tokenize.TokenizeChatRequest:
        """A ``/tokenize`` body decoded off the loop, a chat one's bounds checked first."""
        self.server.check_chat_body(body)
        return tokenize.decode_tokenize(body)

    async def invocations(self, request: Request) -> Response:
        """SageMaker's one inference route: a chat completion body is answered as
        ``/v1/chat/completions``, else a completion body as ``/v1/completions`` (vLLM's order)."""
        return await self.server.guarded(request, self._invoke)

    async def _invoke(self, request: Request, body: bytes) -> Response:
        for handler, kind in ((chat_completions.chat, ChatCompletionRequest), (completions.completions, CompletionRequest)):
            if await self.server.off_loop(request_decoding.fits, body, kind):
                return await handler(self.server, request, body)
        return error_response(ValidationError(
            "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"))

    async def chat(self, request: Request) -> Response:
        return await self.server.guarded(request, partial(chat_completions.chat, self.server))

    async def completions(self, request: Request) -> Response:
        return await self.server.guarded(request, partial(completions.completions, self.server))


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
    server = Server(client, settings)
    handlers = _Routes(server)
    anthropic = AnthropicRoutes(server)
    routes = [
        Route("/v1/chat/completions", handlers.chat, methods=["POST"]),
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/ping", handlers.ping, methods=["GET", "POST"]),
        Route("/version", handlers.version, methods=["GET"]),
        Route("/metrics", handlers.metrics_route, methods=["GET"]),
        Route("/tokenize", handlers.tokenize_route, methods=["POST"]),
        Route("/detokenize", handlers.detokenize_route, methods=["POST"]),
        Route("/invocations", handlers.invocations, methods=["POST"]),
        Route("/load", handlers.load, methods=["GET"]),
        Route("/v1/messages", anthropic.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"]),
    ]
    if settings.enable_tokenizer_info_endpoint:
        routes.append(Route("/tokenizer_info", handlers.tokenizer_info, methods=["GET"]))
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
