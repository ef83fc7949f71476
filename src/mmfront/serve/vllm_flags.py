"""How ``mmfront serve`` routes the ``vllm serve`` flags it does not take itself: engine flags go to
the vLLM engines it starts, the rest are refused with the reason, so that a command line copied
from a vLLM deployment runs with every setting where ``vllm serve`` would apply it, or fails at
once naming the flag.

Engine flags (:data:`ENGINE_FLAGS`) configure the engine cores (the model's execution, its KV
cache, its scheduler, its parallelism): ``mmfront serve --engine vllm`` hands them, as typed, to
each ``vllm serve MODEL --headless`` it starts. Where it starts no vLLM engine (``--engine
mmfront``, or ``--data-parallel-size-local 0``) they belong on the engines' own command line and
are refused. Any other ``vllm serve`` flag ``mmfront serve`` does not list is refused as not
supported.
"""

from __future__ import annotations

ENGINE_FLAGS: dict[str, int | str] = {
    # parallelism and placement of the engine's workers
    "--tensor-parallel-size": 1, "-tp": 1, "--pipeline-parallel-size": 1, "-pp": 1, "--decode-context-parallel-size": 1, "-dcp": 1,
    "--prefill-context-parallel-size": 1, "-pcp": 1,
    "--data-parallel-backend": 1, "-dpb": 1, "--enable-expert-parallel": 0, "-ep": 0, "--disable-expert-parallel": 0,
    "--distributed-executor-backend": 1, "--nnodes": 1, "-n": 1, "--node-rank": 1, "-r": 1, "--master-addr": 1, "--master-port": 1,
    "--device-ids": 1, "--worker-cls": 1, "--worker-extension-cls": 1, "--enable-eplb": 0, "--all2all-backend": 1,
    "--max-parallel-loading-workers": 1,
    # memory and KV cache
    "--gpu-memory-utilization": 1, "--device-memory-utilization": 1, "--kv-cache-memory-bytes": 1, "--kv-cache-dtype": 1,
    "--block-size": 1, "--num-gpu-blocks-override": 1, "--cpu-offload-gb": 1, "--prefix-caching-hash-algo": 1,
    "--kv-offloading-size": 1, "--kv-offloading-backend": 1, "--enable-sleep-mode": 0, "--disable-sleep-mode": 0,
    # scheduler
    "--max-num-seqs": 1, "--max-num-batched-tokens": 1, "--max-num-scheduled-tokens": 1, "--max-num-active-seqs": 1,
    "--max-num-queued-reqs": 1, "--max-num-queued-tokens": 1, "--enable-chunked-prefill": 0, "--disable-chunked-prefill": 0,
    "--scheduling-policy": 1, "--long-prefill-token-threshold": 1, "--async-scheduling": 0, "--no-async-scheduling": 0,
    "--stream-interval": 1, "--scheduler-cls": 1,
    # model execution
    "--quantization": 1, "-q": 1, "--quantization-config": 1, "--enforce-eager": 0, "--no-enforce-eager": 0, "--seed": 1,
    "--load-format": 1, "--code-revision": 1, "--attention-backend": 1,
    "--attention-config": 1, "-ac": 1, "--compilation-config": 1, "-cc": 1, "--cudagraph-capture-sizes": "+",
    "--max-cudagraph-capture-size": 1, "--optimization-level": 1, "--performance-mode": 1,
    "--logprobs-mode": 1, "--generation-config": 1, "--override-generation-config": 1, "--hf-overrides": 1,
    "--speculative-config": 1, "-sc": 1, "--spec-method": 1, "--spec-model": 1, "--spec-tokens": 1,
    "--kv-transfer-config": 1, "--kv-events-config": 1, "--structured-outputs-config": 1,
    "--mm-encoder-tp-mode": 1, "--mm-encoder-attn-backend": 1, "--skip-mm-profiling": 0,
    # LoRA
    "--enable-lora": 0, "--disable-lora": 0, "--max-loras": 1, "--max-lora-rank": 1, "--max-cpu-loras": 1, "--lora-dtype": 1,
}
"""``vllm serve`` flags (and their short forms) that configure only the engine cores, with how many values
each takes (vLLM's parser: ``0`` a switch, ``1`` one value, ``"+"`` one or more): ``mmfront serve`` hands them
to the vLLM engines it starts (``--engine vllm``), unchanged."""

NOT_TAKEN_FRONTEND_FLAGS = {
    "--lora-modules": "mmfront serves the base model only; it loads no LoRA adapters",
    "--tool-server": "tool servers serve vLLM's Responses API (/v1/responses), which mmfront does not serve",
    "--cohere-is-reasoning-model": "it configures /cohere/v2/chat, a route mmfront does not serve",
    "--no-cohere-is-reasoning-model": "it configures /cohere/v2/chat, a route mmfront does not serve",
    "--cohere-format": "it configures /cohere/v2/chat, a route mmfront does not serve",
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

PLACED_BY_THE_LAUNCHER = frozenset({"--data-parallel-rank", "-dpn", "--data-parallel-start-rank", "-dpr"})
"""Engine flags that number an engine: ``mmfront serve`` numbers the engines it starts itself."""

SHARED_SERVE_FLAGS = frozenset({"--served-model-name", "--disable-log-stats", "--max-logprobs", "--revision",
                                "--tokenizer-revision", "--download-dir", "--hf-token"})
"""API-server flags that vLLM's engine reads too (the model's name in its logs, whether it sends
statistics, the logprobs it computes at most, where MODEL comes from): ``mmfront serve`` takes them
and hands them on to the vLLM engines it starts, with every vLLM flag of the processing group (``--max-model-len``,
``--limit-mm-per-prompt``, the processor cache, ``--dtype``, ...), as one ``vllm serve`` command
line configures both."""

HEADLESS_MESSAGE = (
    "--headless starts engines without an API server; mmfront serve is the API server. Run the engines "
    "elsewhere with 'vllm serve MODEL --headless --data-parallel-address HEAD --data-parallel-rpc-port PORT' "
    "(or 'mmfront worker MODEL --data-parallel-address HEAD --data-parallel-rpc-port PORT') and start "
    "'mmfront serve MODEL --data-parallel-size-local 0' on HEAD."
)


def refusal(flag: str, why_not_routed: str = "it starts no vLLM engine") -> str:
    """Why ``mmfront serve`` refuses the option ``flag`` (as typed, ``--name`` or ``--name=value``); for
    an engine flag, ``why_not_routed`` says why no vLLM engine of this server takes it."""
    name = flag.split("=", 1)[0]
    if name == "--headless":
        return HEADLESS_MESSAGE
    if name in PLACED_BY_THE_LAUNCHER:
        return (f"{name} numbers a headless engine: mmfront serve numbers the engines it starts itself (ranks 0 .. "
                "--data-parallel-size-local - 1); give it on the command line of engines started elsewhere "
                f"('vllm serve MODEL --headless {name} ...').")
    if name in NOT_TAKEN_FRONTEND_FLAGS:
        return f"{name} is not taken by mmfront serve: {NOT_TAKEN_FRONTEND_FLAGS[name]}."
    if name in ENGINE_FLAGS:
        return (f"{name} configures the engine, not the API server: mmfront serve hands it to the vLLM engines it "
                f"starts (--engine vllm), and here {why_not_routed}; for other engines it belongs on their command "
                f"line ('vllm serve MODEL --headless {name} ...', behind 'mmfront serve MODEL --data-parallel-size-local 0').")
    return f"{name} is not supported by mmfront serve (see 'mmfront serve --help' and docs/serving.md)."


__all__ = ["ENGINE_FLAGS", "HEADLESS_MESSAGE", "NOT_TAKEN_FRONTEND_FLAGS", "PLACED_BY_THE_LAUNCHER", "SHARED_SERVE_FLAGS",
           "refusal"]
