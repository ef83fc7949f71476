"""What mmfront's reference engine (``mmfront worker``) cannot honour, refused before it runs.

The reference engine decodes greedily, one sequence per request, with the model's plain logits:
it has no sampler, no logits processors, no logprobs, no grammar, no LoRA and no pooling. A
request that asks for any of these would otherwise get a greedy answer that looks like an answer
to what it asked, so the engine refuses it, naming the field, with what to send instead or where
to send it (vLLM's engine). The rule lives with the engine, so every frontend that talks to it
gets the same answer; an API server answers the refusal 400 with ``param`` set
(:func:`mmfront.serve.errors.engine_error`). The engine also says it in vLLM's start-up handshake
(:data:`~mmfront.wire.handshake.EXTRA_REFERENCE_LIMITS`), and mmfront's client then applies the
same rule before sending: the request never travels, and a stream is refused before it starts.

What the engine honours: ``max_tokens``, ``min_tokens``, ``stop_token_ids``, ``ignore_eos``; a
``seed`` (greedy decoding is reproducible whatever the seed); ``top_p``, ``top_k`` and ``min_p``
at temperature 0, where vLLM ignores them too, and ``top_k`` 1 at any temperature (the likeliest
token is the only candidate: greedy). What the API server does itself (stop strings,
detokenisation, ``output_kind``, ``stream_interval``) and what vLLM's own engine ignores without
configuration (``watermarking``, ``extra_args``, ``priority``, ``cache_salt``) is left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mmfront.errors import ValidationError
from mmfront.wire.params import SamplingParams
from mmfront.wire.structs import EngineCoreRequest

__all__ = ["REFERENCE_ENGINE_LIMITS", "EngineLimit", "check_reference_params", "check_reference_request"]

USE_VLLM = "serve with vLLM's engine (mmfront serve --engine vllm, or vllm serve --headless engines)"


@dataclass(frozen=True)
class EngineLimit:
    """One thing the reference engine cannot do: the field that asks for it, when a request asks
    (``asks``), and what the refusal tells the user to do instead (before :data:`USE_VLLM`)."""

    parameter: str
    asks: Callable[[SamplingParams], bool]
    cannot: str
    instead: str


def _sampling(params: SamplingParams) -> bool:
    return not params.is_greedy and params.top_k != 1


REFERENCE_ENGINE_LIMITS: tuple[EngineLimit, ...] = (
    EngineLimit("n", lambda p: p.n > 1, "returns one sequence per request", "send n 1"),
    EngineLimit("temperature", _sampling, "decodes greedily and cannot sample",
                "send temperature 0 (the API server's default is 1.0, which samples)"),
    EngineLimit("presence_penalty", lambda p: p.presence_penalty != 0.0, "applies no penalties",
                "send presence_penalty 0"),
    EngineLimit("frequency_penalty", lambda p: p.frequency_penalty != 0.0, "applies no penalties",
                "send frequency_penalty 0"),
    EngineLimit("repetition_penalty", lambda p: p.repetition_penalty != 1.0, "applies no penalties",
                "send repetition_penalty 1"),
    EngineLimit("logprobs", lambda p: p.logprobs is not None, "computes no logprobs", "leave logprobs out"),
    EngineLimit("logprob_token_ids", lambda p: bool(p.logprob_token_ids), "computes no logprobs",
                "leave logprob_token_ids out"),
    EngineLimit("prompt_logprobs", lambda p: p.prompt_logprobs is not None, "computes no logprobs",
                "leave prompt_logprobs (and echo with logprobs) out"),
    EngineLimit("prompt_logprob_token_ids", lambda p: p.prompt_logprob_token_ids is not None,
                "computes no logprobs", "leave prompt_logprob_token_ids out"),
    EngineLimit("structured_outputs", lambda p: p.structured_outputs is not None,
                "has no grammar backend for structured outputs",
                "leave structured_outputs and response_format (json_object, json_schema) out"),
    EngineLimit("logit_bias", lambda p: bool(p.logit_bias), "applies no logit bias", "leave logit_bias out"),
    EngineLimit("allowed_token_ids", lambda p: p.allowed_token_ids is not None,
                "cannot restrict the vocabulary", "leave allowed_token_ids out"),
    EngineLimit("bad_words", lambda p: bool(p.bad_words), "cannot ban words", "leave bad_words out"),
    EngineLimit("thinking_token_budget", lambda p: p.thinking_token_budget is not None,
                "cannot end reasoning at a budget", "leave thinking_token_budget out"),
    EngineLimit("repetition_detection", lambda p: p.repetition_detection is not None,
                "does not detect repetitions", "leave repetition_detection out"),
    EngineLimit("trace_decode_token_ids", lambda p: p.trace_decode_token_ids is not None,
                "cannot replay forced tokens", "leave trace_decode_token_ids out"),
)
"""Every sampling parameter the reference engine would otherwise ignore, in vLLM's field order
(``n`` first: an ``n`` above 1 at temperature 0 is refused by :class:`SamplingParams` itself)."""


def check_reference_request(request: EngineCoreRequest) -> None:
    """Raise :class:`~mmfront.errors.ValidationError` naming the first field of ``request`` the
    reference engine cannot honour (see the module docstring)."""
    if request.pooling_params is not None:
        raise _refusal("pooling_params", "generates text and pools nothing", "send sampling_params")
    if request.lora_request is not None:
        raise _refusal("lora_request", "runs the base model only and loads no LoRA adapter",
                       "send the request without a LoRA adapter")
    if request.prompt_embeds is not None:
        raise _refusal("prompt_embeds", "takes token prompts only", "send prompt_token_ids")
    if request.sampling_params is not None:
        check_reference_params(request.sampling_params)


def check_reference_params(params: SamplingParams) -> None:
    """Raise :class:`~mmfront.errors.ValidationError` naming the first sampling parameter the
    reference engine cannot honour (:data:`REFERENCE_ENGINE_LIMITS`)."""
    for limit in REFERENCE_ENGINE_LIMITS:
        if limit.asks(params):
            value = getattr(params, limit.parameter)
            raise _refusal(limit.parameter, limit.cannot, limit.instead,
                           value if isinstance(value, int | float) else None)


def _refusal(parameter: str, cannot: str, instead: str, value: object = None) -> ValidationError:
    return ValidationError(f"mmfront's reference engine (mmfront worker) {cannot}: {instead}, or {USE_VLLM}.",
                           parameter=parameter, value=value)
