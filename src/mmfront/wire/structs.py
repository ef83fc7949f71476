"""The messages between the frontend (P0) and the engine (P1), as msgspec structs.

Field names, order, defaults and struct options follow vLLM 0.33 (``vllm.v1.engine``), so a stock
vLLM engine core decodes the requests mmfront sends and mmfront decodes the outputs a stock engine
sends. The array-like structs are encoded positionally and msgspec writes every field (trailing
defaults included); a decoder ignores trailing elements it does not know, which is how newer
fields stay compatible. Logprobs are vLLM's ``LogprobsLists`` (sampled tokens, numpy arrays) and
``LogprobsTensors`` (the prompt's, torch tensors): NamedTuples in vLLM, so arrays on the wire, each
array written as the codec's (dtype, shape, data). Fields whose vLLM types mmfront never builds
(scheduler statistics, KV hints) are carried as plain msgpack data (``Any``).
"""

from __future__ import annotations

import enum
import time
from typing import Any

import msgspec
import numpy as np
import torch

from mmfront.inputs import MultiModalFeatureSpec
from mmfront.wire.params import LoRARequest, PoolingParams, SamplingParams


class EngineCoreRequestType(enum.Enum):
    """The first frame of every message a vLLM frontend sends an engine core (vLLM's bytes)."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x03"


class KvHintAction(msgspec.Struct, frozen=True):
    """One orchestrator hint about a request's KV cache; ``payload`` is JSON-like."""

    action_id: str
    action_type: str
    action_version: str
    payload: dict[str, Any]


class KvHintsEnvelope(msgspec.Struct, frozen=True):
    protocol_version: str
    message_id: str
    actions: list[KvHintAction]


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request to the engine: vLLM 0.33's 22 fields in its order. ``mm_features`` are sorted
    by placeholder offset; a feature's ``data`` is ``None`` when the engine-side cache already
    holds the item."""

    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[MultiModalFeatureSpec] | None
    sampling_params: SamplingParams | None
    pooling_params: PoolingParams | None
    arrival_time: float
    lora_request: LoRARequest | None
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: torch.Tensor | None = None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: KvHintsEnvelope | None = None


class FinishReason(enum.IntEnum):
    """Why a request finished; an int on the wire."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return ("stop", "length", "abort", "error", "repetition")[self.value]


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class EngineCoreEvent(msgspec.Struct):
    """A request's scheduling event (a map ``{"type", "timestamp"}``); ``timestamp`` is the
    engine's monotonic clock, comparable only with the same engine's other events."""

    type: EngineCoreEventType
    timestamp: float


class RequestError(msgspec.Struct):
    """A request-level error (a map); ``retryable`` errors may be resent as they are."""

    code: str
    message: str
    retryable: bool = False


class LogprobsLists(msgspec.Struct, array_like=True, gc=False):
    """vLLM's ``LogprobsLists``: one row per generated position, column 0 the sampled token, then
    the top-k (as many columns as the widest request of the engine step asked for)."""

    logprob_token_ids: np.ndarray
    """[positions, columns] token ids."""
    logprobs: np.ndarray
    """[positions, columns] their logprobs."""
    sampled_token_ranks: np.ndarray
    """[positions] the sampled token's rank in the vocabulary (1: the most likely)."""
    cu_num_generated_tokens: list[int] | None = None


class LogprobsTensors(msgspec.Struct, array_like=True, gc=False):
    """vLLM's ``LogprobsTensors``, as a request's prompt logprobs arrive: one row per prompt
    position after the first (column 0 the next prompt token, then the top-k), sent once the
    prompt is computed (each prefill chunk's rows in turn where the engine sends them so)."""

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor
    cu_num_generated_tokens: list[int] | None = None
    cu_num_generated_tokens_tensor: torch.Tensor | None = None


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's progress in an engine step, vLLM 0.33's 19 fields in its order.

    ``mm_cache_miss_hashes`` is vLLM's drift reply: the engine lacked these items, the request
    finished with ``FinishReason.ERROR`` and is resent with their data. mmfront's engine side
    answers a miss the same way, so a stock vLLM frontend recovers from it too."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs_tensors: LogprobsTensors | None = None
    pooling_output: torch.Tensor | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    prefill_stats: Any = None
    routed_experts: np.ndarray | None = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: list[str] | None = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: torch.Tensor | None = None
    error: RequestError | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    """The answer to a utility call (``failure_message`` set when it failed)."""

    call_id: int
    failure_message: str | None = None
    result: Any = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's outputs for one client, vLLM 0.33's 9 fields in its order. A zero
    ``timestamp`` becomes the current monotonic time, on construction and on decode, as in vLLM."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: Any = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: set[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None

    def __post_init__(self) -> None:
        if self.timestamp == 0.0:
            self.timestamp = time.monotonic()


__all__ = [
    "EngineCoreEvent",
    "EngineCoreEventType",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "EngineCoreRequestType",
    "FinishReason",
    "KvHintAction",
    "KvHintsEnvelope",
    "LoRARequest",
    "LogprobsLists",
    "LogprobsTensors",
    "PoolingParams",
    "RequestError",
    "SamplingParams",
    "UtilityOutput",
]
