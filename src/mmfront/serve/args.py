"""``mmfront serve MODEL_DIR``'s command line: ``vllm serve``'s flag names for everything that
concerns the frontend, mmfront's own beside them, and a refusal naming every other ``vllm serve``
flag (:mod:`mmfront.serve.vllm_flags`), so nothing is silently ignored.

Each flag has one home: :class:`~mmfront.config.MultiModalConfig` (processing, caches, media),
:class:`~mmfront.engine.handshake.DataParallelConfig` (where the engines are),
:class:`~mmfront.serve.settings.ServeSettings` (HTTP) or the launcher's
:class:`~mmfront.serve.launcher.ServePlan` (local engines, waits). This module imports nothing
heavy at the top, so ``mmfront --help`` answers at once; :func:`plan_from_args` imports what the
configuration needs when the command runs.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmfront.serve.vllm_flags import refusal

if TYPE_CHECKING:
    from mmfront.serve.launcher import ServePlan

DESCRIPTION = (
    "Serve MODEL_DIR over vLLM's OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
    "/v1/models, /health, /version, /metrics), in place of 'vllm serve'. By default it starts its engines "
    "itself (--data-parallel-size 'mmfront worker' processes on this host, met through vLLM's start-up "
    "handshake); with --data-parallel-size-local 0 it starts none and waits for headless engines, vLLM's "
    "('vllm serve MODEL --headless') or mmfront's ('mmfront worker MODEL --data-parallel-address HEAD'), on "
    "--data-parallel-address:--data-parallel-rpc-port. The flags keep vLLM's names; a 'vllm serve' flag that "
    "configures only the engines is refused with a message saying it belongs on the engines' command line, "
    "and any other flag it does not take is refused by name."
)

UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
DEFAULT_RPC_PORT = 29550
"""vLLM's default ``--data-parallel-rpc-port`` (the same as :mod:`mmfront.engine.handshake`'s)."""
DEFAULT_ENGINE_READY_TIMEOUT_S = 600.0
"""How long to wait for every engine's ready answer (vLLM's ``VLLM_ENGINE_READY_TIMEOUT_S``)."""

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _json_object(flag: str) -> Any:
    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON object, e.g. {_EXAMPLES[flag]}; "
                                             f"{text!r} is not JSON ({e})") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON object, e.g. {_EXAMPLES[flag]}; got {text!r}")
        return value
    return parse


_EXAMPLES = {
    "--limit-mm-per-prompt": "'{\"image\": 4, \"audio\": 1}'",
    "--mm-processor-kwargs": "'{\"do_pan_and_scan\": true}'",
    "--media-io-kwargs": "'{\"image\": {\"rgba_background_color\": [0, 0, 0]}}'",
}


def human_int(text: str) -> int:
    """An integer as vLLM's ``--max-model-len`` takes it: ``32768``, ``32k`` (x1000) or ``32K`` (x1024)."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 32768, 32k or 32K, got {text!r}")
    value = float(match.group(1)) * _SUFFIX[match.group(2)]
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _port(text: str) -> int:
    value = _count(text)
    if value >= 1 << 16:
        raise argparse.ArgumentTypeError(f"expected a port number in 0..65535, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def add_serve_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``mmfront`` command's sub-parsers; unknown flags are answered by
    :func:`refuse_unknown`."""
    serve: argparse.ArgumentParser = commands.add_parser(
        "serve", help="an OpenAI-compatible HTTP server in place of 'vllm serve', with vLLM's flags",
        description=DESCRIPTION, allow_abbrev=False)
    serve.add_argument("model", metavar="MODEL_DIR", help="model folder (config.json, processor, tokenizer; "
                                                          "weights too when mmfront starts its own engines)")
    http = serve.add_argument_group("HTTP server (vLLM's flags)")
    http.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    http.add_argument("--port", type=_port, default=8000, help="port to listen on (default 8000)")
    http.add_argument("--served-model-name", nargs="+", metavar="NAME",
                      help="names clients may send as 'model'; the first is reported (default: MODEL_DIR)")
    http.add_argument("--api-key", nargs="+", metavar="KEY",
                      help="require 'Authorization: Bearer KEY' on every /v1 request (one key)")
    http.add_argument("--uvicorn-log-level", choices=UVICORN_LOG_LEVELS, default="info",
                      help="uvicorn's log level (default info)")
    http.add_argument("--api-server-count", "-asc", type=_positive_int, default=1, metavar="N",
                      help="API server processes sharing the port (default 1)")
    http.add_argument("--max-body-bytes", type=_positive_int, metavar="BYTES",
                      help="mmfront's own: request bodies above this are refused with 413 before they are read "
                           "whole (default 64 MiB)")
    front = serve.add_argument_group("requests and multimodal processing (vLLM's flags)")
    front.add_argument("--max-model-len", type=human_int, metavar="TOKENS",
                       help="longest prompt plus output accepted (e.g. 8192, 8k, 8K); capped by the engines' own")
    front.add_argument("--max-logprobs", type=int, default=20, metavar="N",
                       help="most logprobs a request may ask for per token (default 20; -1: the vocabulary)")
    front.add_argument("--limit-mm-per-prompt", type=_json_object("--limit-mm-per-prompt"), metavar="JSON",
                       help="most items per modality in one prompt, a JSON object such as "
                            "'{\"image\": 4, \"audio\": 1}' (default 999 each)")
    front.add_argument("--mm-processor-kwargs", type=_json_object("--mm-processor-kwargs"), metavar="JSON",
                       help="HF processor keyword arguments for every request, a JSON object")
    front.add_argument("--media-io-kwargs", type=_json_object("--media-io-kwargs"), metavar="JSON",
                       help="media loading options per modality, a JSON object")
    front.add_argument("--mm-processor-cache-gb", type=float, default=4.0, metavar="GB",
                       help="processor cache size in GiB, in this API server and in each engine (default 4; "
                            "0 turns it off)")
    front.add_argument("--mm-processor-cache-type", choices=["lru", "shm"], default="lru",
                       help="lru: the engine mirrors this server's cache; shm: items go through shared memory "
                            "(engines on this host only) (default lru)")
    front.add_argument("--mm-shm-cache-max-object-size-mb", type=_positive_int, metavar="MB",
                       help="largest item the shm cache stores (default 128)")
    front.add_argument("--mm-hasher-algorithm", choices=["blake3", "sha256", "sha512"], default="blake3",
                       help="content hash of media items (default blake3)")
    front.add_argument("--enable-mm-embeds", action="store_true",
                       help="accept precomputed image_embeds and audio_embeds inputs")
    front.add_argument("--enable-prefix-caching", action="store_true", default=True,
                       help="the engines cache prefixes (the default): items are keyed by content hash")
    front.add_argument("--disable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                       help="the engines cache no prefixes: with the processor cache off too, items are named per "
                            "request instead of hashed (match the engines' setting)")
    front.add_argument("--enable-tower-connector-lora", action="store_true",
                       help="prefix items' cache keys with the LoRA name")
    front.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                       help="model dtype: floating processor outputs are cast to it, and mmfront's own engines load "
                            "the model in it (default auto: the folder's config.json, a float32 checkpoint as "
                            "bfloat16, as vLLM resolves it for a GPU engine)")
    front.add_argument("--model-impl", choices=["auto", "vllm", "transformers"], default="auto",
                       help="the implementation the vLLM engine runs, which decides what it is sent (default auto: "
                            "vLLM's native class where it has one, else its transformers backend)")
    front.add_argument("--mm-device-do-normalize", action=argparse.BooleanOptionalAction, default=None,
                       help="send raw uint8 pixels for the engine to normalise (default: vLLM's default for the "
                            "model class)")
    front.add_argument("--chat-template", metavar="TEMPLATE",
                       help="a Jinja chat template, or the path of a file holding one, in place of the model's")
    front.add_argument("--chat-template-content-format", choices=["auto", "string", "openai"], default="auto",
                       help="how the template reads message content (default auto: detected)")
    front.add_argument("--trust-request-chat-template", action="store_true",
                       help="accept a chat_template sent with a request")
    front.add_argument("--allowed-local-media-path", default="", metavar="DIR",
                       help="file:// media may be read below this absolute folder (default: none)")
    front.add_argument("--allowed-media-domains", nargs="+", metavar="HOST",
                       help="hosts http(s) media may come from (default: none; '*' allows any)")
    own = serve.add_argument_group("mmfront's processing")
    own.add_argument("--processing-lanes", type=_count, metavar="N",
                     help="processes that run the HF processor on cache misses (default: cores - 1, at least 1; "
                          "0: in the server process)")
    own.add_argument("--lane-executor", choices=["process", "ray"], default="process",
                     help="where the lanes run: local processes or Ray actors (default process)")
    own.add_argument("--thread-budget", type=_positive_int, metavar="N",
                     help="threads processing may use at once (default: the cores this process may run on)")
    own.add_argument("--transformers-backend", choices=["auto", "legacy", "offsets"], default="auto",
                     help="the transformers-backend processor's implementation (default auto)")
    engines = serve.add_argument_group("engines (vLLM's flags)")
    engines.add_argument("--data-parallel-size", "-dp", type=_positive_int, default=1, metavar="N",
                         help="engine ranks (default 1)")
    engines.add_argument("--data-parallel-size-local", "-dpl", type=_count, metavar="N",
                         help="ranks this command starts on this host as 'mmfront worker' processes (default: all); "
                              "0: start none and wait for headless engines")
    engines.add_argument("--data-parallel-address", "-dpa", default="127.0.0.1", metavar="HOST",
                         help="where headless engines reach this server's handshake and data sockets "
                              "(default 127.0.0.1)")
    engines.add_argument("--data-parallel-rpc-port", "-dpp", type=_port, default=DEFAULT_RPC_PORT, metavar="PORT",
                         help=f"the handshake port headless engines connect to (default {DEFAULT_RPC_PORT})")
    engines.add_argument("--engine-ready-timeout", type=_seconds, default=DEFAULT_ENGINE_READY_TIMEOUT_S,
                         metavar="S", help="mmfront's own: seconds to wait for every engine to be ready "
                                           f"(default {DEFAULT_ENGINE_READY_TIMEOUT_S:.0f})")
    engines.add_argument("--engine-timeout", type=_seconds, default=30.0, metavar="S",
                         help="mmfront's own: an engine announcing heartbeats that is silent this long while "
                              "requests wait is dead (default 30)")
    engines.add_argument("--worker-device", metavar="DEVICE",
                         help="mmfront's own: torch device of the engines it starts (default: cuda when "
                              "available, else cpu)")
    serve.set_defaults(refuse_unknown=lambda extras: refuse_unknown(serve, extras))
    return serve


def refuse_unknown(parser: argparse.ArgumentParser, extras: Sequence[str]) -> None:
    """End the command (exit 2, as argparse) naming each option ``mmfront serve`` does not take, and
    where an engine-only one belongs."""
    flags = [e for e in extras if e.startswith("-")]
    if not flags:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    parser.error("\n  ".join(["refused:", *(refusal(flag) for flag in flags)]))


def _chat_template_text(value: str | None) -> str | None:
    """vLLM's ``--chat-template`` is a file's path or the template itself."""
    if value is None:
        return None
    path = Path(value).expanduser()
    try:
        return path.read_text(encoding="utf-8") if path.is_file() else value
    except OSError:
        return value


def plan_from_args(args: argparse.Namespace) -> ServePlan:
    """The launcher's plan for parsed ``mmfront serve`` arguments; a value the configuration
    refuses raises :class:`~mmfront.errors.ConfigError` naming it."""
    from mmfront.config import MultiModalConfig
    from mmfront.engine.handshake import DataParallelConfig
    from mmfront.errors import ConfigError
    from mmfront.serve.launcher import LocalEngineOptions, ServePlan
    from mmfront.serve.settings import DEFAULT_MAX_BODY_BYTES, ServeSettings

    if not Path(args.model).is_dir():
        raise ConfigError(f"MODEL_DIR {args.model!r} is not a folder; mmfront serves a local model folder "
                          "(it downloads nothing).")
    if args.api_key and len(args.api_key) > 1:
        raise ConfigError(f"--api-key takes one key in mmfront serve, got {len(args.api_key)}.")
    local = args.data_parallel_size if args.data_parallel_size_local is None else args.data_parallel_size_local
    parallel = DataParallelConfig(args.data_parallel_size, local, args.data_parallel_address,
                                  args.data_parallel_rpc_port)
    chat_template = _chat_template_text(args.chat_template)
    config = MultiModalConfig(
        mm_processor_cache_gb=args.mm_processor_cache_gb,
        mm_processor_cache_type=args.mm_processor_cache_type,
        mm_shm_cache_max_object_size_mb=args.mm_shm_cache_max_object_size_mb,
        mm_hasher_algorithm=args.mm_hasher_algorithm,
        limit_mm_per_prompt=args.limit_mm_per_prompt or {},
        mm_processor_kwargs=args.mm_processor_kwargs,
        media_io_kwargs=args.media_io_kwargs or {},
        enable_mm_embeds=args.enable_mm_embeds,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_tower_connector_lora=args.enable_tower_connector_lora,
        transformers_backend=args.transformers_backend,
        model_impl=args.model_impl,
        mm_device_do_normalize=args.mm_device_do_normalize,
        chat_template=chat_template,
        chat_template_content_format=args.chat_template_content_format,
        trust_request_chat_template=args.trust_request_chat_template,
        mm_processing_lanes=args.processing_lanes,
        mm_lane_executor=args.lane_executor,
        mm_thread_budget=args.thread_budget,
        allowed_local_media_path=args.allowed_local_media_path,
        allowed_media_domains=tuple(args.allowed_media_domains) if args.allowed_media_domains else None,
    )
    if config.mm_processor_cache_type == "shm" and config.mm_processor_cache_gb > 0 and (
            not parallel.all_local or parallel.data_parallel_size > 1 or args.api_server_count > 1):
        raise ConfigError("--mm-processor-cache-type shm serves one engine on this host from one API server (its "
                          "shared memory is theirs); use lru with engines elsewhere, --data-parallel-size or "
                          "--api-server-count above 1 (lru keeps one mirror per rank and API server).")
    settings = ServeSettings(
        model=Path(args.model),
        served_model_name=tuple(args.served_model_name or ()),
        host=args.host,
        port=args.port,
        api_key=args.api_key[0] if args.api_key else None,
        max_model_len=args.max_model_len,
        max_logprobs=args.max_logprobs,
        chat_template=chat_template,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        uvicorn_log_level=args.uvicorn_log_level,
        api_server_count=args.api_server_count,
    )
    engine = LocalEngineOptions(device=args.worker_device, dtype=None if args.dtype == "auto" else args.dtype)
    return ServePlan(settings, config, parallel, engine, engine_ready_timeout_s=args.engine_ready_timeout,
                     engine_timeout_s=args.engine_timeout)


__all__ = ["DESCRIPTION", "add_serve_parser", "human_int", "plan_from_args", "refuse_unknown"]
