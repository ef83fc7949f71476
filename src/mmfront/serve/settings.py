"""What ``mmfront serve`` is configured with, in ``vllm serve``'s terms: the HTTP side
(:class:`ServeSettings`), the engines it starts (:class:`LocalEngineOptions`) and the whole plan
(:class:`ServePlan`, with the processing's :class:`~mmfront.config.MultiModalConfig` and the
engines' :class:`~mmfront.config.DataParallelConfig`).

Each field that is a flag of ``mmfront serve`` says so in its metadata (:func:`mmfront.flags.flag`):
the command line and docs/serving.md's flag table are generated from these classes, so a flag
has one home. This module imports nothing heavy: ``mmfront serve --help`` reads it.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mmfront.config import DataParallelConfig, MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.flags import count, flag, json_list, port, positive_int, seconds
from mmfront.hub import ModelSource
from mmfront.serve.vllm_engine import EngineKind

ToolStrictLevelName = Literal["auto", "function", "parameter"]
"""``--tool-strict-level``'s values, weakest first (vLLM's ``ToolStrictLevelName``)."""
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
"""A chat request's ``reasoning_effort`` (vLLM's ``ReasoningEffort``)."""

DEFAULT_MAX_BODY_BYTES = 64 << 20
"""Request bodies above this are refused before they are read whole (413)."""

UvicornLogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
FingerprintMode = Literal["full", "hash", "custom", "none"]
AnthropicDisabledThinkingEffort = Literal["auto", "none", "low", "medium", "high", "xhigh", "max"]


def check_reasoning_effort_map(effort_map: Any) -> None:
    """vLLM's ``validate_reasoning_effort_map``: known efforts to strings."""
    if effort_map is None:
        return
    if not isinstance(effort_map, Mapping) or not all(isinstance(value, str) for value in effort_map.values()):
        raise ConfigError("--reasoning-effort-map must be a JSON object mapping reasoning efforts to strings.")
    efforts = typing.get_args(ReasoningEffort)
    if unknown := sorted(set(effort_map) - set(efforts)):
        raise ConfigError(f"--reasoning-effort-map has unknown efforts {unknown}; keys must be one of {list(efforts)}.")


def one_key(keys: Sequence[str]) -> str:
    """``--api-key`` takes several keys in ``vllm serve``; ``mmfront serve`` checks one."""
    if len(keys) > 1:
        raise ConfigError(f"--api-key takes one key in mmfront serve, got {len(keys)}.")
    return keys[0]


@dataclass(frozen=True)
class ServeSettings:
    """The HTTP side of one ``mmfront serve``."""

    model: str = field(metadata=flag(positional=True, metavar="MODEL"))
    """The model, as ``vllm serve MODEL`` takes it: a local folder (config.json, processor and
    tokenizer, with the weights when the engines are mmfront's reference workers) or a Hugging Face
    hub id, read from the local HF cache and downloaded where missing and the network allows it
    (``--revision``, ``--download-dir``, ``--hf-token``, ``HF_HUB_OFFLINE``)."""
    served_model_name: tuple[str, ...] = field(default=(), metadata=flag(metavar="NAME"))
    """Names clients may send as ``model``; the first is the one reported (empty: ``model``'s path,
    as vLLM)."""
    host: str = field(default="0.0.0.0", metadata=flag())
    """The address to listen on."""
    port: int = field(default=8000, metadata=flag(parse=port))
    """The port to listen on."""
    api_key: str | None = field(default=None, metadata=flag(several=True, metavar="KEY", collect=one_key))
    """With a key, every ``/v1`` request needs ``Authorization: Bearer KEY`` (else 401); one key."""
    max_logprobs: int = field(default=20, metadata=flag(metavar="N"))
    """Most logprobs a request may ask for per token (-1: the vocabulary); more are refused with 400."""
    return_tokens_as_token_ids: bool = field(default=False, metadata=flag())
    """Logprob tokens written as ``token_id:N`` for every request (a request's
    ``return_tokens_as_token_ids`` overrides it), so tokens that are not valid UTF-8 stay apart."""
    max_body_bytes: int = field(default=DEFAULT_MAX_BODY_BYTES, metadata=flag(
        vllm=False, parse=positive_int, metavar="BYTES", shown_default="64 MiB"))
    """Request bodies above this are refused with 413 before they are read whole."""
    uvicorn_log_level: UvicornLogLevel = field(default="info", metadata=flag())
    """uvicorn's log level."""
    api_server_count: int = field(default=1, metadata=flag(aliases=("-asc",), parse=positive_int, metavar="N"))
    """API server processes sharing the port (docs/serving.md, "Several API servers")."""
    enable_auto_tool_choice: bool = field(default=False, metadata=flag())
    """Read tool calls out of the output for ``tool_choice: "auto"`` (needs ``--tool-call-parser``)."""
    tool_call_parser: str | None = field(default=None, metadata=flag(metavar="NAME"))
    """The format of the model's tool calls: ``hermes``, ``qwen3_json``, ``llama3_json``, ``llama4_json``,
    ``mistral``, ``pythonic``, ``qwen3_coder``, ``qwen3_xml``, ``deepseek_v3``, or one a plugin registers."""
    tool_parser_plugin: str = field(default="", metadata=flag(metavar="PATH"))
    """A Python file run at start-up that registers tool parsers in
    ``mmfront.serve.tool_parsers.TOOL_PARSERS`` (vLLM's plugins register in vLLM, and do not load)."""
    exclude_tools_when_tool_choice_none: bool = field(default=False, metadata=flag())
    """Leave the tools out of the prompt when ``tool_choice`` is ``"none"``."""
    tool_strict_level: ToolStrictLevelName | None = field(default=None, metadata=flag())
    """The least a tool-call structural tag constrains, over each tool's ``strict``: ``auto`` as
    ``tool_choice`` and the tools' ``strict`` ask, ``function`` the calls' markup and names for every
    request with tools, ``parameter`` the arguments too, as if every tool were ``strict``. Unset, the
    tool parser's default (``auto``)."""
    reasoning_parser: str = field(default="", metadata=flag(metavar="NAME"))
    """Split the output's reasoning into ``reasoning``: ``deepseek_r1``, ``qwen3``, or one a plugin registers."""
    reasoning_parser_plugin: str = field(default="", metadata=flag(metavar="PATH"))
    """A Python file run at start-up that registers reasoning parsers in
    ``mmfront.serve.reasoning.REASONING_PARSERS``."""

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ConfigError("--enable-auto-tool-choice requires --tool-call-parser.")
        if self.enable_per_request_metrics and self.disable_log_stats:
            raise ConfigError("--enable-per-request-metrics requires engine statistics logging; remove "
                              "--disable-log-stats to enable per-request metrics.")
        check_reasoning_effort_map(self.reasoning_effort_map)
        if self.sse_keep_alive_interval < 0:
            raise ConfigError("--sse-keep-alive-interval must be a non-negative integer (0 disables keep-alive "
                              "comments).")

    # --- the HTTP server (vLLM's FrontendArgs) ---
    uds: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Listen on this Unix domain socket instead of ``--host``:``--port``."""
    disable_uvicorn_access_log: bool = field(default=False, metadata=flag())
    """Turn uvicorn's access log off."""
    disable_access_log_for_endpoints: str | None = field(default=None, metadata=flag(metavar="PATHS"))
    """Comma-separated paths left out of the access log (e.g. ``/health,/metrics,/ping``)."""
    allow_credentials: bool = field(default=False, metadata=flag())
    """CORS: allow credentials."""
    allowed_origins: tuple[str, ...] = field(default=(), metadata=flag(parse=json_list("--allowed-origins"),
                                                                       metavar="JSON"))
    """CORS: the origins browsers may call from, as a JSON list (``'["https://app.example"]'``); empty: no
    cross-origin access."""
    allowed_methods: tuple[str, ...] = field(default=("*",), metadata=flag(parse=json_list("--allowed-methods"),
                                                                           metavar="JSON", shown_default='["*"]'))
    """CORS: the methods allowed, as a JSON list."""
    allowed_headers: tuple[str, ...] = field(default=("*",), metadata=flag(parse=json_list("--allowed-headers"),
                                                                           metavar="JSON", shown_default='["*"]'))
    """CORS: the request headers allowed, as a JSON list."""
    ssl_keyfile: str | None = field(default=None, metadata=flag(metavar="FILE"))
    """The TLS private key (PEM); with ``--ssl-certfile`` the server speaks HTTPS."""
    ssl_certfile: str | None = field(default=None, metadata=flag(metavar="FILE"))
    """The TLS certificate chain (PEM)."""
    ssl_ca_certs: str | None = field(default=None, metadata=flag(metavar="FILE"))
    """CA certificates client certificates are checked against."""
    ssl_cert_reqs: int = field(default=0, metadata=flag(metavar="N"))
    """Whether a client certificate is required: 0 none, 1 optional, 2 required (the ``ssl`` module's ``CERT_*``)."""
    ssl_ciphers: str | None = field(default=None, metadata=flag(metavar="CIPHERS"))
    """TLS cipher suites (TLS 1.2 and below), in OpenSSL's cipher-list form."""
    root_path: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """The path prefix a path-routing proxy serves the app under (ASGI ``root_path``)."""
    middleware: tuple[str, ...] = field(default=(), metadata=flag(repeat=True, default=[], metavar="IMPORT.PATH"))
    """ASGI middleware to wrap the app in, by import path, once per flag: a class is added as
    ``app.add_middleware(cls)``, a function as an HTTP middleware ``async (request, call_next)``."""
    enable_request_id_headers: bool = field(default=False, metadata=flag())
    """Answer every response with an ``X-Request-Id`` header (the client's, else a new one)."""
    disable_fastapi_docs: bool = field(default=False, metadata=flag())
    """Serve no ``/openapi.json``, ``/docs`` or ``/redoc``."""
    h11_max_incomplete_event_size: int = field(default=4 * 1024 * 1024, metadata=flag(parse=positive_int,
                                                                                      metavar="BYTES"))
    """Largest request head (request line and headers) a connection may send; a larger one is
    refused with 431 as its bytes arrive (vLLM's h11 limit, applied to mmfront's httptools parser)."""
    # --- the HTTP front door's bounds (docs/security.md, "The HTTP front door") ---
    h11_max_header_count: int = field(default=256, metadata=flag(parse=positive_int, metavar="N"))
    """Most header lines a request head may have (431 above)."""
    max_url_length: int = field(default=16384, metadata=flag(vllm=False, parse=positive_int, metavar="BYTES"))
    """Longest request URL, path and query (414 above)."""
    header_read_timeout: float = field(default=5.0, metadata=flag(vllm=False, parse=seconds, metavar="S"))
    """Seconds a request head may take to arrive whole, from the connection or the head's first
    byte (408, then the connection is closed)."""
    body_read_timeout: float = field(default=5.0, metadata=flag(vllm=False, parse=seconds, metavar="S"))
    """Seconds a request body may stall between two reads (408, then the connection is closed)."""
    http_timeout_keep_alive: int = field(default=5, metadata=flag(vllm=False, parse=positive_int, metavar="S"))
    """Seconds an idle keep-alive connection stays open (vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``)."""
    max_connections: int = field(default=8192, metadata=flag(vllm=False, parse=positive_int, metavar="N"))
    """Most open HTTP connections; a new one past it is answered 503 and closed. Kept under half of
    the open-file limit, which the server raises to 65535 (or the hard limit) at start."""
    max_body_bytes_in_flight: int = field(default=4 * DEFAULT_MAX_BODY_BYTES, metadata=flag(
        vllm=False, parse=positive_int, metavar="BYTES", shown_default="256 MiB"))
    """Most bytes of request bodies held at once, across requests, from their reading to their
    answer; a body that does not fit is refused with 503 before it is read."""
    max_chat_messages: int = field(default=10000, metadata=flag(vllm=False, parse=positive_int, metavar="N"))
    """Most messages a chat request may have (400 above, before any is looked at)."""
    max_content_parts: int = field(default=10000, metadata=flag(vllm=False, parse=positive_int, metavar="N"))
    """Most content parts (text, media) a chat request's messages may have together (400 above)."""

    # --- requests and responses ---
    response_role: str = field(default="assistant", metadata=flag(metavar="ROLE"))
    """The role of the answer when the request asks for a generation prompt (``add_generation_prompt``)."""
    enable_force_include_usage: bool = field(default=False, metadata=flag())
    """Every stream ends with a usage chunk, as if each request sent ``stream_options.include_usage``."""
    enable_tokenizer_info_endpoint: bool = field(default=False, metadata=flag())
    """Serve ``/tokenizer_info`` (the tokenizer's configuration, chat template included)."""
    enable_log_requests: bool = field(default=False, metadata=flag(negation="--disable-log-requests"))
    """Log each request (its id and sampling parameters at INFO; its prompt at DEBUG)."""
    disable_log_stats: bool = field(default=False, metadata=flag(negation=""))
    """No statistics: no periodic stats line (every ``VLLM_LOG_STATS_INTERVAL`` seconds, 10 by
    default) and none of the engine's request and scheduler families on ``/metrics``."""
    max_log_len: int | None = field(default=None, metadata=flag(metavar="N"))
    """Most prompt or output characters, or token ids, a request log shows (``None``: all)."""
    enable_log_outputs: bool = field(default=False, metadata=flag())
    """Log each response's output too (with ``--enable-log-requests``): its text and finish reason
    at INFO, its token ids at DEBUG; a stream's deltas one by one, then its whole text."""
    enable_log_deltas: bool = field(default=True, metadata=flag())
    """With ``--enable-log-outputs``, log a stream's deltas (off: only its whole text)."""
    enable_prompt_tokens_details: bool = field(default=False, metadata=flag())
    """Answer ``usage.prompt_tokens_details``: the prompt tokens the engine's prefix cache held
    (``cached_tokens``) and, for chat, those it newly cached (``created_cache_tokens``) and the
    multimodal placeholder tokens by modality (``multimodal_tokens``)."""
    enable_per_request_metrics: bool = field(default=False, metadata=flag())
    """Answer each request's timings as ``metrics`` (time to first token, generation, queue and mean
    inter-token times in ms, tokens per second), as vLLM's: on a whole answer with one choice, and
    on a stream's usage chunk; needs the statistics (not with ``--disable-log-stats``)."""
    sse_keep_alive_interval: int = field(default=0, metadata=flag(parse=count, metavar="S"))
    """Write an SSE comment (``: keep-alive``) into a streaming response idle this many seconds
    (queued, prefilling, between tokens), so proxies with read timeouts keep the connection; 0: never."""
    trust_request_mm_kwargs: bool = field(default=False, metadata=flag())
    """Take a request's ``mm_processor_kwargs`` and ``media_io_kwargs``; off, a request sending them is
    refused (400): they change how much work and memory its media take. Turn on only for trusted clients."""
    log_error_stack: bool = field(default=False, metadata=flag())
    """Log the stack trace of every error response."""
    default_chat_template_kwargs: Mapping[str, Any] | None = field(default=None, metadata=flag(
        metavar="JSON", example="'{\"enable_thinking\": false}'"))
    """Chat template keyword arguments every chat request gets, under its own ``chat_template_kwargs``
    (the request's win), e.g. ``'{"enable_thinking": false}'``."""
    reasoning_effort_map: Mapping[str, str] | None = field(default=None, metadata=flag(
        metavar="JSON", example="'{\"medium\": \"low\", \"xhigh\": \"max\"}'"))
    """Rewrite a request's ``reasoning_effort`` before the chat template sees it, for templates that
    know only some efforts, e.g. ``'{"medium": "low", "xhigh": "max"}'``; efforts not listed pass
    unchanged."""
    enable_server_load_tracking: bool = field(default=False, metadata=flag())
    """Count the generation requests in flight, answered by ``/load`` (``{"server_load": N}``)."""
    fingerprint_mode: FingerprintMode = field(default="full", metadata=flag())
    """The responses' ``system_fingerprint``: ``full`` and ``hash`` ``mmfront-<version>-<hash8>``,
    ``custom`` ``--fingerprint-value``, ``none`` null."""
    fingerprint_value: str | None = field(default=None, metadata=flag(metavar="TEXT"))
    """The fingerprint of ``--fingerprint-mode custom``."""
    anthropic_disabled_thinking_effort: AnthropicDisabledThinkingEffort = field(default="auto", metadata=flag())
    """The ``reasoning_effort`` a ``/v1/messages`` request with ``thinking: {"type": "disabled"}``
    renders with: ``auto`` probes the chat template once (``none`` where it renders a prompt of its
    own, else ``low``)."""

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names ``model`` may take; the first is reported in responses and ``/v1/models``."""
        return self.served_model_name or (str(self.model),)


@dataclass(frozen=True)
class LocalEngineOptions:
    """Which engines this server starts (``--data-parallel-size-local`` of them) and how they run
    the model."""

    engine: EngineKind | None = field(default=None, metadata=flag(
        vllm=False, shown_default="vllm where vLLM is found, else mmfront"))
    """The engine cores ``mmfront serve`` starts: ``vllm``, vLLM's own (``vllm serve MODEL --headless``, with
    every engine flag given here, such as ``--gpu-memory-utilization`` or ``--tensor-parallel-size``,
    passed on unchanged); ``mmfront``, mmfront's reference engine (``mmfront worker``: HF transformers,
    greedy decoding of one sequence per request, for tests and trials)."""
    vllm_command: str | None = field(default=None, metadata=flag(vllm=False, metavar="PATH"))
    """vLLM's ``vllm`` CLI, or the python of the venv that holds vLLM, for ``--engine vllm`` (default: vLLM
    importable here, else ``vllm`` on ``PATH``)."""
    device: str | None = field(default=None, metadata=flag(name="--worker-device", vllm=False, metavar="DEVICE"))
    """torch device of the ``mmfront worker`` engines ``mmfront serve`` starts (``None``: CUDA when
    available, else the CPU)."""
    dtype: str | None = None
    """Model dtype (``None``: the folder's ``config.json``); ``mmfront serve`` passes ``--dtype``."""
    vllm_cli: tuple[str, ...] = ()
    """vLLM's CLI as found (:func:`mmfront.serve.vllm_engine.vllm_cli`), for ``engine="vllm"``."""
    vllm_args: tuple[str, ...] = ()
    """What follows ``vllm serve`` for the vLLM engines: MODEL as the user gave it, then the flags
    routed to the engines (:func:`mmfront.serve.args.route_serve_argv`), as typed."""


@dataclass(frozen=True)
class ServePlan:
    """Everything ``mmfront serve`` was told: HTTP (:class:`ServeSettings`), processing
    (:class:`MultiModalConfig`), where the engines are (:class:`DataParallelConfig`) and how the
    local ones run."""

    settings: ServeSettings
    config: MultiModalConfig
    parallel: DataParallelConfig = field(default_factory=DataParallelConfig)
    engine: LocalEngineOptions = field(default_factory=LocalEngineOptions)
    source: ModelSource = field(default_factory=ModelSource)
    resolved_model: Path | None = None
    """The local folder ``settings.model`` resolved to (:func:`mmfront.hub.resolve_model_folder`);
    ``None``: ``settings.model`` is that folder."""
    engine_ready_timeout_s: float = field(default=600.0, metadata=flag(
        name="--engine-ready-timeout", vllm=False, parse=seconds, metavar="S"))
    """Seconds to wait for every engine to be ready (vLLM's ``VLLM_ENGINE_READY_TIMEOUT_S``)."""
    engine_timeout_s: float = field(default=30.0, metadata=flag(
        name="--engine-timeout", vllm=False, parse=seconds, metavar="S"))
    """An engine announcing heartbeats that is silent this long while requests wait is dead."""

    @property
    def model_folder(self) -> Path:
        """The folder the API server (and a reference worker) loads the model from; ``settings.model``
        stays the name it is served and reported under, a hub id as ``vllm serve`` reports it."""
        return self.resolved_model or Path(self.settings.model)


__all__ = ["DEFAULT_MAX_BODY_BYTES", "LocalEngineOptions", "ReasoningEffort", "ServePlan", "ServeSettings",
           "ToolStrictLevelName", "check_reasoning_effort_map", "one_key"]
