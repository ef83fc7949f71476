"""The ASGI middleware ``vllm serve``'s flags put around the app: ``--root-path``,
``--enable-request-id-headers`` and the user's own ``--middleware`` (CORS is Starlette's, the
API key check lives with the app)."""

from __future__ import annotations

import importlib
import inspect
import uuid
from dataclasses import dataclass
from typing import Any, cast

from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmfront.errors import ConfigError


class RootPath:
    """Sets the ASGI ``root_path`` of every request, as FastAPI's ``root_path`` does: behind a
    proxy that routes ``/llm/...`` here, both ``/llm/v1/models`` and ``/v1/models`` reach the route."""

    def __init__(self, app: ASGIApp, root_path: str) -> None:
        self.app = app
        self.root_path = root_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "root_path": self.root_path}
        await self.app(scope, receive, send)


class XRequestIdMiddleware:
    """Every response carries ``X-Request-Id``: the request's, else a new uuid4 (vLLM's
    ``--enable-request-id-headers``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request_id = Headers(scope=scope).get("X-Request-Id") or uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(raw=message["headers"]).setdefault("X-Request-Id", request_id)
            await send(message)

        await self.app(scope, receive, send_with_id)


@dataclass
class LoadCount:
    """Generation requests in flight (``/load``)."""

    in_flight: int = 0


class LoadTracker:
    """Counts each request to ``paths`` from its start to the end of its response (a stream's
    last chunk, or the client gone), as vLLM's ``--enable-server-load-tracking`` does."""

    def __init__(self, app: ASGIApp, count: LoadCount, paths: frozenset[str]) -> None:
        self.app = app
        self.count = count
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if scope["type"] != "http" or path not in self.paths:
            await self.app(scope, receive, send)
            return
        self.count.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.count.in_flight -= 1


def add_user_middleware(app: Starlette, path: str) -> None:
    """``--middleware module.name``: a class is added with ``app.add_middleware``, a coroutine
    function as an HTTP middleware ``async (request, call_next)``, as vLLM adds them."""
    module_path, _, name = path.rpartition(".")
    if not module_path:
        raise ConfigError(f"--middleware {path!r}: give an import path, module.name")
    try:
        found = getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--middleware {path!r} cannot be imported: {e}") from None
    if inspect.isclass(found):
        app.add_middleware(cast(Any, found))
    elif inspect.iscoroutinefunction(found):
        app.add_middleware(BaseHTTPMiddleware, dispatch=found)
    else:
        raise ConfigError(f"Invalid middleware {path}. Must be a function or a class.")


__all__ = ["LoadCount", "LoadTracker", "RootPath", "XRequestIdMiddleware", "add_user_middleware"]
