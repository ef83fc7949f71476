"""``vllm serve`` flags that ``mmfront serve`` does not take, and why, so that a command line
copied from a vLLM deployment fails at once with a message naming the flag instead of running
with a setting silently dropped.

Engine-only flags configure the engine cores (the model's execution, its KV cache, its
scheduler, its parallelism): with ``mmfront serve`` they belong on the engines' own command line,
``vllm serve MODEL --headless ...`` behind ``mmfront serve --data-parallel-size-local 0``.
Any other ``vllm serve`` flag ``mmfront serve`` does not list is refused as not supported.
"""

from __future__ import annotations

ENGINE_ONLY_FLAGS = frozenset({
    # parallelism and placement of the engine's workers
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--decode-context-parallel-size", "-dcp",
    "--prefill-context-parallel-size", "-pcp", "--data-parallel-rank", "-dpn", "--data-parallel-start-rank", "-dpr",
    "--data-parallel-backend", "-dpb", "--enable-expert-parallel", "-ep", "--disable-expert-parallel",
    "--distributed-executor-backend", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port",
    "--device-ids", "--worker-cls", "--worker-extension-cls", "--enable-eplb", "--all2all-backend",
    "--max-parallel-loading-workers",
    # memory and KV cache
    "--gpu-memory-utilization", "--device-memory-utilization", "--kv-cache-memory-bytes", "--kv-cache-dtype",
    "--block-size", "--num-gpu-blocks-override", "--cpu-offload-gb", "--prefix-caching-hash-algo",
    "--kv-offloading-size", "--kv-offloading-backend", "--enable-sleep-mode", "--disable-sleep-mode",
    # scheduler
    "--max-num-seqs", "--max-num-batched-tokens", "--max-num-scheduled-tokens", "--max-num-active-seqs",
    "--max-num-queued-reqs", "--max-num-queued-tokens", "--enable-chunked-prefill", "--disable-chunked-prefill",
    "--scheduling-policy", "--long-prefill-token-threshold", "--async-scheduling", "--no-async-scheduling",
    "--stream-interval", "--scheduler-cls",
    # model execution
    "--quantization", "-q", "--quantization-config", "--enforce-eager", "--no-enforce-eager", "--seed",
    "--load-format", "--code-revision", "--attention-backend",
    "--attention-config", "-ac", "--compilation-config", "-cc", "--cudagraph-capture-sizes",
    "--max-cudagraph-capture-size", "--optimization-level", "--performance-mode",
    "--logprobs-mode", "--generation-config", "--override-generation-config", "--hf-overrides",
    "--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens",
    "--kv-transfer-config", "--kv-events-config", "--structured-outputs-config",
    "--mm-encoder-tp-mode", "--mm-encoder-attn-backend", "--skip-mm-profiling",
    # LoRA
    "--enable-lora", "--disable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras", "--lora-dtype",
})
"""``vllm serve`` flags (and their short forms) that configure only the engine cores."""

NOT_TAKEN_FRONTEND_FLAGS = {
    "--lora-modules": "mmfront serves the base model only; it loads no LoRA adapters",
    "--tool-server": "tool servers serve vLLM's Responses API (/v1/responses), which mmfront does not serve",
    "--cohere-is-reasoning-model": "it configures /cohere/v2/chat, a route mmfront does not serve",
    "--no-cohere-is-reasoning-model": "it configures /cohere/v2/chat, a route mmfront does not serve",
    "--cohere-format": "it configures /cohere/v2/chat, a route mmfront does not serve",
    "--anthropic-disabled-thinking-effort": "it configures /v1/messages (Anthropic), a route mmfront does not serve",
    "--tokens-only": "the tokens-in/tokens-out endpoints of disaggregated serving are not mmfront's",
    "--no-tokens-only": "the tokens-in/tokens-out endpoints of disaggregated serving are not mmfront's",
    "--enable-scale-out": "the scale-out endpoints (/render, /inference/v1/generate) are not mmfront's",
    "--disable-scale-out": "the scale-out endpoints (/render, /inference/v1/generate) are not mmfront's",
    "--grpc-port": "it needs vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1); mmfront serves HTTP only",
    "--data-parallel-supervisor-port": "it belongs to --data-parallel-multi-port-external-lb, which mmfront does not run",
    "--dp-supervisor-probe-interval-s": "it belongs to --data-parallel-multi-port-external-lb, which mmfront does not run",
    "--dp-supervisor-probe-timeout-s": "it belongs to --data-parallel-multi-port-external-lb, which mmfront does not run",
    "--dp-supervisor-probe-failure-threshold": "it belongs to --data-parallel-multi-port-external-lb, which mmfront "
                                               "does not run",
    "--enable-flash-late-interaction": "it configures pooling (late-interaction scoring); mmfront serves generation",
    "--disable-flash-late-interaction": "it configures pooling (late-interaction scoring); mmfront serves generation",
    "--enable-offline-docs": "mmfront's /docs page loads Swagger UI from the jsDelivr CDN, as FastAPI's; it vendors "
                             "no copy",
    "--disable-offline-docs": "mmfront's /docs page loads Swagger UI from the jsDelivr CDN, as FastAPI's; it "
                              "vendors no copy",
    "--enable-ssl-refresh": "mmfront reads the TLS files once at start-up; restart it to load new certificates",
    "--disable-ssl-refresh": "mmfront reads the TLS files once at start-up; restart it to load new certificates",
}
"""``vllm serve`` API-server flags ``mmfront serve`` does not take, each with the reason
(docs/serving.md, "Differences from vllm serve")."""

HEADLESS_MESSAGE = (
    "--headless starts engines without an API server; mmfront serve is the API server. Run the engines "
    "elsewhere with 'vllm serve MODEL --headless --data-parallel-address HEAD --data-parallel-rpc-port PORT' "
    "(or 'mmfront worker MODEL --data-parallel-address HEAD --data-parallel-rpc-port PORT') and start "
    "'mmfront serve MODEL --data-parallel-size-local 0' on HEAD."
)


def refusal(flag: str) -> str:
    """Why ``mmfront serve`` refuses the option ``flag`` (as typed, ``--name`` or ``--name=value``)."""
    name = flag.split("=", 1)[0]
    if name == "--headless":
        return HEADLESS_MESSAGE
    if name in NOT_TAKEN_FRONTEND_FLAGS:
        return f"{name} is not taken by mmfront serve: {NOT_TAKEN_FRONTEND_FLAGS[name]}."
    if name in ENGINE_ONLY_FLAGS:
        return (f"{name} configures the engine, not the API server: it belongs on the engines' command line "
                f"('vllm serve MODEL --headless {name} ...', behind 'mmfront serve MODEL --data-parallel-size-local 0').")
    return f"{name} is not supported by mmfront serve (see 'mmfront serve --help' and docs/serving.md)."


__all__ = ["ENGINE_ONLY_FLAGS", "HEADLESS_MESSAGE", "NOT_TAKEN_FRONTEND_FLAGS", "refusal"]
