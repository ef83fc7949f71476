"""The options of ``vllm serve``'s API-server group in vLLM 0.33 (its ``FrontendArgs``, the
"Frontend" section of ``vllm serve --help``), and the API-server options ``vllm serve`` adds
beside them, as vLLM's parser lists them; test_cli_serve_vllm_flags.py checks this list against
the parser of the peer venv where it exists (CI has none, so the list is checked in)."""

FRONTEND_FLAGS = (
    "--lora-modules", "--chat-template", "--chat-template-content-format", "--trust-request-chat-template",
    "--no-trust-request-chat-template", "--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs",
    "--default-chat-template-kwargs", "--reasoning-effort-map", "--response-role", "--return-tokens-as-token-ids",
    "--no-return-tokens-as-token-ids", "--enable-auto-tool-choice", "--disable-auto-tool-choice",
    "--exclude-tools-when-tool-choice-none", "--no-exclude-tools-when-tool-choice-none", "--tool-call-parser",
    "--tool-parser-plugin", "--tool-strict-level", "--tool-server", "--max-log-len", "--enable-prompt-tokens-details",
    "--disable-prompt-tokens-details", "--enable-per-request-metrics", "--disable-per-request-metrics",
    "--enable-server-load-tracking", "--disable-server-load-tracking", "--enable-force-include-usage",
    "--disable-force-include-usage", "--sse-keep-alive-interval", "--enable-tokenizer-info-endpoint",
    "--disable-tokenizer-info-endpoint", "--enable-log-outputs", "--disable-log-outputs", "--enable-log-deltas",
    "--disable-log-deltas", "--cohere-is-reasoning-model", "--no-cohere-is-reasoning-model", "--cohere-format",
    "--anthropic-disabled-thinking-effort", "--log-error-stack", "--no-log-error-stack", "--tokens-only",
    "--no-tokens-only", "--enable-scale-out", "--disable-scale-out", "--fingerprint-mode", "--fingerprint-value",
    "--host", "--port", "--grpc-port", "--data-parallel-supervisor-port", "--dp-supervisor-probe-interval-s",
    "--dp-supervisor-probe-timeout-s", "--dp-supervisor-probe-failure-threshold", "--uds", "--uvicorn-log-level",
    "--disable-uvicorn-access-log", "--enable-uvicorn-access-log", "--disable-access-log-for-endpoints",
    "--allow-credentials", "--no-allow-credentials", "--allowed-origins", "--allowed-methods", "--allowed-headers",
    "--api-key", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--enable-ssl-refresh", "--disable-ssl-refresh",
    "--ssl-cert-reqs", "--ssl-ciphers", "--root-path", "--middleware", "--enable-request-id-headers",
    "--disable-request-id-headers", "--disable-fastapi-docs", "--enable-fastapi-docs",
    "--h11-max-incomplete-event-size", "--h11-max-header-count", "--enable-offline-docs", "--disable-offline-docs",
    "--enable-flash-late-interaction", "--disable-flash-late-interaction",
)
"""``vllm serve``'s "Frontend" group, in its order."""

SERVER_FLAGS = ("--api-server-count", "-asc", "--config", "--tokenizer", "--trust-remote-code", "--no-trust-remote-code",
                "--enable-log-requests", "--disable-log-requests", "--allowed-media-domains",
                "--allowed-local-media-path")
"""Options of other groups that configure the API server (its processes, its configuration file,
its tokenizer, its request log, where its media may come from)."""

PEER_SCRIPT = """
import json
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
group = next(g for g in parser._action_groups if g.title == "Frontend")
by_dest = {a.dest: a.option_strings for a in parser._actions}
server = [o for dest in ("api_server_count", "config", "tokenizer", "trust_remote_code", "enable_log_requests",
                         "allowed_media_domains", "allowed_local_media_path") for o in by_dest[dest]]
print(json.dumps({"frontend": [o for a in group._group_actions for o in a.option_strings], "server": server}))
"""
"""What the test runs in the peer venv to read the lists from vLLM's own parser."""
