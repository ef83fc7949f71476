"""``/openapi.json``, ``/docs`` (Swagger UI) and ``/redoc``, as FastAPI serves them for
``vllm serve`` (off with ``--disable-fastapi-docs``). The schema is generated from the msgspec
structs the routes decode and encode, so it describes exactly what the server takes; the two
pages load their scripts from the jsDelivr CDN, as FastAPI's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from mmfront import __version__
from mmfront.serve import anthropic_messages, anthropic_protocol, responses, tokenize
from mmfront.serve.errors import ErrorResponse
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest

TITLE = "mmfront"

BODIES: dict[str, tuple[tuple[type, ...], type | None]] = {
    "/v1/chat/completions": ((ChatCompletionRequest,), responses.ChatCompletionResponse),
    "/v1/completions": ((CompletionRequest,), responses.CompletionResponse),
    "/invocations": ((ChatCompletionRequest, CompletionRequest), None),
    "/tokenize": ((tokenize.TokenizeCompletionRequest, tokenize.TokenizeChatRequest), tokenize.TokenizeResponse),
    "/detokenize": ((tokenize.DetokenizeRequest,), tokenize.DetokenizeResponse),
    "/v1/models": ((), responses.ModelList),
    "/version": ((), responses.VersionResponse),
    "/v1/messages": ((anthropic_protocol.AnthropicMessagesRequest,), anthropic_messages.AnthropicMessagesResponse),
    "/v1/messages/count_tokens": ((anthropic_protocol.AnthropicCountTokensRequest,),
                                  anthropic_messages.AnthropicCountTokensResponse),
}
"""Each route's request body types (one of them; none: no body) and response body type (``None``:
not one JSON object)."""


def openapi_schema(routes: Sequence[tuple[str, Sequence[str]]], root_path: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (path, methods)."""
    types = list(dict.fromkeys([*(t for kinds, _ in BODIES.values() for t in kinds),
                                *(t for _, t in BODIES.values() if t is not None), ErrorResponse]))
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    refs = dict(zip(types, schemas))
    paths: dict[str, Any] = {}
    for path, methods in routes:
        request_types, response_type = BODIES.get(path, ((), None))
        for method in methods:
            if method == "HEAD":
                continue
            operation: dict[str, Any] = {
                "summary": path, "operationId": f"{method.lower()}_{path.strip('/').replace('/', '_') or 'root'}",
                "responses": {"200": {"description": "Successful Response"}}}
            if request_types and method == "POST":
                body = refs[request_types[0]] if len(request_types) == 1 else {
                    "oneOf": [refs[t] for t in request_types]}
                operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
                operation["responses"]["400"] = {"description": "Bad Request", "content": {
                    "application/json": {"schema": refs[ErrorResponse]}}}
            if response_type is not None:
                operation["responses"]["200"]["content"] = {"application/json": {"schema": refs[response_type]}}
            paths.setdefault(path, {})[method.lower()] = operation
    document: dict[str, Any] = {"openapi": "3.1.0", "info": {"title": TITLE, "version": __version__},
                                "paths": paths, "components": {"schemas": components}}
    if root_path:
        document["servers"] = [{"url": root_path}]
    return document


def routes(served: Sequence[tuple[str, Sequence[str]]]) -> list[Route]:
    """The three documentation routes for an app serving ``served`` (path, methods)."""
    cache: dict[str, bytes] = {}

    async def schema(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        if root not in cache:
            cache[root] = msgspec.json.encode(openapi_schema(served, root))
        return Response(cache[root], media_type="application/json")

    async def docs(request: Request) -> Response:
        return HTMLResponse(swagger_page(request.scope.get("root_path", "") + "/openapi.json"))

    async def redoc(request: Request) -> Response:
        return HTMLResponse(redoc_page(request.scope.get("root_path", "") + "/openapi.json"))

    return [Route("/openapi.json", schema, methods=["GET"]), Route("/docs", docs, methods=["GET"]),
            Route("/redoc", redoc, methods=["GET"])]


def swagger_page(openapi_url: str) -> str:
    """FastAPI's Swagger UI page."""
    return f"""<!DOCTYPE html>
<html>
<head>
<link type="text/css" rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css">
<title>{TITLE} - Swagger UI</title>
</head>
<body>
<div id="swagger-ui">
</div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>
const ui = SwaggerUIBundle({{
    url: '{openapi_url}',
    dom_id: '#swagger-ui',
    layout: 'BaseLayout',
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
}})
</script>
</body>
</html>
"""


def redoc_page(openapi_url: str) -> str:
    """FastAPI's ReDoc page."""
    return f"""<!DOCTYPE html>
<html>
<head>
<title>{TITLE} - ReDoc</title>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1">
</head>
<body>
<noscript>ReDoc requires Javascript to function. Please enable it to browse the documentation.</noscript>
<redoc spec-url="{openapi_url}"></redoc>
<script src="https://cdn.jsdelivr.net/npm/redoc@2/bundles/redoc.standalone.js"></script>
</body>
</html>
"""


__all__ = ["BODIES", "TITLE", "openapi_schema", "redoc_page", "routes", "swagger_page"]
